//! The proxy listener: provider-shaped traffic in, every verdict enforced. The folders follow
//! a request: [`hooks`] (pingora's entry points) → [`gated`] (`read` → `decide` → `enforce`,
//! then [`forward`] upstream) or [`passthrough`].
//!
//! Gated routes (`POST /v1/chat/completions`, `POST /v1/messages`) are answered entirely in
//! `request_filter`: the whole body is read (bounded), the gate decides, and the verdict is
//! enforced there — SERVE, CHALLENGE and BLOCK answer at once and never reach upstream; ALLOW
//! and DOWNGRADE are forwarded by [`forward`] through pingora's pooled upstream connector. The
//! body is buffered before the decision, and pingora 0.9 only replays 64 KiB of a body read in
//! `request_filter`, so the gate writes the upstream request itself rather than hand the body
//! back to the proxy pipeline. `GET /v1/models` passes through pingora's normal proxy path.

mod access;
mod forward;
mod gated;
mod hooks;
mod models;
mod passthrough;
pub mod responses;
pub use forward::usage;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;

use crate::config::Config;
use crate::error::GateError;
use crate::gatekeeper::Gatekeeper;
use tokensaver_core::request::Route;

pub use crate::upstreams::ProviderPeer;
use crate::upstreams::Upstreams;
use passthrough::StoredRead;

pub struct GateProxy {
    pub gatekeeper: Arc<Gatekeeper>,
    connector: Connector,
    upstreams: Arc<Upstreams>,
    /// Which key created each stored Responses object (`responses.rs`).
    registry: responses::Registry,
}

impl GateProxy {
    pub fn new(gatekeeper: Arc<Gatekeeper>) -> std::io::Result<Self> {
        let config = gatekeeper.core.config.clone();
        let timeout = Duration::from_secs(config.upstream_timeout_secs);
        let upstreams = Arc::new(Upstreams::start(&config.upstreams, &config.keys, timeout)?);
        Ok(Self {
            gatekeeper,
            connector: Connector::new(None),
            upstreams,
            registry: responses::Registry::default(),
        })
    }

    fn config(&self) -> &Config {
        &self.gatekeeper.core.config
    }

    /// The key a pass-through request comes with: one of this gate's keys, or in digest mode
    /// the key this instance was given (the one its bindings are made for).
    fn passthrough_key(&self, presented: Option<&str>) -> Option<Arc<str>> {
        self.gatekeeper
            .authenticate(presented)
            .ok()
            .map(|(_, caller)| caller.key_id)
    }

    /// The configured upstreams, as they resolve now (`/readyz`); an upstream that does not
    /// resolve at start stops `serve` before it listens.
    pub fn upstreams(&self) -> Arc<Upstreams> {
        self.upstreams.clone()
    }
}

/// Per-request state: which provider a pass-through request goes to. It lives from the
/// request's header to the end of `logging`, and counts the request in flight for the drain.
pub struct Ctx {
    passthrough: Option<ProviderPeer>,
    /// Which of the pass-through's addresses is tried now (the next after a failed connect).
    attempt: usize,
    /// The facts of its access-log line.
    access: access::Access,
    /// A pass-through read of a stored Responses object (`GET /v1/responses/{id}`, `POST
    /// …/cancel`): its answer is read for the context figure the registry lacks.
    stored_read: Option<StoredRead>,
    _in_flight: crate::lifecycle::InFlight,
}

/// Write a complete response the gate produced itself.
pub(crate) async fn respond(
    session: &mut Session,
    status: u16,
    content_type: &str,
    body: Bytes,
    headers: &[(&'static str, String)],
) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(4 + headers.len()))?;
    resp.insert_header("content-type", content_type)?;
    resp.insert_header("content-length", body.len().to_string())?;
    for (name, value) in headers {
        resp.insert_header(*name, value.as_str())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

pub(crate) async fn respond_error(
    session: &mut Session,
    route: Option<Route>,
    err: &GateError,
    extra: &[(&'static str, String)],
) -> Result<()> {
    err.log();
    let mut headers: Vec<(&'static str, String)> = extra.to_vec();
    if err.no_retry() {
        headers.push(("x-should-retry", "false".into()));
    }
    if let Some(id) = err.hold_id() {
        headers.push(("x-tokensaver-hold", id.to_string()));
    }
    if let Some(secs) = err.retry_after_secs() {
        headers.push(("retry-after", secs.to_string()));
    }
    respond(
        session,
        err.status(),
        "application/json",
        err.body(route),
        &headers,
    )
    .await
}
