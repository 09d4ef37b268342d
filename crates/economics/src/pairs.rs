//! Runs into pairs: what each arm bought, whether its task's own check passed, and what
//! follows for the pair (seed 001's pair statuses and per-pair reductions).

use std::collections::BTreeMap;

use super::model::*;

/// How one run did.
#[derive(Clone, Debug, Default)]
pub struct RunOutcome {
    /// What the arm bought from the provider (requests, usage, cost), and the tool calls the
    /// agent was asked to make.
    pub usage: EconomicsUsage,
    /// The task's own check.
    pub succeeded: bool,
    /// A bought answer reported no usage.
    pub usage_missing: bool,
    /// Usage of the answers the gate served from its store (not bought again).
    pub not_bought: u64,
    /// Total tokens bought in the last session.
    pub last_session_total: u64,
    /// Input of the first bought request.
    pub first_input: Option<u64>,
    /// The gate's refusals: `VERDICT (reason)` → count.
    pub refusals: BTreeMap<String, u64>,
}

fn ok(status: u16) -> bool {
    (200..300).contains(&status)
}

/// The outcome of a run.
pub fn outcome(run: &RunRecord) -> RunOutcome {
    let mut o = RunOutcome {
        succeeded: run.check.passed,
        ..Default::default()
    };
    let last = run.sessions.iter().map(|s| s.index).max().unwrap_or(0);
    let mut cost = Some(0u64);
    for b in run.bought.iter().filter(|b| ok(b.status)) {
        o.usage.requests += 1;
        match &b.usage {
            Some(u) => {
                o.usage.add_step(u);
                if b.session == last {
                    o.last_session_total += u.total();
                }
                if o.first_input.is_none() {
                    o.first_input = Some(u.input());
                }
            }
            None => o.usage_missing = true,
        }
        cost = match (cost, b.cost_nano_usd) {
            (Some(c), Some(x)) => Some(c + x),
            _ => None,
        };
    }
    o.usage.cost_nano_usd = cost.filter(|_| o.usage.requests > 0);
    for s in &run.steps {
        if ok(s.status) {
            o.usage.tool_calls += s.tool_calls;
        }
        match s.verdict.as_deref() {
            Some("SERVE") => o.not_bought += s.usage.as_ref().map_or(0, StepUsage::total),
            Some(v @ ("BLOCK" | "CHALLENGE")) => {
                let reason = s.reason.as_deref().unwrap_or("unknown");
                *o.refusals.entry(format!("{v} ({reason})")).or_insert(0) += 1;
            }
            _ => {}
        }
    }
    o
}

/// How many runs of its most repeated step a run's client sent — another step sent in between
/// ends a run, unless it is one other result of the same action between two of the step (a
/// stray: SPEC §2.3) — read off the recorded digests' step fingerprints and actions, in order
/// of arrival; `None` when the run kept no digests.
pub fn repeat_runs(run: &RunRecord) -> Option<u32> {
    let field = |s: &StepRecord, name: &str| -> Option<String> {
        s.digest.as_ref()?["request"][name]
            .as_str()
            .map(str::to_owned)
    };
    let mut steps: Vec<(u64, String, Option<String>)> = run
        .steps
        .iter()
        .filter_map(|s| {
            let fp = field(s, "step_fingerprint")?;
            Some((s.at_ms.unwrap_or(0), fp, field(s, "step_action")))
        })
        .collect();
    steps.sort();
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for (_, fp, _) in &steps {
        *counts.entry(fp).or_default() += 1;
    }
    let (repeated, _) = counts.into_iter().max_by_key(|&(_, n)| n)?;
    let action = steps
        .iter()
        .find(|(_, fp, _)| fp.as_str() == repeated)
        .and_then(|(_, _, a)| a.as_deref());
    let is = |i: usize| {
        steps
            .get(i)
            .is_some_and(|(_, fp, _)| fp.as_str() == repeated)
    };
    let stray = |i: usize| {
        i > 0 && is(i - 1) && is(i + 1) && action.is_some() && steps[i].2.as_deref() == action
    };
    let mut runs = 0;
    let mut inside = false;
    for i in 0..steps.len() {
        if is(i) {
            runs += u32::from(!inside);
            inside = true;
        } else if !stray(i) {
            inside = false;
        }
    }
    Some(runs)
}

fn reduction(control: f64, treatment: f64) -> Option<f64> {
    (control > 0.0).then(|| 1.0 - treatment / control)
}

/// A pair's identity: `<task>--<client>--r<repetition>`.
pub fn pair_id(task: &str, client: &str, repetition: u32) -> String {
    format!("{task}--{client}--r{repetition}")
}

/// What a pair is, before its runs.
#[derive(Clone, Debug)]
pub struct PairKey<'a> {
    pub suite: &'a str,
    pub task: &'a str,
    pub category: &'a str,
    pub client: &'a str,
    pub model: &'a str,
    pub sessions: u32,
    pub repetition: u32,
}

/// Pair a control run and a treatment run of one task, client and repetition.
pub fn make_pair(
    k: &PairKey<'_>,
    control: Option<&RunRecord>,
    treatment: Option<&RunRecord>,
) -> EconomicsPair {
    let mut p = EconomicsPair {
        suite: k.suite.to_string(),
        task: k.task.to_string(),
        category: k.category.to_string(),
        client: k.client.to_string(),
        sessions: k.sessions,
        repetition: k.repetition,
        seed: control.or(treatment).map_or(0, |r| r.seed),
        model: control
            .or(treatment)
            .map_or(k.model, |r| &r.model)
            .to_string(),
        control: control.map(|r| r.id.clone()),
        treatment: treatment.map(|r| r.id.clone()),
        status: EconomicsPairStatus::Missing,
        reasons: vec![],
        control_usage: None,
        treatment_usage: None,
        token_reduction: None,
        request_reduction: None,
        cost_reduction: None,
        tool_call_reduction: None,
        continuation_reduction: None,
        first_request_overhead: None,
        succeeded: None,
        refusals: vec![],
        tokens_not_bought: None,
        seconds: None,
        paced_ms: None,
        repeat_runs: None,
    };
    let (c, t) = match (control, treatment) {
        (Some(c), Some(t)) => (c, t),
        (None, _) => {
            p.reasons.push("no control run recorded".into());
            return p;
        }
        (_, None) => {
            p.reasons.push("no treatment run recorded".into());
            return p;
        }
    };
    let (co, to) = (outcome(c), outcome(t));
    p.control_usage = Some(co.usage.clone());
    p.treatment_usage = Some(to.usage.clone());
    p.tokens_not_bought = Some(to.not_bought);
    p.seconds = Some([c.seconds, t.seconds]);
    p.paced_ms = Some(t.steps.iter().filter_map(|s| s.paced_ms).sum());
    p.repeat_runs = repeat_runs(t);
    p.succeeded = Some([co.succeeded, to.succeeded]);
    p.refusals = to
        .refusals
        .iter()
        .map(|(r, n)| format!("{n}× {r}"))
        .collect();
    let incomparable = incomparable(c, t);
    let failed = |r: &RunRecord, arm: &str| {
        format!(
            "{arm} failed its task's check ({}){}",
            r.check.output.trim(),
            exit_codes(r)
        )
    };
    p.status = if !incomparable.is_empty() {
        p.reasons = incomparable;
        EconomicsPairStatus::Incomparable
    } else if !co.succeeded && !to.succeeded {
        p.reasons.push(failed(c, "control"));
        p.reasons.push(failed(t, "treatment"));
        EconomicsPairStatus::BothFailed
    } else if !co.succeeded {
        p.reasons.push(failed(c, "control"));
        EconomicsPairStatus::ControlFailed
    } else if !to.succeeded {
        p.reasons.push(failed(t, "treatment"));
        EconomicsPairStatus::TreatmentFailed
    } else if co.usage_missing || to.usage_missing || co.usage.total == 0 {
        p.reasons
            .push("a bought answer reported no usage to compare".into());
        EconomicsPairStatus::UsageUnavailable
    } else {
        fill_reductions(&mut p, &co, &to);
        EconomicsPairStatus::Valid
    };
    p
}

fn exit_codes(r: &RunRecord) -> String {
    let codes: Vec<String> = r
        .sessions
        .iter()
        .filter(|s| s.exit_code != 0)
        .map(|s| format!("session {} exited {}", s.index + 1, s.exit_code))
        .collect();
    if codes.is_empty() {
        String::new()
    } else {
        format!("; {}", codes.join(", "))
    }
}

fn incomparable(c: &RunRecord, t: &RunRecord) -> Vec<String> {
    let mut out = Vec::new();
    if c.task_digest != t.task_digest {
        out.push("the arms ran different task files".to_string());
    }
    if c.model != t.model {
        out.push(format!("models differ: {} vs {}", c.model, t.model));
    }
    if c.seed != t.seed {
        out.push(format!("seeds differ: {} vs {}", c.seed, t.seed));
    }
    if c.sessions.len() != t.sessions.len() {
        out.push(format!(
            "session counts differ: {} vs {}",
            c.sessions.len(),
            t.sessions.len()
        ));
    }
    out
}

fn fill_reductions(p: &mut EconomicsPair, co: &RunOutcome, to: &RunOutcome) {
    let f = |x: u64| x as f64;
    p.token_reduction = reduction(f(co.usage.total), f(to.usage.total));
    p.request_reduction = reduction(f(co.usage.requests), f(to.usage.requests));
    p.tool_call_reduction = reduction(f(co.usage.tool_calls), f(to.usage.tool_calls));
    if let (Some(c), Some(t)) = (co.usage.cost_nano_usd, to.usage.cost_nano_usd) {
        p.cost_reduction = reduction(f(c), f(t));
    }
    if p.sessions > 1 {
        p.continuation_reduction = reduction(f(co.last_session_total), f(to.last_session_total));
    }
    if let (Some(c), Some(t)) = (co.first_input, to.first_input) {
        p.first_request_overhead = Some(t as i64 - c as i64);
    }
}

/// Count pairs by status (pairs with no run at all are declared, not attempted).
pub fn count_pairs(pairs: &[&EconomicsPair], declared: usize) -> EconomicsPairCounts {
    let mut c = EconomicsPairCounts {
        declared,
        ..Default::default()
    };
    for p in pairs {
        if p.control.is_none() && p.treatment.is_none() {
            continue;
        }
        c.attempted += 1;
        match p.status {
            EconomicsPairStatus::Valid => c.valid += 1,
            EconomicsPairStatus::ControlFailed => c.control_failed += 1,
            EconomicsPairStatus::TreatmentFailed => c.treatment_failed += 1,
            EconomicsPairStatus::BothFailed => c.both_failed += 1,
            _ => c.other += 1,
        }
    }
    c
}

/// Whether a pair has both runs, comparable, with usage to count: it enters the metrics that
/// count failed tasks too.
pub fn comparable(p: &EconomicsPair) -> bool {
    matches!(
        p.status,
        EconomicsPairStatus::Valid
            | EconomicsPairStatus::ControlFailed
            | EconomicsPairStatus::TreatmentFailed
            | EconomicsPairStatus::BothFailed
    )
}

/// `(control tokens, control succeeded, treatment tokens, treatment succeeded)` of a
/// comparable pair.
pub fn per_success_row(p: &EconomicsPair) -> Option<(u64, bool, u64, bool)> {
    let (c, t, s) = (
        p.control_usage.as_ref()?,
        p.treatment_usage.as_ref()?,
        p.succeeded?,
    );
    comparable(p).then_some((c.total, s[0], t.total, s[1]))
}

/// `1 − (treatment tokens per success) / (control tokens per success)` over rows: every
/// attempted comparable pair's tokens count, failed runs included, and only successes divide.
/// `None` when either arm has no success or the control bought nothing. (The summary weighs
/// tasks equally first: [`weigh_tasks_equally`].)
pub fn per_success_reduction(rows: &[(f64, bool, f64, bool)]) -> Option<f64> {
    let (mut ct, mut cs, mut tt, mut ts) = (0.0, 0u64, 0.0, 0u64);
    for &(c, c_ok, t, t_ok) in rows {
        ct += c;
        tt += t;
        cs += u64::from(c_ok);
        ts += u64::from(t_ok);
    }
    if cs == 0 || ts == 0 || ct <= 0.0 {
        return None;
    }
    Some(1.0 - (tt / ts as f64) / (ct / cs as f64))
}

/// A task's rows with its tokens in units of its mean control run, so that every task
/// weighs alike in a pooled figure (a stuck task that burns ten times the tokens of the
/// others, failing in both arms by design, would otherwise carry it alone).
pub fn weigh_tasks_equally(rows: &[(u64, bool, u64, bool)]) -> Vec<(f64, bool, f64, bool)> {
    let control: u64 = rows.iter().map(|r| r.0).sum();
    let unit = control as f64 / rows.len().max(1) as f64;
    if unit <= 0.0 {
        return Vec::new();
    }
    rows.iter()
        .map(|&(c, c_ok, t, t_ok)| (c as f64 / unit, c_ok, t as f64 / unit, t_ok))
        .collect()
}
