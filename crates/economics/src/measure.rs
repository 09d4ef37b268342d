//! What the suites' metrics are built from: a metric not yet measured, the bootstrap's
//! parameters, the simulation's warning and the ratio of pooled sums. The live suite
//! (`summarize.rs`), the stuck suite (`stuck.rs`) and the context suite (`context.rs`) stand on
//! this, and none on another's internals.

use super::model::*;
use super::stats;

/// The warning every metric of simulated evidence carries first.
pub(crate) const SIMULATION_WARNING: &str = "a simulation against a scripted provider: it measures the gate's mechanisms on scripted agent behaviour, not a real model's costs";

pub(crate) struct Boot {
    pub(crate) seed: u64,
    pub(crate) resamples: u32,
    pub(crate) level_bp: u32,
}

impl Boot {
    pub(crate) fn interval<T: Clone>(
        &self,
        clusters: &[Vec<T>],
        stat: impl Fn(&[T]) -> Option<f64>,
        method: &str,
    ) -> Option<EconomicsInterval> {
        let (low, high) =
            stats::cluster_bootstrap(clusters, stat, self.resamples, self.seed, self.level_bp)?;
        Some(EconomicsInterval {
            level_bp: self.level_bp,
            low,
            high,
            method: method.to_string(),
            resamples: self.resamples,
            seed: self.seed,
        })
    }
}

pub(crate) fn metric(
    id: &str,
    title: &str,
    class: EconomicsClass,
    inputs: Option<EconomicsClass>,
    unit: &str,
    formula: &str,
    suite: &str,
) -> EconomicsMetric {
    EconomicsMetric {
        id: id.into(),
        title: title.into(),
        class,
        inputs,
        unit: unit.into(),
        formula: formula.into(),
        status: EconomicsMetricStatus::NotMeasured,
        n: 0,
        suite: suite.into(),
        value: None,
        distribution: None,
        interval: None,
        evidence: vec![],
        not: None,
        leave_one_task_out: None,
        warnings: vec![],
    }
}

/// The ratio of two pooled sums: Σ first ÷ Σ second (`None` when the second sums to zero).
pub(crate) fn ratio(v: &[(u64, u64)]) -> Option<f64> {
    let r: u64 = v.iter().map(|x| x.0).sum();
    let t: u64 = v.iter().map(|x| x.1).sum();
    (t > 0).then(|| r as f64 / t as f64)
}
