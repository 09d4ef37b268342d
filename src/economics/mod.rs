//! Economics: proving the savings (SPEC §6, seed 001's `economics.summary`).
//!
//! A **live suite** runs real agent clients (Claude Code, Codex CLI, the OpenAI Agents SDK)
//! on fixture tasks (`tasks/<id>/`) in a closed loop, in two arms — control straight to a
//! provider, treatment through the gate — and judges each run by the task's own check
//! (`tokensaver economics run`, [`run`]; evidence in `evidence/<suite>/*.json`, one file per
//! run, never overwritten). Against the built-in scripted provider the evidence is a
//! **simulation**: it says so in the first words of its statement and is never verified.
//! A **context suite** counts, with the pinned tokenizer, the tokens of the parts of the
//! treatment's requests that the gate's findings flag as removable. The two are separate
//! metrics and are never merged.
//!
//! Evidence records what it was recorded with ([`identity`]): the build, the gate config's
//! policy, the methodology, every task and the harness; a summary compares them with what is
//! here now ([`Current`]) and calls the suite `stale`, naming every reason, when any differs.
//!
//! Everything here is pure except [`load`] (reads the directory) and [`run`]; the clock is
//! passed in. The directory is laid out as `corpus/economics/`:
//!
//! ```text
//! <dir>/methodology.json          the declaration: arms, clients, suites, bootstrap, rule
//! <dir>/methodology-versions.json the BLAKE3 of every methodology version (a test pins it)
//! <dir>/tasks/<id>/               a fixture task: task.json, its check, its workspace
//! <dir>/evidence/<suite>/*.json   one file per recorded run of the suite (history)
//! ```

pub mod context;
pub mod identity;
pub mod model;
pub mod pairs;
pub mod render;
pub mod rule;
pub mod run;
pub mod stats;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use model::*;
pub use pairs::{make_pair, outcome, pair_id, PairKey};
pub use render::render_text;
pub use rule::{
    effective_rule, evaluate_rule, verdict_statement, RuleInputs, RuleOutcome, StatementInputs,
    SEED_FLOOR, SIMULATION_LABEL,
};

use crate::config::Config;

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
    /// BLAKE3 of the harness beside the directory (`None`: not found here).
    pub harness_blake3: Option<String>,
    pub diagnostics: Vec<String>,
}

fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for p in rd.filter_map(Result::ok).map(|e| e.path()) {
        if p.is_dir() {
            json_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Result<(T, Vec<u8>), String> {
    let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    let v = serde_path_to_error::deserialize(de).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok((v, bytes))
}

/// Read the methodology, tasks and evidence under `dir`. Problems become diagnostics.
pub fn load(dir: &Path) -> Loaded {
    let mut out = Loaded::default();
    let mpath = dir.join("methodology.json");
    if mpath.exists() {
        match read_json::<Methodology>(&mpath) {
            Ok((m, bytes)) => {
                out.methodology = Some(m);
                out.methodology_blake3 = Some(blake3::hash(&bytes).to_hex().to_string());
            }
            Err(e) => out.diagnostics.push(e),
        }
    }
    if let Ok(rd) = std::fs::read_dir(dir.join("tasks")) {
        let mut dirs: Vec<PathBuf> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.join("task.json").is_file())
            .collect();
        dirs.sort();
        for d in dirs {
            let id = d
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            match (
                read_json::<TaskDecl>(&d.join("task.json")),
                identity::dir_blake3(&d),
            ) {
                (Ok((t, _)), Ok(digest)) => {
                    out.tasks.insert(id, (t, digest));
                }
                (Err(e), _) => out.diagnostics.push(e),
                (_, Err(e)) => out.diagnostics.push(format!("{}: {e}", d.display())),
            }
        }
    }
    let ev_dir = dir.join("evidence");
    let mut files = Vec::new();
    json_files(&ev_dir, &mut files);
    files.sort();
    for p in files {
        let rel = p
            .strip_prefix(&ev_dir)
            .map(|r| r.to_string_lossy().into_owned())
            .unwrap_or_default();
        match read_json::<EvidenceFile>(&p) {
            Ok((e, _)) if e.format == EVIDENCE_FORMAT => out.evidence.push((rel, e)),
            Ok((e, _)) => out.diagnostics.push(format!(
                "evidence/{rel}: format {} is not this build's {EVIDENCE_FORMAT}; not read",
                e.format
            )),
            Err(e) => out.diagnostics.push(e),
        }
    }
    out.harness_blake3 = identity::repo_root(dir).and_then(|r| identity::harness_blake3(&r));
    out
}

/// What a summary compares evidence with: this build, and the gate config in force (the
/// running server's, or the one the command line names).
#[derive(Clone, Copy, Debug)]
pub struct Current<'a> {
    /// The build's source BLAKE3 ([`identity::SOURCE_BLAKE3`] for this binary).
    pub build: &'a str,
    /// The gate config in force; `None`: there is none to compare with (stale).
    pub config: Option<&'a Config>,
}

impl<'a> Current<'a> {
    /// This build with `config`.
    pub fn this_build(config: Option<&'a Config>) -> Self {
        Current {
            build: identity::SOURCE_BLAKE3,
            config,
        }
    }
}

/// The summary of the economics directory `dir` (laid out as `corpus/economics/`), narrowed
/// by `query`, with freshness judged at `now_unix_ms` against `current`. Never fails:
/// problems are diagnostics.
pub fn summary(
    dir: &Path,
    query: &EconomicsQuery,
    now_unix_ms: u64,
    current: &Current<'_>,
) -> EconomicsSummary {
    summarize(&load(dir), query, now_unix_ms, current, None)
}

/// The summary for a gate config: its economics directory, judged against it and this build
/// (what `GET /economics` and `tokensaver economics summary` answer).
pub fn summary_for(
    config: &Config,
    dir: Option<&Path>,
    query: &EconomicsQuery,
    now_unix_ms: u64,
) -> EconomicsSummary {
    let dir = dir.unwrap_or(&config.economics_dir);
    summary(dir, query, now_unix_ms, &Current::this_build(Some(config)))
}

/// A UTC timestamp `YYYY-MM-DDTHH:MM:SSZ` from Unix milliseconds.
pub fn format_utc(unix_ms: u64) -> String {
    crate::utc::rfc3339(unix_ms)
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

/// Where recorded evidence stands against what is here now, with every reason it is not
/// current.
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
    if ev.build.source_blake3 != current.build {
        reasons.push(format!(
            "recorded by build {}, this build is {}",
            short(&ev.build.source_blake3),
            short(current.build)
        ));
    }
    match current
        .config
        .map(|c| identity::gate_policy_blake3(c, &m.treatment_key))
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
    for (id, (_, digest)) in &loaded.tasks {
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
    for id in ev.tasks.keys().filter(|id| !loaded.tasks.contains_key(*id)) {
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
        (EconomicsFreshness::Current, reasons)
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
    for (id, (t, _)) in &loaded.tasks {
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
