//! Join tokens as the API hands them out: created (capped at the servers'
//! `max_token_ttl_secs`, optionally for N uses), listed without their secret,
//! and a limited token's use taken through the log on the leader before a
//! join is admitted, so racing joins cannot take more uses than it allows.

use crate::clock::now_ms;
use crate::model::{Role, TokenRecord};
use crate::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind, TokenInfo};
use crate::net::token::JoinToken;
use crate::state::{Command, CommandResult};

use super::Api;

impl Api {
    /// Every token, without its secret (admins only; the caller checked).
    pub(super) fn token_list(&self) -> ApiResponse {
        let tokens = self.state().tokens.values().map(token_info).collect();
        ApiResponse::Tokens { tokens }
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
        if ttl_secs == 0 {
            return ApiResponse::error(ErrorKind::BadInput, "--ttl must be positive, e.g. 24h");
        }
        let max = self.cfg.max_token_ttl_secs;
        if ttl_secs > max {
            return ApiResponse::error(
                ErrorKind::BadInput,
                format!(
                    "--ttl {ttl_secs}s is longer than this cluster allows ({max}s, the \
                     servers' max_token_ttl_secs): give a shorter --ttl"
                ),
            );
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
