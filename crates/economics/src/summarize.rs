//! The summary: suites and their evidence, pairs, metrics, segments, history, the rule and the
//! statement.

use std::collections::{BTreeMap, BTreeSet};

use super::measure::{metric, Boot, SIMULATION_WARNING};
use super::model::*;
use super::pairs::{
    comparable, count_pairs, per_success_reduction, per_success_row, weigh_tasks_equally,
};
use super::rule::{effective_rule, evaluate_rule, verdict_statement, RuleInputs, StatementInputs};
use super::{format_utc, freshness_of, pairs_of, stats, Current, Loaded};

const CLUSTER_METHOD: &str =
    "cluster bootstrap over tasks (a task's pairs, every client and repetition, resampled together), percentile interval";

/// What the usage figures are: the provider's word (`observed`), or, against the built-in
/// provider, the count its tokenizer made of the bytes (`counted`).
fn usage_class(simulated: bool) -> EconomicsClass {
    if simulated {
        EconomicsClass::Counted
    } else {
        EconomicsClass::Observed
    }
}

/// `stat` over every task but one, for each task: the lowest and the highest, and which
/// task's absence gives each (`None` with fewer than two tasks).
fn leave_one_task_out<T: Clone>(
    tasks: &[(String, Vec<T>)],
    stat: impl Fn(&[T]) -> Option<f64>,
) -> Option<EconomicsRange> {
    if tasks.len() < 2 {
        return None;
    }
    let mut values = tasks
        .iter()
        .enumerate()
        .filter_map(|(left_out, (task, _))| {
            let rest: Vec<T> = tasks
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != left_out)
                .flat_map(|(_, (_, rows))| rows.iter().cloned())
                .collect();
            stat(&rest).map(|v| (v, task.clone()))
        });
    let first = values.next()?;
    let (mut low, mut high) = (first.clone(), first);
    for v in values {
        if v.0 < low.0 {
            low = v.clone();
        }
        if v.0 > high.0 {
            high = v;
        }
    }
    Some(EconomicsRange {
        low: low.0,
        low_without: low.1,
        high: high.0,
        high_without: high.1,
    })
}

fn matches(q: &EconomicsQuery, p: &EconomicsPair) -> bool {
    q.suite.as_deref().is_none_or(|s| s == p.suite)
        && q.category.as_deref().is_none_or(|s| s == p.category)
        && q.model.as_deref().is_none_or(|s| s == p.model)
        && q.task.as_deref().is_none_or(|s| s == p.task)
}

/// Per-task clusters of a per-pair value over valid pairs (in task order).
fn clusters(pairs: &[&EconomicsPair], f: impl Fn(&EconomicsPair) -> Option<f64>) -> Vec<Vec<f64>> {
    task_clusters(pairs, f)
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

/// [`clusters`] with each task's id.
fn task_clusters(
    pairs: &[&EconomicsPair],
    f: impl Fn(&EconomicsPair) -> Option<f64>,
) -> Vec<(String, Vec<f64>)> {
    let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for p in pairs
        .iter()
        .filter(|p| p.status == EconomicsPairStatus::Valid)
    {
        if let Some(v) = f(p) {
            m.entry(p.task.as_str()).or_default().push(v);
        }
    }
    m.into_iter().map(|(t, v)| (t.to_string(), v)).collect()
}

type SuccessRow = (f64, bool, f64, bool);

/// Per task, its comparable pairs' rows, each task weighed alike ([`weigh_tasks_equally`]).
fn row_clusters(pairs: &[&EconomicsPair]) -> Vec<(String, Vec<SuccessRow>)> {
    let mut m: BTreeMap<&str, Vec<(u64, bool, u64, bool)>> = BTreeMap::new();
    for p in pairs {
        if let Some(r) = per_success_row(p) {
            m.entry(p.task.as_str()).or_default().push(r);
        }
    }
    m.into_iter()
        .map(|(t, v)| (t.to_string(), weigh_tasks_equally(&v)))
        .collect()
}

fn pooled(v: &[(u64, u64)]) -> Option<f64> {
    let c: u64 = v.iter().map(|x| x.0).sum();
    let t: u64 = v.iter().map(|x| x.1).sum();
    (c > 0).then(|| 1.0 - t as f64 / c as f64)
}

fn empty(query: &EconomicsQuery, diagnostics: Vec<String>) -> EconomicsSummary {
    EconomicsSummary {
        present: false,
        methodology: None,
        question: None,
        primary_metric: None,
        publication: None,
        verdict: EconomicsVerdict {
            publishable: false,
            statement: "No methodology is declared.".into(),
            unmet: vec![],
        },
        simulated: false,
        methodology_blake3: None,
        metrics: vec![],
        suites: vec![],
        pairs: vec![],
        segments: vec![],
        history: vec![],
        variants: vec![],
        hypotheses: vec![],
        context: None,
        stuck: vec![],
        mechanisms: vec![],
        mechanism_notes: vec![],
        query: query.clone(),
        diagnostics,
    }
}

/// [`super::summary`] over already-loaded data; `resamples` overrides the methodology's
/// count (tests use fewer; the real summary passes `None`).
pub fn summarize(
    loaded: &Loaded,
    query: &EconomicsQuery,
    now_unix_ms: u64,
    current: &Current<'_>,
    resamples: Option<u32>,
) -> EconomicsSummary {
    let mut s = empty(query, loaded.diagnostics.clone());
    let Some(m) = &loaded.methodology else {
        return s;
    };
    let (rule, raised) = effective_rule(&m.publication);
    s.diagnostics.extend(
        raised
            .into_iter()
            .map(|r| format!("methodology.json publication rule: {r}")),
    );
    s.present = true;
    s.methodology = Some(m.version);
    s.methodology_blake3 = loaded.methodology_blake3.clone();
    s.question = Some(m.question.clone());
    s.primary_metric = Some(m.primary_metric.clone());
    s.publication = Some(rule.clone());
    s.variants = m.variants.clone();
    s.hypotheses = m.hypotheses.clone();
    let boot = Boot {
        seed: m.bootstrap.seed,
        resamples: resamples.unwrap_or(m.bootstrap.resamples),
        level_bp: m.bootstrap.level_bp,
    };
    s.history = history(loaded);

    let mut primary_verdict: Option<EconomicsVerdict> = None;
    for decl in &m.suites {
        let source = if decl.kind == SuiteKind::Context {
            decl.reads.clone().unwrap_or_default()
        } else {
            decl.id.clone()
        };
        let latest = super::latest_evidence(loaded, &source);
        let (freshness, reasons) = match latest {
            None => (
                EconomicsFreshness::NoEvidence,
                vec!["no run recorded".to_string()],
            ),
            Some((_, ev)) => freshness_of(ev, loaded, current, now_unix_ms),
        };
        let usable = latest
            .filter(|_| freshness != EconomicsFreshness::Incompatible)
            .map(|(_, e)| e);
        if let (Some((name, ev)), EconomicsFreshness::Incompatible) = (latest, freshness) {
            s.diagnostics.push(format!(
                "evidence/{name} of suite {} was recorded under methodology v{} and is incompatible with v{}: not used",
                ev.suite, ev.methodology, m.version
            ));
        }
        let mut view = suite_view(decl, loaded, latest, freshness, reasons);
        if decl.kind == SuiteKind::Context {
            if query.suite.as_deref().is_some_and(|q| q != decl.id) {
                continue;
            }
            let (metrics, ctx) = super::context::suite(decl, usable, query, &boot);
            view.runs = usable.map_or(0, |e| e.runs.len());
            s.metrics.extend(metrics);
            s.context = ctx;
            s.suites.push(view);
            continue;
        }
        let all_pairs = pairs_of(&decl.id, loaded, usable, decl.repetitions);
        let all: Vec<&EconomicsPair> = all_pairs.iter().collect();
        view.pairs = count_pairs(
            &all,
            loaded
                .tasks_of(&decl.id)
                .map(|(_, (t, _))| t.clients.len())
                .sum::<usize>()
                * decl.repetitions as usize,
        );
        let simulated = usable.is_some_and(|e| e.provider.kind == ProviderKind::Simulated);
        if decl.kind == SuiteKind::Stuck {
            if query.suite.as_deref().is_some_and(|q| q != decl.id) {
                s.suites.push(view);
                continue;
            }
            let narrowed: Vec<&EconomicsPair> =
                all_pairs.iter().filter(|p| matches(query, p)).collect();
            mechanisms(&mut s, decl, loaded, latest, &all, true, &boot);
            let rows = super::stuck::rows(&narrowed);
            s.metrics
                .extend(super::stuck::metrics(&decl.id, &rows, simulated));
            s.stuck.extend(rows);
            s.pairs.extend(narrowed.into_iter().cloned());
            s.suites.push(view);
            continue;
        }
        if primary_verdict.is_none() {
            s.simulated = simulated;
            primary_verdict = Some(verdict(
                &decl.id, loaded, usable, &all, &view, freshness, &rule, &boot,
            ));
        }
        if query.suite.as_deref().is_some_and(|q| q != decl.id) {
            s.suites.push(view);
            continue;
        }
        mechanisms(&mut s, decl, loaded, latest, &all, false, &boot);
        let narrowed: Vec<&EconomicsPair> =
            all_pairs.iter().filter(|p| matches(query, p)).collect();
        let publishable = primary_verdict.as_ref().is_some_and(|v| v.publishable)
            && m.primary_metric == "token_reduction"
            && !simulated;
        s.metrics.extend(live_metrics(
            &decl.id,
            &narrowed,
            query,
            publishable,
            simulated,
            &boot,
        ));
        s.segments.extend(segments(&narrowed));
        s.pairs.extend(narrowed.into_iter().cloned());
        s.suites.push(view);
    }
    s.hypotheses = tested(&s.hypotheses, &s.metrics);
    s.verdict = primary_verdict.unwrap_or_else(|| EconomicsVerdict {
        publishable: false,
        statement: "No quantitative token claim: the methodology declares no live suite.".into(),
        unmet: vec![],
    });
    s
}

/// Each ablation arm's latest recording against the suite's latest evidence, read as what
/// its mechanism saved ([`crate::ablation`]). A recording against an earlier evidence file is
/// not read (its full-gate pairs are not the ones judged now): a diagnostic says so.
fn mechanisms(
    s: &mut EconomicsSummary,
    decl: &SuiteDecl,
    loaded: &Loaded,
    latest: Option<&(String, EvidenceFile)>,
    all: &[&EconomicsPair],
    stuck: bool,
    boot: &Boot,
) {
    let Some((name, _)) = latest else {
        return;
    };
    let full: Vec<EconomicsPair> = all.iter().map(|p| (*p).clone()).collect();
    let boot = BootstrapDecl {
        seed: boot.seed,
        resamples: boot.resamples,
        level_bp: boot.level_bp,
    };
    let mut rows = Vec::new();
    let mut by_arm: BTreeMap<&str, &(String, crate::ablation::AblationFile)> = BTreeMap::new();
    for f in loaded
        .ablations
        .iter()
        .filter(|(_, f)| f.evidence.suite == decl.id)
    {
        if &f.1.against != name {
            s.diagnostics.push(format!(
                "ablation/{} was recorded against evidence/{}, the suite's latest is evidence/{name}: not read",
                f.0, f.1.against
            ));
            continue;
        }
        let newer = by_arm.get(f.1.arm.as_str()).is_none_or(|g| {
            (g.1.evidence.recorded_at_unix_ms, &g.0) < (f.1.evidence.recorded_at_unix_ms, &f.0)
        });
        if newer {
            by_arm.insert(&f.1.arm, f);
        }
    }
    for (file_name, file) in by_arm.into_values() {
        let ablated = pairs_of(&decl.id, loaded, Some(&file.evidence), decl.repetitions);
        rows.push(crate::ablation::mechanism(
            &decl.id,
            stuck,
            (file_name, file),
            &full,
            &ablated,
            &boot,
        ));
    }
    let refs: Vec<&EconomicsMechanism> = rows.iter().collect();
    let gate = crate::ablation::gate_cost_saving(&full, stuck);
    if let Some(note) = crate::ablation::overlap(&refs, gate) {
        s.mechanism_notes.push(format!("{}: {note}", decl.id));
    }
    s.mechanisms.extend(rows);
}

fn suite_view(
    decl: &SuiteDecl,
    loaded: &Loaded,
    latest: Option<&(String, EvidenceFile)>,
    freshness: EconomicsFreshness,
    reasons: Vec<String>,
) -> EconomicsSuiteView {
    let ev = latest.map(|(_, e)| e);
    let models: BTreeSet<String> = ev
        .into_iter()
        .flat_map(|e| e.runs.iter())
        .flat_map(|r| r.bought.iter().filter_map(|b| b.model.clone()))
        .collect();
    EconomicsSuiteView {
        id: decl.id.clone(),
        kind: decl.kind,
        version: decl.version,
        title: decl.title.clone(),
        // The models its clients asked for, as recorded (`client=model`).
        model: ev
            .map(|e| {
                e.clients
                    .iter()
                    .map(|c| format!("{}={}", c.id, c.model))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|m| !m.is_empty()),
        freshness,
        freshness_detail: (!reasons.is_empty()).then(|| reasons.join("; ")),
        stale_reasons: if freshness == EconomicsFreshness::Stale {
            reasons
        } else {
            vec![]
        },
        runs: ev.map_or(0, |e| e.runs.len()),
        pairs: EconomicsPairCounts::default(),
        revisions: ev
            .map(|e| {
                let mut r = e.build.source_blake3.clone();
                if let Some(c) = &e.build.commit {
                    r.push_str(&format!(" (commit {c})"));
                }
                vec![r]
            })
            .unwrap_or_default(),
        harnesses: ev
            .map(|e| {
                vec![format!(
                    "{} v{} (blake3 {})",
                    e.harness.path, e.harness.version, e.harness.blake3
                )]
            })
            .unwrap_or_default(),
        models_reported: models.into_iter().collect(),
        provider: ev.map(|e| e.provider.clone()),
        clients: ev.map(|e| e.clients.clone()).unwrap_or_default(),
        evidence_file: latest.map(|(n, _)| format!("evidence/{n}")),
        tasks: loaded
            .tasks_of(decl.reads.as_deref().unwrap_or(&decl.id))
            .count(),
    }
}

/// The hypotheses, each marked `tested` (where the methodology left it `untested`) when the
/// summary holds a measured figure for every metric it names, with those figures.
fn tested(
    hypotheses: &[EconomicsHypothesis],
    metrics: &[EconomicsMetric],
) -> Vec<EconomicsHypothesis> {
    hypotheses
        .iter()
        .map(|h| {
            let mut h = h.clone();
            let figures: Vec<String> = h
                .tested_by
                .iter()
                .filter_map(|id| {
                    let m = metrics.iter().find(|m| &m.id == id && m.n > 0)?;
                    let v = m.value?;
                    let mut line = format!(
                        "{id} = {} (n = {}, suite {})",
                        figure(v, &m.unit),
                        m.n,
                        m.suite
                    );
                    // A median over every task can hide the one the hypothesis is about.
                    let by_task =
                        !m.evidence.is_empty() && m.evidence.iter().all(|e| e.ends_with(" pairs)"));
                    if by_task {
                        line.push_str(&format!("; by task: {}", m.evidence.join(", ")));
                    }
                    Some(line)
                })
                .collect();
            if !h.tested_by.is_empty() && figures.len() == h.tested_by.len() {
                if h.status == "untested" {
                    h.status = "tested".into();
                }
                h.figures = figures;
            }
            h
        })
        .collect()
}

fn figure(v: f64, unit: &str) -> String {
    match unit {
        "ratio" => format!("{:.1}%", v * 100.0),
        "seconds" => format!("{v:.1} s"),
        _ => format!("{v}"),
    }
}

fn failed_lists(all: &[&EconomicsPair]) -> (Vec<String>, Vec<String>) {
    let mut under_gate: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut both: BTreeMap<&str, usize> = BTreeMap::new();
    for p in all {
        match p.status {
            EconomicsPairStatus::TreatmentFailed => under_gate
                .entry(p.task.as_str())
                .or_default()
                .push(format!("{} r{}", p.client, p.repetition)),
            EconomicsPairStatus::BothFailed => *both.entry(p.task.as_str()).or_insert(0) += 1,
            _ => {}
        }
    }
    (
        under_gate
            .into_iter()
            .map(|(t, v)| format!("{t} ({})", v.join(", ")))
            .collect(),
        both.into_iter()
            .map(|(t, n)| format!("{t} ({n} pair{})", if n == 1 { "" } else { "s" }))
            .collect(),
    )
}

#[allow(clippy::too_many_arguments)]
fn verdict(
    suite: &str,
    loaded: &Loaded,
    ev: Option<&EvidenceFile>,
    all: &[&EconomicsPair],
    view: &EconomicsSuiteView,
    freshness: EconomicsFreshness,
    rule: &EconomicsPublicationPolicy,
    boot: &Boot,
) -> EconomicsVerdict {
    let cl = clusters(all, |p| p.token_reduction);
    let vals: Vec<f64> = cl.iter().flatten().copied().collect();
    let interval = boot.interval(&cl, stats::median, CLUSTER_METHOD);
    let mut category_pairs: BTreeMap<String, usize> = BTreeMap::new();
    for (_, (t, _)) in loaded.tasks_of(suite) {
        category_pairs.entry(t.category.clone()).or_insert(0);
    }
    for p in all
        .iter()
        .filter(|p| p.status == EconomicsPairStatus::Valid)
    {
        *category_pairs.entry(p.category.clone()).or_insert(0) += 1;
    }
    let min_reps = loaded
        .tasks_of(suite)
        .flat_map(|(id, (t, _))| {
            t.clients.iter().flat_map(move |c| {
                ["control", "treatment"].map(|arm| {
                    ev.map_or(0, |ev| {
                        ev.runs
                            .iter()
                            .filter(|r| &r.task == id && &r.client == c && r.arm == arm)
                            .count() as u32
                    })
                })
            })
        })
        .min()
        .unwrap_or(0);
    let simulated = ev.is_some_and(|e| e.provider.kind == ProviderKind::Simulated);
    let inputs = RuleInputs {
        valid_pairs: view.pairs.valid,
        attempted_pairs: view.pairs.attempted,
        treatment_failed_pairs: view.pairs.treatment_failed + view.pairs.both_failed,
        control_successes: view.pairs.valid + view.pairs.treatment_failed,
        treatment_successes: view.pairs.valid + view.pairs.control_failed,
        tasks_with_valid_pairs: cl.len(),
        category_pairs,
        min_repetitions: min_reps,
        interval: interval.as_ref().map(|i| (i.low, i.high)),
        freshness: Some(freshness),
        simulated,
    };
    let outcome = evaluate_rule(rule, &inputs);
    let attempted: Vec<&&EconomicsPair> = all
        .iter()
        .filter(|p| p.control.is_some() || p.treatment.is_some())
        .collect();
    let row_tasks = row_clusters(all);
    let row_sets: Vec<Vec<SuccessRow>> = row_tasks.iter().map(|(_, r)| r.clone()).collect();
    let rows: Vec<SuccessRow> = row_sets.iter().flatten().copied().collect();
    let cost_tasks = task_clusters(all, |p| p.cost_reduction);
    let cost_sets: Vec<Vec<f64>> = cost_tasks.iter().map(|(_, v)| v.clone()).collect();
    let cost_vals: Vec<f64> = cost_sets.iter().flatten().copied().collect();
    let (failed_under_gate, failed_in_both) = failed_lists(all);
    let st = StatementInputs {
        suite: suite.to_string(),
        simulated,
        provider: ev
            .map(|e| format!("{} ({})", e.provider.name, e.provider.upstream))
            .unwrap_or_default(),
        clients: ev.map(|e| e.clients.clone()).unwrap_or_default(),
        level_bp: boot.level_bp,
        median: stats::median(&vals),
        rule: inputs,
        tasks: attempted
            .iter()
            .map(|p| p.task.as_str())
            .collect::<BTreeSet<_>>()
            .len(),
        categories: attempted
            .iter()
            .map(|p| p.category.as_str())
            .collect::<BTreeSet<_>>()
            .len(),
        failed_under_gate,
        failed_in_both,
        per_success: per_success_reduction(&rows),
        per_success_interval: boot
            .interval(&row_sets, per_success_reduction, CLUSTER_METHOD)
            .map(|i| (i.low, i.high)),
        per_success_range: leave_one_task_out(&row_tasks, per_success_reduction)
            .map(|r| (r.low, r.low_without, r.high, r.high_without)),
        successes: (
            rows.iter().filter(|r| r.1).count(),
            rows.iter().filter(|r| r.3).count(),
            rows.len(),
        ),
        cost_median: stats::median(&cost_vals),
        cost_interval: boot
            .interval(&cost_sets, stats::median, CLUSTER_METHOD)
            .map(|i| (i.low, i.high)),
    };
    EconomicsVerdict {
        publishable: outcome.publishable,
        statement: verdict_statement(&st, &outcome),
        unmet: outcome.unmet,
    }
}

fn valid_values(pairs: &[&EconomicsPair], f: impl Fn(&EconomicsPair) -> Option<f64>) -> Vec<f64> {
    pairs
        .iter()
        .filter(|p| p.status == EconomicsPairStatus::Valid)
        .filter_map(|p| f(p))
        .collect()
}

fn measured(m: &mut EconomicsMetric, n: usize) {
    m.n = n;
    m.status = if n == 0 {
        EconomicsMetricStatus::NotMeasured
    } else {
        EconomicsMetricStatus::Preliminary
    };
}

fn live_metrics(
    suite: &str,
    pairs: &[&EconomicsPair],
    query: &EconomicsQuery,
    publishable: bool,
    simulated: bool,
    boot: &Boot,
) -> Vec<EconomicsMetric> {
    let mut out = Vec::new();
    let inputs = usage_class(simulated);

    // Stated first: what the gate broke.
    let failed: Vec<&&EconomicsPair> = pairs
        .iter()
        .filter(|p| p.status == EconomicsPairStatus::TreatmentFailed)
        .collect();
    let attempted = pairs.iter().filter(|p| comparable(p)).count();
    let mut gf = metric(
        "gate_caused_failures",
        "Tasks that failed under the gate and passed without it",
        EconomicsClass::Observed,
        None,
        "pairs",
        "pairs whose control passed its task's check and whose treatment did not",
        suite,
    );
    gf.not = Some("not every failure: pairs failing in both arms (a task the agent could not do anyway) are counted in both_failed".into());
    if attempted > 0 {
        gf.value = Some(failed.len() as f64);
        gf.n = attempted;
        gf.status = EconomicsMetricStatus::Preliminary;
    }
    gf.evidence = failed
        .iter()
        .map(|p| {
            format!(
                "{} ({})",
                super::pair_id(&p.task, &p.client, p.repetition),
                p.refusals.join(", ")
            )
        })
        .collect();
    out.push(gf);

    // Tokens and cost, with equal standing: each its own interval and range.
    let headline = Headline {
        pairs,
        query,
        publishable,
        simulated,
        boot,
        suite,
        inputs,
    };
    let mut tr = headline.metric(
        "token_reduction",
        "Total-token reduction",
        "median over valid pairs of 1 - treatment total tokens / control total tokens (provider-reported usage, as the provider answered it; a SERVE or a refusal buys 0 tokens)",
        |p| p.token_reduction,
    );
    tr.not = Some("not the context reduction (counted removable context), and not a saving over failed runs: a pair counts only when both arms' tasks passed their checks (see tokens_per_success_reduction for one that counts failures)".into());
    out.push(tr);
    let mut cr = headline.metric(
        "cost_reduction",
        "Cost reduction at the recorded price table",
        "median over valid pairs (both arms priced) of 1 - treatment cost / control cost, each part of the provider-reported usage (input, cache write, cache read, output) at the price table recorded with the evidence",
        |p| p.cost_reduction,
    );
    cr.not = Some("not an invoice: the cost is the usage at the price table recorded with the evidence, with no discount the provider did not report".into());
    out.push(cr);

    let rows = row_clusters(pairs);
    let row_sets: Vec<Vec<SuccessRow>> = rows.iter().map(|(_, r)| r.clone()).collect();
    let flat: Vec<_> = row_sets.iter().flatten().copied().collect();
    let mut ps = metric(
        "tokens_per_success_reduction",
        "Tokens per successful task: reduction, failures counted",
        EconomicsClass::Derived,
        Some(inputs),
        "ratio",
        "over every attempted comparable pair (valid, control failed, treatment failed, both failed), each task weighed alike (its tokens in units of its mean control run): 1 - (treatment tokens / treatment successes) / (control tokens / control successes)",
        suite,
    );
    ps.not = Some("not a per-pair median: it pools all runs, so a runaway the gate stopped counts as the tokens it did not buy, and a task the gate broke counts as tokens with no success".into());
    ps.value = per_success_reduction(&flat);
    ps.interval = boot.interval(&row_sets, per_success_reduction, CLUSTER_METHOD);
    ps.leave_one_task_out = leave_one_task_out(&rows, per_success_reduction);
    ps.evidence = pairs
        .iter()
        .filter(|p| comparable(p))
        .map(|p| super::pair_id(&p.task, &p.client, p.repetition))
        .collect();
    measured(&mut ps, flat.len());
    if ps.value.is_none() {
        ps.status = EconomicsMetricStatus::NotMeasured;
    }
    ps.warnings.push(
        "pooled over tasks: one heavy task can carry it (see leave_one_task_out); secondary, the publication rule is evaluated for the primary metric only"
            .into(),
    );
    out.push(ps);

    let pooled_rows: Vec<(u64, u64)> = pairs
        .iter()
        .filter(|p| p.status == EconomicsPairStatus::Valid)
        .filter_map(|p| {
            Some((
                p.control_usage.as_ref()?.total,
                p.treatment_usage.as_ref()?.total,
            ))
        })
        .collect();
    let mut pr = metric(
        "pooled_token_reduction",
        "Pooled total-token reduction",
        EconomicsClass::Derived,
        Some(inputs),
        "ratio",
        "1 - sum of treatment total tokens / sum of control total tokens, over valid pairs",
        suite,
    );
    pr.value = pooled(&pooled_rows);
    measured(&mut pr, pooled_rows.len());
    pr.warnings
        .push("secondary: the publication rule is evaluated for the primary metric only".into());
    out.push(pr);

    for (id, title, formula, f) in [
        (
            "request_reduction",
            "Provider-request reduction",
            "median over valid pairs of 1 - treatment provider requests / control provider requests",
            (|p: &EconomicsPair| p.request_reduction) as fn(&EconomicsPair) -> Option<f64>,
        ),
        (
            "tool_call_reduction",
            "Tool-call reduction",
            "median over valid pairs of 1 - tool calls the treatment's agent was asked to make / the control's",
            |p| p.tool_call_reduction,
        ),
        (
            "continuation_reduction",
            "Continuation reduction (last session)",
            "median over valid pairs of tasks of several sessions of 1 - treatment tokens / control tokens in the last session",
            |p| p.continuation_reduction,
        ),
    ] {
        let v = valid_values(pairs, f);
        let mut mm = metric(id, title, EconomicsClass::Derived, Some(inputs), "ratio", formula, suite);
        mm.value = stats::median(&v);
        mm.distribution = stats::distribution(&v);
        mm.evidence = per_task_medians(pairs, f, "ratio");
        measured(&mut mm, v.len());
        out.push(mm);
    }

    // What pacing costs in time, a metric of its own: the gate's holds, and the whole run's
    // wall time against the control's.
    for (id, title, formula, f) in [
        (
            "paced_seconds",
            "Time the gate held the agent's requests (pacing)",
            "median over valid pairs of the treatment's paced time in all (the receipts' paced_ms), in seconds",
            (|p: &EconomicsPair| p.paced_ms.map(|ms| ms as f64 / 1_000.0))
                as fn(&EconomicsPair) -> Option<f64>,
        ),
        (
            "time_added_seconds",
            "Wall time added through the gate",
            "median over valid pairs of the treatment run's wall-clock seconds minus the control run's",
            |p| p.seconds.map(|[c, t]| t - c),
        ),
    ] {
        let v = valid_values(pairs, f);
        let mut mm = metric(id, title, EconomicsClass::Observed, None, "seconds", formula, suite);
        mm.value = stats::median(&v);
        mm.distribution = stats::distribution(&v);
        mm.evidence = per_task_medians(pairs, f, "seconds");
        measured(&mut mm, v.len());
        mm.not = Some("not a cost: time the agent waited, which the provider does not bill; on a compressed recording it is compressed time".into());
        out.push(mm);
    }

    let nb: Vec<&&EconomicsPair> = pairs
        .iter()
        .filter(|p| p.status == EconomicsPairStatus::Valid)
        .collect();
    let mut tnb = metric(
        "tokens_not_bought",
        "Tokens not bought (SERVE)",
        inputs,
        None,
        "tokens",
        "sum over valid pairs of the usage the provider reported for the answers the gate served from its store",
        suite,
    );
    if !nb.is_empty() {
        tnb.value = Some(nb.iter().filter_map(|p| p.tokens_not_bought).sum::<u64>() as f64);
        tnb.n = nb.len();
        tnb.status = EconomicsMetricStatus::Preliminary;
    }
    tnb.not = Some(
        "not a total of savings across tiers: worst-case avoided tokens of BLOCKs are never added"
            .into(),
    );
    out.push(tnb);

    if simulated {
        for mm in &mut out {
            mm.warnings.insert(0, SIMULATION_WARNING.to_string());
        }
    }
    out
}

/// What a headline reduction (tokens, cost) is computed over.
struct Headline<'a> {
    pairs: &'a [&'a EconomicsPair],
    query: &'a EconomicsQuery,
    publishable: bool,
    simulated: bool,
    boot: &'a Boot,
    suite: &'a str,
    inputs: EconomicsClass,
}

impl Headline<'_> {
    /// A per-pair reduction with the primary metric's standing: median, distribution,
    /// task-cluster interval, leave-one-task-out range, and the publication status.
    fn metric(
        &self,
        id: &str,
        title: &str,
        formula: &str,
        f: fn(&EconomicsPair) -> Option<f64>,
    ) -> EconomicsMetric {
        let tasks = task_clusters(self.pairs, f);
        let cl: Vec<Vec<f64>> = tasks.iter().map(|(_, v)| v.clone()).collect();
        let vals: Vec<f64> = cl.iter().flatten().copied().collect();
        let mut m = metric(
            id,
            title,
            EconomicsClass::Derived,
            Some(self.inputs),
            "ratio",
            formula,
            self.suite,
        );
        m.value = stats::median(&vals);
        m.distribution = stats::distribution(&vals);
        m.interval = self.boot.interval(&cl, stats::median, CLUSTER_METHOD);
        m.leave_one_task_out = leave_one_task_out(&tasks, stats::median);
        m.evidence = self
            .pairs
            .iter()
            .filter(|p| p.status == EconomicsPairStatus::Valid && f(p).is_some())
            .map(|p| super::pair_id(&p.task, &p.client, p.repetition))
            .collect();
        measured(&mut m, vals.len());
        let narrowed = self.query.is_narrowed();
        if self.publishable && !narrowed && !vals.is_empty() && !self.simulated {
            m.status = EconomicsMetricStatus::Verified;
        }
        if narrowed && !vals.is_empty() {
            m.warnings.push("narrowed by the query: the publication rule was evaluated over all the evidence, not this slice".into());
        }
        if !self.publishable && !vals.is_empty() {
            m.warnings
                .push("below the publication rule: a result, not a claim".into());
        }
        if cl.len() < 2 && !vals.is_empty() {
            m.warnings
                .push("fewer than two tasks: the interval says nothing about other tasks".into());
        }
        m
    }
}

/// Each task's median of a per-pair figure, one line a task (`task: median (n pairs)`): where
/// a suite-wide median hides the task that moves.
fn per_task_medians(
    pairs: &[&EconomicsPair],
    f: fn(&EconomicsPair) -> Option<f64>,
    unit: &str,
) -> Vec<String> {
    task_clusters(pairs, f)
        .into_iter()
        .filter_map(|(task, v)| {
            let m = stats::median(&v)?;
            Some(format!("{task}: {} ({} pairs)", figure(m, unit), v.len()))
        })
        .collect()
}

/// A dimension the pairs are segmented by: its name, and a pair's value in it.
type Dimension = (&'static str, fn(&EconomicsPair) -> String);

const DIMENSIONS: [Dimension; 6] = [
    ("category", |p| p.category.clone()),
    ("client", |p| p.client.clone()),
    ("model", |p| p.model.clone()),
    ("sessions", |p| match p.sessions {
        1 => "1 session".into(),
        n => format!("{n} sessions"),
    }),
    ("session_length", session_length),
    ("complexity", complexity),
];

/// A pair's session length, by the provider calls its control bought: the seed's segment by
/// session length, in three bands.
fn session_length(p: &EconomicsPair) -> String {
    match p.control_usage.as_ref().map(|u| u.requests) {
        None => "unknown".into(),
        Some(0..=9) => "short (under 10 calls)".into(),
        Some(10..=29) => "medium (10-29 calls)".into(),
        Some(_) => "long (30 calls or more)".into(),
    }
}

/// A pair's complexity, read as the context one of its calls carries: the control's input
/// tokens per provider call, in three bands (the seed names the dimension, not its measure; a
/// task's size in calls is its session length, above).
fn complexity(p: &EconomicsPair) -> String {
    match p.control_usage.as_ref() {
        Some(u) if u.requests > 0 => match u.total_input / u.requests {
            0..=7_999 => "small context (under 8k input tokens a call)".into(),
            8_000..=31_999 => "medium context (8k-32k input tokens a call)".into(),
            _ => "large context (32k input tokens a call or more)".into(),
        },
        _ => "unknown".into(),
    }
}

fn segments(pairs: &[&EconomicsPair]) -> Vec<EconomicsSegment> {
    let mut out = Vec::new();
    for (dim, value_of) in DIMENSIONS {
        let mut seg: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for p in pairs {
            let (tokens, cost) = seg.entry(value_of(p)).or_default();
            if p.status == EconomicsPairStatus::Valid {
                tokens.extend(p.token_reduction);
                cost.extend(p.cost_reduction);
            }
        }
        for (value, (tokens, cost)) in seg {
            out.push(EconomicsSegment {
                dimension: dim.into(),
                value,
                n: tokens.len(),
                token_reduction: stats::distribution(&tokens),
                cost_reduction: stats::distribution(&cost),
            });
        }
    }
    out
}

/// One point per evidence file and metric (compatible or not, each labelled with its
/// methodology and build): the history that appends.
fn history(loaded: &Loaded) -> Vec<EconomicsHistoryPoint> {
    let mut out = Vec::new();
    for (name, ev) in &loaded.evidence {
        let pairs = pairs_of(&ev.suite, loaded, Some(ev), 0);
        let refs: Vec<&EconomicsPair> = pairs
            .iter()
            .filter(|p| p.control.is_some() || p.treatment.is_some())
            .collect();
        let vals = valid_values(&refs, |p| p.token_reduction);
        let costs = valid_values(&refs, |p| p.cost_reduction);
        let rows: Vec<SuccessRow> = row_clusters(&refs)
            .into_iter()
            .flat_map(|(_, r)| r)
            .collect();
        let point = |metric: &str, value: f64, n: usize| EconomicsHistoryPoint {
            suite: ev.suite.clone(),
            methodology: ev.methodology,
            revision: ev
                .build
                .source_blake3
                .get(..12)
                .unwrap_or_default()
                .to_string(),
            provider: match ev.provider.kind {
                ProviderKind::Simulated => "simulated".into(),
                ProviderKind::Real => "real".into(),
            },
            file: format!("evidence/{name}"),
            at: format_utc(ev.recorded_at_unix_ms),
            metric: metric.into(),
            value,
            n,
        };
        if let Some(v) = stats::median(&vals) {
            out.push(point("token_reduction", v, vals.len()));
        }
        if let Some(v) = stats::median(&costs) {
            out.push(point("cost_reduction", v, costs.len()));
        }
        if let Some(v) = per_success_reduction(&rows) {
            out.push(point("tokens_per_success_reduction", v, rows.len()));
        }
    }
    out.sort_by(|a, b| (&a.at, &a.file, &a.metric).cmp(&(&b.at, &b.file, &b.metric)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(sessions: u32, requests: u64, total_input: u64, saved: f64) -> EconomicsPair {
        let mut p: EconomicsPair = serde_json::from_value(serde_json::json!({
            "suite": "s", "task": "t", "category": "c", "client": "x", "sessions": sessions,
            "repetition": 1, "model": "m", "status": "valid"
        }))
        .unwrap();
        p.control_usage = Some(EconomicsUsage {
            requests,
            total_input,
            ..EconomicsUsage::default()
        });
        p.token_reduction = Some(saved);
        p.cost_reduction = Some(saved);
        p
    }

    #[test]
    fn pairs_are_segmented_by_sessions_and_by_the_context_a_call_carries() {
        let pairs = [
            pair(1, 4, 4 * 7_999, 0.1),
            pair(1, 10, 10 * 8_000, 0.2),
            pair(2, 40, 40 * 32_000, 0.5),
        ];
        let refs: Vec<&EconomicsPair> = pairs.iter().collect();
        let seg = segments(&refs);
        let of = |dim: &str| -> Vec<(String, usize)> {
            seg.iter()
                .filter(|g| g.dimension == dim)
                .map(|g| (g.value.clone(), g.n))
                .collect()
        };
        assert_eq!(
            of("sessions"),
            [("1 session".to_string(), 2), ("2 sessions".to_string(), 1)]
        );
        assert_eq!(
            of("complexity"),
            [
                (
                    "large context (32k input tokens a call or more)".to_string(),
                    1
                ),
                ("medium context (8k-32k input tokens a call)".to_string(), 1),
                (
                    "small context (under 8k input tokens a call)".to_string(),
                    1
                ),
            ]
        );
        assert_eq!(
            of("session_length"),
            [
                ("long (30 calls or more)".to_string(), 1),
                ("medium (10-29 calls)".to_string(), 1),
                ("short (under 10 calls)".to_string(), 1),
            ]
        );
    }
}
