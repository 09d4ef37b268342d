//! The economics benchmark: bootstrap, pair statuses, the publication rule, the query, and
//! the summary over the committed corpus evidence.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;
use tokensaver::economics::model::*;
use tokensaver::economics::stats::{cluster_bootstrap, median};
use tokensaver::economics::{self, evaluate_rule, make_pair, RuleInputs};

const DIR: &str = "corpus/economics";
const RESAMPLES: u32 = 2_000;

fn dir() -> &'static Path {
    Path::new(DIR)
}

fn now_for(l: &economics::Loaded) -> u64 {
    l.evidence
        .iter()
        .map(|e| e.recorded_at_unix_ms)
        .max()
        .unwrap()
        + 86_400_000
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

#[test]
fn bootstrap_is_reproducible_and_correct_on_a_tiny_case() {
    let clusters = vec![vec![0.1, 0.2], vec![0.4], vec![0.3, 0.35, 0.5]];
    let a = cluster_bootstrap(&clusters, median, 10_000, 42, 9500).unwrap();
    let b = cluster_bootstrap(&clusters, median, 10_000, 42, 9500).unwrap();
    assert_eq!(a, b, "same seed, same interval");
    // Two clusters {0} and {1}, mean: a resample's mean is 0, 0.5 or 1 with probability
    // 1/4, 1/2, 1/4, so the 2.5th percentile is 0 and the 97.5th is 1.
    let two = vec![vec![0.0], vec![1.0]];
    assert_eq!(
        cluster_bootstrap(&two, mean, 10_000, 7, 9500),
        Some((0.0, 1.0))
    );
    // A 40% interval lies inside {0.5}: the middle half of the mass.
    assert_eq!(
        cluster_bootstrap(&two, mean, 10_000, 7, 4000),
        Some((0.5, 0.5))
    );
    assert_eq!(cluster_bootstrap::<f64>(&[], mean, 100, 1, 9500), None);
}

#[test]
fn bootstrap_resamples_whole_clusters() {
    // Repetitions of one task travel together: two identical-value clusters of unequal size
    // can only produce pooled means from whole-cluster mixtures.
    let clusters = vec![vec![0.0, 0.0, 0.0], vec![1.0]];
    let (lo, hi) = cluster_bootstrap(&clusters, mean, 5_000, 3, 10_000).unwrap();
    assert_eq!((lo, hi), (0.0, 1.0));
    let allowed = [0.0, 0.25, 1.0];
    let m = |v: &[f64]| {
        let x = mean(v).unwrap();
        assert!(allowed.iter().any(|a| (a - x).abs() < 1e-12), "{x}");
        Some(x)
    };
    cluster_bootstrap(&clusters, m, 1_000, 9, 9500).unwrap();
}

fn run(arm: &str, steps: Vec<StepRecord>) -> RunRecord {
    RunRecord {
        id: format!("t--{arm}--r1"),
        task: "t".into(),
        category: "bugfix".into(),
        model: "gpt-4o".into(),
        arm: arm.into(),
        variant: arm.into(),
        repetition: 1,
        session_digest: "d".into(),
        steps,
    }
}

fn step(i: usize, needed: bool, answered: bool, verdict: Option<&str>, total: u64) -> StepRecord {
    let usage = StepUsage {
        input_uncached: total.saturating_sub(10),
        cache_write: 0,
        cache_read: 0,
        output: 10,
    };
    let served = verdict == Some("SERVE");
    StepRecord {
        index: i,
        needed,
        status: if answered { 200 } else { 429 },
        answered,
        verdict: verdict.map(str::to_string),
        usage: (answered && !served).then(|| usage.clone()),
        served_usage: served.then_some(usage),
        model_reported: None,
        findings: vec![],
    }
}

fn pair(c: Option<&RunRecord>, t: Option<&RunRecord>) -> EconomicsPair {
    make_pair("s", "t", "bugfix", "gpt-4o", 1, c, t)
}

#[test]
fn pair_statuses() {
    let c = run(
        "control",
        vec![
            step(0, true, true, None, 100),
            step(1, true, true, None, 100),
        ],
    );
    // Treatment: the repeat was served (0 bought tokens).
    let t = run(
        "treatment",
        vec![
            step(0, true, true, Some("ALLOW"), 100),
            step(1, true, true, Some("SERVE"), 100),
        ],
    );
    let p = pair(Some(&c), Some(&t));
    assert_eq!(p.status, EconomicsPairStatus::Valid);
    assert_eq!(p.token_reduction, Some(0.5));
    assert_eq!(p.tokens_not_bought, Some(100));
    assert_eq!(p.treatment_usage.as_ref().unwrap().requests, 1);

    // A BLOCK on a step the task needs fails the treatment's success gate...
    let tb = run(
        "treatment",
        vec![
            step(0, true, true, Some("ALLOW"), 100),
            step(1, true, false, Some("BLOCK"), 0),
        ],
    );
    let p = pair(Some(&c), Some(&tb));
    assert_eq!(p.status, EconomicsPairStatus::TreatmentFailed);
    assert!(p.token_reduction.is_none());
    // ...but not on a retry it does not need.
    let tr = run(
        "treatment",
        vec![
            step(0, true, true, Some("ALLOW"), 100),
            step(1, false, false, Some("BLOCK"), 0),
        ],
    );
    assert_eq!(pair(Some(&c), Some(&tr)).status, EconomicsPairStatus::Valid);

    let cf = run(
        "control",
        vec![
            step(0, true, false, None, 0),
            step(1, true, true, None, 100),
        ],
    );
    assert_eq!(
        pair(Some(&cf), Some(&t)).status,
        EconomicsPairStatus::ControlFailed
    );
    assert_eq!(
        pair(Some(&cf), Some(&tb)).status,
        EconomicsPairStatus::BothFailed
    );

    let mut other = t.clone();
    other.session_digest = "e".into();
    let p = pair(Some(&c), Some(&other));
    assert_eq!(p.status, EconomicsPairStatus::Incomparable);
    let mut other = t.clone();
    other.model = "claude-sonnet-4-5".into();
    assert_eq!(
        pair(Some(&c), Some(&other)).status,
        EconomicsPairStatus::Incomparable
    );

    let mut nousage = t.clone();
    nousage.steps[0].usage = None;
    assert_eq!(
        pair(Some(&c), Some(&nousage)).status,
        EconomicsPairStatus::UsageUnavailable
    );

    let p = pair(Some(&c), None);
    assert_eq!(p.status, EconomicsPairStatus::Missing);
    assert!(p.token_reduction.is_none());
}

fn policy() -> EconomicsPublicationPolicy {
    serde_json::from_value(json!({
        "min_valid_pairs": 6, "min_tasks": 3, "min_categories": 2, "min_pairs_per_category": 2,
        "min_repetitions": 2, "min_valid_pair_rate_bp": 8000, "max_interval_width_bp": 3000,
        "interval_excludes_zero": true, "require_current": true, "freshness_window_days": 30
    }))
    .unwrap()
}

fn good_inputs() -> RuleInputs {
    RuleInputs {
        valid_pairs: 6,
        attempted_pairs: 6,
        tasks_with_valid_pairs: 3,
        category_pairs: BTreeMap::from([("a".into(), 4), ("b".into(), 2)]),
        min_repetitions: 2,
        interval: Some((0.10, 0.30)),
        freshness: Some(EconomicsFreshness::Current),
    }
}

#[test]
fn publication_rule_both_ways() {
    let rule = policy();
    let ok = evaluate_rule(&rule, &good_inputs());
    assert!(ok.publishable && ok.unmet.is_empty());
    let s = economics::verdict_statement("s", &ok, Some(0.2), &good_inputs(), 9500);
    assert!(s.starts_with("Through the gate"), "{s}");
    assert!(
        s.contains("20.0% fewer") && s.contains("10.0% to 30.0%"),
        "{s}"
    );

    let mut bad = good_inputs();
    bad.valid_pairs = 4;
    bad.interval = Some((-0.05, 0.30));
    bad.freshness = Some(EconomicsFreshness::Stale);
    let no = evaluate_rule(&rule, &bad);
    assert!(!no.publishable);
    assert!(no
        .unmet
        .iter()
        .any(|u| u.starts_with("min_valid_pairs: 4 < 6")));
    assert!(no
        .unmet
        .iter()
        .any(|u| u.starts_with("interval_excludes_zero")));
    assert!(no
        .unmet
        .iter()
        .any(|u| u.starts_with("max_interval_width_bp")));
    assert!(no.unmet.iter().any(|u| u.starts_with("require_current")));
    assert!(no
        .unmet
        .iter()
        .any(|u| u.starts_with("min_valid_pair_rate_bp")));
    let s = economics::verdict_statement("s", &no, Some(0.2), &bad, 9500);
    assert!(s.starts_with("No quantitative token claim"), "{s}");
    for u in &no.unmet {
        assert!(
            s.contains(u.as_str()),
            "every unmet threshold is named: {u}"
        );
    }

    // A rule without a threshold is refused: no defaults.
    let mut lax = serde_json::to_value(&rule).unwrap();
    lax.as_object_mut().unwrap().remove("require_current");
    assert!(serde_json::from_value::<EconomicsPublicationPolicy>(lax).is_err());
}

#[test]
fn unknown_query_field_refused() {
    let all: EconomicsQuery = serde_json::from_value(json!({})).unwrap();
    assert_eq!(all, EconomicsQuery::default());
    let q: EconomicsQuery =
        serde_json::from_value(json!({"suite": "agent-sessions", "category": "bugfix"})).unwrap();
    assert_eq!(q.category.as_deref(), Some("bugfix"));
    assert!(serde_json::from_value::<EconomicsQuery>(json!({"suites": "x"})).is_err());
    assert!(serde_json::from_value::<EconomicsQuery>(json!({"limit": 3})).is_err());
}

#[test]
fn class_order_and_weakest() {
    use EconomicsClass::*;
    assert!(Observed < Counted && Counted < Derived && Derived < Estimated);
    assert!(Estimated < Counterfactual);
    assert_eq!(
        EconomicsClass::weakest(&[Observed, Derived, Counted]),
        Some(Derived)
    );
    assert_eq!(
        serde_json::to_value(Counterfactual).unwrap(),
        "counterfactual"
    );
}

#[test]
fn summary_over_the_committed_evidence() {
    let loaded = economics::load(dir());
    assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
    assert!(loaded.sessions.len() >= 6);
    let now = now_for(&loaded);
    let s = economics::summarize(&loaded, &EconomicsQuery::default(), now, Some(RESAMPLES));
    assert!(s.present);
    assert_eq!(s.primary_metric.as_deref(), Some("token_reduction"));
    let live = s.suites.iter().find(|v| v.kind == "live").unwrap();
    assert_eq!(live.freshness, EconomicsFreshness::Current);
    let c = &live.pairs;
    assert_eq!(c.declared, loaded.sessions.len() * 3);
    assert_eq!(
        c.valid + c.control_failed + c.treatment_failed + c.both_failed + c.other,
        c.attempted
    );
    assert_eq!(s.pairs.len(), c.declared);
    let categories: std::collections::BTreeSet<_> =
        s.pairs.iter().map(|p| p.category.as_str()).collect();
    assert!(categories.len() >= 2);

    // The verdict sentence matches the rule's outcome.
    let tr = s
        .metrics
        .iter()
        .find(|m| m.id == "token_reduction")
        .unwrap();
    let i = tr.interval.as_ref().unwrap();
    assert_eq!(i.resamples, RESAMPLES);
    let rule = s.publication.as_ref().unwrap();
    let reevaluated = evaluate_rule(
        rule,
        &RuleInputs {
            valid_pairs: c.valid,
            attempted_pairs: c.attempted,
            tasks_with_valid_pairs: s
                .pairs
                .iter()
                .filter(|p| p.status == EconomicsPairStatus::Valid)
                .map(|p| p.task.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            category_pairs: s
                .segments
                .iter()
                .filter(|g| g.dimension == "category")
                .map(|g| (g.value.clone(), g.n))
                .collect(),
            min_repetitions: 3,
            interval: Some((i.low, i.high)),
            freshness: Some(live.freshness),
        },
    );
    assert_eq!(s.verdict.publishable, reevaluated.publishable);
    assert_eq!(s.verdict.unmet, reevaluated.unmet);
    if s.verdict.publishable {
        assert_eq!(tr.status, EconomicsMetricStatus::Verified);
        assert!(s.verdict.statement.starts_with("Through the gate"));
    } else {
        assert_eq!(tr.status, EconomicsMetricStatus::Preliminary);
        assert!(s
            .verdict
            .statement
            .starts_with("No quantitative token claim"));
    }
    let v = tr.value.unwrap();
    assert!(s
        .verdict
        .statement
        .contains(&format!("{:.1}%", v.abs() * 100.0)));

    // Context and total-token reduction: separate metrics, separate classes, never merged.
    let cr = s
        .metrics
        .iter()
        .find(|m| m.id == "context_reduction")
        .unwrap();
    assert_eq!(cr.status, EconomicsMetricStatus::Measured);
    assert_eq!(cr.class, EconomicsClass::Derived);
    assert_eq!(cr.inputs, Some(EconomicsClass::Counted));
    assert_eq!(tr.inputs, Some(EconomicsClass::Observed));
    assert_ne!(cr.suite, tr.suite);
    let ctx = s.context.as_ref().unwrap();
    assert!(ctx.removable_tokens > 0 && ctx.removable_tokens < ctx.counted_tokens);
    let expected = ctx.removable_tokens as f64 / ctx.counted_tokens as f64;
    assert!((cr.value.unwrap() - expected).abs() < 1e-12);
    assert!(
        !s.verdict.statement.contains("context"),
        "the verdict is about total tokens only"
    );
    assert_eq!(
        s.metrics
            .iter()
            .filter(|m| m.id.contains("reduction") && m.suite == cr.suite)
            .count(),
        1
    );

    // Same input, same output (the bootstrap is seeded).
    let again = economics::summarize(&loaded, &EconomicsQuery::default(), now, Some(RESAMPLES));
    assert_eq!(s, again);
    assert!(economics::render_text(&s).contains(&s.verdict.statement));
}

#[test]
fn narrowed_and_stale_views() {
    let loaded = economics::load(dir());
    let now = now_for(&loaded);
    let q = EconomicsQuery {
        category: Some("bugfix".into()),
        ..Default::default()
    };
    let all = economics::summarize(&loaded, &EconomicsQuery::default(), now, Some(200));
    let s = economics::summarize(&loaded, &q, now, Some(200));
    assert!(s.pairs.iter().all(|p| p.category == "bugfix"));
    assert_eq!(
        s.verdict, all.verdict,
        "the verdict is about all the evidence"
    );
    let tr = s
        .metrics
        .iter()
        .find(|m| m.id == "token_reduction")
        .unwrap();
    assert_ne!(
        tr.status,
        EconomicsMetricStatus::Verified,
        "a narrowed metric is never verified"
    );

    // Past the freshness window the evidence is stale and the rule cannot be met.
    let later = now + 60 * 86_400_000;
    let st = economics::summarize(&loaded, &EconomicsQuery::default(), later, Some(200));
    let live = st.suites.iter().find(|v| v.kind == "live").unwrap();
    assert_eq!(live.freshness, EconomicsFreshness::Stale);
    assert!(!st.verdict.publishable);
    assert!(st
        .verdict
        .unmet
        .iter()
        .any(|u| u.starts_with("require_current")));

    // Evidence under another methodology version is incompatible and not used.
    let mut other = loaded.clone();
    for e in &mut other.evidence {
        e.methodology += 1;
    }
    let inc = economics::summarize(&other, &EconomicsQuery::default(), now, Some(200));
    let live = inc.suites.iter().find(|v| v.kind == "live").unwrap();
    assert_eq!(live.freshness, EconomicsFreshness::Incompatible);
    assert!(inc
        .pairs
        .iter()
        .all(|p| p.status == EconomicsPairStatus::Missing));
    assert!(!inc.verdict.publishable);
}

#[test]
fn no_methodology_is_said_plainly() {
    let tmp = tempfile::tempdir().unwrap();
    let s = economics::summary(tmp.path(), &EconomicsQuery::default(), 0);
    assert!(!s.present);
    assert_eq!(s.verdict.statement, "No methodology is declared.");
    let json = serde_json::to_value(&s).unwrap();
    assert!(json.get("methodology").is_none());
}
