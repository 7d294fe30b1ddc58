//! Tokens as the API hands them out. Join tokens: created by admins (capped
//! at the servers' `max_token_ttl_secs`, optionally for N uses), listed
//! without their secret, and a limited token's use taken through the log on
//! the leader before a join is admitted, so racing joins cannot take more
//! uses than it allows. API tokens (bearer tokens of the HTTP port): made
//! by a user for themself or by an admin for anyone, listed to their user
//! and admins, revoked by either; [`Api::authenticate`] checks one.

use crate::clock::now_ms;
use crate::model::{ApiTokenRecord, Role, TokenRecord};
use crate::net::proto::{ApiRequest, ApiResponse, ApiTokenInfo, Caller, ErrorKind, TokenInfo};
use crate::net::token::JoinToken;
use crate::state::{Command, CommandResult};

use super::Api;

impl Api {
    /// Tokens without their secret: every one for an admin, a user's own
    /// API tokens for anyone else.
    pub(super) fn token_list(&self, caller: &Caller) -> ApiResponse {
        let s = self.state();
        let tokens = if caller.admin {
            s.tokens.values().map(token_info).collect()
        } else {
            Vec::new()
        };
        let api_tokens = s
            .api_tokens
            .values()
            .filter(|t| caller.admin || t.user == caller.user)
            .map(ApiTokenInfo::from)
            .collect();
        ApiResponse::Tokens { tokens, api_tokens }
    }

    /// Revokes a token: any for an admin, a user's own API token for them.
    pub(super) async fn revoke_token(&self, caller: &Caller, id: String) -> ApiResponse {
        let own = self
            .state()
            .api_tokens
            .get(&id)
            .is_some_and(|t| t.user == caller.user);
        if !caller.admin && !own {
            return ApiResponse::error(
                ErrorKind::Forbidden,
                format!("token {id} is not yours: revoking others' tokens needs an admin"),
            );
        }
        let cmd = Command::RevokeToken {
            id: id.clone(),
            now: now_ms(),
        };
        match self.write(cmd).await {
            Ok(CommandResult::TokenRevoked) => ApiResponse::TokenRevoked { id },
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }

    /// Makes an API token for `user` (the caller by default).
    pub(super) async fn create_api_token(
        &self,
        caller: &Caller,
        user: Option<String>,
        ttl_secs: u64,
        read_only: bool,
    ) -> ApiResponse {
        let user = user.unwrap_or_else(|| caller.user.clone());
        if user != caller.user && !caller.admin {
            return ApiResponse::error(
                ErrorKind::Forbidden,
                format!(
                    "a token for {user} needs an admin: leave out --user to make one for \
                     yourself ({})",
                    caller.user
                ),
            );
        }
        if user.trim().is_empty() || user.contains(char::is_whitespace) {
            return ApiResponse::error(ErrorKind::BadInput, format!("{user:?} is not a user name"));
        }
        if let Some(resp) = self.check_ttl(ttl_secs) {
            return resp;
        }
        let token = crate::net::token::ApiToken::generate();
        let now = now_ms();
        let record = ApiTokenRecord {
            id: token.id.clone(),
            secret_sha256: token.secret_sha256(),
            user,
            read_only,
            created_at: now,
            expires_at: now.saturating_add(ttl_secs.saturating_mul(1000)),
            created_by: caller.user.clone(),
            revoked: false,
        };
        let info = ApiTokenInfo::from(&record);
        match self.write(Command::CreateApiToken { record }).await {
            Ok(CommandResult::ApiTokenCreated) => ApiResponse::ApiToken {
                token: token.to_string(),
                info,
            },
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }

    /// Who an API token speaks for, from this server's applied state.
    pub fn authenticate(&self, text: &str) -> Result<crate::http::Grant, crate::http::AuthError> {
        use crate::http::AuthError;
        let token = crate::net::token::ApiToken::parse(text).ok_or(AuthError::Malformed)?;
        let s = self.state();
        let record = s.api_tokens.get(&token.id).ok_or(AuthError::Unknown)?;
        if !crate::net::token::hashes_equal(&record.secret_sha256, &token.secret_sha256()) {
            return Err(AuthError::Forged);
        }
        if record.revoked {
            return Err(AuthError::Revoked);
        }
        if now_ms() >= record.expires_at {
            return Err(AuthError::Expired);
        }
        Ok(crate::http::Grant {
            user: record.user.clone(),
            read_only: record.read_only,
        })
    }

    fn check_ttl(&self, ttl_secs: u64) -> Option<ApiResponse> {
        if ttl_secs == 0 {
            return Some(ApiResponse::error(
                ErrorKind::BadInput,
                "--ttl must be positive, e.g. 24h",
            ));
        }
        let max = self.cfg.max_token_ttl_secs;
        (ttl_secs > max).then(|| {
            ApiResponse::error(
                ErrorKind::BadInput,
                format!(
                    "--ttl {ttl_secs}s is longer than this cluster allows ({max}s, the \
                     servers' max_token_ttl_secs): give a shorter --ttl"
                ),
            )
        })
    }

    /// Takes one use of a limited token for a join being admitted (on the
    /// leader; a follower forwards).
    pub(super) async fn use_token(&self, caller: &Caller, id: String) -> ApiResponse {
        let req = ApiRequest::UseToken { id: id.clone() };
        if let Some(resp) = self.forward_if_follower(caller, &req).await {
            return resp;
        }
        if let Some(resp) = self.refuse_without_lease() {
            return resp;
        }
        match self.write(Command::TokenUsed { id, now: now_ms() }).await {
            Ok(CommandResult::TokenUsed) => ApiResponse::Ok,
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }

    /// For a join: takes one use of a token that allows only so many,
    /// committed before the certificate is handed out, so that racing joins
    /// cannot take more uses than it allows. `Err` says why not.
    pub(in crate::server) async fn take_token_use(&self, id: &str) -> Result<(), String> {
        let server = Caller {
            user: "gpuq-join".into(),
            uid: 0,
            admin: false,
        };
        match self.use_token(&server, id.to_string()).await {
            ApiResponse::Ok => Ok(()),
            ApiResponse::Error { message, .. } => Err(message),
            other => Err(format!("unexpected answer: {other:?}")),
        }
    }

    pub(super) async fn create_token(
        &self,
        caller: &Caller,
        role: Role,
        ttl_secs: u64,
        uses: Option<u64>,
    ) -> ApiResponse {
        if role == Role::Login {
            return ApiResponse::error(
                ErrorKind::BadInput,
                "role login: create an agent token; it admits login agents too",
            );
        }
        if let Some(resp) = self.check_ttl(ttl_secs) {
            return resp;
        }
        if uses == Some(0) {
            return ApiResponse::error(
                ErrorKind::BadInput,
                "--uses must be at least 1, e.g. --uses 1 for one machine",
            );
        }
        let ca_fp = match self.identity.ca_fingerprint() {
            Ok(fp) => fp,
            Err(e) => return ApiResponse::error(ErrorKind::Internal, e.to_string()),
        };
        let token = match JoinToken::generate(&ca_fp) {
            Ok(t) => t,
            Err(e) => return ApiResponse::error(ErrorKind::Internal, e.to_string()),
        };
        let now = now_ms();
        let record = TokenRecord {
            id: token.id.clone(),
            secret_sha256: token.secret_sha256(),
            role,
            created_at: now,
            expires_at: now.saturating_add(ttl_secs.saturating_mul(1000)),
            created_by: caller.user.clone(),
            revoked: false,
            uses: 0,
            max_uses: uses,
        };
        let info = token_info(&record);
        match self.write(Command::CreateToken { record }).await {
            Ok(CommandResult::TokenCreated) => ApiResponse::Token {
                token: token.to_string(),
                info,
            },
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }
}

fn token_info(t: &TokenRecord) -> TokenInfo {
    TokenInfo {
        id: t.id.clone(),
        role: t.role,
        created_at: t.created_at,
        expires_at: t.expires_at,
        created_by: t.created_by.clone(),
        revoked: t.revoked,
        uses: t.uses,
        max_uses: t.max_uses,
    }
}
