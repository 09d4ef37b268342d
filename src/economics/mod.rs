//! Economics: proving the savings (SPEC §6, seed 001's `economics.summary`).
//!
//! A **live suite** replays recorded agent sessions (`sessions/*.json`) in two arms — control
//! straight to a provider, treatment through the gate — and records provider-reported usage
//! per step (`evidence/*.json`, written by `examples/economics_live.rs`). A **context suite**
//! counts, with the pinned tokenizer, the tokens of the parts the gate's findings flag as
//! removable over the same sessions. The two are separate metrics and are never merged.
//!
//! Everything here is pure except [`load`], which reads the directory; the clock is passed in.
//! The stable API is [`summary`] and [`render_text`]; the directory they expect is laid out
//! as `corpus/economics/`:
//!
//! ```text
//! <dir>/methodology.json      the declaration: suites, bootstrap, publication rule
//! <dir>/sessions/*.json       recorded agent sessions, one task each
//! <dir>/evidence/*.json       runs recorded by the live harness, one file per suite run
//! ```

pub mod context;
pub mod model;
pub mod stats;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use model::*;

/// The version of the gate this build is: evidence recorded by another is stale.
pub const GATE_VERSION: &str = env!("CARGO_PKG_VERSION");

const DAY_MS: u64 = 86_400_000;

/// Everything read from an economics directory.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub methodology: Option<Methodology>,
    /// Sessions with the BLAKE3 (hex) of their file.
    pub sessions: Vec<(Session, String)>,
    pub evidence: Vec<EvidenceFile>,
    pub diagnostics: Vec<String>,
}

fn json_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Read the methodology, sessions and evidence under `dir`. Problems become diagnostics.
pub fn load(dir: &Path) -> Loaded {
    let mut out = Loaded::default();
    let mpath = dir.join("methodology.json");
    match std::fs::read(&mpath) {
        Ok(bytes) => {
            let de = &mut serde_json::Deserializer::from_slice(&bytes);
            match serde_path_to_error::deserialize::<_, Methodology>(de) {
                Ok(m) => out.methodology = Some(m),
                Err(e) => out.diagnostics.push(format!("methodology.json: {e}")),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => out.diagnostics.push(format!("methodology.json: {e}")),
    }
    for p in json_files(&dir.join("sessions")) {
        let name = p.display().to_string();
        match std::fs::read(&p) {
            Ok(bytes) => match serde_json::from_slice::<Session>(&bytes) {
                Ok(s) => out
                    .sessions
                    .push((s, blake3::hash(&bytes).to_hex().to_string())),
                Err(e) => out.diagnostics.push(format!("{name}: {e}")),
            },
            Err(e) => out.diagnostics.push(format!("{name}: {e}")),
        }
    }
    for p in json_files(&dir.join("evidence")) {
        let name = p.display().to_string();
        match std::fs::read(&p) {
            Ok(bytes) => match serde_json::from_slice::<EvidenceFile>(&bytes) {
                Ok(e) => out.evidence.push(e),
                Err(e) => out.diagnostics.push(format!("{name}: {e}")),
            },
            Err(e) => out.diagnostics.push(format!("{name}: {e}")),
        }
    }
    out
}

/// The summary of the economics directory `dir` (laid out as `corpus/economics/`), narrowed
/// by `query`, with freshness judged at `now_unix_ms`. Never fails: problems are diagnostics.
pub fn summary(dir: &Path, query: &EconomicsQuery, now_unix_ms: u64) -> EconomicsSummary {
    summarize(&load(dir), query, now_unix_ms, None)
}

/// A UTC timestamp `YYYY-MM-DDTHH:MM:SSZ` from Unix milliseconds.
pub fn format_utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// How one run did.
#[derive(Clone, Debug)]
struct RunOutcome {
    usage: EconomicsUsage,
    succeeded: bool,
    unanswered_needed: Vec<usize>,
    usage_missing: bool,
    not_bought: u64,
}

fn outcome(run: &RunRecord) -> RunOutcome {
    let mut usage = EconomicsUsage::default();
    let mut unanswered_needed = Vec::new();
    let mut usage_missing = false;
    let mut not_bought = 0;
    for s in &run.steps {
        if s.needed && !s.answered {
            unanswered_needed.push(s.index);
        }
        if let Some(u) = &s.served_usage {
            not_bought += u.total();
        }
        let served = s.verdict.as_deref() == Some("SERVE");
        if s.answered && !served {
            usage.requests += 1;
            match &s.usage {
                Some(u) => usage.add_step(u),
                None => usage_missing = true,
            }
        }
    }
    RunOutcome {
        usage,
        succeeded: unanswered_needed.is_empty(),
        unanswered_needed,
        usage_missing,
        not_bought,
    }
}

/// Pair a task's control and treatment runs at one repetition.
pub fn make_pair(
    suite: &str,
    task: &str,
    category: &str,
    model: &str,
    repetition: u32,
    control: Option<&RunRecord>,
    treatment: Option<&RunRecord>,
) -> EconomicsPair {
    let mut p = EconomicsPair {
        suite: suite.to_string(),
        task: task.to_string(),
        category: category.to_string(),
        sessions: 1,
        repetition,
        model: model.to_string(),
        control: control.map(|r| r.id.clone()),
        treatment: treatment.map(|r| r.id.clone()),
        status: EconomicsPairStatus::Missing,
        reasons: vec![],
        control_usage: None,
        treatment_usage: None,
        token_reduction: None,
        request_reduction: None,
        tokens_not_bought: None,
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
    let mut incomparable = Vec::new();
    if c.session_digest != t.session_digest {
        incomparable.push("the arms replayed different session files".to_string());
    }
    if c.model != t.model {
        incomparable.push(format!("models differ: {} vs {}", c.model, t.model));
    }
    if c.steps.len() != t.steps.len() {
        incomparable.push(format!(
            "step counts differ: {} vs {}",
            c.steps.len(),
            t.steps.len()
        ));
    }
    let unanswered = |o: &RunOutcome, arm: &str| {
        format!(
            "{arm} got no answer to needed step(s) {:?}",
            o.unanswered_needed
        )
    };
    p.status = if !incomparable.is_empty() {
        p.reasons = incomparable;
        EconomicsPairStatus::Incomparable
    } else if !co.succeeded && !to.succeeded {
        p.reasons.push(unanswered(&co, "control"));
        p.reasons.push(unanswered(&to, "treatment"));
        EconomicsPairStatus::BothFailed
    } else if !co.succeeded {
        p.reasons.push(unanswered(&co, "control"));
        EconomicsPairStatus::ControlFailed
    } else if !to.succeeded {
        p.reasons.push(unanswered(&to, "treatment"));
        EconomicsPairStatus::TreatmentFailed
    } else if co.usage_missing || to.usage_missing || co.usage.total == 0 {
        p.reasons
            .push("an answered provider request reported no usage".into());
        EconomicsPairStatus::UsageUnavailable
    } else {
        p.token_reduction = Some(1.0 - to.usage.total as f64 / co.usage.total as f64);
        if co.usage.requests > 0 {
            p.request_reduction = Some(1.0 - to.usage.requests as f64 / co.usage.requests as f64);
        }
        EconomicsPairStatus::Valid
    };
    p
}

fn count_pairs(pairs: &[&EconomicsPair], declared: usize) -> EconomicsPairCounts {
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

fn matches(q: &EconomicsQuery, suite: &str, category: &str, model: &str, task: &str) -> bool {
    q.suite.as_deref().is_none_or(|s| s == suite)
        && q.category.as_deref().is_none_or(|s| s == category)
        && q.model.as_deref().is_none_or(|s| s == model)
        && q.task.as_deref().is_none_or(|s| s == task)
}

/// Per-task clusters of the valid pairs' token reductions (in task order).
fn clusters(pairs: &[&EconomicsPair]) -> Vec<Vec<f64>> {
    let mut m: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for p in pairs {
        if let (EconomicsPairStatus::Valid, Some(r)) = (p.status, p.token_reduction) {
            m.entry(p.task.as_str()).or_default().push(r);
        }
    }
    m.into_values().collect()
}

fn usage_clusters(pairs: &[&EconomicsPair]) -> Vec<Vec<(u64, u64)>> {
    let mut m: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for p in pairs {
        if let (EconomicsPairStatus::Valid, Some(c), Some(t)) =
            (p.status, &p.control_usage, &p.treatment_usage)
        {
            m.entry(p.task.as_str())
                .or_default()
                .push((c.total, t.total));
        }
    }
    m.into_values().collect()
}

fn pooled_reduction(v: &[(u64, u64)]) -> Option<f64> {
    let c: u64 = v.iter().map(|x| x.0).sum();
    let t: u64 = v.iter().map(|x| x.1).sum();
    (c > 0).then(|| 1.0 - t as f64 / c as f64)
}

fn ratio(v: &[(u64, u64)]) -> Option<f64> {
    let r: u64 = v.iter().map(|x| x.0).sum();
    let t: u64 = v.iter().map(|x| x.1).sum();
    (t > 0).then(|| r as f64 / t as f64)
}

struct Boot {
    seed: u64,
    resamples: u32,
    level_bp: u32,
}

impl Boot {
    fn interval<T: Clone>(
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

const CLUSTER_METHOD: &str =
    "cluster bootstrap over tasks (a task's repetitions resampled together), percentile interval";

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
    pub tasks_with_valid_pairs: usize,
    /// Valid pairs per category.
    pub category_pairs: BTreeMap<String, usize>,
    /// The fewest repetitions recorded for any declared task and arm.
    pub min_repetitions: u32,
    pub interval: Option<(f64, f64)>,
    pub freshness: Option<EconomicsFreshness>,
}

/// Evaluate the publication rule: every threshold not met is named.
pub fn evaluate_rule(rule: &EconomicsPublicationPolicy, i: &RuleInputs) -> RuleOutcome {
    let mut unmet = Vec::new();
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
    let rate_bp = (i.valid_pairs * 10_000)
        .checked_div(i.attempted_pairs)
        .unwrap_or(0);
    if rate_bp < rule.min_valid_pair_rate_bp as usize {
        unmet.push(format!(
            "min_valid_pair_rate_bp: {rate_bp} < {}",
            rule.min_valid_pair_rate_bp
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
        let f = i
            .freshness
            .map(|f| {
                serde_json::to_value(f)
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            })
            .unwrap_or_else(|| "\"no_evidence\"".into());
        unmet.push(format!("require_current: the evidence is {f}"));
    }
    RuleOutcome {
        publishable: unmet.is_empty(),
        unmet,
    }
}

/// The one sentence the evidence allows, generated from the numbers and the rule's outcome.
pub fn verdict_statement(
    suite: &str,
    outcome: &RuleOutcome,
    value: Option<f64>,
    inputs: &RuleInputs,
    level_bp: u32,
) -> String {
    match (outcome.publishable, value, inputs.interval) {
        (true, Some(v), Some((lo, hi))) => {
            let (dir, mag) = if v >= 0.0 { ("fewer", v) } else { ("more", -v) };
            format!(
                "Through the gate, the median agent task of suite {suite} used {} {dir} total tokens than the same session sent straight to the provider ({}% interval {} to {}; {} valid pairs over {} tasks in {} categories, at least {} repetitions each).",
                pct(mag),
                f64::from(level_bp) / 100.0,
                pct(lo),
                pct(hi),
                inputs.valid_pairs,
                inputs.tasks_with_valid_pairs,
                inputs.category_pairs.values().filter(|&&n| n > 0).count(),
                inputs.min_repetitions
            )
        }
        _ => {
            let mut s = format!(
                "No quantitative token claim for suite {suite}: {}.",
                outcome.unmet.join("; ")
            );
            if let Some(v) = value {
                let _ = write!(
                    s,
                    " The median per-pair token reduction of {} over {} valid pairs is a preliminary result, not a claim.",
                    pct(v),
                    inputs.valid_pairs
                );
            }
            s
        }
    }
}

fn metric(
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
        warnings: vec![],
    }
}

fn freshness_of(
    ev: &EvidenceFile,
    m: &Methodology,
    now_unix_ms: u64,
) -> (EconomicsFreshness, Option<String>) {
    if ev.methodology != m.version {
        return (
            EconomicsFreshness::Incompatible,
            Some(format!(
                "recorded under methodology v{}, this is v{}",
                ev.methodology, m.version
            )),
        );
    }
    if ev.gate_version != GATE_VERSION {
        return (
            EconomicsFreshness::Stale,
            Some(format!(
                "recorded with gate {}, this build is {GATE_VERSION}",
                ev.gate_version
            )),
        );
    }
    let window = u64::from(m.publication.freshness_window_days) * DAY_MS;
    let age = now_unix_ms.saturating_sub(ev.recorded_at_unix_ms);
    if age > window {
        return (
            EconomicsFreshness::Stale,
            Some(format!(
                "recorded {} days ago, the window is {} days",
                age / DAY_MS,
                m.publication.freshness_window_days
            )),
        );
    }
    (EconomicsFreshness::Current, None)
}

/// Pairs of one evidence file, against the declared sessions.
fn pairs_of(
    ev: &EvidenceFile,
    sessions: &[(Session, String)],
    repetitions: u32,
) -> Vec<EconomicsPair> {
    let mut tasks: BTreeMap<String, (String, String)> = sessions
        .iter()
        .map(|(s, _)| (s.task.clone(), (s.category.clone(), s.model.clone())))
        .collect();
    let mut reps: BTreeSet<u32> = (1..=repetitions).collect();
    for r in &ev.runs {
        tasks
            .entry(r.task.clone())
            .or_insert_with(|| (r.category.clone(), r.model.clone()));
        reps.insert(r.repetition);
    }
    let mut out = Vec::new();
    for (task, (category, model)) in &tasks {
        for &rep in &reps {
            let find = |arm: &str| {
                ev.runs
                    .iter()
                    .find(|r| &r.task == task && r.repetition == rep && r.arm == arm)
            };
            out.push(make_pair(
                &ev.suite,
                task,
                category,
                model,
                rep,
                find("control"),
                find("treatment"),
            ));
        }
    }
    out
}

/// [`summary`] over already-loaded data; `resamples` overrides the methodology's count
/// (tests use fewer; the real summary passes `None`).
pub fn summarize(
    loaded: &Loaded,
    query: &EconomicsQuery,
    now_unix_ms: u64,
    resamples: Option<u32>,
) -> EconomicsSummary {
    let mut s = EconomicsSummary {
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
        metrics: vec![],
        suites: vec![],
        pairs: vec![],
        segments: vec![],
        history: vec![],
        variants: vec![],
        hypotheses: vec![],
        context: None,
        query: query.clone(),
        diagnostics: loaded.diagnostics.clone(),
    };
    let Some(m) = &loaded.methodology else {
        return s;
    };
    s.present = true;
    s.methodology = Some(m.version);
    s.question = Some(m.question.clone());
    s.primary_metric = Some(m.primary_metric.clone());
    s.publication = Some(m.publication.clone());
    s.variants = m.variants.clone();
    s.hypotheses = m.hypotheses.clone();
    let boot = Boot {
        seed: m.bootstrap.seed,
        resamples: resamples.unwrap_or(m.bootstrap.resamples),
        level_bp: m.bootstrap.level_bp,
    };

    // History: every evidence file, compatible or not, labelled with its methodology.
    for ev in &loaded.evidence {
        let pairs = pairs_of(ev, &loaded.sessions, 0);
        let vals: Vec<f64> = pairs.iter().filter_map(|p| p.token_reduction).collect();
        if let Some(v) = stats::median(&vals) {
            s.history.push(EconomicsHistoryPoint {
                suite: ev.suite.clone(),
                methodology: ev.methodology,
                revision: ev.gate_version.clone(),
                at: format_utc(ev.recorded_at_unix_ms),
                metric: "token_reduction".into(),
                value: v,
                n: vals.len(),
            });
        }
    }
    s.history.sort_by(|a, b| a.at.cmp(&b.at));

    let mut primary_verdict: Option<EconomicsVerdict> = None;
    for decl in &m.suites {
        let source = if decl.kind == "context" {
            decl.reads.clone().unwrap_or_default()
        } else {
            decl.id.clone()
        };
        // The latest evidence file for the suite (incompatible ones too, to say so).
        let latest = loaded
            .evidence
            .iter()
            .filter(|e| e.suite == source)
            .max_by_key(|e| e.recorded_at_unix_ms);
        let (freshness, detail) = match latest {
            None => (
                EconomicsFreshness::NoEvidence,
                Some("no run recorded".to_string()),
            ),
            Some(ev) => freshness_of(ev, m, now_unix_ms),
        };
        let usable = latest.filter(|_| freshness != EconomicsFreshness::Incompatible);
        if let (Some(ev), EconomicsFreshness::Incompatible) = (latest, freshness) {
            s.diagnostics.push(format!(
                "evidence of suite {} recorded under methodology v{} is incompatible with v{} and is not used",
                ev.suite, ev.methodology, m.version
            ));
        }
        let sessions_declared = loaded.sessions.len();
        let mut view = EconomicsSuiteView {
            id: decl.id.clone(),
            kind: decl.kind.clone(),
            version: decl.version,
            title: decl.title.clone(),
            model: None,
            freshness,
            freshness_detail: detail,
            runs: 0,
            pairs: EconomicsPairCounts::default(),
            revisions: latest
                .map(|e| vec![e.gate_version.clone()])
                .unwrap_or_default(),
            harnesses: latest.map(|e| vec![e.harness.clone()]).unwrap_or_default(),
            models_reported: vec![],
        };
        if let Some(ev) = usable {
            let models: BTreeSet<String> = ev
                .runs
                .iter()
                .flat_map(|r| r.steps.iter().filter_map(|st| st.model_reported.clone()))
                .collect();
            view.models_reported = models.into_iter().collect();
        }

        if decl.kind == "context" {
            if query.suite.as_deref().is_some_and(|q| q != decl.id) {
                continue;
            }
            let (metrics, ctx) = context_suite(m, decl, loaded, usable, query, &boot);
            view.runs = usable.map(|e| e.runs.len()).unwrap_or(0);
            s.metrics.extend(metrics);
            s.context = ctx;
            s.suites.push(view);
            continue;
        }

        // Live suite.
        let all_pairs = usable
            .map(|ev| pairs_of(ev, &loaded.sessions, decl.repetitions))
            .unwrap_or_default();
        let all_refs: Vec<&EconomicsPair> = all_pairs.iter().collect();
        view.runs = usable.map(|e| e.runs.len()).unwrap_or(0);
        view.pairs = count_pairs(&all_refs, sessions_declared * decl.repetitions as usize);
        let models: BTreeSet<&str> = loaded
            .sessions
            .iter()
            .map(|(x, _)| x.model.as_str())
            .collect();
        if models.len() == 1 {
            view.model = models.into_iter().next().map(str::to_string);
        }

        // The rule, over all the evidence of this suite.
        let is_primary_suite = primary_verdict.is_none();
        let all_clusters = clusters(&all_refs);
        let all_vals: Vec<f64> = all_clusters.iter().flatten().copied().collect();
        let all_interval = boot.interval(&all_clusters, stats::median, CLUSTER_METHOD);
        let mut category_pairs: BTreeMap<String, usize> = BTreeMap::new();
        for (x, _) in &loaded.sessions {
            category_pairs.entry(x.category.clone()).or_insert(0);
        }
        for p in all_refs
            .iter()
            .filter(|p| p.status == EconomicsPairStatus::Valid)
        {
            *category_pairs.entry(p.category.clone()).or_insert(0) += 1;
        }
        let min_reps = loaded
            .sessions
            .iter()
            .flat_map(|(x, _)| {
                ["control", "treatment"].map(|arm| {
                    usable
                        .map(|ev| {
                            ev.runs
                                .iter()
                                .filter(|r| r.task == x.task && r.arm == arm)
                                .count() as u32
                        })
                        .unwrap_or(0)
                })
            })
            .min()
            .unwrap_or(0);
        let inputs = RuleInputs {
            valid_pairs: view.pairs.valid,
            attempted_pairs: view.pairs.attempted,
            tasks_with_valid_pairs: all_clusters.len(),
            category_pairs,
            min_repetitions: min_reps,
            interval: all_interval.as_ref().map(|i| (i.low, i.high)),
            freshness: Some(freshness),
        };
        let rule = evaluate_rule(&m.publication, &inputs);
        let all_median = stats::median(&all_vals);
        if is_primary_suite {
            primary_verdict = Some(EconomicsVerdict {
                publishable: rule.publishable,
                statement: verdict_statement(&decl.id, &rule, all_median, &inputs, boot.level_bp),
                unmet: rule.unmet.clone(),
            });
        }

        if query.suite.as_deref().is_some_and(|q| q != decl.id) {
            continue;
        }
        // Narrowed view.
        let narrowed: Vec<&EconomicsPair> = all_pairs
            .iter()
            .filter(|p| matches(query, &p.suite, &p.category, &p.model, &p.task))
            .collect();
        let cl = clusters(&narrowed);
        let vals: Vec<f64> = cl.iter().flatten().copied().collect();
        let evidence: Vec<String> = narrowed
            .iter()
            .filter(|p| p.status == EconomicsPairStatus::Valid)
            .map(|p| format!("{}#r{}", p.task, p.repetition))
            .collect();

        let mut tr = metric(
            "token_reduction",
            "Total-token reduction",
            EconomicsClass::Derived,
            Some(EconomicsClass::Observed),
            "ratio",
            "median over valid pairs of 1 - treatment total tokens / control total tokens (provider-reported usage; a SERVE buys 0 tokens)",
            &decl.id,
        );
        tr.not = Some("not the context reduction: that one counts removable context, this one what the provider billed".into());
        tr.n = vals.len();
        tr.value = stats::median(&vals);
        tr.distribution = stats::distribution(&vals);
        tr.interval = boot.interval(&cl, stats::median, CLUSTER_METHOD);
        tr.evidence = evidence.clone();
        tr.status = if vals.is_empty() {
            EconomicsMetricStatus::NotMeasured
        } else if m.primary_metric == "token_reduction"
            && is_primary_suite
            && rule.publishable
            && !query.is_narrowed()
        {
            EconomicsMetricStatus::Verified
        } else {
            EconomicsMetricStatus::Preliminary
        };
        if query.is_narrowed() && !vals.is_empty() {
            tr.warnings.push("narrowed by the query: the publication rule was evaluated over all the evidence, not this slice".into());
        }
        if !rule.publishable && !vals.is_empty() {
            tr.warnings
                .push("below the publication rule: a result, not a claim".into());
        }
        if decl.repetitions > 0 && cl.len() < 2 && !vals.is_empty() {
            tr.warnings
                .push("fewer than two tasks: the interval says nothing about other tasks".into());
        }
        s.metrics.push(tr);

        let ucl = usage_clusters(&narrowed);
        let pooled: Vec<(u64, u64)> = ucl.iter().flatten().copied().collect();
        let mut pr = metric(
            "pooled_token_reduction",
            "Pooled total-token reduction",
            EconomicsClass::Derived,
            Some(EconomicsClass::Observed),
            "ratio",
            "1 - sum of treatment total tokens / sum of control total tokens, over valid pairs",
            &decl.id,
        );
        pr.n = pooled.len();
        pr.value = pooled_reduction(&pooled);
        pr.interval = boot.interval(&ucl, pooled_reduction, CLUSTER_METHOD);
        pr.evidence = evidence.clone();
        pr.status = if pooled.is_empty() {
            EconomicsMetricStatus::NotMeasured
        } else {
            EconomicsMetricStatus::Preliminary
        };
        pr.warnings.push(
            "secondary: the publication rule is evaluated for the primary metric only".into(),
        );
        s.metrics.push(pr);

        let rq: Vec<f64> = narrowed
            .iter()
            .filter(|p| p.status == EconomicsPairStatus::Valid)
            .filter_map(|p| p.request_reduction)
            .collect();
        let mut rr = metric(
            "request_reduction",
            "Provider-request reduction",
            EconomicsClass::Derived,
            Some(EconomicsClass::Observed),
            "ratio",
            "median over valid pairs of 1 - treatment provider requests / control provider requests",
            &decl.id,
        );
        rr.n = rq.len();
        rr.value = stats::median(&rq);
        rr.distribution = stats::distribution(&rq);
        rr.status = if rq.is_empty() {
            EconomicsMetricStatus::NotMeasured
        } else {
            EconomicsMetricStatus::Preliminary
        };
        s.metrics.push(rr);

        let nb: Vec<&EconomicsPair> = narrowed
            .iter()
            .copied()
            .filter(|p| p.status == EconomicsPairStatus::Valid)
            .collect();
        let mut tnb = metric(
            "tokens_not_bought",
            "Tokens not bought (SERVE)",
            EconomicsClass::Observed,
            None,
            "tokens",
            "sum over valid pairs of the usage the provider reported for the answers the gate served from its store",
            &decl.id,
        );
        tnb.n = nb.len();
        if !nb.is_empty() {
            tnb.value = Some(nb.iter().filter_map(|p| p.tokens_not_bought).sum::<u64>() as f64);
            tnb.status = EconomicsMetricStatus::Preliminary;
        }
        tnb.not = Some("not a total of savings across tiers: worst-case avoided tokens of BLOCKs are never added".into());
        s.metrics.push(tnb);

        // Segments.
        for (dim, key) in [("category", 0usize), ("model", 1)] {
            let mut seg: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for p in &narrowed {
                let k = if key == 0 { &p.category } else { &p.model };
                let e = seg.entry(k.clone()).or_default();
                if let (EconomicsPairStatus::Valid, Some(r)) = (p.status, p.token_reduction) {
                    e.push(r);
                }
            }
            for (value, v) in seg {
                s.segments.push(EconomicsSegment {
                    dimension: dim.into(),
                    value,
                    n: v.len(),
                    token_reduction: stats::distribution(&v),
                });
            }
        }
        s.pairs.extend(narrowed.into_iter().cloned());
        s.suites.push(view);
    }
    match primary_verdict {
        Some(v) => s.verdict = v,
        None => {
            s.verdict.statement =
                "No quantitative token claim: the methodology declares no live suite.".into();
        }
    }
    s
}

fn context_suite(
    m: &Methodology,
    decl: &SuiteDecl,
    loaded: &Loaded,
    evidence: Option<&EvidenceFile>,
    query: &EconomicsQuery,
    boot: &Boot,
) -> (Vec<EconomicsMetric>, Option<EconomicsContextView>) {
    let tokenizer = EconomicsTokenizer {
        encoding: "cl100k_base".into(),
        implementation: format!(
            "tiktoken-rs {}",
            crate::split_profile::tokenizer::TIKTOKEN_RS_VERSION
        ),
    };
    let mut cr = metric(
        "context_reduction",
        "Context reduction",
        EconomicsClass::Derived,
        Some(EconomicsClass::Counted),
        "ratio",
        "counted tokens of the parts the gate's findings flag as removable / counted context tokens, over every request of every session",
        &decl.id,
    );
    cr.not = Some("not a total-token reduction: nothing here was billed or avoided; it is what the context carried that the findings call removable".into());
    let mut ct = metric(
        "context_tokens",
        "Context tokens counted",
        EconomicsClass::Counted,
        None,
        "tokens",
        "cl100k_base tokens of system prompt, turns and tool definitions of every request",
        &decl.id,
    );
    let mut rt = metric(
        "removable_context_tokens",
        "Removable context tokens",
        EconomicsClass::Counted,
        None,
        "tokens",
        "cl100k_base tokens of the turns and tool definitions the findings flag (each part once)",
        &decl.id,
    );
    let Some(ev) = evidence else {
        return (vec![cr, ct, rt], None);
    };
    let mut per_session: Vec<Vec<(u64, u64)>> = Vec::new();
    let mut by_finding: BTreeMap<String, u64> = BTreeMap::new();
    let mut requests = 0;
    let mut ids = Vec::new();
    let mut failed = false;
    for (sess, digest) in &loaded.sessions {
        if !matches(query, &decl.id, &sess.category, &sess.model, &sess.task) {
            continue;
        }
        let Some(run) = ev
            .runs
            .iter()
            .filter(|r| r.task == sess.task && r.arm == "treatment" && &r.session_digest == digest)
            .min_by_key(|r| r.repetition)
        else {
            continue;
        };
        let (mut removable, mut counted) = (0u64, 0u64);
        for (i, step) in sess.steps.iter().enumerate() {
            let findings = run
                .steps
                .iter()
                .find(|x| x.index == i)
                .map(|x| x.findings.clone())
                .unwrap_or_default();
            match context::count_request(
                &step.body,
                &findings,
                m.context.keep_recent_turns,
                &m.context.removable_findings,
            ) {
                Some(c) => {
                    counted += c.counted;
                    removable += c.removable;
                    for (k, v) in c.by_finding {
                        *by_finding.entry(k).or_insert(0) += v;
                    }
                    requests += 1;
                }
                None => failed = true,
            }
        }
        per_session.push(vec![(removable, counted)]);
        ids.push(run.id.clone());
    }
    if failed {
        cr.warnings
            .push("the tokenizer was unavailable for some requests".into());
        return (vec![cr, ct, rt], None);
    }
    let pooled: Vec<(u64, u64)> = per_session.iter().flatten().copied().collect();
    let counted: u64 = pooled.iter().map(|x| x.1).sum();
    let removable: u64 = pooled.iter().map(|x| x.0).sum();
    if !pooled.is_empty() {
        let per: Vec<f64> = pooled
            .iter()
            .filter(|x| x.1 > 0)
            .map(|x| x.0 as f64 / x.1 as f64)
            .collect();
        cr.n = pooled.len();
        cr.value = ratio(&pooled);
        cr.distribution = stats::distribution(&per);
        cr.interval = boot.interval(
            &per_session,
            ratio,
            "bootstrap over sessions, percentile interval",
        );
        cr.status = EconomicsMetricStatus::Measured;
        cr.evidence = ids.clone();
        for (mm, v) in [(&mut ct, counted), (&mut rt, removable)] {
            mm.n = pooled.len();
            mm.value = Some(v as f64);
            mm.status = EconomicsMetricStatus::Measured;
            mm.evidence = ids.clone();
        }
    }
    let view = EconomicsContextView {
        suite: decl.id.clone(),
        measured_at: format_utc(ev.recorded_at_unix_ms),
        tokenizer,
        sessions: pooled.len(),
        requests,
        counted_tokens: counted,
        removable_tokens: removable,
        removable_by_finding: by_finding,
    };
    (vec![cr, ct, rt], Some(view))
}

fn status_str<T: serde::Serialize>(x: &T) -> String {
    serde_json::to_value(x)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A plain-text rendering of a summary, for the command line.
pub fn render_text(s: &EconomicsSummary) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "tokensaver economics summary");
    if !s.present {
        let _ = writeln!(o, "verdict: {}", s.verdict.statement);
        for d in &s.diagnostics {
            let _ = writeln!(o, "diagnostic: {d}");
        }
        return o;
    }
    if let Some(v) = s.methodology {
        let _ = writeln!(o, "methodology: v{v}");
    }
    if let Some(q) = &s.question {
        let _ = writeln!(o, "question: {q}");
    }
    if s.query.is_narrowed() {
        let _ = writeln!(
            o,
            "query: {} (metrics narrowed; the verdict is over all the evidence)",
            serde_json::to_string(&s.query).unwrap_or_default()
        );
    }
    let _ = writeln!(
        o,
        "\nverdict ({}): {}",
        if s.verdict.publishable {
            "publishable"
        } else {
            "not publishable"
        },
        s.verdict.statement
    );
    for u in &s.verdict.unmet {
        let _ = writeln!(o, "  unmet: {u}");
    }
    let _ = writeln!(o, "\nsuites:");
    for v in &s.suites {
        let _ = writeln!(
            o,
            "  {} ({}, v{}): {}{} — runs {}, pairs declared {} attempted {} valid {} control_failed {} treatment_failed {} both_failed {} other {}",
            v.id,
            v.kind,
            v.version,
            status_str(&v.freshness),
            v.freshness_detail
                .as_ref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default(),
            v.runs,
            v.pairs.declared,
            v.pairs.attempted,
            v.pairs.valid,
            v.pairs.control_failed,
            v.pairs.treatment_failed,
            v.pairs.both_failed,
            v.pairs.other
        );
    }
    let _ = writeln!(o, "\nmetrics:");
    for m in &s.metrics {
        let value = match (m.value, m.unit.as_str()) {
            (None, _) => "—".to_string(),
            (Some(v), "ratio") => pct(v),
            (Some(v), _) => format!("{v:.0}"),
        };
        let interval = m
            .interval
            .as_ref()
            .map(|i| {
                format!(
                    " [{}% interval {} to {}, {} resamples, seed {}]",
                    f64::from(i.level_bp) / 100.0,
                    pct(i.low),
                    pct(i.high),
                    i.resamples,
                    i.seed
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  {} = {value}{interval} — {}, class {}{}, n {}, suite {}",
            m.id,
            status_str(&m.status),
            status_str(&m.class),
            m.inputs
                .map(|c| format!(" from {}", status_str(&c)))
                .unwrap_or_default(),
            m.n,
            m.suite
        );
    }
    if let Some(c) = &s.context {
        let _ = writeln!(
            o,
            "\ncontext: {} removable of {} counted tokens ({} {}), {} sessions, {} requests",
            c.removable_tokens,
            c.counted_tokens,
            c.tokenizer.encoding,
            c.tokenizer.implementation,
            c.sessions,
            c.requests
        );
        for (k, v) in &c.removable_by_finding {
            let _ = writeln!(o, "  {k}: {v}");
        }
    }
    if !s.segments.is_empty() {
        let _ = writeln!(o, "\nsegments (median token reduction):");
        for g in &s.segments {
            let med = g
                .token_reduction
                .as_ref()
                .map(|d| pct(d.median))
                .unwrap_or_else(|| "—".into());
            let _ = writeln!(o, "  {}={}: {med} (n {})", g.dimension, g.value, g.n);
        }
    }
    let _ = writeln!(o, "\npairs:");
    for p in &s.pairs {
        let _ = writeln!(
            o,
            "  {} r{} [{}]: {}{}{}",
            p.task,
            p.repetition,
            p.category,
            status_str(&p.status),
            p.token_reduction
                .map(|r| format!(" token_reduction {}", pct(r)))
                .unwrap_or_default(),
            if p.reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.reasons.join("; "))
            }
        );
    }
    for d in &s.diagnostics {
        let _ = writeln!(o, "diagnostic: {d}");
    }
    o
}
