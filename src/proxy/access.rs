//! The access log: one line per request on the proxy listener, written from pingora's
//! `logging()` hook, so early answers (400, 401, 404, 413) are there too. No content: the
//! route, the key's id, the models (when they read as model ids), the upstream's name, the
//! verdict and its rule, the statuses, byte counts, latencies and the decision id.
//!
//! Emitted as a `tracing` event with target `tokensaver::access` at INFO, so it takes the
//! server's log format (`--log-format text|json`: key=value, or one JSON object a line) and
//! its filter (`RUST_LOG=tokensaver::access=off` silences it; `[log] access = false` too).

use std::sync::Arc;
use std::time::Instant;

use crate::receipt::DecisionId;
use tokensaver_core::gate::Verdict;

/// What a request's line says, filled in as the facts become known.
pub struct Access {
    pub started: Instant,
    /// The gated route or pass-through it took (a closed vocabulary).
    pub route: &'static str,
    pub key_id: Option<Arc<str>>,
    pub model_requested: Option<String>,
    pub model_served: Option<String>,
    pub upstream: Option<String>,
    pub verdict: Option<Verdict>,
    pub rule: Option<&'static str>,
    pub decision_id: Option<DecisionId>,
    pub upstream_status: Option<u16>,
    /// From the first byte written upstream to the answer's end.
    pub upstream_ms: Option<f64>,
    /// From the request's start to the provider's response header.
    pub ttfb_ms: Option<f64>,
}

impl Access {
    pub fn new() -> Self {
        Access {
            started: Instant::now(),
            route: "unknown",
            key_id: None,
            model_requested: None,
            model_served: None,
            upstream: None,
            verdict: None,
            rule: None,
            decision_id: None,
            upstream_status: None,
            upstream_ms: None,
            ttfb_ms: None,
        }
    }

    /// What the decision said.
    pub fn decided(
        &mut self,
        verdict: &Verdict,
        rule: &'static str,
        decision_id: DecisionId,
        model_served: &Option<String>,
    ) {
        self.verdict = Some(*verdict);
        self.rule = Some(rule);
        self.decision_id = Some(decision_id);
        if let Some(m) = model_served {
            self.model_served = Self::model(m);
        }
    }

    /// A caller's model string, kept only when it reads as a model id.
    pub fn model(model: &str) -> Option<String> {
        crate::error::looks_like_model_id(model).then(|| model.to_string())
    }

    /// Count the request in the metrics and, when `write` holds, log its line.
    pub fn finish(
        &self,
        metrics: &crate::metrics::Metrics,
        status: Option<u16>,
        bytes_in: usize,
        bytes_out: usize,
        write: bool,
    ) {
        let total = self.started.elapsed().as_secs_f64();
        let verdict = self.verdict.map_or("none", |v| v.as_str());
        metrics
            .request_seconds
            .with_label_values(&[verdict])
            .observe(total);
        if self.verdict.is_none() && self.upstream.is_none() {
            let status = status.map_or_else(|| "none".to_string(), |s| s.to_string());
            metrics.early_answers.with_label_values(&[&status]).inc();
        }
        if !write {
            return;
        }
        let ms = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.3}"));
        tracing::info!(
            target: "tokensaver::access",
            route = self.route,
            key = %or_dash(self.key_id.as_deref()),
            model_requested = %or_dash(self.model_requested.as_deref()),
            model_served = %or_dash(self.model_served.as_deref()),
            upstream = %or_dash(self.upstream.as_deref()),
            verdict,
            rule = self.rule.unwrap_or("-"),
            status = status.unwrap_or(0),
            upstream_status = self.upstream_status.unwrap_or(0),
            bytes_in,
            bytes_out,
            total_ms = format!("{:.3}", total * 1000.0),
            upstream_ms = %ms(self.upstream_ms),
            ttfb_ms = %ms(self.ttfb_ms),
            decision = %self.decision_id.map_or_else(|| "-".into(), |d| d.to_string()),
            "access"
        );
    }
}

impl Default for Access {
    fn default() -> Self {
        Self::new()
    }
}

/// A value of the access line, or `-` where there is none.
fn or_dash(v: Option<&str>) -> &str {
    v.unwrap_or("-")
}
