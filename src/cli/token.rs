//! `gpuq token`: join tokens for daemons (admins) and bearer tokens for the
//! HTTP API (a user's own; admins' for anyone): create, list, revoke.

use clap::Subcommand;

use super::table::{fmt_time, Table};
use super::{call, print_json, unexpected, CliError, JsonFlag};
use crate::model::Role;
use crate::net::proto::{ApiRequest, ApiResponse};

// `gpuq token ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum TokenCommand {
    /// Print a new token: a join token (--role agent or server, admins), or
    /// a bearer token for the HTTP API (--role user).
    Create {
        /// agent (compute and login agents may join with it), server, or
        /// user (an API token acting as a user, never as an admin).
        #[arg(long, default_value = "agent", value_parser = parse_token_role)]
        role: TokenRole,
        /// With --role user: whose token (admins only; default yourself).
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// With --role user: for reads only (queue, show, nodes, ...).
        #[arg(long)]
        read_only: bool,
        /// How long it is valid, e.g. 30m, 24h, 7d (at most the servers'
        /// max_token_ttl_secs, a week by default).
        #[arg(long, default_value = "24h", value_parser = parse_ttl)]
        ttl: u64,
        /// How many daemons may join with it, e.g. 1 for one machine.
        /// Default: any number until it expires.
        #[arg(long)]
        uses: Option<u64>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// List tokens (never their secrets): join tokens for admins, and API
    /// tokens (all for admins, your own otherwise).
    List {
        /// With --json: user lists API tokens; otherwise join tokens.
        #[arg(long, value_parser = parse_token_role)]
        role: Option<TokenRole>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Revoke a token by id: it admits nobody from now on.
    Revoke {
        /// The token id (the part after `gpuq1-`, before the first dot).
        id: String,
    },
}

/// What `gpuq token create --role` makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRole {
    /// A join token for daemons of this role.
    Join(Role),
    /// A bearer token for the HTTP API.
    User,
}

fn parse_token_role(s: &str) -> Result<TokenRole, String> {
    match (s, Role::parse(s)) {
        ("user", _) => Ok(TokenRole::User),
        (_, Some(r @ (Role::Agent | Role::Server))) => Ok(TokenRole::Join(r)),
        _ => Err(format!("unknown role {s:?}; use agent, server or user")),
    }
}

fn parse_ttl(s: &str) -> Result<u64, String> {
    crate::spec::time::parse_ttl(s)
        .map(|d| d.as_secs())
        .map_err(|e| e.to_string())
}

pub(super) async fn token(cmd: TokenCommand) -> Result<(), CliError> {
    match cmd {
        TokenCommand::Create {
            role: TokenRole::User,
            ttl,
            uses,
            user,
            read_only,
            json,
        } => {
            if uses.is_some() {
                return Err(CliError::input(
                    "--uses is for join tokens; an API token is used until it expires",
                ));
            }
            match call(ApiRequest::ApiTokenCreate {
                user,
                ttl_secs: ttl,
                read_only,
            })
            .await?
            {
                ApiResponse::ApiToken { token, info } => {
                    if json.json {
                        return print_json(&serde_json::json!({ "token": token, "info": info }));
                    }
                    println!("{token}");
                    eprintln!(
                        "API token {} for {}{}, valid until {} UTC; send it as \
                         `Authorization: Bearer <token>`",
                        info.id,
                        info.user,
                        if info.read_only { " (read-only)" } else { "" },
                        fmt_time(info.expires_at)
                    );
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        TokenCommand::Create {
            role: TokenRole::Join(role),
            ttl,
            uses,
            user,
            read_only,
            json,
        } => {
            if user.is_some() || read_only {
                return Err(CliError::input(
                    "--user and --read-only are for API tokens: add --role user",
                ));
            }
            match call(ApiRequest::TokenCreate {
                role,
                ttl_secs: ttl,
                uses,
            })
            .await?
            {
                ApiResponse::Token { token, info } => {
                    if json.json {
                        return print_json(&serde_json::json!({ "token": token, "info": info }));
                    }
                    println!("{token}");
                    eprintln!(
                        "token {} for {} daemons, valid until {} UTC",
                        info.id,
                        info.role,
                        fmt_time(info.expires_at)
                    );
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        TokenCommand::List { role, json } => match call(ApiRequest::TokenList).await? {
            ApiResponse::Tokens { tokens, api_tokens } => {
                if json.json && role == Some(TokenRole::User) {
                    return print_json(&api_tokens);
                }
                if json.json {
                    return print_json(&tokens);
                }
                let mut t = Table::new(&["ID", "ROLE", "EXPIRES", "CREATED_BY", "USES", "STATE"]);
                let now = crate::clock::now_ms();
                let tokens = tokens.into_iter().filter(|k| match role {
                    None => true,
                    Some(TokenRole::Join(r)) => k.role == r,
                    Some(TokenRole::User) => false,
                });
                for k in tokens {
                    let st = if k.revoked {
                        "revoked"
                    } else if k.max_uses.is_some_and(|max| k.uses >= max) {
                        "used up"
                    } else if now >= k.expires_at {
                        "expired"
                    } else {
                        "valid"
                    };
                    t.row(vec![
                        k.id,
                        k.role.to_string(),
                        fmt_time(k.expires_at),
                        k.created_by,
                        match k.max_uses {
                            Some(max) => format!("{}/{max}", k.uses),
                            None => k.uses.to_string(),
                        },
                        st.into(),
                    ]);
                }
                if matches!(role, None | Some(TokenRole::User)) {
                    for k in api_tokens {
                        let st = if k.revoked {
                            "revoked"
                        } else if now >= k.expires_at {
                            "expired"
                        } else {
                            "valid"
                        };
                        let ro = if k.read_only { " (read-only)" } else { "" };
                        t.row(vec![
                            k.id,
                            format!("user {}{ro}", k.user),
                            fmt_time(k.expires_at),
                            k.created_by,
                            "-".into(),
                            st.into(),
                        ]);
                    }
                }
                print!("{}", t.render());
                Ok(())
            }
            other => Err(unexpected(other)),
        },
        TokenCommand::Revoke { id } => match call(ApiRequest::TokenRevoke { id }).await? {
            ApiResponse::TokenRevoked { id } => {
                println!("Revoked token {id}");
                Ok(())
            }
            other => Err(unexpected(other)),
        },
    }
}
