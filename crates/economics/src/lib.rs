//! Economics: proving the savings (SPEC §6, seed 001's `economics.summary`).
//!
//! A **live suite** runs real agent clients (Claude Code, Codex CLI, the OpenAI Agents SDK)
//! on fixture tasks (`tasks/<id>/`) in a closed loop, in two arms — control straight to a
//! provider, treatment through the gate — and judges each run by the task's own check
//! (`tokensaver economics run`, the server's `economics::run`; evidence in `evidence/<suite>/*.json`, one file per
//! run, never overwritten). Against the built-in scripted provider the evidence is a
//! **simulation**: it says so in the first words of its statement and is never verified.
//! A **context suite** counts, with the pinned tokenizer, the tokens of the parts of the
//! treatment's requests that the gate's findings flag as removable. The two are separate
//! metrics and are never merged.
//!
//! Evidence records what it was recorded with (the server's `economics::identity`): the build, the gate config's
//! policy, the methodology, every task and the harness; a summary compares them with what is
//! here now ([`Current`]) and calls the suite `stale`, naming every reason, when any differs.
//!
//! Everything here is pure: the server reads the directory into a [`Loaded`]
//! (`economics::load`) and runs the suites; the clock is passed in. The directory is laid out
//! as `corpus/economics/`:
//!
//! ```text
//! <dir>/methodology.json          the declaration: arms, clients, suites, bootstrap, rule
//! <dir>/methodology-versions.json the BLAKE3 of every methodology version (a test pins it)
//! <dir>/tasks/<id>/               a fixture task: task.json, its check, its workspace
//! <dir>/evidence/<suite>/*.json   one file per recorded run of the suite (history)
//! <dir>/ablations.json            the ablation arms (one mechanism off each), versioned apart
//! <dir>/ablation/<suite>/*.json   an arm recorded against a suite's evidence file
//! ```

pub mod ablation;
pub mod context;
mod measure;
pub mod model;
pub mod pairs;
pub mod plot;
pub mod render;
pub mod rule;
pub mod stats;
mod stuck;

use std::collections::BTreeMap;

use model::*;
pub use pairs::{make_pair, outcome, pair_id, PairKey};
pub use render::render_text;
pub use rule::{
    effective_rule, evaluate_rule, floor_of, verdict_statement, RuleInputs, RuleOutcome,
    StatementInputs, FLOOR, SEED_THRESHOLDS, SIMULATION_LABEL,
};

/// The evidence layout this build writes and reads.
pub const EVIDENCE_FORMAT: u32 = 2;

const DAY_MS: u64 = 86_400_000;

/// Everything read from an economics directory.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub methodology: Option<Methodology>,
    /// BLAKE3 of `methodology.json`'s bytes.
    pub methodology_blake3: Option<String>,
    /// Tasks by id, with the BLAKE3 of their directory.
    pub tasks: BTreeMap<String, (TaskDecl, String)>,
    /// Evidence files, with their path relative to `evidence/`.
    pub evidence: Vec<(String, EvidenceFile)>,
    /// `ablations.json`, its BLAKE3, and the ablation arms' recordings (`ablation/`), with
    /// their path relative to `ablation/`.
    pub ablation: Option<ablation::AblationDecl>,
    pub ablation_blake3: Option<String>,
    pub ablations: Vec<(String, ablation::AblationFile)>,
    /// BLAKE3 of the harness beside the directory (`None`: not found here).
    pub harness_blake3: Option<String>,
    pub diagnostics: Vec<String>,
}

impl Loaded {
    /// The tasks of one recorded suite (a task names its suite).
    pub fn tasks_of<'a>(
        &'a self,
        suite: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a (TaskDecl, String))> + 'a {
        self.tasks
            .iter()
            .filter(move |(_, (t, _))| t.suite == suite)
    }
}

/// The latest evidence file of a suite (what its summary judges), with its path relative to
/// `evidence/`.
pub fn latest_evidence<'l>(loaded: &'l Loaded, suite: &str) -> Option<&'l (String, EvidenceFile)> {
    loaded
        .evidence
        .iter()
        .filter(|(_, e)| e.suite == suite)
        .max_by_key(|(name, e)| (e.recorded_at_unix_ms, name.clone()))
}

/// The gate config in force, as far as freshness needs it: the BLAKE3 of the policy it applies
/// to the treatment key (the server implements it for its `Config`).
pub trait GateConfigInForce {
    /// The error is the implementor's own (the server's, with its context): this crate only
    /// says it, in the reasons evidence is stale.
    fn gate_policy_blake3(
        &self,
        key: &TreatmentKeyDecl,
    ) -> Result<String, Box<dyn std::error::Error + Send + Sync>>;

    /// Whether this build's gate, with this config, decides every recorded treatment call of
    /// `ev` as it was decided (the calls' digests replayed on the recording's clock):
    /// `Ok(calls replayed)`, or `Err` naming the first call decided otherwise, or why the
    /// evidence cannot be replayed.
    fn decides_alike(&self, ev: &EvidenceFile, key: &TreatmentKeyDecl) -> Result<usize, String>;
}

/// What a summary compares evidence with: a build, and the gate config in force (the
/// running server's, or the one the command line names).
#[derive(Clone)]
pub struct Current<'a> {
    /// The build's source BLAKE3 (the server's `economics::identity::SOURCE_BLAKE3`).
    pub build: &'a str,
    /// The gate config in force; `None`: there is none to compare with (stale).
    pub config: Option<&'a dyn GateConfigInForce>,
    /// The client versions this build's tests pin, by client program id (`claude-code`,
    /// `codex`, `openai-agents`); empty: not compared.
    pub clients: BTreeMap<String, String>,
    /// How the built-in provider counts and bills now (`ProviderInfo::usage_counting`), and
    /// the tokenizer that counts context now: simulated evidence made otherwise is stale.
    pub simulated_usage_counting: &'a str,
    pub tokenizer: Option<EconomicsTokenizer>,
}

/// What a client id is installed and pinned as: the Agents SDK's two clients are one
/// package, the anthropic-sdk loop is the `anthropic` package, the others their own names.
pub fn client_package(client_id: &str) -> &str {
    match client_id {
        id if id.starts_with("agents-sdk") => "openai-agents",
        "anthropic-sdk" => "anthropic",
        id => id,
    }
}

/// A UTC timestamp `YYYY-MM-DDTHH:MM:SSZ` from Unix milliseconds.
pub fn format_utc(unix_ms: u64) -> String {
    tokensaver_core::utc::rfc3339(unix_ms)
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

/// Where recorded evidence stands against what is here now, with every reason it is not
/// current (when current: how, if another build recorded it).
pub fn freshness_of(
    ev: &EvidenceFile,
    loaded: &Loaded,
    current: &Current<'_>,
    now_unix_ms: u64,
) -> (EconomicsFreshness, Vec<String>) {
    let Some(m) = &loaded.methodology else {
        return (EconomicsFreshness::NoEvidence, vec![]);
    };
    if ev.methodology != m.version {
        return (
            EconomicsFreshness::Incompatible,
            vec![format!(
                "recorded under methodology v{}, this is v{}",
                ev.methodology, m.version
            )],
        );
    }
    let mut reasons = Vec::new();
    if let Some(now) = &loaded.methodology_blake3 {
        if &ev.methodology_blake3 != now {
            reasons.push(format!(
                "methodology.json changed since it was recorded (blake3 {} → {}) without a new version: any change to the methodology needs one",
                short(&ev.methodology_blake3),
                short(now)
            ));
        }
    }
    // Another build still describes the same gate when it decides every recorded call alike.
    let mut notes = Vec::new();
    if ev.build.source_blake3 != current.build {
        let built = format!(
            "recorded by build {}, this build is {}",
            short(&ev.build.source_blake3),
            short(current.build)
        );
        match current.config.map(|c| c.decides_alike(ev, &m.treatment_key)) {
            Some(Ok(calls)) => notes.push(format!(
                "{built}, which decides its {calls} recorded treatment calls alike (replayed from their digests)"
            )),
            Some(Err(why)) => reasons.push(format!("{built}; replayed: {why}")),
            None => reasons.push(built),
        }
    }
    match current
        .config
        .map(|c| c.gate_policy_blake3(&m.treatment_key))
    {
        None => reasons.push("no gate config in force to compare the recorded one with".into()),
        Some(Err(e)) => reasons.push(format!("the gate config in force: {e}")),
        Some(Ok(h)) if h != ev.gate_config_blake3 => reasons.push(format!(
            "recorded with gate config {}, the config in force is {}",
            short(&ev.gate_config_blake3),
            short(&h)
        )),
        Some(Ok(_)) => {}
    }
    for c in &ev.clients {
        if let Some(pinned) = current.clients.get(client_package(&c.id)) {
            if &c.version != pinned {
                reasons.push(format!(
                    "recorded with {} {}, the pinned version is {pinned}",
                    c.program, c.version
                ));
            }
        }
    }
    if ev.provider.kind == ProviderKind::Simulated
        && ev.provider.usage_counting != current.simulated_usage_counting
    {
        reasons.push(format!(
            "recorded against a built-in provider that counted and billed otherwise ({}); it now counts: {}",
            ev.provider.usage_counting, current.simulated_usage_counting
        ));
    }
    if let Some(t) = current.tokenizer.as_ref().filter(|t| **t != ev.tokenizer) {
        reasons.push(format!(
            "context counted by {} ({}), the tokenizer now is {} ({})",
            ev.tokenizer.encoding, ev.tokenizer.implementation, t.encoding, t.implementation
        ));
    }
    for (id, (_, digest)) in loaded.tasks_of(&ev.suite) {
        match ev.tasks.get(id) {
            None => reasons.push(format!("task {id} is declared but was not recorded")),
            Some(d) if d != digest => reasons.push(format!(
                "task {id} changed since it was recorded ({} → {})",
                short(d),
                short(digest)
            )),
            Some(_) => {}
        }
    }
    for id in ev.tasks.keys().filter(|id| {
        loaded
            .tasks
            .get(*id)
            .is_none_or(|(t, _)| t.suite != ev.suite)
    }) {
        reasons.push(format!("task {id} was recorded but is no longer declared"));
    }
    if let Some(h) = &loaded.harness_blake3 {
        if h != &ev.harness.blake3 {
            reasons.push(format!(
                "the harness changed since it was recorded ({} → {})",
                short(&ev.harness.blake3),
                short(h)
            ));
        }
    }
    let window = u64::from(effective_rule(&m.publication).0.freshness_window_days) * DAY_MS;
    let age = now_unix_ms.saturating_sub(ev.recorded_at_unix_ms);
    if age > window {
        reasons.push(format!(
            "recorded {} days ago, the window is {} days",
            age / DAY_MS,
            window / DAY_MS
        ));
    }
    if reasons.is_empty() {
        (EconomicsFreshness::Current, notes)
    } else {
        (EconomicsFreshness::Stale, reasons)
    }
}

/// The pairs a live suite declares, with their runs in `ev` (if any): every task × its
/// clients × repetitions `1..=repetitions`, plus any pair the evidence holds beyond them.
pub fn pairs_of(
    suite: &str,
    loaded: &Loaded,
    ev: Option<&EvidenceFile>,
    repetitions: u32,
) -> Vec<EconomicsPair> {
    struct Declared<'a> {
        task: &'a str,
        category: &'a str,
        client: &'a str,
        model: String,
        sessions: u32,
        rep: u32,
    }
    let model_of = |client: &str| {
        loaded
            .methodology
            .as_ref()
            .and_then(|m| m.clients.get(client))
            .map(|c| c.model.clone())
            .unwrap_or_default()
    };
    let mut keys: BTreeMap<String, Declared<'_>> = BTreeMap::new();
    for (id, (t, _)) in loaded.tasks_of(suite) {
        for client in &t.clients {
            for rep in 1..=repetitions {
                keys.insert(
                    pair_id(id, client, rep),
                    Declared {
                        task: id,
                        category: &t.category,
                        client,
                        model: model_of(client),
                        sessions: t.sessions,
                        rep,
                    },
                );
            }
        }
    }
    if let Some(ev) = ev {
        for r in &ev.runs {
            keys.entry(r.pair.clone()).or_insert_with(|| Declared {
                task: &r.task,
                category: &r.category,
                client: &r.client,
                model: r.model.clone(),
                sessions: r.sessions.len() as u32,
                rep: r.repetition,
            });
        }
    }
    keys.into_iter()
        .map(|(id, d)| {
            let find =
                |arm: &str| ev.and_then(|ev| ev.runs.iter().find(|r| r.pair == id && r.arm == arm));
            make_pair(
                &PairKey {
                    suite,
                    task: d.task,
                    category: d.category,
                    client: d.client,
                    model: &d.model,
                    sessions: d.sessions,
                    repetition: d.rep,
                },
                find("control"),
                find("treatment"),
            )
        })
        .collect()
}

mod summarize;
pub use summarize::summarize;
