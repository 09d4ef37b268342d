//! The pingora shell around [`Api`]: read the request, admit it (a route that needs a key
//! refuses one without it before any of its body is read), read the body (bounded in size and
//! time), route it, write the answer. The admin listener answers `/healthz` and `/readyz` here
//! ([`Ops`]), before the route table: they report on the process, not on the gate.
//!
//! This is pingora's HTTP server loop written out, not its `ServeHttp` helper, for three
//! reasons: a route is admitted from its headers before its body is read; `POST /gate` watches
//! its caller's connection while the gate holds the digest; and nothing of a request — its
//! target, its headers — is ever written to the log (pingora's helper logs a request summary
//! with the whole request-target when an answer cannot be written).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use tokio::sync::Semaphore;

use super::http::{ApiRequest, ApiResponse};
use super::ops::Ops;
use super::routes::{Admission, Api, Listener};
use crate::error::{ApiError, GateError};

/// The longest a request's body may take to arrive: a client that trickles it is cut off.
const BODY_DEADLINE: Duration = Duration::from_secs(30);
/// Bodies of routes that check no credential, read at once per listener: what keyless callers
/// can make the listener hold is this many small bodies.
const PUBLIC_READS: usize = 32;
/// `/healthz` and `/readyz` take no body; a small one is read past for their 405.
const OPS_BODY_CAP: usize = 64 * 1024;

pub struct ApiApp {
    pub api: Arc<Api>,
    pub listener: Listener,
    /// Health and readiness (admin listener only).
    pub ops: Option<Arc<Ops>>,
    public_reads: Semaphore,
}

impl ApiApp {
    pub fn new(api: Arc<Api>, listener: Listener, ops: Option<Arc<Ops>>) -> Self {
        Self {
            api,
            listener,
            ops,
            public_reads: Semaphore::new(PUBLIC_READS),
        }
    }

    /// The answer to one request whose header has been read.
    async fn answer(&self, session: &mut ServerSession) -> ApiResponse {
        // A drain waits for this answer (and for its commit, if it makes one).
        let _in_flight = crate::lifecycle::enter();
        // Requests pipelined behind this one are answered in order (RFC 9112 §9.3.2), as on
        // the proxy listener; pingora's default drops them and closes.
        session.set_pipelining_enabled(true);
        let header = session.req_header();
        let (method, path) = (header.method.clone(), header.uri.path().to_string());
        let admission = match self.ops.is_some() && Ops::serves(&path) {
            true => Admission::Read {
                cap: OPS_BODY_CAP,
                public: true,
            },
            false => self
                .api
                .admission(self.listener, &method, &path, &header.headers),
        };
        let (cap, public) = match admission {
            Admission::Read { cap, public } => (cap, public),
            Admission::Answer(resp) => {
                // The body is never read: the connection cannot be reused.
                session.set_keepalive(None);
                return resp;
            }
        };
        let _permit = match public {
            true => match self.public_reads.try_acquire() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    session.set_keepalive(None);
                    return ApiError::Busy.into();
                }
            },
            false => None,
        };
        let body = match tokio::time::timeout(BODY_DEADLINE, read_body(session, cap)).await {
            Ok(Ok(body)) => body,
            Ok(Err(resp)) => return resp,
            Err(_) => {
                session.set_keepalive(None);
                return ApiError::BodyTimeout.into();
            }
        };
        drop(_permit);
        let header = session.req_header();
        let req = ApiRequest {
            method,
            path,
            query: header.uri.query().map(str::to_string),
            headers: header.headers.clone(),
            body,
            peer: session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip()),
        };
        if let Some(ops) = &self.ops {
            if let Some(resp) = ops.route(&req).await {
                return resp;
            }
        }
        self.api
            .handle(self.listener, &req, caller_gone(session))
            .await
    }
}

/// Ends when the client closes its connection (the body was read whole).
fn caller_gone(session: &mut ServerSession) -> crate::gatekeeper::CallerGone<'_> {
    Box::pin(async move { while let Ok(Some(_)) = session.read_body_or_idle(true).await {} })
}

#[async_trait]
impl HttpServerApp for ApiApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        match session.read_request().await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                // The error's type only: its context may quote the request.
                tracing::debug!(
                    error = e.etype().as_str(),
                    "an API request could not be read"
                );
                return None;
            }
        }
        session.set_keepalive(if *shutdown.borrow() { None } else { Some(60) });
        let resp = self.answer(&mut session).await;
        let mut header = match ResponseHeader::build(resp.status, Some(3 + resp.headers.len())) {
            Ok(header) => header,
            Err(_) => return None,
        };
        let _ = header.insert_header("content-type", resp.content_type);
        let _ = header.insert_header("content-length", resp.body.len().to_string());
        for (name, value) in &resp.headers {
            let _ = header.append_header(*name, value.as_str());
        }
        if session
            .write_response_header(Box::new(header))
            .await
            .is_err()
        {
            // The caller went away: nothing of its request is logged.
            return None;
        }
        if !resp.body.is_empty()
            && session
                .write_response_body(Bytes::from(resp.body), true)
                .await
                .is_err()
        {
            return None;
        }
        let settings = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
            Ok(reusable) => reusable.map(|s| ReusedHttpStream::from_reusable_stream(s, settings)),
            Err(_) => None,
        }
    }
}

async fn read_body(session: &mut ServerSession, cap: usize) -> Result<Bytes, ApiResponse> {
    // A body declared over the cap is refused unread (the connection then closes): the
    // listener holds nothing for a caller that announces more than it may send.
    if crate::body::declared_length(session).is_some_and(|len| len > cap) {
        session.set_keepalive(None);
        return Err(GateError::BodyTooLarge.into());
    }
    // One `100 Continue` before the body (the declared length is within the cap).
    if crate::body::expects_continue(session) && crate::body::write_continue(session).await.is_err()
    {
        return Err(GateError::BodyUnreadable.into());
    }
    crate::body::read_capped(session, cap)
        .await
        .map_err(|e| GateError::from(e).into())
}
