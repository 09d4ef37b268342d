//! The stuck-agent suite: what a stuck session bought through the gate against straight to
//! the provider, per task and client. A stuck task fails in both arms by design, so it has no
//! valid pair and is never judged by the publication rule nor pooled with healthy work; what it
//! shows is the spend the gate cut and the time it took to stop.

use std::collections::BTreeMap;

use super::measure::{metric, SIMULATION_WARNING};
use super::model::*;

/// The reason a stop carries (`BLOCK (runaway_step)` among a pair's refusals).
const STOP: &str = "(runaway_step)";

fn arm(runs: &[(&EconomicsUsage, f64)]) -> EconomicsStuckArm {
    let n = runs.len().max(1) as f64;
    EconomicsStuckArm {
        runs: runs.len(),
        calls: runs.iter().map(|(u, _)| u.requests as f64).sum::<f64>() / n,
        max_calls: runs.iter().map(|(u, _)| u.requests).max().unwrap_or(0),
        tokens: runs.iter().map(|(u, _)| u.total as f64).sum::<f64>() / n,
        cost_nano_usd: runs
            .iter()
            .map(|(u, _)| u.cost_nano_usd.unwrap_or(0) as f64)
            .sum::<f64>()
            / n,
        seconds: runs.iter().map(|(_, s)| s).sum::<f64>() / n,
    }
}

/// One row per task and client, over the pairs whose arms both ran.
pub(crate) fn rows(pairs: &[&EconomicsPair]) -> Vec<EconomicsStuckRow> {
    let mut by: BTreeMap<(&str, &str), Vec<&EconomicsPair>> = BTreeMap::new();
    for p in pairs {
        if p.control_usage.is_some() && p.treatment_usage.is_some() && p.seconds.is_some() {
            by.entry((&p.task, &p.client)).or_default().push(p);
        }
    }
    by.into_iter()
        .map(|((task, client), ps)| {
            let side = |i: usize| -> Vec<(&EconomicsUsage, f64)> {
                ps.iter()
                    .filter_map(|p| {
                        let u = if i == 0 {
                            &p.control_usage
                        } else {
                            &p.treatment_usage
                        };
                        Some((u.as_ref()?, p.seconds?[i]))
                    })
                    .collect()
            };
            let sides = [side(0), side(1)];
            let (control, treatment) = (arm(&sides[0]), arm(&sides[1]));
            let cost =
                |i: usize| -> Option<u64> { sides[i].iter().map(|(u, _)| u.cost_nano_usd).sum() };
            EconomicsStuckRow {
                suite: ps[0].suite.clone(),
                task: task.into(),
                client: client.into(),
                stopped: ps
                    .iter()
                    .filter(|p| p.refusals.iter().any(|r| r.ends_with(STOP)))
                    .count(),
                cost_reduction: match (cost(0), cost(1)) {
                    (Some(c), Some(t)) if c > 0 => Some(1.0 - t as f64 / c as f64),
                    _ => None,
                },
                most_repeat_runs: ps.iter().filter_map(|p| p.repeat_runs).max().unwrap_or(0),
                paced_seconds: ps.iter().map(|p| p.paced_ms.unwrap_or(0)).sum::<u64>() as f64
                    / 1_000.0
                    / ps.len() as f64,
                control,
                treatment,
            }
        })
        .collect()
}

/// The suite's figures: the cost cut over every stuck run, the most calls one stuck run
/// bought through the gate, and how many were stopped.
pub(crate) fn metrics(
    suite: &str,
    rows: &[EconomicsStuckRow],
    simulated: bool,
) -> Vec<EconomicsMetric> {
    let inputs = if simulated {
        EconomicsClass::Counted
    } else {
        EconomicsClass::Observed
    };
    let runs: usize = rows.iter().map(|r| r.treatment.runs).sum();
    let line = |r: &EconomicsStuckRow| {
        format!(
            "{} on {}: {:.1} calls, {:.0} s straight; {:.1} calls (at most {}), {:.0} s through the gate, {} of {} stopped, at most {} run(s) of the repeated step",
            r.client,
            r.task,
            r.control.calls,
            r.control.seconds,
            r.treatment.calls,
            r.treatment.max_calls,
            r.treatment.seconds,
            r.stopped,
            r.treatment.runs,
            r.most_repeat_runs
        )
    };
    let mut cost = metric(
        "stuck_cost_reduction",
        "Stuck agents: cost cut",
        EconomicsClass::Derived,
        Some(inputs),
        "ratio",
        "1 - the sum of the treatment runs' cost / the sum of the control runs' cost, over every stuck task, client and repetition (pooled: each run what it bought until the client gave up or was stopped)",
        suite,
    );
    let sums = rows.iter().fold((0.0, 0.0), |(c, t), r| {
        (
            c + r.control.cost_nano_usd * r.control.runs as f64,
            t + r.treatment.cost_nano_usd * r.treatment.runs as f64,
        )
    });
    if sums.0 > 0.0 {
        cost.value = Some(1.0 - sums.1 / sums.0);
        cost.n = runs;
        cost.status = EconomicsMetricStatus::Preliminary;
    }
    cost.evidence = rows.iter().map(line).collect();
    cost.not = Some("not a saving on work that succeeds: a stuck task fails in both arms; what it shows is what the gate did not buy for a session that made no progress".into());
    let mut most = metric(
        "stuck_most_calls_bought",
        "Stuck agents: the most provider calls one stuck run bought through the gate",
        EconomicsClass::Observed,
        None,
        "requests",
        "the largest count of provider calls any treatment run of the suite bought",
        suite,
    );
    let mut stopped = metric(
        "stuck_runs_stopped",
        "Stuck agents: treatment runs the gate stopped (runaway_step)",
        EconomicsClass::Observed,
        None,
        "runs",
        "treatment runs with a BLOCK (runaway_step) among the gate's refusals",
        suite,
    );
    if runs > 0 {
        most.value = rows
            .iter()
            .map(|r| r.treatment.max_calls as f64)
            .reduce(f64::max);
        most.n = runs;
        most.status = EconomicsMetricStatus::Preliminary;
        stopped.value = Some(rows.iter().map(|r| r.stopped).sum::<usize>() as f64);
        stopped.n = runs;
        stopped.status = EconomicsMetricStatus::Preliminary;
    }
    let mut out = vec![cost, most, stopped];
    if simulated {
        for m in &mut out {
            m.warnings.insert(0, SIMULATION_WARNING.to_string());
        }
    }
    out
}
