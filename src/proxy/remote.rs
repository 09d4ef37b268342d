//! Digest mode: the local instance asks a central gate, sending only the digest.
//!
//! Prompts and answers never leave the caller's building: `POST /gate` carries the digest
//! (counts and keyed hashes), `POST /record` carries the decision id, wire form, served model,
//! completeness and the four usage parts. Answers are kept in this instance's own store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::gate::Verdict;
use crate::ledger::UsageReport;
use crate::receipt::Envelope;
use crate::request::Digest;

#[derive(Debug, Clone)]
pub struct RemoteGate {
    pub gate_url: String,
    /// The tokensaver key: authenticates with the gate and keys the fingerprints.
    pub key: String,
    agent: ureq::Agent,
    /// The hold TTL the central gate last stated with a CHALLENGE (0: not yet stated), for
    /// this instance's 409 message. One gate, one configuration: the last value is its value.
    hold_ttl_ms: Arc<AtomicU64>,
}

/// What the central gate answered.
#[derive(Debug, Clone, Deserialize)]
pub struct RemoteDecision {
    pub verdict: Verdict,
    pub decision_id: String,
    pub status: u16,
    pub reason: String,
    pub hold_id: Option<String>,
    pub model_served: Option<String>,
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

impl RemoteGate {
    pub fn new(gate_url: &str, key: String) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(30))
            .build();
        Self {
            gate_url: gate_url.trim_end_matches('/').to_string(),
            key,
            agent,
            hold_ttl_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The central gate's hold TTL, once it has stated it.
    pub fn hold_ttl_ms(&self) -> Option<u64> {
        Some(self.hold_ttl_ms.load(Ordering::Relaxed)).filter(|&ms| ms > 0)
    }

    fn post(&self, path: &str, body: String) -> Result<String, RemoteError> {
        let resp = self
            .agent
            .post(&format!("{}{path}", self.gate_url))
            .set("authorization", &format!("Bearer {}", self.key))
            .set("content-type", "application/json")
            .send_string(&body);
        match resp {
            Ok(r) => r.into_string().map_err(|_| RemoteError::Malformed),
            Err(ureq::Error::Status(code, _)) => Err(RemoteError::Refused(code)),
            Err(_) => Err(RemoteError::Unreachable),
        }
    }

    /// `POST /gate` with the digest (blocking: call from `spawn_blocking`).
    pub fn gate(&self, digest: &Digest) -> Result<RemoteDecision, RemoteError> {
        let body = serde_json::to_string(digest).map_err(|_| RemoteError::Malformed)?;
        let text = self.post("/gate", body)?;
        let decision: RemoteDecision =
            serde_json::from_str(&text).map_err(|_| RemoteError::Malformed)?;
        if let Some(ms) = decision.hold_ttl_ms.filter(|&ms| ms > 0) {
            self.hold_ttl_ms.store(ms, Ordering::Relaxed);
        }
        Ok(decision)
    }

    /// `POST /record`: what the provider reported for a forwarded decision and how its answer
    /// ended (the gate settles an incomplete answer at its worst case).
    pub fn record(&self, report: &UsageReport) -> Result<(), RemoteError> {
        let body = json!({
            "decision_id": report.decision_id,
            "wire": report.wire,
            "served_model": report.served_model,
            "complete": report.ending == crate::store::Ending::Complete,
            "ending": report.ending,
            "usage": report.usage.map(|b| b.usage),
            "cache_write_1h": report.usage.map(|b| b.cache_write_1h).unwrap_or(0),
            "web_search_requests": report.usage.map(|b| b.web_search_requests).unwrap_or(0),
        });
        self.post("/record", body.to_string()).map(|_| ())
    }
}
