//! The economics benchmark: bootstrap, pair statuses, the publication rule and its floor, the
//! statement (a simulation says so first), freshness (build, gate config, task files,
//! methodology), history, and the summary over the committed evidence.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use tokensaver::config::Config;
use tokensaver::economics::model::*;
use tokensaver::economics::stats::{cluster_bootstrap, median};
use tokensaver::economics::{
    self, evaluate_rule, identity, make_pair, Current, GateConfigInForce, PairKey, RuleInputs,
    FLOOR, SIMULATION_LABEL,
};

const DIR: &str = "corpus/economics";
const RESAMPLES: u32 = 500;

fn dir() -> &'static Path {
    Path::new(DIR)
}

fn config() -> Config {
    Config::load(Path::new("config/tokensaver.toml")).unwrap()
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

// ------------------------------------------------------------------------------ bootstrap

#[test]
fn bootstrap_is_reproducible_and_correct_on_a_tiny_case() {
    let clusters = vec![vec![0.1, 0.2], vec![0.4], vec![0.3, 0.35, 0.5]];
    let a = cluster_bootstrap(&clusters, median, 10_000, 42, 9500).unwrap();
    let b = cluster_bootstrap(&clusters, median, 10_000, 42, 9500).unwrap();
    assert_eq!(a, b, "same seed, same interval");
    let two = vec![vec![0.0], vec![1.0]];
    assert_eq!(
        cluster_bootstrap(&two, mean, 10_000, 7, 9500),
        Some((0.0, 1.0))
    );
    assert_eq!(
        cluster_bootstrap(&two, mean, 10_000, 7, 4000),
        Some((0.5, 0.5))
    );
    assert_eq!(cluster_bootstrap::<f64>(&[], mean, 100, 1, 9500), None);
}

#[test]
fn bootstrap_resamples_whole_clusters() {
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

// ------------------------------------------------------------------------------ runs, pairs

fn usage(total: u64) -> StepUsage {
    StepUsage {
        input_uncached: total.saturating_sub(10),
        cache_write: 0,
        cache_read: 0,
        output: total.min(10),
        ..Default::default()
    }
}

fn step(i: usize, session: u32, verdict: Option<&str>, status: u16, total: u64) -> StepRecord {
    StepRecord {
        index: i,
        session,
        path: "/v1/messages".into(),
        status,
        verdict: verdict.map(str::to_string),
        reason: match verdict {
            Some("BLOCK") => Some("runaway_loop_unattended".into()),
            Some("SERVE") => Some("answer_held".into()),
            Some(_) => Some("allowed".into()),
            None => None,
        },
        findings: vec![],
        paced_ms: None,
        usage: (status == 200).then(|| usage(total)),
        tool_calls: 1,
        model_requested: Some("claude-sonnet-5-5".into()),
        model_reported: Some("claude-sonnet-5-5".into()),
        context: None,
        at_ms: None,
        round_trip_ms: None,
        digest: None,
    }
}

fn bought(session: u32, total: u64) -> BoughtCall {
    BoughtCall {
        session,
        path: "/v1/messages".into(),
        status: 200,
        usage: Some(usage(total)),
        model: Some("claude-sonnet-5-5".into()),
        cost_nano_usd: Some(total * 3),
    }
}

/// A run of `task` by `client` at `rep`: `steps` (verdict, status, tokens) per session, the
/// calls with status 200 and no SERVE bought.
fn run(
    task: &str,
    client: &str,
    arm: &str,
    rep: u32,
    passed: bool,
    sessions: &[&[(Option<&str>, u16, u64)]],
) -> RunRecord {
    let mut steps = Vec::new();
    let mut buy = Vec::new();
    for (s, list) in sessions.iter().enumerate() {
        for &(v, status, total) in list.iter() {
            steps.push(step(steps.len(), s as u32, v, status, total));
            if status == 200 && v != Some("SERVE") {
                buy.push(bought(s as u32, total));
            }
        }
    }
    RunRecord {
        id: format!("{task}--{client}--r{rep}--{arm}"),
        pair: economics::pair_id(task, client, rep),
        task: task.into(),
        category: "bugfix".into(),
        client: client.into(),
        model: "claude-sonnet-5-5".into(),
        arm: arm.into(),
        variant: if arm == "control" { "direct" } else { "gate" }.into(),
        repetition: rep,
        seed: u64::from(rep),
        order: 1,
        task_digest: "d".into(),
        started_at_unix_ms: 0,
        seconds: 1.0,
        sessions: (0..sessions.len() as u32)
            .map(|i| SessionRecord {
                index: i,
                exit_code: 0,
                seconds: 1.0,
                output_tail: String::new(),
            })
            .collect(),
        check: CheckRecord {
            passed,
            exit_code: if passed { 0 } else { 1 },
            output: if passed { "OK" } else { "FAILED" }.into(),
        },
        steps,
        bought: buy,
    }
}

fn key(sessions: u32) -> PairKey<'static> {
    PairKey {
        suite: "s",
        task: "t",
        category: "bugfix",
        client: "claude-code",
        model: "claude-sonnet-5-5",
        sessions,
        repetition: 1,
    }
}

#[test]
fn pair_statuses_and_fields() {
    let ok = Some("ALLOW");
    let c = run(
        "t",
        "claude-code",
        "control",
        1,
        true,
        &[&[(None, 200, 100), (None, 200, 100)]],
    );
    let t = run(
        "t",
        "claude-code",
        "treatment",
        1,
        true,
        &[&[(ok, 200, 100), (Some("SERVE"), 200, 100)]],
    );
    let p = make_pair(&key(1), Some(&c), Some(&t));
    assert_eq!(p.status, EconomicsPairStatus::Valid);
    assert_eq!(p.token_reduction, Some(0.5));
    assert_eq!(p.request_reduction, Some(0.5));
    assert_eq!(p.cost_reduction, Some(0.5), "cost at the recorded prices");
    assert_eq!(
        p.tool_call_reduction,
        Some(0.0),
        "a served answer's tool call still runs"
    );
    assert_eq!(p.tokens_not_bought, Some(100));
    assert_eq!(p.first_request_overhead, Some(0));
    assert_eq!(
        p.continuation_reduction, None,
        "one session: no continuation"
    );
    assert_eq!(p.succeeded, Some([true, true]));

    // Two sessions: the continuation is the last session's tokens.
    let c2 = run(
        "t",
        "claude-code",
        "control",
        1,
        true,
        &[&[(None, 200, 100)], &[(None, 200, 100)]],
    );
    let t2 = run(
        "t",
        "claude-code",
        "treatment",
        1,
        true,
        &[&[(ok, 200, 100)], &[(Some("SERVE"), 200, 100)]],
    );
    let p = make_pair(&key(2), Some(&c2), Some(&t2));
    assert_eq!(p.continuation_reduction, Some(1.0));

    // The treatment's task failed its check: the gate refused a step it needed.
    let tb = run(
        "t",
        "claude-code",
        "treatment",
        1,
        false,
        &[&[(ok, 200, 100), (Some("BLOCK"), 429, 0)]],
    );
    let p = make_pair(&key(1), Some(&c), Some(&tb));
    assert_eq!(p.status, EconomicsPairStatus::TreatmentFailed);
    assert!(p.token_reduction.is_none());
    assert_eq!(
        p.refusals,
        vec!["1× BLOCK (runaway_loop_unattended)".to_string()]
    );
    assert!(
        p.reasons[0].contains("treatment failed its task's check"),
        "{:?}",
        p.reasons
    );
    // A refused request the task did not need: judged by the check, not by the status.
    let tr = run(
        "t",
        "claude-code",
        "treatment",
        1,
        true,
        &[&[(ok, 200, 100), (Some("BLOCK"), 429, 0)]],
    );
    assert_eq!(
        make_pair(&key(1), Some(&c), Some(&tr)).status,
        EconomicsPairStatus::Valid
    );

    let cf = run(
        "t",
        "claude-code",
        "control",
        1,
        false,
        &[&[(None, 200, 100)]],
    );
    assert_eq!(
        make_pair(&key(1), Some(&cf), Some(&t)).status,
        EconomicsPairStatus::ControlFailed
    );
    assert_eq!(
        make_pair(&key(1), Some(&cf), Some(&tb)).status,
        EconomicsPairStatus::BothFailed
    );

    let mut other = t.clone();
    other.task_digest = "e".into();
    assert_eq!(
        make_pair(&key(1), Some(&c), Some(&other)).status,
        EconomicsPairStatus::Incomparable
    );
    let mut other = t.clone();
    other.seed = 9;
    assert_eq!(
        make_pair(&key(1), Some(&c), Some(&other)).status,
        EconomicsPairStatus::Incomparable
    );

    let mut nousage = t.clone();
    nousage.bought[0].usage = None;
    assert_eq!(
        make_pair(&key(1), Some(&c), Some(&nousage)).status,
        EconomicsPairStatus::UsageUnavailable
    );
    let p = make_pair(&key(1), Some(&c), None);
    assert_eq!(p.status, EconomicsPairStatus::Missing);
}

#[test]
fn tokens_per_success_counts_failed_runs() {
    use tokensaver::economics::pairs::per_success_reduction;
    // Two successes each way at 100 tokens; a runaway both arms failed: 1 000 tokens bought
    // without the gate, 300 with it.
    let rows = [
        (100.0, true, 100.0, true),
        (100.0, true, 100.0, true),
        (1000.0, false, 300.0, false),
    ];
    let r = per_success_reduction(&rows).unwrap();
    assert!((r - (1.0 - 250.0 / 600.0)).abs() < 1e-12, "{r}");
    // A task the gate broke costs its tokens and a success.
    let broken = [(100.0, true, 100.0, true), (100.0, true, 60.0, false)];
    let r = per_success_reduction(&broken).unwrap();
    assert!(r < 0.0, "the gate's arm paid more per success: {r}");
    assert_eq!(per_success_reduction(&[(100.0, true, 100.0, false)]), None);
    // Weighed alike, the runaway's tenfold tokens count as one task's: in units of its mean
    // control run, 1.0 and 0.3 against the others' 1.0 and 1.0.
    use tokensaver::economics::pairs::weigh_tasks_equally;
    let mut alike = weigh_tasks_equally(&[(100, true, 100, true), (100, true, 100, true)]);
    alike.extend(weigh_tasks_equally(&[(1000, false, 300, false)]));
    let r = per_success_reduction(&alike).unwrap();
    assert!((r - (1.0 - (2.3 / 2.0) / (3.0 / 2.0))).abs() < 1e-12, "{r}");
}

// ------------------------------------------------------------------------------ rule, statement

fn good_inputs() -> RuleInputs {
    RuleInputs {
        valid_pairs: 36,
        attempted_pairs: 40,
        treatment_failed_pairs: 1,
        tasks_with_valid_pairs: 6,
        category_pairs: BTreeMap::from([
            ("a".into(), 9),
            ("b".into(), 9),
            ("c".into(), 9),
            ("d".into(), 9),
        ]),
        min_repetitions: 3,
        interval: Some((0.10, 0.25)),
        freshness: Some(EconomicsFreshness::Current),
        simulated: false,
        // 38 of 40 succeed both ways (1 failed under the gate, 1 without it).
        control_successes: 38,
        treatment_successes: 38,
    }
}

#[test]
fn the_rule_is_never_looser_than_the_seeds() {
    let mut lax = FLOOR.clone();
    lax.min_valid_pairs = 5;
    lax.min_categories = 1;
    lax.max_interval_width_bp = 9000;
    lax.require_current = false;
    let (rule, raised) = economics::effective_rule(&lax);
    assert_eq!(rule, FLOOR);
    assert_eq!(raised.len(), 4, "{raised:?}");
    assert!(raised
        .iter()
        .any(|r| r == "min_valid_pairs: 5 is below the seed's 30; 30 applies"));
    // A threshold the seed does not have is named as this project's.
    let mut failing = FLOOR.clone();
    failing.max_treatment_failed_rate_bp = 1000;
    let (_, raised) = economics::effective_rule(&failing);
    assert_eq!(
        raised,
        ["max_treatment_failed_rate_bp: 1000 is looser than this project's 500; 500 applies"]
    );
    let ok = evaluate_rule(&rule, &good_inputs());
    assert!(ok.publishable && ok.unmet.is_empty(), "{:?}", ok.unmet);
    let mut thin = good_inputs();
    thin.valid_pairs = 20;
    thin.category_pairs = BTreeMap::from([("a".into(), 10), ("b".into(), 10)]);
    let no = evaluate_rule(&rule, &thin);
    assert!(no
        .unmet
        .iter()
        .any(|u| u.starts_with("min_valid_pairs: 20 < 30")));
    assert!(no
        .unmet
        .iter()
        .any(|u| u.starts_with("min_categories: 2 < 4")));
    // Success through the gate at most 2 points worse than without it (of 100 attempted
    // pairs: 88 against 90 is allowed, 87 is not).
    let inferior = |control: usize, treatment: usize| {
        let mut i = good_inputs();
        (
            i.attempted_pairs,
            i.control_successes,
            i.treatment_successes,
        ) = (100, control, treatment);
        evaluate_rule(&rule, &i)
            .unmet
            .into_iter()
            .find(|u| u.starts_with("non_inferiority: "))
    };
    assert_eq!(inferior(90, 88), None);
    assert_eq!(inferior(90, 95), None);
    let unmet = inferior(90, 87).expect("2.5 points worse is refused");
    assert!(unmet.contains("8700 bp < without it 9000 bp"), "{unmet}");
    // A rule without a threshold is refused: no defaults.
    let mut v = serde_json::to_value(&FLOOR).unwrap();
    v.as_object_mut().unwrap().remove("require_current");
    assert!(serde_json::from_value::<EconomicsPublicationPolicy>(v).is_err());
}

fn statement_inputs(simulated: bool) -> economics::StatementInputs {
    economics::StatementInputs {
        suite: "agent-sessions".into(),
        simulated,
        provider: "a real provider named by the user (https://api.example.test)".into(),
        clients: vec![ClientInfo {
            id: "claude-code".into(),
            program: "Claude Code".into(),
            version: "2.1.332".into(),
            model: "claude-sonnet-5-5".into(),
        }],
        level_bp: 9500,
        median: Some(0.18),
        rule: RuleInputs {
            simulated,
            ..good_inputs()
        },
        tasks: 6,
        categories: 4,
        failed_under_gate: vec!["poll-export-job (claude-code r1)".into()],
        failed_in_both: vec!["runaway-migration (3 pairs)".into()],
        per_success: Some(0.3),
        per_success_interval: Some((0.1, 0.4)),
        per_success_range: Some((
            0.05,
            "runaway-migration".into(),
            0.35,
            "poll-export-job".into(),
        )),
        successes: (34, 33, 40),
        cost_median: Some(0.2),
        cost_interval: Some((0.1, 0.3)),
    }
}

#[test]
fn a_simulation_says_so_first_and_never_reads_as_a_real_result() {
    // Every threshold met, current evidence: only the provider is a simulation.
    let s = statement_inputs(true);
    let outcome = evaluate_rule(&FLOOR, &s.rule);
    assert!(!outcome.publishable, "a simulation is never publishable");
    assert!(outcome.unmet[0].starts_with("provider: recorded against a scripted provider"));
    let text = economics::verdict_statement(&s, &outcome);
    assert!(text.starts_with(SIMULATION_LABEL), "{text}");
    assert!(
        text.starts_with("In a simulation against a scripted provider, "),
        "{text}"
    );
    for real in [
        "Against ",
        "Through the gate, the median agent task",
        "verified claim:",
    ] {
        assert!(
            !text.contains(real),
            "reads as a real-provider result ({real}): {text}"
        );
    }
    assert!(text.contains("never a verified claim"), "{text}");
    assert!(
        text.contains("36 valid of 40 attempted pairs over 6 tasks"),
        "{text}"
    );
    assert!(
        text.contains("poll-export-job (claude-code r1)"),
        "names the tasks the gate failed: {text}"
    );
    // What the gate broke comes first, right after the simulation's label.
    assert!(
        text.starts_with(&format!(
            "{SIMULATION_LABEL} tasks that succeeded without the gate failed through it: poll-export-job"
        )),
        "{text}"
    );
    // Cost with its interval; the per-success figure with its interval and its range.
    assert!(
        text.contains("cost 20.0% less through the gate (95% interval 10.0% to 30.0%)"),
        "{text}"
    );
    assert!(
        text.contains("(95% interval 10.0% to 40.0%; 5.0% without runaway-migration to 35.0% without poll-export-job, leaving one task out;"),
        "{text}"
    );
    assert!(
        text.contains("Claude Code 2.1.332"),
        "names the clients: {text}"
    );
    // The same numbers from a real provider are a claim, worded as one.
    let r = statement_inputs(false);
    let outcome = evaluate_rule(&FLOOR, &r.rule);
    assert!(outcome.publishable, "{:?}", outcome.unmet);
    let text = economics::verdict_statement(&r, &outcome);
    assert!(text.starts_with("Against a real provider"), "{text}");
    assert!(!text.contains("simulation"), "{text}");
}

#[test]
fn unknown_query_field_refused() {
    let all: EconomicsQuery = serde_json::from_value(json!({})).unwrap();
    assert_eq!(all, EconomicsQuery::default());
    let q: EconomicsQuery =
        serde_json::from_value(json!({"suite": "agent-sessions", "category": "bugfix"})).unwrap();
    assert_eq!(q.category.as_deref(), Some("bugfix"));
    assert!(serde_json::from_value::<EconomicsQuery>(json!({"suites": "x"})).is_err());
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
}

// ------------------------------------------------------------------------------ freshness

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// A copy of the corpus (methodology and tasks, no evidence) with one evidence file recorded
/// "now" by this build with the example config: current, until something changes.
fn fresh_copy() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("economics");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(dir().join("methodology.json"), d.join("methodology.json")).unwrap();
    copy_dir(&dir().join("tasks"), &d.join("tasks"));
    let loaded = economics::load(&d);
    assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
    let m = loaded.methodology.clone().unwrap();
    let mut runs = Vec::new();
    for (task, (t, digest)) in loaded.tasks_of("healthy-work") {
        for client in &t.clients {
            for arm in ["control", "treatment"] {
                let mut r = run(
                    task,
                    client,
                    arm,
                    1,
                    true,
                    &[&[(
                        if arm == "control" {
                            None
                        } else {
                            Some("ALLOW")
                        },
                        200,
                        1000,
                    )]],
                );
                r.category = t.category.clone();
                r.task_digest = digest.clone();
                runs.push(r);
            }
        }
    }
    let ev = EvidenceFile {
        format: economics::EVIDENCE_FORMAT,
        suite: "healthy-work".into(),
        methodology: m.version,
        methodology_blake3: loaded.methodology_blake3.clone().unwrap(),
        recorded_at_unix_ms: 1_000,
        build: identity::build(None),
        gate_config_blake3: identity::gate_policy_blake3(&config(), &m.treatment_key).unwrap(),
        provider: ProviderInfo {
            kind: ProviderKind::Simulated,
            name: "tokensaver mock-provider".into(),
            upstream: "127.0.0.1".into(),
            usage_counting: economics::SIMULATED_USAGE_COUNTING.into(),
        },
        clients: vec![],
        harness: HarnessInfo {
            path: "scripts/economics_harness.py".into(),
            version: "2".into(),
            blake3: "h".into(),
        },
        tasks: loaded
            .tasks_of("healthy-work")
            .map(|(k, (_, d))| (k.clone(), d.clone()))
            .collect(),
        repetitions: 1,
        tokenizer: economics::context_tokenizer(),
        runs,
    };
    let ev_dir = d.join("evidence/healthy-work");
    std::fs::create_dir_all(&ev_dir).unwrap();
    std::fs::write(ev_dir.join("a.json"), serde_json::to_vec(&ev).unwrap()).unwrap();
    (tmp, d)
}

const NOW: u64 = 2_000;

/// The summary of an economics directory at `NOW`, against `current`.
fn summary_at_now(dir: &Path, current: &Current<'_>) -> EconomicsSummary {
    economics::summarize(
        &economics::load(dir),
        &EconomicsQuery::default(),
        NOW,
        current,
        Some(50),
    )
}

fn live(dir: &Path, current: &Current<'_>) -> EconomicsSuiteView {
    let s = summary_at_now(dir, current);
    s.suites
        .into_iter()
        .find(|v| v.kind == SuiteKind::Live)
        .unwrap()
}

#[test]
fn fresh_evidence_is_current() {
    let (_tmp, d) = fresh_copy();
    let c = config();
    let v = live(&d, &economics::this_build(Some(&c)));
    assert_eq!(
        v.freshness,
        EconomicsFreshness::Current,
        "{:?}",
        v.stale_reasons
    );
}

#[test]
fn stale_when_the_gate_config_changes() {
    let (_tmp, d) = fresh_copy();
    let mut c = config();
    c.gate.bands.challenge -= 0.05;
    let v = live(&d, &economics::this_build(Some(&c)));
    assert_eq!(v.freshness, EconomicsFreshness::Stale);
    assert!(
        v.stale_reasons
            .iter()
            .any(|r| r.starts_with("recorded with gate config")),
        "{:?}",
        v.stale_reasons
    );
    let v = live(&d, &economics::this_build(None));
    assert!(v
        .stale_reasons
        .iter()
        .any(|r| r.contains("no gate config in force")));
}

/// Evidence made with other client versions than the project pins, against a built-in provider
/// that counted or billed otherwise, or with its context counted by another tokenizer, is
/// stale, each for its own reason.
#[test]
fn stale_when_the_clients_the_provider_or_the_tokenizer_changed() {
    let (_tmp, d) = fresh_copy();
    let c = config();
    let file = d.join("evidence/healthy-work/a.json");
    let mut ev: EvidenceFile = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let pinned = economics::pinned_clients();
    assert!(pinned.contains_key("claude-code") && pinned.contains_key("openai-agents"));
    ev.clients = vec![ClientInfo {
        id: "claude-code".into(),
        program: "Claude Code".into(),
        version: "0.0.1".into(),
        model: "claude-sonnet-5-5".into(),
    }];
    ev.provider.usage_counting = "cl100k_base; no prompt caching".into();
    ev.tokenizer.implementation = "another tokenizer".into();
    std::fs::write(&file, serde_json::to_vec(&ev).unwrap()).unwrap();
    let v = live(&d, &economics::this_build(Some(&c)));
    assert_eq!(v.freshness, EconomicsFreshness::Stale);
    assert_eq!(v.stale_reasons.len(), 3, "{:?}", v.stale_reasons);
    assert!(
        v.stale_reasons[0].contains("Claude Code 0.0.1"),
        "{:?}",
        v.stale_reasons
    );
    assert!(
        v.stale_reasons[1].contains("no prompt caching"),
        "{:?}",
        v.stale_reasons
    );
    assert!(
        v.stale_reasons[2].contains("another tokenizer"),
        "{:?}",
        v.stale_reasons
    );
}

#[test]
fn stale_when_the_build_changes() {
    let (_tmp, d) = fresh_copy();
    let c = config();
    let other = "0".repeat(64);
    let v = live(
        &d,
        &Current {
            build: &other,
            ..economics::this_build(Some(&c))
        },
    );
    assert_eq!(v.freshness, EconomicsFreshness::Stale);
    assert_eq!(v.stale_reasons.len(), 1, "{:?}", v.stale_reasons);
    assert!(
        v.stale_reasons[0].starts_with("recorded by build"),
        "{:?}",
        v.stale_reasons
    );
    assert!(v.stale_reasons[0].contains("this build is 000000000000"));
}

#[test]
fn stale_when_a_task_file_changes() {
    let (_tmp, d) = fresh_copy();
    let c = config();
    let f = d.join("tasks/bugfix-vat-rounding/workspace/vat.py");
    let mut text = std::fs::read_to_string(&f).unwrap();
    text.push_str("\n# an edit\n");
    std::fs::write(&f, text).unwrap();
    let v = live(&d, &economics::this_build(Some(&c)));
    assert_eq!(v.freshness, EconomicsFreshness::Stale);
    assert_eq!(v.stale_reasons.len(), 1, "{:?}", v.stale_reasons);
    assert!(
        v.stale_reasons[0].starts_with("task bugfix-vat-rounding changed since it was recorded")
    );
}

#[test]
fn stale_when_the_methodology_changes_and_incompatible_under_a_new_version() {
    let (_tmp, d) = fresh_copy();
    let c = config();
    let path = d.join("methodology.json");
    let original = std::fs::read_to_string(&path).unwrap();
    // Loosening a threshold without a new version: stale, and said so.
    std::fs::write(
        &path,
        original.replace(
            "\"max_interval_width_bp\": 2000",
            "\"max_interval_width_bp\": 1900",
        ),
    )
    .unwrap();
    let v = live(&d, &economics::this_build(Some(&c)));
    assert_eq!(v.freshness, EconomicsFreshness::Stale);
    assert!(
        v.stale_reasons[0].starts_with("methodology.json changed since it was recorded"),
        "{:?}",
        v.stale_reasons
    );
    assert!(v.stale_reasons[0].contains("needs one"));
    // With a new version: another methodology, not comparable at all.
    std::fs::write(
        &path,
        original.replace("\"version\": 4,", "\"version\": 5,"),
    )
    .unwrap();
    let s = summary_at_now(&d, &economics::this_build(Some(&c)));
    let v = s.suites.iter().find(|v| v.kind == SuiteKind::Live).unwrap();
    assert_eq!(v.freshness, EconomicsFreshness::Incompatible);
    assert!(s
        .pairs
        .iter()
        .all(|p| p.status == EconomicsPairStatus::Missing));
}

#[test]
fn history_appends_and_the_latest_is_judged() {
    let (_tmp, d) = fresh_copy();
    let c = config();
    let ev_dir = d.join("evidence/healthy-work");
    let mut ev: EvidenceFile =
        serde_json::from_slice(&std::fs::read(ev_dir.join("a.json")).unwrap()).unwrap();
    ev.recorded_at_unix_ms = 1_500;
    ev.build.source_blake3 = "1".repeat(64);
    std::fs::write(ev_dir.join("b.json"), serde_json::to_vec(&ev).unwrap()).unwrap();
    let s = summary_at_now(&d, &economics::this_build(Some(&c)));
    let files: std::collections::BTreeSet<_> = s.history.iter().map(|h| h.file.as_str()).collect();
    assert_eq!(
        files.len(),
        2,
        "one history line per evidence file: {:?}",
        s.history
    );
    let v = s.suites.iter().find(|v| v.kind == SuiteKind::Live).unwrap();
    assert_eq!(
        v.evidence_file.as_deref(),
        Some("evidence/healthy-work/b.json")
    );
    assert_eq!(
        v.freshness,
        EconomicsFreshness::Stale,
        "the latest file, from another build"
    );
}

/// The two recorded suites stay apart: stuck agents (failing in both arms by design) are
/// reported as what each run bought, per task and client, and never enter healthy work's pairs
/// or its statement. The figures here are worked out from the runs this test writes.
#[test]
fn stuck_agents_are_reported_apart_from_healthy_work() {
    let (_tmp, d) = fresh_copy();
    let c = config();
    let loaded = economics::load(&d);
    let healthy_pairs: usize = loaded
        .tasks_of("healthy-work")
        .map(|(_, (t, _))| t.clients.len())
        .sum();
    let mut ev: EvidenceFile =
        serde_json::from_slice(&std::fs::read(d.join("evidence/healthy-work/a.json")).unwrap())
            .unwrap();
    ev.suite = "stuck-agents".into();
    ev.tasks = loaded
        .tasks_of("stuck-agents")
        .map(|(k, (_, d))| (k.clone(), d.clone()))
        .collect();
    ev.runs.clear();
    // Straight: 40 calls of 1,000 tokens, 10 s. Through the gate: 12 calls, each held 500 ms,
    // then a BLOCK (runaway_step); 90 s. Every run fails its check.
    let mut stuck_rows = 0;
    for (task, (t, digest)) in loaded.tasks_of("stuck-agents") {
        for client in &t.clients {
            stuck_rows += 1;
            for rep in 1..=2 {
                let straight = vec![(None, 200, 1_000); 40];
                let mut gated = vec![(Some("ALLOW"), 200, 1_000); 12];
                gated.push((Some("BLOCK"), 429, 0));
                for (arm, steps, secs) in [("control", straight, 10.0), ("treatment", gated, 90.0)]
                {
                    let mut r = run(task, client, arm, rep, false, &[&steps]);
                    r.category = t.category.clone();
                    r.task_digest = digest.clone();
                    r.seconds = secs;
                    for st in r.steps.iter_mut().filter(|_| arm == "treatment") {
                        match st.verdict.as_deref() {
                            Some("BLOCK") => st.reason = Some("runaway_step".into()),
                            _ => st.paced_ms = Some(500),
                        }
                    }
                    ev.runs.push(r);
                }
            }
        }
    }
    assert!(stuck_rows >= 8, "two stuck tasks, four clients each");
    let stuck_dir = d.join("evidence/stuck-agents");
    std::fs::create_dir_all(&stuck_dir).unwrap();
    std::fs::write(stuck_dir.join("a.json"), serde_json::to_vec(&ev).unwrap()).unwrap();

    let s = summary_at_now(&d, &economics::this_build(Some(&c)));
    let view = |id: &str| s.suites.iter().find(|v| v.id == id).unwrap();
    assert_eq!(view("healthy-work").pairs.attempted, healthy_pairs);
    assert_eq!(view("healthy-work").pairs.both_failed, 0);
    assert_eq!(view("stuck-agents").pairs.both_failed, 2 * stuck_rows);
    assert_eq!(view("stuck-agents").freshness, EconomicsFreshness::Current);
    assert!(
        s.verdict
            .statement
            .contains(&format!("of {healthy_pairs} attempted pairs")),
        "{}",
        s.verdict.statement
    );
    assert!(!s.verdict.statement.contains("Failed in both arms"));
    assert_eq!(s.stuck.len(), stuck_rows);
    for r in &s.stuck {
        assert_eq!((r.control.runs, r.treatment.runs), (2, 2));
        assert_eq!((r.control.calls, r.treatment.calls), (40.0, 12.0));
        assert_eq!(r.treatment.max_calls, 12);
        assert_eq!((r.control.seconds, r.treatment.seconds), (10.0, 90.0));
        // 3 nano-USD a token (the test's price): 120,000 straight, 36,000 through the gate.
        assert_eq!(
            (r.control.cost_nano_usd, r.treatment.cost_nano_usd),
            (120_000.0, 36_000.0)
        );
        assert!((r.cost_reduction.unwrap() - 0.7).abs() < 1e-12);
        assert_eq!(r.stopped, 2);
        assert_eq!(r.paced_seconds, 6.0);
        // Runs of repeats are read from the calls' digests: these runs kept none.
        assert_eq!(r.most_repeat_runs, 0);
    }
    let metric = |id: &str| s.metrics.iter().find(|m| m.id == id).unwrap();
    assert!((metric("stuck_cost_reduction").value.unwrap() - 0.7).abs() < 1e-12);
    assert_eq!(metric("stuck_most_calls_bought").value, Some(12.0));
    assert_eq!(
        metric("stuck_runs_stopped").value,
        Some((2 * stuck_rows) as f64)
    );
    assert_eq!(metric("stuck_cost_reduction").suite, "stuck-agents");
    assert_eq!(metric("token_reduction").suite, "healthy-work");
    // Hypotheses: tested where every metric they name was measured, with the figures.
    let h = |id: &str| s.hypotheses.iter().find(|h| h.id == id).unwrap();
    assert_eq!(h("stuck").status, "tested");
    assert_eq!(h("stuck").figures.len(), 3);
    assert!(
        h("stuck").figures[0].starts_with("stuck_cost_reduction = 70.0%"),
        "{:?}",
        h("stuck").figures
    );
    let text = economics::render_text(&s);
    assert!(text.contains("stuck agents (mean per run"), "{text}");
    assert!(text.contains("70.0% less"), "{text}");
    // Without the stuck suite's evidence the hypothesis stays as the methodology left it.
    std::fs::remove_file(stuck_dir.join("a.json")).unwrap();
    let s = summary_at_now(&d, &economics::this_build(Some(&c)));
    let h = s.hypotheses.iter().find(|h| h.id == "stuck").unwrap();
    assert_eq!((h.status.as_str(), h.figures.len()), ("untested", 0));
    assert!(s.stuck.is_empty());
}

// ------------------------------------------------------------------------------ the corpus

#[test]
fn every_methodology_version_is_pinned() {
    let bytes = std::fs::read(dir().join("methodology.json")).unwrap();
    let m: Methodology = serde_json::from_slice(&bytes).unwrap();
    let pins: BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(dir().join("methodology-versions.json")).unwrap())
            .unwrap();
    let hash = blake3::hash(&bytes).to_hex().to_string();
    assert_eq!(
        pins.get(&m.version.to_string()),
        Some(&hash),
        "methodology.json v{} is not the pinned v{}: any change needs a new version (and a new pin, never an edited one)",
        m.version,
        m.version
    );
}

/// The evidence is recorded with `corpus/economics/recording.toml`: the example config with every
/// window of the gate shortened 60 times (`scripts/economics-record.sh`) and a price for the
/// model Codex runs the simulation on, and nothing else changed.
#[test]
fn the_recording_config_is_the_example_with_every_window_shortened_60_times() {
    let mut recording = Config::load(&dir().join("recording.toml"))
        .unwrap()
        .policy();
    let codex = recording
        .prices
        .remove("gpt-5.5")
        .expect("the simulation prices gpt-5.5");
    assert_eq!(
        (codex.input, codex.cache_read, codex.output),
        (5_000_000, 500_000, 30_000_000)
    );
    let mut expected = config().policy();
    assert!(!expected.prices.contains_key("gpt-5.5"));
    let (w, st) = (&mut expected.gate.windows, &mut expected.gate.steps);
    for secs in [
        &mut w.loop_secs,
        &mut w.burst_secs,
        &mut w.grind_secs,
        &mut st.pace_window_secs,
        &mut st.max_hold_secs,
        &mut st.runaway_after_secs,
    ] {
        assert_eq!(*secs % 60, 0);
        *secs /= 60;
    }
    assert_eq!(recording, expected);
    assert_ne!(recording.gate, config().policy().gate);
}

#[test]
fn summary_over_the_committed_evidence() {
    let loaded = economics::load(dir());
    assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
    assert!(loaded.tasks.len() >= 6);
    let c = config();
    let latest = |suite: &str| committed(&loaded, suite);
    let now = latest("healthy-work").recorded_at_unix_ms + 86_400_000;
    let s = economics::summarize(
        &loaded,
        &EconomicsQuery::default(),
        now,
        &economics::this_build(Some(&c)),
        Some(RESAMPLES),
    );
    assert!(s.present);
    assert!(s.simulated, "the committed evidence is a simulation");
    assert!(
        s.verdict.statement.starts_with(SIMULATION_LABEL),
        "{}",
        s.verdict.statement
    );
    assert!(!s.verdict.publishable);
    // The rule judges healthy work alone: a simulation is all that keeps it from publishing.
    assert!(
        s.verdict
            .unmet
            .iter()
            .all(|u| !u.starts_with("min_valid_pair_rate_bp")
                && !u.starts_with("max_treatment_failed_rate_bp")),
        "{:?}",
        s.verdict.unmet
    );
    let live = s.suites.iter().find(|v| v.kind == SuiteKind::Live).unwrap();
    assert_eq!(live.id, "healthy-work");
    assert_eq!(
        live.provider.as_ref().unwrap().kind,
        ProviderKind::Simulated
    );
    assert!(live.clients.len() >= 4, "{:?}", live.clients);
    let p = &live.pairs;
    assert_eq!(
        p.valid + p.control_failed + p.treatment_failed + p.both_failed + p.other,
        p.attempted
    );
    assert!(p.attempted >= 30, "the full run: {p:?}");
    let stuck = s
        .suites
        .iter()
        .find(|v| v.kind == SuiteKind::Stuck)
        .unwrap();
    assert_eq!(stuck.id, "stuck-agents");
    assert!(stuck.pairs.attempted >= 16, "{:?}", stuck.pairs);
    // The suites never mix: every pair sits in its task's suite.
    for pair in &s.pairs {
        assert_eq!(
            pair.suite, loaded.tasks[&pair.task].0.suite,
            "{}",
            pair.task
        );
    }
    assert!(s
        .metrics
        .iter()
        .all(|m| m.status != EconomicsMetricStatus::Verified));
    let metric = |id: &str| s.metrics.iter().find(|m| m.id == id).unwrap();
    let tr = metric("token_reduction");
    assert!(
        tr.warnings[0].starts_with("a simulation"),
        "{:?}",
        tr.warnings
    );
    assert_eq!(tr.suite, "healthy-work");
    assert_eq!(metric("tokens_per_success_reduction").suite, "healthy-work");
    assert_eq!(metric("stuck_cost_reduction").suite, "stuck-agents");
    // Context and total-token reduction: separate metrics, never merged.
    let cr = metric("context_reduction");
    assert_eq!(cr.inputs, Some(EconomicsClass::Counted));
    assert_ne!(cr.suite, tr.suite);
    // Nothing was removed: what removing would have saved is counterfactual.
    assert_eq!(cr.class, EconomicsClass::Counterfactual);
    // The mock's usage is its own tokenizer's count, not a provider's word.
    assert_eq!(tr.inputs, Some(EconomicsClass::Counted));
    // What the gate broke is stated before any reduction.
    let at = |id: &str| s.metrics.iter().position(|m| m.id == id).unwrap();
    assert!(at("gate_caused_failures") < at("token_reduction"));
    assert_eq!(metric("gate_caused_failures").value, Some(0.0));
    // Cost stands with tokens: its own interval and leave-one-task-out range.
    let cost = metric("cost_reduction");
    assert!(
        cost.interval.is_some() && cost.leave_one_task_out.is_some(),
        "{cost:?}"
    );
    assert_eq!(cost.status, tr.status);
    // What pacing costs in time is a figure of its own.
    assert!(metric("paced_seconds").n >= 30);
    assert!(metric("time_added_seconds").n >= 30);
    // Every hypothesis the evidence holds figures for is marked tested, with them.
    for h in &s.hypotheses {
        assert_eq!(h.status, "tested", "{}: {:?}", h.id, h.figures);
        assert_eq!(h.figures.len(), h.tested_by.len(), "{}", h.id);
    }
    healthy_work_targets(&latest("healthy-work"));
    stuck_agent_targets(&latest("stuck-agents"), &s.stuck);
    // Same input, same output (the bootstrap is seeded); the text says what the JSON says.
    let again = economics::summarize(
        &loaded,
        &EconomicsQuery::default(),
        now,
        &economics::this_build(Some(&c)),
        Some(RESAMPLES),
    );
    assert_eq!(s, again);
    let text = economics::render_text(&s);
    assert!(text.contains(&s.verdict.statement));
    assert!(text.contains("provider: simulated"));
    assert!(text.contains("    not: "));
    assert!(text.contains("    warning: a simulation"));
    assert!(text.contains("arms:\n  direct (control)"));
    assert!(text.contains("stuck agents (mean per run"));
    if live.freshness != EconomicsFreshness::Current {
        assert!(text.contains(live.freshness_detail.as_deref().unwrap()));
    }
}

/// The latest committed evidence file of `suite`.
fn committed(loaded: &economics::Loaded, suite: &str) -> EvidenceFile {
    loaded
        .evidence
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e.suite == suite)
        .max_by_key(|e| e.recorded_at_unix_ms)
        .cloned()
        .unwrap_or_else(|| panic!("no committed evidence of {suite}"))
}

/// A run's pair, arm and the cost of what it bought (nano-USD), read off the raw runs.
fn by_pair(ev: &EvidenceFile) -> BTreeMap<&str, [Option<&RunRecord>; 2]> {
    let mut out: BTreeMap<&str, [Option<&RunRecord>; 2]> = BTreeMap::new();
    for r in &ev.runs {
        out.entry(r.pair.as_str()).or_default()[usize::from(r.arm == "treatment")] = Some(r);
    }
    out
}

fn bought_cost(r: &RunRecord) -> u64 {
    r.bought.iter().filter_map(|b| b.cost_nano_usd).sum()
}

/// The digest's step fingerprint of a treatment step (what the client asked the model to do
/// next; the same for every repeat of one tool call).
fn step_fp(s: &StepRecord) -> Option<&str> {
    s.digest.as_ref()?["request"]["step_fingerprint"].as_str()
}

fn step_action(s: &StepRecord) -> Option<&str> {
    s.digest.as_ref()?["request"]["step_action"].as_str()
}

/// Whether `steps[i]`, another step than `fp`, is a stray of it (SPEC §2.3): one other result
/// of the same action, between two of `fp` — no progress, so no end of `fp`'s run.
fn stray(steps: &[&StepRecord], i: usize, fp: &str) -> bool {
    let action = steps
        .iter()
        .find(|s| step_fp(s) == Some(fp))
        .and_then(|s| step_action(s));
    i > 0
        && i + 1 < steps.len()
        && step_fp(steps[i - 1]) == Some(fp)
        && step_fp(steps[i + 1]) == Some(fp)
        && action.is_some()
        && step_action(steps[i]) == action
}

/// The step a run repeated most, how often the client sent it, and the times (ms after the run
/// started) at which the gate let it through to the provider (arrival plus the gate's hold),
/// split into segments wherever the client sent another step in between (which ends a run of
/// repeated steps: SPEC §2.3) that is no [`stray`] of it.
fn repeated_step_bought(r: &RunRecord) -> (usize, Vec<Vec<u64>>) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &r.steps {
        if let Some(fp) = step_fp(s) {
            *counts.entry(fp).or_default() += 1;
        }
    }
    let Some((fp, sent)) = counts.into_iter().max_by_key(|(_, n)| *n) else {
        return (0, vec![]);
    };
    let mut steps: Vec<&StepRecord> = r.steps.iter().filter(|s| step_fp(s).is_some()).collect();
    steps.sort_by_key(|s| s.at_ms);
    let mut segments: Vec<Vec<u64>> = vec![vec![]];
    for (i, s) in steps.iter().enumerate() {
        if step_fp(s) != Some(fp) {
            if !stray(&steps, i, fp) && !segments.last().unwrap().is_empty() {
                segments.push(vec![]);
            }
            continue;
        }
        if matches!(s.verdict.as_deref(), Some("ALLOW" | "DOWNGRADE")) {
            segments
                .last_mut()
                .unwrap()
                .push(s.at_ms.unwrap() + s.paced_ms.unwrap_or(0));
        }
    }
    segments.retain(|s| !s.is_empty());
    (sent, segments)
}

/// Issue "evidence"'s targets for healthy work, off the committed runs themselves (each run's
/// own check; costs summed from what the provider tap saw bought, at the recorded price table):
/// valid pairs at least 80 %, treatment failures at most 5 %, no task that succeeded straight
/// failing through the gate — the hour's poll (scaled) included, for every client — and that
/// poll reaching the provider at most 20 times through the gate (issue "fair over hours").
fn healthy_work_targets(ev: &EvidenceFile) {
    let pairs = by_pair(ev);
    let (mut attempted, mut valid, mut treatment_failed) = (0, 0, 0);
    let mut by_client: BTreeMap<&str, [u64; 2]> = BTreeMap::new();
    let mut long_polls: BTreeMap<&str, usize> = BTreeMap::new();
    for (pair, arms) in &pairs {
        let [Some(c), Some(t)] = *arms else {
            panic!("{pair}: an arm is missing");
        };
        attempted += 1;
        let (c_ok, t_ok) = (c.check.passed, t.check.passed);
        assert!(t_ok || !c_ok, "the gate broke {pair}: {}", t.check.output);
        valid += usize::from(c_ok && t_ok);
        treatment_failed += usize::from(!t_ok);
        if c_ok && t_ok {
            let e = by_client.entry(&c.client).or_default();
            e[0] += bought_cost(c);
            e[1] += bought_cost(t);
        }
        if c.task == "poll-long-job" {
            assert!(
                c_ok && t_ok,
                "{pair}: the hour's poll must complete in both arms"
            );
            let (sent_straight, _) = (c.steps.len(), ());
            let through: Vec<u64> = repeated_step_bought(t).1.concat();
            eprintln!(
                "{pair}: {sent_straight} calls straight, {} through the gate ({} of them the poll's check), {:.0} s against {:.0} s",
                t.bought.len(),
                through.len(),
                t.seconds,
                c.seconds
            );
            assert!(
                through.len() <= 20,
                "{pair}: {} checks bought",
                through.len()
            );
            // Straight, the client checks every fraction of a second, a hundred times and more.
            assert!(through.len() * 4 < c.bought.len(), "{pair}");
            *long_polls.entry(&c.client).or_default() += 1;
        }
    }
    assert!(
        valid * 100 >= attempted * 80,
        "{valid} valid of {attempted}"
    );
    assert!(
        treatment_failed * 100 <= attempted * 5,
        "{treatment_failed} of {attempted}"
    );
    assert_eq!(
        long_polls.keys().copied().collect::<Vec<_>>(),
        ["agents-sdk", "anthropic-sdk", "claude-code", "codex"],
        "the hour's poll, for every client"
    );
    assert!(long_polls.values().all(|&n| n >= 3), "{long_polls:?}");
    for (client, [c, t]) in &by_client {
        eprintln!(
            "healthy work, {client}: ${:.4} straight, ${:.4} through the gate, {:+.1} %",
            *c as f64 / 1e9,
            *t as f64 / 1e9,
            -100.0 * (1.0 - *t as f64 / *c as f64)
        );
        assert!(t <= c, "{client} costs more through the gate");
    }
}

/// Issue "fair over hours"'s targets for stuck agents, off the committed runs: every client's
/// stuck agent with noisy output is stopped (`runaway_step`), each run of its repeated step
/// bought at most 30 times through the gate and at most 15 times in any hour (60 s at the
/// recording's 60-fold compression) after its first 10 minutes (10 s), and at most 30 calls in
/// all; a short stuck loop that gives up on its own is slowed, not cut. An attempt id the step
/// normaliser cannot tell from a number (8 hex digits, all digits: one run in 43) makes a stray
/// step, which does not end the run (SPEC §2.3). The summary's rows say what the runs say.
fn stuck_agent_targets(ev: &EvidenceFile, rows: &[EconomicsStuckRow]) {
    const HOUR_MS: u64 = 60_000;
    const TEN_MINUTES_MS: u64 = 10_000;
    let mut stopped_clients = std::collections::BTreeSet::new();
    for (pair, arms) in by_pair(ev) {
        let [Some(c), Some(t)] = arms else {
            panic!("{pair}: an arm is missing");
        };
        assert!(
            !c.check.passed && !t.check.passed,
            "{pair}: stuck by design"
        );
        let (sent, segments) = repeated_step_bought(t);
        let bought: usize = segments.iter().map(Vec::len).sum();
        let most_in_an_hour = segments
            .iter()
            .flat_map(|times| {
                let first = times[0];
                times
                    .iter()
                    .filter(move |&&x| x >= first + TEN_MINUTES_MS)
                    .map(move |&x| times.iter().filter(|&&y| y >= x && y < x + HOUR_MS).count())
            })
            .max()
            .unwrap_or(0);
        let stopped = t
            .steps
            .iter()
            .any(|s| s.reason.as_deref() == Some("runaway_step"));
        eprintln!(
            "{pair}: straight {} calls in {:.0} s; through the gate {bought} of {sent} repeats bought in {} run(s) {:?}, {most_in_an_hour} in the busiest hour after the first ten minutes, {:.0} s, stopped {stopped}",
            c.bought.len(),
            c.seconds,
            segments.len(),
            segments.iter().map(Vec::len).collect::<Vec<_>>(),
            t.seconds
        );
        if c.task == "stuck-noisy-deploy" {
            assert!(stopped, "{pair}: not stopped");
            assert_eq!(segments.len(), 1, "{pair}: {segments:?}");
            assert!(t.bought.len() <= 30, "{pair}: {} in all", t.bought.len());
            assert!(
                most_in_an_hour <= 15,
                "{pair}: {most_in_an_hour} in an hour"
            );
            // The stuck agent through the gate costs under a quarter of it straight (its 30
            // calls are the early, shorter ones: Codex's cost the most, 20 % of straight).
            assert!(bought_cost(t) * 4 < bought_cost(c), "{pair}");
            stopped_clients.insert(c.client.clone());
        } else {
            // A short stuck loop gives up on its own before the bound: paced, not cut.
            assert_eq!(t.bought.len(), c.bought.len(), "{pair}");
            assert!(
                t.steps.iter().any(|s| s.paced_ms.unwrap_or(0) > 0),
                "{pair}"
            );
        }
    }
    assert_eq!(
        stopped_clients.into_iter().collect::<Vec<_>>(),
        ["agents-sdk", "anthropic-sdk", "claude-code", "codex"],
        "every client's stuck agent is stopped"
    );
    for r in rows {
        let runs: Vec<&RunRecord> = ev
            .runs
            .iter()
            .filter(|x| x.task == r.task && x.client == r.client && x.arm == "treatment")
            .collect();
        let calls = runs.iter().map(|x| x.bought.len()).sum::<usize>() as f64 / runs.len() as f64;
        assert_eq!((r.treatment.runs, r.treatment.calls), (runs.len(), calls));
        // Runs of the repeated step the client sent, counted here: a step of another
        // fingerprint in between, unless a stray of it, starts a new one.
        let most_runs = runs
            .iter()
            .map(|t| {
                let mut steps: Vec<&StepRecord> =
                    t.steps.iter().filter(|s| step_fp(s).is_some()).collect();
                steps.sort_by_key(|s| s.at_ms);
                let mut n: BTreeMap<&str, usize> = BTreeMap::new();
                for s in &steps {
                    *n.entry(step_fp(s).unwrap()).or_default() += 1;
                }
                let fp = n.into_iter().max_by_key(|(_, c)| *c).unwrap().0;
                let kept: Vec<bool> = (0..steps.len())
                    .filter(|&i| !stray(&steps, i, fp))
                    .map(|i| step_fp(steps[i]) == Some(fp))
                    .collect();
                (0..kept.len())
                    .filter(|&i| kept[i] && (i == 0 || !kept[i - 1]))
                    .count() as u32
            })
            .max()
            .unwrap();
        assert_eq!(r.most_repeat_runs, most_runs, "{} on {}", r.client, r.task);
    }
}

/// Fresh without a re-record (issue "evidence"): another build that decides every recorded
/// treatment call alike — replayed from the calls' digests on the recording's clock — leaves
/// the committed evidence current and says so; a gate that decides one call otherwise makes it
/// stale, naming that call.
#[test]
fn another_build_that_decides_alike_keeps_the_evidence_current() {
    let loaded = economics::load(dir());
    let recording = Config::load(&dir().join("recording.toml")).unwrap();
    let ev = committed(&loaded, "healthy-work");
    let now = ev.recorded_at_unix_ms + 86_400_000;
    let other = "0".repeat(64);
    let view = |config: &Config, suite: &str| {
        let s = economics::summarize(
            &loaded,
            &EconomicsQuery {
                suite: Some(suite.into()),
                ..Default::default()
            },
            now,
            &Current {
                build: &other,
                ..economics::this_build(Some(config))
            },
            Some(50),
        );
        s.suites.into_iter().find(|v| v.id == suite).unwrap()
    };
    for suite in ["healthy-work", "stuck-agents"] {
        let v = view(&recording, suite);
        assert_eq!(
            v.freshness,
            EconomicsFreshness::Current,
            "{suite}: {:?}",
            v.freshness_detail
        );
        let detail = v.freshness_detail.unwrap();
        assert!(
            detail.contains("this build is 000000000000") && detail.contains("calls alike"),
            "{detail}"
        );
    }
    // A gate that stops a run of one step after 30 s (the recording's bound is 90 s) decides
    // the hour's poll otherwise: stale, with the first call it decides otherwise.
    let mut stricter = recording.clone();
    stricter.gate.steps.runaway_after_secs = 30;
    let m = loaded.methodology.as_ref().unwrap();
    let why = stricter
        .decides_alike(&ev, &m.treatment_key)
        .expect_err("a stricter bound decides the long poll otherwise");
    assert!(
        why.contains("poll-long-job")
            && why.contains("recorded ALLOW")
            && why.contains("BLOCK (runaway_step"),
        "{why}"
    );
    let calls = recording.decides_alike(&ev, &m.treatment_key).unwrap();
    let recorded: usize = ev
        .runs
        .iter()
        .filter(|r| r.arm == "treatment")
        .map(|r| r.steps.iter().filter(|s| s.verdict.is_some()).count())
        .sum();
    assert_eq!(calls, recorded);
}

/// Every saving attributed (issue "evidence"): each committed ablation arm is paired with its
/// suite's latest evidence; it recorded again exactly the pairs where a replay finds its
/// mechanism acting (this build's replay, here); and the summary's saving for it is the one
/// recomputed here from the raw runs — what the ablated treatment bought over what the full
/// gate's bought, on the pairs it acted on (every other pair: 0), over what the control arms
/// bought on every pair that counts.
#[test]
fn every_committed_ablation_is_recomputed_from_its_raw_runs() {
    let loaded = economics::load(dir());
    let recording = Config::load(&dir().join("recording.toml")).unwrap();
    let m = loaded.methodology.as_ref().unwrap();
    let declared = loaded.ablation.as_ref().expect("ablations.json");
    assert!(!loaded.ablations.is_empty(), "no ablation arm committed");
    let s = summary_at_now(dir(), &economics::this_build(Some(&recording)));
    // Where each arm's mechanism acted, by suite: one replay of the full gate per suite,
    // beside one without each of its arms' mechanisms.
    let mut acted_in: BTreeMap<&str, BTreeMap<_, BTreeMap<String, usize>>> = BTreeMap::new();
    for (_, a) in &loaded.ablations {
        acted_in
            .entry(a.evidence.suite.as_str())
            .or_default()
            .insert(a.without, BTreeMap::new());
    }
    for (suite, arms) in &mut acted_in {
        let mechanisms: Vec<_> = arms.keys().copied().collect();
        let found = tokensaver::economics::replay::acted_on(
            &recording,
            &committed(&loaded, suite),
            &m.treatment_key,
            &mechanisms,
        )
        .unwrap();
        arms.values_mut().zip(found).for_each(|(slot, a)| *slot = a);
    }
    for (name, a) in &loaded.ablations {
        assert!(declared
            .arms
            .iter()
            .any(|arm| arm.id == a.arm && arm.without == a.without));
        let main = committed(&loaded, &a.evidence.suite);
        assert_eq!(
            a.against_recorded_at_unix_ms, main.recorded_at_unix_ms,
            "{name}"
        );
        let acted = &acted_in[a.evidence.suite.as_str()][&a.without];
        assert_eq!(
            acted, &a.acted,
            "{name}: the pairs a replay finds it acting on"
        );
        let ablated = by_pair(&a.evidence);
        assert!(
            ablated.keys().all(|id| a.acted.contains_key(*id)),
            "{name}: only pairs it acted on are recorded again"
        );
        assert!(a
            .evidence
            .runs
            .iter()
            .filter(|r| r.arm == "treatment")
            .all(|r| r.variant == a.arm));
        let stuck = a.evidence.suite == "stuck-agents";
        let counts = |runs: &[Option<&RunRecord>; 2]| match runs {
            [Some(c), Some(t)] => stuck || (c.check.passed && t.check.passed),
            _ => false,
        };
        let (mut control, mut saved, mut unmeasured) = (0u64, 0i64, 0usize);
        for (id, runs) in by_pair(&main) {
            if !counts(&runs) {
                continue;
            }
            let [Some(c), Some(t)] = runs else {
                unreachable!()
            };
            let delta = if a.acted.contains_key(id) {
                match ablated.get(id).filter(|r| counts(r)) {
                    Some([_, Some(at)]) => bought_cost(at) as i64 - bought_cost(t) as i64,
                    _ => {
                        unmeasured += 1;
                        continue;
                    }
                }
            } else {
                0
            };
            control += bought_cost(c);
            saved += delta;
        }
        let row = s
            .mechanisms
            .iter()
            .find(|r| &r.ablation_file == name)
            .unwrap_or_else(|| panic!("{name} is not in the summary"));
        assert_eq!(row.mechanism, a.without);
        assert_eq!(row.acted - row.measured, unmeasured, "{name}");
        let recomputed = saved as f64 / control as f64;
        assert!(
            (row.cost_saving.unwrap() - recomputed).abs() < 1e-9,
            "{name}: summary {:?}, recomputed {recomputed}",
            row.cost_saving
        );
        let i = row.cost_interval.as_ref().unwrap();
        assert!(i.low <= recomputed + 1e-12 && recomputed <= i.high + 1e-12);
    }
}

/// The committed evidence verifies against the public key committed beside it
/// (`evidence/receipt-keys.txt`, in the format of a data dir's `receipt-earlier-keys.txt`):
/// anyone can check it without the key that signed it, and one changed byte is refused.
#[test]
fn the_committed_evidence_verifies_against_the_committed_public_key() {
    let tmp = tempfile::tempdir().unwrap();
    // A verifier's own data dir: its own signing key, and the evidence's key as an earlier one.
    tokensaver::receipt::load_or_create(tmp.path()).unwrap();
    std::fs::copy(
        dir().join("evidence/receipt-keys.txt"),
        tmp.path().join("receipt-earlier-keys.txt"),
    )
    .unwrap();
    let signer = tokensaver::receipt::load(tmp.path()).unwrap();
    let mut checked = 0;
    // The suites' evidence, and the ablation arms recorded against it.
    let mut paths: Vec<PathBuf> = [
        "evidence/agent-sessions",
        "evidence/healthy-work",
        "evidence/stuck-agents",
        "ablation/healthy-work",
        "ablation/stuck-agents",
    ]
    .iter()
    .flat_map(|d| std::fs::read_dir(dir().join(d)).unwrap())
    .map(|entry| entry.unwrap().path())
    .collect();
    paths.sort();
    for path in paths {
        if path.extension().and_then(|e| e.to_str()) != Some("sig") {
            continue;
        }
        let envelope: tokensaver::receipt::Envelope =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let (kind, body) = signer.verify_document(&envelope).unwrap();
        assert_eq!(kind, Some(tokensaver::receipt::DocumentKind::Evidence));
        let document = path.with_extension("");
        assert_eq!(
            body,
            std::fs::read(&document).unwrap(),
            "{}",
            document.display()
        );
        // One changed byte of the document (`ewog` is `{\n  `; `fwog` decodes too).
        let mut tampered = envelope.clone();
        assert!(tampered.body.starts_with("ewog"));
        tampered.body.replace_range(..1, "f");
        assert_eq!(
            signer.verify_document(&tampered).unwrap_err(),
            tokensaver::receipt::VerifyError::BadSignature
        );
        checked += 1;
    }
    assert!(checked >= 10, "signed evidence: {checked} files");
}

#[test]
fn no_methodology_is_said_plainly() {
    let tmp = tempfile::tempdir().unwrap();
    let s = economics::summary(
        tmp.path(),
        &EconomicsQuery::default(),
        0,
        &economics::this_build(None),
    );
    assert!(!s.present);
    assert_eq!(s.verdict.statement, "No methodology is declared.");
    assert!(serde_json::to_value(&s)
        .unwrap()
        .get("methodology")
        .is_none());
}

/// The thresholds the diagnostics call the seed's are exactly the ones seed 001's
/// `EconomicsPublicationPolicy` requires (read from the shipped seed's JSON Schema).
#[test]
fn the_floor_names_as_the_seeds_only_what_the_seed_has() {
    let seed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/spec/seeds/001_e05ad084ae73fd8f.txt"
    ))
    .unwrap();
    // The page's last schema is the summary's, with every type under `$defs`.
    let schema_at = seed.rfind("\nJSON Schema").expect("the seed's schema");
    let json = &seed[schema_at + seed[schema_at..].find('{').unwrap()..];
    let schema: serde_json::Value = serde_json::Deserializer::from_str(json)
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    let required: Vec<&str> = schema["$defs"]["EconomicsPublicationPolicy"]["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, economics::SEED_THRESHOLDS);
    let floor = serde_json::to_value(&FLOOR).unwrap();
    for (name, _) in floor.as_object().unwrap() {
        let expected = if required.contains(&name.as_str()) {
            "the seed's"
        } else {
            "this project's"
        };
        assert_eq!(economics::floor_of(name), expected, "{name}");
    }
}
