//! Prometheus metrics: requests by verdict and reason, decision latency, tokens by tier,
//! store size. Labels are closed vocabularies (verdicts, rule ids); never request content.

use prometheus::{
    Counter, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub decision_seconds: Histogram,
    pub tokens: IntCounterVec,
    pub answer_store_bytes: IntGauge,
    pub upstream_errors: IntCounterVec,
    /// Re-sends of a request whose hold is pending: answered with the original CHALLENGE,
    /// not counted in `requests` (SPEC §2.3).
    pub hold_resends: IntCounter,
    /// Repeated steps held until their pace window admitted them (SPEC §2.3), the seconds
    /// they were held, and how many are held now.
    pub paced: IntCounter,
    pub paced_seconds: Counter,
    pub paced_waiting: IntGauge,
    /// Held requests whose caller left before the window admitted them: never decided.
    pub paced_abandoned: IntCounter,
    /// Repeated steps the gate could not hold (a cap on held requests reached): refused as a
    /// loop, as a gate that cannot hold refuses them.
    pub paced_refused: IntCounter,
    /// Every request on the proxy listener, from its header to its last byte, by verdict
    /// (`none`: answered before any decision, a pass-through, or an early refusal).
    pub request_seconds: HistogramVec,
    /// Answers given before any decision (400, 401, 404, 405, 413, …), by status.
    pub early_answers: IntCounterVec,
    /// Cache health of settled calls (SPEC §2.11b): prompt tokens by how they were billed
    /// (`input`, `cache_write`, `cache_read`: the read share is read ÷ their sum), rebuilds
    /// after a pause and what they and one-hour entries cost, in nano-USD.
    pub prompt_tokens: IntCounterVec,
    pub cache_rebuilds: IntCounter,
    pub cache_cost_nano: IntCounterVec,
    /// The derived, counterfactual saving of each of the gate's cache mechanisms, nano-USD; a
    /// gauge because it is signed (writes never read cost more than they saved).
    pub cache_saving_derived_nano: IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let r = |name: &str, help: &str| Opts::new(name, help);
        Self {
            requests: registered(
                &registry,
                IntCounterVec::new(
                    r("tokensaver_requests_total", "Gated requests by verdict and reason"),
                    &["verdict", "reason"],
                ),
            ),
            decision_seconds: registered(
                &registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "tokensaver_decision_seconds",
                        "Time to decide a request and sign its receipt",
                    )
                    .buckets(vec![
                        0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5,
                        0.005, 0.01, 0.05,
                    ]),
                ),
            ),
            tokens: registered(
                &registry,
                IntCounterVec::new(
                    r("tokensaver_tokens_total", "Tokens by certainty tier"),
                    &["tier"],
                ),
            ),
            answer_store_bytes: registered(
                &registry,
                IntGauge::new("tokensaver_answer_store_bytes", "Bytes of stored answers"),
            ),
            upstream_errors: registered(
                &registry,
                IntCounterVec::new(
                    r("tokensaver_upstream_errors_total", "Upstream failures by kind"),
                    &["kind"],
                ),
            ),
            hold_resends: registered(
                &registry,
                IntCounter::new(
                    "tokensaver_hold_resends_total",
                    "Re-sends of a request whose hold is pending (answered with the same CHALLENGE)",
                ),
            ),
            paced: registered(
                &registry,
                IntCounter::new(
                    "tokensaver_paced_total",
                    "Repeated steps held in the gate until their window admitted them",
                ),
            ),
            paced_seconds: registered(
                &registry,
                Counter::new(
                    "tokensaver_paced_seconds_total",
                    "Seconds repeated steps were held in the gate",
                ),
            ),
            paced_waiting: registered(
                &registry,
                IntGauge::new(
                    "tokensaver_paced_waiting",
                    "Repeated steps held in the gate now",
                ),
            ),
            paced_abandoned: registered(
                &registry,
                IntCounter::new(
                    "tokensaver_paced_abandoned_total",
                    "Held requests whose caller left before they were decided (nothing bought)",
                ),
            ),
            paced_refused: registered(
                &registry,
                IntCounter::new(
                    "tokensaver_paced_refused_total",
                    "Repeated steps refused because the caps on held requests were reached",
                ),
            ),
            request_seconds: registered(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "tokensaver_request_seconds",
                        "Proxy requests from header to last byte, by verdict",
                    )
                    .buckets(vec![
                        0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                        2.5, 5.0, 10.0, 30.0, 60.0, 180.0,
                    ]),
                    &["verdict"],
                ),
            ),
            early_answers: registered(
                &registry,
                IntCounterVec::new(
                    r(
                        "tokensaver_early_answers_total",
                        "Proxy answers given before any decision, by status",
                    ),
                    &["status"],
                ),
            ),
            prompt_tokens: registered(
                &registry,
                IntCounterVec::new(
                    r(
                        "tokensaver_prompt_tokens_total",
                        "Prompt tokens of settled calls by how the provider billed them",
                    ),
                    &["billed_as"],
                ),
            ),
            cache_rebuilds: registered(
                &registry,
                IntCounter::new(
                    "tokensaver_cache_rebuilds_total",
                    "Settled calls that wrote the cache after a pause of their session",
                ),
            ),
            cache_cost_nano: registered(
                &registry,
                IntCounterVec::new(
                    r(
                        "tokensaver_cache_cost_nano_usd_total",
                        "Cache rebuilds' write cost and the one-hour premium, nano-USD",
                    ),
                    &["part"],
                ),
            ),
            cache_saving_derived_nano: registered(
                &registry,
                IntGaugeVec::new(
                    r(
                        "tokensaver_cache_saving_derived_nano_usd",
                        "Derived, counterfactual cache saving by the gate's mechanism, nano-USD (in no total)",
                    ),
                    &["mechanism"],
                ),
            ),
            registry,
        }
    }

    /// A settled call's cache health.
    pub fn count_cache(&self, row: &crate::store::UsageRow) {
        let u = &row.usage;
        for (billed_as, n) in [
            ("input", u.input),
            ("cache_write", u.cache_write),
            ("cache_read", u.cache_read),
        ] {
            self.prompt_tokens.with_label_values(&[billed_as]).inc_by(n);
        }
        let c = &row.cache;
        if let Some(nano) = c.cache_rebuild_nano {
            self.cache_rebuilds.inc();
            self.cache_cost_nano
                .with_label_values(&["rebuild"])
                .inc_by(nano);
        }
        self.cache_cost_nano
            .with_label_values(&["premium_1h"])
            .inc_by(c.cache_premium_1h_nano);
        for (mechanism, nano) in [
            ("breakpoints", row.cache_saving_nano),
            ("lifetimes", c.cache_saving_lifetimes_nano),
            ("routing", c.cache_saving_routing_nano),
        ] {
            if let Some(nano) = nano {
                self.cache_saving_derived_nano
                    .with_label_values(&[mechanism])
                    .add(nano);
            }
        }
    }

    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

/// A metric, registered. Construction and registration fail only for an invalid or duplicate
/// name; the names are the constants in [`Metrics::new`], so a failure is a programming error
/// caught by the first test.
#[allow(clippy::expect_used)]
fn registered<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    made: prometheus::Result<C>,
) -> C {
    let metric = made.expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn metrics_build_and_render_without_content() {
        let m = super::Metrics::new();
        m.requests.with_label_values(&["ALLOW", "allowed"]).inc();
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("tokensaver_requests_total{reason=\"allowed\",verdict=\"ALLOW\"} 1"));
    }
}
