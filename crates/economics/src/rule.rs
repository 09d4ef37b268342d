//! The publication rule and the one sentence the evidence allows (seed 001), generated from
//! the numbers, never typed.
//!
//! Two things no methodology can change: the rule is never looser than [`FLOOR`] — the seed's
//! seven thresholds (≥ 30 valid pairs over ≥ 4 categories of ≥ 5 each, ≥ 3 repetitions, ≥ 80 %
//! of attempted pairs valid, an interval at most 20 points wide, current evidence) and this
//! project's four (≥ 6 tasks, ≤ 5 % of pairs failed under the gate, an interval excluding 0,
//! evidence at most 90 days old) — and
//! evidence recorded against a simulated provider is never publishable: its statement opens
//! with [`SIMULATION_LABEL`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::model::{ClientInfo, EconomicsFreshness, EconomicsPublicationPolicy};

/// The first words of every statement about evidence from a simulated provider.
pub const SIMULATION_LABEL: &str = "In a simulation against a scripted provider,";

/// The loosest rule this build applies, whatever the methodology says (a looser threshold
/// is raised to this one and named in the diagnostics, with whose floor it is: [`floor_of`]).
pub const FLOOR: EconomicsPublicationPolicy = EconomicsPublicationPolicy {
    min_valid_pairs: 30,
    min_tasks: 6,
    min_categories: 4,
    min_pairs_per_category: 5,
    min_repetitions: 3,
    min_valid_pair_rate_bp: 8000,
    max_interval_width_bp: 2000,
    max_treatment_failed_rate_bp: 500,
    interval_excludes_zero: true,
    require_current: true,
    freshness_window_days: 90,
};

/// The thresholds seed 001's `EconomicsPublicationPolicy` itself has (its required fields);
/// the others in [`FLOOR`] are this project's.
pub const SEED_THRESHOLDS: [&str; 7] = [
    "min_valid_pairs",
    "min_categories",
    "min_pairs_per_category",
    "min_repetitions",
    "min_valid_pair_rate_bp",
    "max_interval_width_bp",
    "require_current",
];

/// Whose floor a threshold is, as the diagnostics name it.
pub fn floor_of(threshold: &str) -> &'static str {
    if SEED_THRESHOLDS.contains(&threshold) {
        "the seed's"
    } else {
        "this project's"
    }
}

/// The rule applied: the methodology's, each threshold at least as strict as [`FLOOR`]'s;
/// every threshold the floor raised is named.
pub fn effective_rule(m: &EconomicsPublicationPolicy) -> (EconomicsPublicationPolicy, Vec<String>) {
    let f = &FLOOR;
    let mut raised = Vec::new();
    let mut at_least = |name: &str, v: usize, floor: usize| {
        if v < floor {
            raised.push(format!(
                "{name}: {v} is below {} {floor}; {floor} applies",
                floor_of(name)
            ));
        }
        v.max(floor)
    };
    let mut r = m.clone();
    r.min_valid_pairs = at_least("min_valid_pairs", m.min_valid_pairs, f.min_valid_pairs);
    r.min_tasks = at_least("min_tasks", m.min_tasks, f.min_tasks);
    r.min_categories = at_least("min_categories", m.min_categories, f.min_categories);
    r.min_pairs_per_category = at_least(
        "min_pairs_per_category",
        m.min_pairs_per_category,
        f.min_pairs_per_category,
    );
    r.min_repetitions = at_least(
        "min_repetitions",
        m.min_repetitions as usize,
        f.min_repetitions as usize,
    ) as u32;
    r.min_valid_pair_rate_bp = at_least(
        "min_valid_pair_rate_bp",
        m.min_valid_pair_rate_bp as usize,
        f.min_valid_pair_rate_bp as usize,
    ) as u32;
    let mut at_most = |name: &str, v: u32, floor: u32| {
        if v > floor {
            raised.push(format!(
                "{name}: {v} is looser than {} {floor}; {floor} applies",
                floor_of(name)
            ));
        }
        v.min(floor)
    };
    r.max_interval_width_bp = at_most(
        "max_interval_width_bp",
        m.max_interval_width_bp,
        f.max_interval_width_bp,
    );
    r.max_treatment_failed_rate_bp = at_most(
        "max_treatment_failed_rate_bp",
        m.max_treatment_failed_rate_bp,
        f.max_treatment_failed_rate_bp,
    );
    r.freshness_window_days = at_most(
        "freshness_window_days",
        m.freshness_window_days,
        f.freshness_window_days,
    );
    for (name, v) in [
        ("interval_excludes_zero", m.interval_excludes_zero),
        ("require_current", m.require_current),
    ] {
        if !v {
            raised.push(format!(
                "{name}: false is looser than {} true; true applies",
                floor_of(name)
            ));
        }
    }
    r.interval_excludes_zero = true;
    r.require_current = true;
    (r, raised)
}

/// The outcome of the publication rule over all the evidence of the primary suite.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleOutcome {
    pub publishable: bool,
    pub unmet: Vec<String>,
}

/// The inputs of the publication rule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuleInputs {
    pub valid_pairs: usize,
    pub attempted_pairs: usize,
    /// Pairs whose treatment failed its check (alone or with the control).
    pub treatment_failed_pairs: usize,
    pub tasks_with_valid_pairs: usize,
    /// Valid pairs per category.
    pub category_pairs: BTreeMap<String, usize>,
    /// The fewest repetitions recorded for any declared task, client and arm.
    pub min_repetitions: u32,
    pub interval: Option<(f64, f64)>,
    pub freshness: Option<EconomicsFreshness>,
    /// The evidence was recorded against a simulated provider.
    pub simulated: bool,
    /// Of the attempted pairs, how many control runs and how many treatment runs passed
    /// their task's check.
    pub control_successes: usize,
    pub treatment_successes: usize,
}

/// Task success through the gate may be at most this much worse than without it (basis
/// points of the attempted pairs) for a claim: held by the code, whatever a methodology says.
pub const NON_INFERIORITY_MARGIN_BP: usize = 200;

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn rate_bp(n: usize, of: usize) -> usize {
    (n * 10_000).checked_div(of).unwrap_or(0)
}

/// Evaluate the rule (apply [`effective_rule`] first): every threshold not met is named.
pub fn evaluate_rule(rule: &EconomicsPublicationPolicy, i: &RuleInputs) -> RuleOutcome {
    let mut unmet = Vec::new();
    if i.simulated {
        unmet.push(
            "provider: recorded against a scripted provider (a simulation); a simulation is never a verified claim"
                .to_string(),
        );
    }
    if i.valid_pairs < rule.min_valid_pairs {
        unmet.push(format!(
            "min_valid_pairs: {} < {}",
            i.valid_pairs, rule.min_valid_pairs
        ));
    }
    if i.tasks_with_valid_pairs < rule.min_tasks {
        unmet.push(format!(
            "min_tasks: {} < {}",
            i.tasks_with_valid_pairs, rule.min_tasks
        ));
    }
    let cats = i
        .category_pairs
        .values()
        .filter(|&&n| n >= rule.min_pairs_per_category)
        .count();
    if cats < rule.min_categories {
        unmet.push(format!(
            "min_categories: {cats} < {} (with at least {} valid pairs each)",
            rule.min_categories, rule.min_pairs_per_category
        ));
    }
    if i.min_repetitions < rule.min_repetitions {
        unmet.push(format!(
            "min_repetitions: {} < {}",
            i.min_repetitions, rule.min_repetitions
        ));
    }
    let valid_bp = rate_bp(i.valid_pairs, i.attempted_pairs);
    if valid_bp < rule.min_valid_pair_rate_bp as usize {
        unmet.push(format!(
            "min_valid_pair_rate_bp: {valid_bp} < {} ({} valid of {} attempted)",
            rule.min_valid_pair_rate_bp, i.valid_pairs, i.attempted_pairs
        ));
    }
    let failed_bp = rate_bp(i.treatment_failed_pairs, i.attempted_pairs);
    if failed_bp > rule.max_treatment_failed_rate_bp as usize {
        unmet.push(format!(
            "max_treatment_failed_rate_bp: {failed_bp} > {} ({} of {} attempted pairs' treatment runs failed their task's check)",
            rule.max_treatment_failed_rate_bp, i.treatment_failed_pairs, i.attempted_pairs
        ));
    }
    let (control_bp, treatment_bp) = (
        rate_bp(i.control_successes, i.attempted_pairs),
        rate_bp(i.treatment_successes, i.attempted_pairs),
    );
    if treatment_bp + NON_INFERIORITY_MARGIN_BP < control_bp {
        unmet.push(format!(
            "non_inferiority: task success through the gate {treatment_bp} bp < without it {control_bp} bp − {NON_INFERIORITY_MARGIN_BP} ({} and {} of {} attempted pairs succeeded)",
            i.treatment_successes, i.control_successes, i.attempted_pairs
        ));
    }
    match i.interval {
        None => unmet.push("interval: none could be computed".into()),
        Some((lo, hi)) => {
            let width_bp = ((hi - lo) * 10_000.0).round();
            if width_bp > f64::from(rule.max_interval_width_bp) {
                unmet.push(format!(
                    "max_interval_width_bp: {width_bp} > {}",
                    rule.max_interval_width_bp
                ));
            }
            if rule.interval_excludes_zero && lo <= 0.0 && hi >= 0.0 {
                unmet.push(format!(
                    "interval_excludes_zero: the interval {} to {} contains 0",
                    pct(lo),
                    pct(hi)
                ));
            }
        }
    }
    if rule.require_current && i.freshness != Some(EconomicsFreshness::Current) {
        let f = match i.freshness {
            Some(EconomicsFreshness::Current) => "current",
            Some(EconomicsFreshness::Stale) => "stale",
            Some(EconomicsFreshness::Incompatible) => "incompatible",
            Some(EconomicsFreshness::NoEvidence) | None => "no_evidence",
        };
        unmet.push(format!("require_current: the evidence is {f}"));
    }
    RuleOutcome {
        publishable: unmet.is_empty() && !i.simulated,
        unmet,
    }
}

/// Everything the statement is generated from.
#[derive(Clone, Debug, Default)]
pub struct StatementInputs {
    pub suite: String,
    pub simulated: bool,
    /// The provider, in words (real evidence).
    pub provider: String,
    pub clients: Vec<ClientInfo>,
    pub level_bp: u32,
    /// The median per-pair token reduction over all valid pairs.
    pub median: Option<f64>,
    pub rule: RuleInputs,
    /// Tasks covered by the evidence (with at least one attempted pair).
    pub tasks: usize,
    pub categories: usize,
    /// `task (client rN, ...)` of the pairs whose treatment failed and control passed.
    pub failed_under_gate: Vec<String>,
    /// Pairs where both arms failed, by task.
    pub failed_in_both: Vec<String>,
    /// The tokens-per-successful-task reduction over every comparable pair.
    pub per_success: Option<f64>,
    /// Its interval, and its lowest and highest with one task left out (and which task).
    pub per_success_interval: Option<(f64, f64)>,
    pub per_success_range: Option<(f64, String, f64, String)>,
    /// Successes per arm over the comparable pairs: `(control, treatment, pairs)`.
    pub successes: (usize, usize, usize),
    /// The median per-pair cost reduction over valid pairs, and its interval.
    pub cost_median: Option<f64>,
    pub cost_interval: Option<(f64, f64)>,
}

fn fewer_or_more(v: f64) -> (String, &'static str) {
    if v >= 0.0 {
        (pct(v), "fewer")
    } else {
        (pct(-v), "more")
    }
}

fn clients_text(c: &[ClientInfo]) -> String {
    if c.is_empty() {
        return "no client recorded".into();
    }
    c.iter()
        .map(|c| format!("{} {} ({})", c.program, c.version, c.model))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The statement's first sentence after its opening: what the gate broke.
fn broke_text(s: &StatementInputs) -> String {
    if s.failed_under_gate.is_empty() {
        "no task that succeeded without the gate failed through it.".into()
    } else {
        format!(
            "tasks that succeeded without the gate failed through it: {}.",
            s.failed_under_gate.join("; ")
        )
    }
}

/// The cost figure, with the token figure's standing (its own interval).
fn cost_text(s: &StatementInputs) -> String {
    let level = f64::from(s.level_bp) / 100.0;
    match (s.cost_median, s.cost_interval) {
        (Some(v), Some((lo, hi))) => {
            let (mag, dir) = if v >= 0.0 {
                (pct(v), "less")
            } else {
                (pct(-v), "more")
            };
            format!(
                " At the recorded price table the median pair cost {mag} {dir} through the gate ({level}% interval {} to {}).",
                pct(lo),
                pct(hi)
            )
        }
        _ => String::new(),
    }
}

/// The sentences that follow the headline whatever it is: the tasks that failed in both arms,
/// and the figure that counts failed runs (only with its interval and its range).
fn failures_text(s: &StatementInputs) -> String {
    let mut o = cost_text(s);
    if !s.failed_in_both.is_empty() {
        let _ = write!(o, " Failed in both arms: {}.", s.failed_in_both.join("; "));
    }
    let (c, t, n) = s.successes;
    let level = f64::from(s.level_bp) / 100.0;
    if let (Some(v), Some((lo, hi)), Some((low, low_task, high, high_task))) =
        (s.per_success, s.per_success_interval, &s.per_success_range)
    {
        let (mag, dir) = fewer_or_more(v);
        let _ = write!(
            o,
            " Counting failed runs too, the gate's arm bought {mag} {dir} tokens per successful task ({level}% interval {} to {}; {} without {low_task} to {} without {high_task}, leaving one task out; {t} of {n} treatment runs and {c} of {n} control runs succeeded).",
            pct(lo),
            pct(hi),
            pct(*low),
            pct(*high)
        );
    } else if n > 0 {
        let _ = write!(
            o,
            " Tokens per successful task cannot be compared ({t} of {n} treatment runs and {c} of {n} control runs succeeded)."
        );
    }
    o
}

/// The one sentence (a few, in fact) the evidence allows: generated, never typed.
pub fn verdict_statement(s: &StatementInputs, outcome: &RuleOutcome) -> String {
    let i = &s.rule;
    let level = f64::from(s.level_bp) / 100.0;
    let interval = i
        .interval
        .map(|(lo, hi)| format!("{level}% interval {} to {}", pct(lo), pct(hi)))
        .unwrap_or_else(|| "no interval".into());
    let counts = format!(
        "{} valid of {} attempted pairs over {} tasks in {} categories",
        i.valid_pairs, i.attempted_pairs, s.tasks, s.categories
    );
    let mut o = String::new();
    if s.simulated {
        match s.median {
            Some(v) => {
                let (mag, dir) = fewer_or_more(v);
                let _ = write!(
                    o,
                    "{SIMULATION_LABEL} {} The median pair of suite {} used {mag} {dir} total tokens through the gate than straight to the scripted provider ({interval}; {counts}; clients {}).",
                    broke_text(s),
                    s.suite,
                    clients_text(&s.clients)
                );
            }
            None => {
                let _ = write!(
                    o,
                    "{SIMULATION_LABEL} {} No pair of suite {} was valid ({counts}; clients {}): no token figure.",
                    broke_text(s),
                    s.suite,
                    clients_text(&s.clients)
                );
            }
        }
        o.push_str(&failures_text(s));
        o.push_str(" A simulation measures the gate's mechanisms on scripted agent behaviour, not a real model's costs, and is never a verified claim");
        let others: Vec<&String> = outcome.unmet.iter().skip(1).collect();
        if others.is_empty() {
            o.push('.');
        } else {
            let _ = write!(
                o,
                "; the rule is also unmet on: {}.",
                others
                    .iter()
                    .map(|u| u.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        return o;
    }
    match (outcome.publishable, s.median, i.interval) {
        (true, Some(v), Some(_)) => {
            let (mag, dir) = fewer_or_more(v);
            let _ = write!(
                o,
                "Against {}, {} Through the gate, the median agent task of suite {} used {mag} {dir} total tokens than the same task sent straight to the provider ({interval}; {counts}, at least {} repetitions each; clients {}).",
                s.provider,
                broke_text(s),
                s.suite,
                i.min_repetitions,
                clients_text(&s.clients)
            );
        }
        _ => {
            if i.attempted_pairs > 0 {
                let mut first = broke_text(s);
                first[..1].make_ascii_uppercase();
                let _ = write!(o, "{first} ");
            }
            let _ = write!(
                o,
                "No quantitative token claim for suite {} against {}: {}.",
                s.suite,
                if s.provider.is_empty() {
                    "any provider"
                } else {
                    s.provider.as_str()
                },
                outcome.unmet.join("; ")
            );
            if let Some(v) = s.median {
                let (mag, dir) = fewer_or_more(v);
                let _ = write!(
                    o,
                    " The median pair used {mag} {dir} total tokens through the gate ({counts}): a preliminary result, not a claim."
                );
            }
        }
    }
    if i.attempted_pairs > 0 {
        o.push_str(&failures_text(s));
    }
    o
}
