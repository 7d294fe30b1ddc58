//! What a server serves on its HTTP port (`http::Site`): its metrics page,
//! its health, and (see `http::api`) the API through `Api::handle`.

use std::sync::Arc;

use super::Api;

/// The server's HTTP site.
pub struct ServerSite {
    pub api: Arc<Api>,
}

#[async_trait::async_trait]
impl crate::http::Site for ServerSite {
    fn metrics(&self) -> String {
        super::metrics::render(&self.api)
    }

    fn authenticate(
        &self,
        token: &str,
    ) -> Option<Result<crate::http::Grant, crate::http::AuthError>> {
        Some(self.api.authenticate(token))
    }

    async fn call(
        &self,
        caller: crate::net::proto::Caller,
        req: crate::net::proto::ApiRequest,
    ) -> crate::net::proto::ApiResponse {
        self.api.handle(caller, req).await
    }

    fn health(&self) -> Result<String, String> {
        let m = self.api.metrics().borrow().clone();
        if let Err(fatal) = &m.running_state {
            return Err(format!("the Raft core stopped: {fatal}"));
        }
        match self.api.leader_elsewhere() {
            None => Ok("ok: leader".into()),
            Some(Some(addr)) => Ok(format!("ok: follower of {addr}")),
            Some(None) => Err("no leader known".into()),
        }
    }
}
