//! Digest mode's client of the central gate: the local instance asks it, sending only the
//! digest.
//!
//! Prompts and answers never leave the caller's building: `POST /gate` carries the digest
//! (counts and keyed hashes), `POST /record` carries the decision id, wire form, served model,
//! completeness and the four usage parts. Answers are kept in this instance's own store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;

use crate::gatekeeper::settlement::RecordBody;
use crate::gatekeeper::UsageReport;
use crate::http_client::{Bounds, ClientError, HttpClient, OriginError, Request};
use crate::receipt::{DecisionId, Envelope};
use tokensaver_core::gate::Decision;
use tokensaver_core::request::Digest;

/// A decision or record answer is a few hundred bytes; anything near this is not the gate.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// Longer than the longest the central gate holds a repeated step before it answers
/// (`[gate.steps] max_hold_secs`: 240 s by default, at most 280 s; SPEC §2.3).
const TIMEOUT: Duration = Duration::from_secs(300);

/// The central gate's client: on the one HTTP client (pingora's connector, async, pooled), so
/// digest mode adds no second HTTP stack beside the proxy's.
#[derive(Clone)]
pub struct RemoteGate {
    pub gate_url: String,
    /// The tokensaver key: authenticates with the gate and keys the fingerprints.
    pub key: String,
    /// Shared by every clone (one per forwarded request): the peer and its connection pool.
    client: Arc<HttpClient>,
    /// The hold TTL the central gate last stated with a CHALLENGE (0: not yet stated), for
    /// this instance's 409 message. One gate, one configuration: the last value is its value.
    hold_ttl_ms: Arc<AtomicU64>,
    /// The central gate's reservation TTL, as its latest forwarded decision stated it.
    reservation_ttl_ms: Arc<AtomicU64>,
}

impl std::fmt::Debug for RemoteGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteGate")
            .field("gate_url", &self.gate_url)
            .finish_non_exhaustive()
    }
}

/// What the central gate answered: its decision (as it serialised it: the terms this
/// instance enforces — verdict, rule, hold, served model, cache placements) and its signed
/// receipt.
#[derive(Debug, Clone, Deserialize)]
pub struct RemoteDecision {
    pub decision_id: DecisionId,
    pub decision: Decision,
    pub receipt: Envelope,
    /// With a CHALLENGE: how long the hold lives (absent from gates that do not state it).
    #[serde(default)]
    pub hold_ttl_ms: Option<u64>,
    /// With a forwarded verdict: how long its reservation lives unrenewed.
    #[serde(default)]
    pub reservation_ttl_ms: Option<u64>,
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

/// Every failure to get an answer is the gate being unreachable, except a request this
/// client could not write and an answer too long to be the gate's.
impl From<ClientError> for RemoteError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Connect(_) | ClientError::Exchange(_) | ClientError::TimedOut(_) => {
                RemoteError::Unreachable
            }
            ClientError::InvalidRequest(_) | ClientError::TooLarge(_) => RemoteError::Malformed,
        }
    }
}

impl RemoteGate {
    /// The gate's address is resolved here, once, like the providers' (`ProviderPeer`).
    pub fn new(gate_url: &str, key: String) -> anyhow::Result<Self> {
        let bounds = Bounds {
            connect: Duration::from_secs(10),
            silence: TIMEOUT,
            max_answer_bytes: MAX_ANSWER_BYTES,
        };
        let client = HttpClient::new(gate_url, bounds).map_err(|e| match e {
            OriginError::NotAnOrigin(why) => anyhow::anyhow!("the gate URL {why}"),
            OriginError::NoAddress => anyhow::anyhow!("the gate URL's host has no address"),
        })?;
        Ok(Self {
            gate_url: gate_url.trim_end_matches('/').to_string(),
            key,
            client: Arc::new(client),
            hold_ttl_ms: Arc::new(AtomicU64::new(0)),
            reservation_ttl_ms: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The central gate's hold TTL, once it has stated it.
    pub fn hold_ttl_ms(&self) -> Option<u64> {
        Some(self.hold_ttl_ms.load(Ordering::Relaxed)).filter(|&ms| ms > 0)
    }

    /// One POST of a JSON body with this instance's key; the answer's body, if the gate
    /// accepted the request.
    async fn post(&self, path: &'static str, body: Vec<u8>) -> Result<Bytes, RemoteError> {
        let request = Request::post(path, body)
            .header("authorization", format!("Bearer {}", self.key))
            .header("content-type", "application/json");
        let answer = self.client.send(&request).await?;
        if answer.is_error() {
            return Err(RemoteError::Refused(answer.status));
        }
        Ok(answer.body)
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
        if let Some(ms) = decision.reservation_ttl_ms.filter(|&ms| ms > 0) {
            self.reservation_ttl_ms.store(ms, Ordering::Relaxed);
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

    /// `POST /renew`: keep the central gate's reservation of a decision live while its
    /// answer is still being relayed here (SPEC §4).
    pub async fn renew(&self, decision_id: &DecisionId) -> Result<(), RemoteError> {
        let body = serde_json::to_vec(&serde_json::json!({"decision_id": decision_id}))
            .map_err(|_| RemoteError::Malformed)?;
        self.post("/renew", body).await.map(|_| ())
    }
}

impl RemoteGate {
    /// The central gate's reservation TTL, once a forwarded decision has stated it.
    pub fn reservation_ttl_ms(&self) -> Option<u64> {
        Some(self.reservation_ttl_ms.load(Ordering::Relaxed)).filter(|&ms| ms > 0)
    }
}
