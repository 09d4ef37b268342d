//! Digest mode: the local instance asks a central gate, sending only the digest.
//!
//! Prompts and answers never leave the caller's building: `POST /gate` carries the digest
//! (counts and keyed hashes), `POST /record` carries the decision id, wire form, served model,
//! completeness and the four usage parts. Answers are kept in this instance's own store.

use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;
use serde::Deserialize;

use crate::config::parse_origin;
use crate::gatekeeper::settlement::RecordBody;
use crate::gatekeeper::UsageReport;
use crate::receipt::{DecisionId, Envelope};
use tokensaver_core::gate::Verdict;
use tokensaver_core::request::Digest;

/// A decision or record answer is a few hundred bytes; anything near this is not the gate.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// Longer than the longest the central gate holds a repeated step before it answers
/// (`[gate.steps]`: the pace window plus its slack, 150 s by default, at most 240 s; SPEC
/// §2.3).
const TIMEOUT: Duration = Duration::from_secs(270);
/// Pooled connections to the gate are dropped after this long idle.
const IDLE: Duration = Duration::from_secs(60);

/// The central gate's client: pingora's own connector (async, pooled), so digest mode adds
/// no second HTTP stack beside the proxy's.
#[derive(Clone)]
pub struct RemoteGate {
    pub gate_url: String,
    /// The tokensaver key: authenticates with the gate and keys the fingerprints.
    pub key: String,
    /// Shared by every clone (one per forwarded request): the peer and its connection pool.
    link: Arc<Link>,
    /// The hold TTL the central gate last stated with a CHALLENGE (0: not yet stated), for
    /// this instance's 409 message. One gate, one configuration: the last value is its value.
    hold_ttl_ms: Arc<AtomicU64>,
}

impl std::fmt::Debug for RemoteGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteGate")
            .field("gate_url", &self.gate_url)
            .finish_non_exhaustive()
    }
}

struct Link {
    peer: HttpPeer,
    /// The `Host` header.
    authority: String,
    connector: Connector,
}

/// What the central gate answered.
#[derive(Debug, Clone, Deserialize)]
pub struct RemoteDecision {
    pub verdict: Verdict,
    pub decision_id: DecisionId,
    pub status: u16,
    pub reason: String,
    pub hold_id: Option<String>,
    pub model_served: Option<String>,
    /// Where to place prompt-cache breakpoints (indices into the digest's `cache_points`,
    /// SPEC §2.11b); absent from gates that place none.
    #[serde(default)]
    pub cache_breakpoints: Vec<u16>,
    pub receipt: Envelope,
    /// With a CHALLENGE: how long the hold lives (absent from gates that do not state it).
    #[serde(default)]
    pub hold_ttl_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    #[error("the central gate could not be reached")]
    Unreachable,
    #[error("the central gate refused the request")]
    Refused(u16),
    #[error("the central gate's answer was malformed")]
    Malformed,
}

/// One exchange's failure: retry it on a new connection, or give up.
enum Attempt {
    Retry,
    Failed(RemoteError),
}

impl Attempt {
    fn error(self) -> RemoteError {
        match self {
            Attempt::Retry => RemoteError::Unreachable,
            Attempt::Failed(e) => e,
        }
    }
}

impl RemoteGate {
    /// The gate's address is resolved here, once, like the providers' (`ProviderPeer`).
    pub fn new(gate_url: &str, key: String) -> anyhow::Result<Self> {
        let origin = parse_origin(gate_url).map_err(|why| anyhow::anyhow!("the gate URL {why}"))?;
        let addr = (origin.host.as_str(), origin.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| anyhow::anyhow!("the gate URL's host has no address"))?;
        let mut peer = HttpPeer::new(addr, origin.tls, origin.host.clone());
        peer.options.connection_timeout = Some(Duration::from_secs(10));
        peer.options.read_timeout = Some(TIMEOUT);
        peer.options.write_timeout = Some(TIMEOUT);
        peer.options.idle_timeout = Some(IDLE);
        Ok(Self {
            gate_url: gate_url.trim_end_matches('/').to_string(),
            key,
            link: Arc::new(Link {
                peer,
                authority: origin.authority,
                connector: Connector::new(None),
            }),
            hold_ttl_ms: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The central gate's hold TTL, once it has stated it.
    pub fn hold_ttl_ms(&self) -> Option<u64> {
        Some(self.hold_ttl_ms.load(Ordering::Relaxed)).filter(|&ms| ms > 0)
    }

    /// One POST. A pooled connection the gate had already closed is retried once on a new
    /// one, by pingora's own rule (`RetryType::ReusedOnly`: the request cannot have reached
    /// the gate); nothing else is retried.
    async fn post(&self, path: &'static str, body: Vec<u8>) -> Result<Bytes, RemoteError> {
        let body = Bytes::from(body);
        match self.exchange(path, body.clone()).await {
            Err(Attempt::Retry) => self.exchange(path, body).await.map_err(Attempt::error),
            other => other.map_err(Attempt::error),
        }
    }

    async fn exchange(&self, path: &'static str, body: Bytes) -> Result<Bytes, Attempt> {
        let link = &*self.link;
        let (mut session, reused) = link
            .connector
            .get_http_session(&link.peer)
            .await
            .map_err(|_| Attempt::Failed(RemoteError::Unreachable))?;
        let failed = |mut e: Box<pingora::Error>| {
            e.retry.decide_reuse(reused);
            if e.retry() {
                Attempt::Retry
            } else {
                Attempt::Failed(RemoteError::Unreachable)
            }
        };
        let mut req = RequestHeader::build("POST", path.as_bytes(), None)
            .map_err(|_| Attempt::Failed(RemoteError::Malformed))?;
        let headers = [
            ("host", link.authority.clone()),
            ("authorization", format!("Bearer {}", self.key)),
            ("content-type", "application/json".to_string()),
            ("content-length", body.len().to_string()),
        ];
        for (name, value) in headers {
            req.insert_header(name, value)
                .map_err(|_| Attempt::Failed(RemoteError::Malformed))?;
        }
        session
            .write_request_header(Box::new(req))
            .await
            .map_err(failed)?;
        session
            .write_request_body(body, true)
            .await
            .map_err(failed)?;
        session.finish_request_body().await.map_err(failed)?;
        session.read_response_header().await.map_err(failed)?;
        let status = session
            .response_header()
            .map(|h| h.status.as_u16())
            .ok_or(Attempt::Failed(RemoteError::Malformed))?;
        let mut answer = BytesMut::new();
        while let Some(chunk) = session
            .read_response_body()
            .await
            .map_err(|_| Attempt::Failed(RemoteError::Unreachable))?
        {
            if answer.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(Attempt::Failed(RemoteError::Malformed));
            }
            answer.extend_from_slice(&chunk);
        }
        link.connector
            .release_http_session(session, &link.peer, Some(IDLE))
            .await;
        if status >= 400 {
            return Err(Attempt::Failed(RemoteError::Refused(status)));
        }
        Ok(answer.freeze())
    }

    /// `POST /gate` with the digest.
    pub async fn gate(&self, digest: &Digest) -> Result<RemoteDecision, RemoteError> {
        let body = serde_json::to_vec(digest).map_err(|_| RemoteError::Malformed)?;
        let answer = self.post("/gate", body).await?;
        let decision: RemoteDecision =
            serde_json::from_slice(&answer).map_err(|_| RemoteError::Malformed)?;
        if let Some(ms) = decision.hold_ttl_ms.filter(|&ms| ms > 0) {
            self.hold_ttl_ms.store(ms, Ordering::Relaxed);
        }
        Ok(decision)
    }

    /// `POST /record`: what the provider reported for a forwarded decision and how its answer
    /// ended (the gate settles an incomplete answer at its worst case).
    pub async fn record(&self, report: &UsageReport) -> Result<(), RemoteError> {
        let body =
            serde_json::to_vec(&RecordBody::of(report)).map_err(|_| RemoteError::Malformed)?;
        self.post("/record", body).await.map(|_| ())
    }
}

/// Digest mode's central gate did not decide: the request fails closed (spend never bypasses
/// the gate), whatever went wrong.
impl From<RemoteError> for crate::error::GateError {
    fn from(_: RemoteError) -> Self {
        crate::error::GateError::GateUnreachable
    }
}
