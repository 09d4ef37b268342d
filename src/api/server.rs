//! The pingora shell around [`Api`]: read the request (bounded), route it, write the answer.
//! The admin listener answers `/healthz` and `/readyz` here ([`Ops`]), before the route table:
//! they report on the process, not on the gate.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use super::http::{ApiRequest, ApiResponse};
use super::ops::Ops;
use super::routes::{Api, Listener};

pub struct ApiApp {
    pub api: Arc<Api>,
    pub listener: Listener,
    /// Health and readiness (admin listener only).
    pub ops: Option<Arc<Ops>>,
}

#[async_trait]
impl ServeHttp for ApiApp {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        // A drain waits for this answer (and for its commit, if it makes one).
        let _in_flight = crate::lifecycle::enter();
        let cap = self.api.body_cap(self.listener);
        let resp = match read_body(session, cap).await {
            Ok(body) => {
                let header = session.req_header();
                let req = ApiRequest {
                    method: header.method.clone(),
                    path: header.uri.path().to_string(),
                    query: header.uri.query().map(str::to_string),
                    headers: header.headers.clone(),
                    body,
                    peer: session
                        .client_addr()
                        .and_then(|a| a.as_inet())
                        .map(|a| a.ip()),
                };
                let ops = match &self.ops {
                    Some(ops) => ops.route(&req).await,
                    None => None,
                };
                match ops {
                    Some(resp) => resp,
                    None => self.api.handle(self.listener, &req).await,
                }
            }
            Err(resp) => resp,
        };
        let mut builder = http::Response::builder()
            .status(resp.status)
            .header("content-type", resp.content_type)
            .header("content-length", resp.body.len());
        for (name, value) in &resp.headers {
            builder = builder.header(*name, value.as_str());
        }
        builder.body(resp.body).unwrap_or_else(|_| {
            let mut fallback = http::Response::new(Vec::new());
            *fallback.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            fallback
        })
    }
}

async fn read_body(session: &mut ServerSession, cap: usize) -> Result<Bytes, ApiResponse> {
    // Requests pipelined behind this one are answered in order (RFC 9112 §9.3.2), as on the
    // proxy listener; pingora's default drops them and closes.
    session.set_pipelining_enabled(true);
    if crate::body::expects_continue(session) {
        // One `100 Continue`, unless the declared body is over the cap: then the 413 at once.
        if crate::body::declared_length(session).is_some_and(|len| len > cap) {
            return Err(ApiResponse::error(
                413,
                "body_too_large",
                "request body exceeds the size cap",
            ));
        }
        if crate::body::write_continue(session).await.is_err() {
            return Err(ApiResponse::error(
                400,
                "body_unreadable",
                "request body could not be read",
            ));
        }
    }
    crate::body::read_capped(session, cap)
        .await
        .map_err(|e| match e {
            crate::body::BodyError::TooLarge => {
                ApiResponse::error(413, "body_too_large", "request body exceeds the size cap")
            }
            crate::body::BodyError::Unreadable => {
                ApiResponse::error(400, "body_unreadable", "request body could not be read")
            }
        })
}
