//! Economics in the server: reading the economics directory ([`load`]), the build and gate
//! identity evidence is recorded with ([`identity`]), and the live suites ([`run`]). The maths
//! (pairs, bootstrap, the publication rule, the summary and its text) is the
//! `tokensaver-economics` crate, re-exported here; it never touches the disk.

pub mod identity;
pub mod replay;
pub mod run;

use std::path::{Path, PathBuf};

pub use tokensaver_economics::*;

use crate::config::Config;
use model::{
    EconomicsQuery, EconomicsSummary, EvidenceFile, Methodology, TaskDecl, TreatmentKeyDecl,
};

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

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> anyhow::Result<(T, Vec<u8>)> {
    let bytes = std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    let v = serde_path_to_error::deserialize(de)
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
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
            Err(e) => out.diagnostics.push(e.to_string()),
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
                (Err(e), _) => out.diagnostics.push(e.to_string()),
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
            Err(e) => out.diagnostics.push(e.to_string()),
        }
    }
    let apath = dir.join("ablations.json");
    if apath.exists() {
        match read_json::<ablation::AblationDecl>(&apath) {
            Ok((a, bytes)) => {
                out.ablation = Some(a);
                out.ablation_blake3 = Some(blake3::hash(&bytes).to_hex().to_string());
            }
            Err(e) => out.diagnostics.push(e.to_string()),
        }
    }
    let ab_dir = dir.join("ablation");
    let mut files = Vec::new();
    json_files(&ab_dir, &mut files);
    files.sort();
    for p in files {
        let rel = p
            .strip_prefix(&ab_dir)
            .map(|r| r.to_string_lossy().into_owned())
            .unwrap_or_default();
        match read_json::<ablation::AblationFile>(&p) {
            Ok((a, _)) if a.format == ablation::ABLATION_FORMAT => out.ablations.push((rel, a)),
            Ok((a, _)) => out.diagnostics.push(format!(
                "ablation/{rel}: format {} is not this build's {}; not read",
                a.format,
                ablation::ABLATION_FORMAT
            )),
            Err(e) => out.diagnostics.push(e.to_string()),
        }
    }
    out.harness_blake3 = identity::repo_root(dir).and_then(|r| identity::harness_blake3(&r));
    out
}

impl GateConfigInForce for Config {
    fn gate_policy_blake3(
        &self,
        key: &TreatmentKeyDecl,
    ) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
        Ok(identity::gate_policy_blake3(self, key)?)
    }

    fn decides_alike(&self, ev: &EvidenceFile, key: &TreatmentKeyDecl) -> Result<usize, String> {
        let policy = identity::gate_policy_blake3(self, key).map_err(|e| e.to_string())?;
        replay::decides_alike(self, ev, key, &policy)
    }
}

/// A fresh scratch directory under the system's temp dir, `tokensaver-<what>-<random>`: a
/// recording's workspaces and logs, a replay's store. The caller removes it.
fn scratch_dir(what: &str) -> Result<PathBuf, String> {
    let mut seed = [0u8; 6];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut seed);
    let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
    let d = std::env::temp_dir().join(format!("tokensaver-{what}-{hex}"));
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    Ok(d)
}

/// A recorded answer's usage as the gate bills it (the one-hour cache writes apart).
fn billed(u: &model::StepUsage) -> tokensaver_core::gate::Billed {
    tokensaver_core::gate::Billed {
        usage: tokensaver_core::gate::Usage {
            input: u.input_uncached,
            cache_write: u.cache_write,
            cache_read: u.cache_read,
            output: u.output,
        },
        cache_write_1h: u.cache_write_1h,
        web_search_requests: 0,
    }
}

/// What evidence is compared with: this build, with `config` in force.
pub fn this_build(config: Option<&Config>) -> Current<'_> {
    Current {
        build: identity::SOURCE_BLAKE3,
        config: config.map(|c| c as &dyn GateConfigInForce),
        clients: pinned_clients(),
        simulated_usage_counting: SIMULATED_USAGE_COUNTING,
        tokenizer: Some(context_tokenizer()),
    }
}

/// How the built-in provider counts and bills (recorded with simulated evidence; evidence
/// made under other rules is stale).
pub const SIMULATED_USAGE_COUNTING: &str = "cl100k_base over the whole canonical request body (tools, calls and results included) and over the answer; prompt caching billed as Anthropic and OpenAI bill it";

/// The tokenizer that counts the treatment's context.
pub fn context_tokenizer() -> tokensaver_economics::model::EconomicsTokenizer {
    tokensaver_economics::model::EconomicsTokenizer {
        encoding: "cl100k_base".into(),
        implementation: format!(
            "tiktoken-rs {} data, counted by tokensaver::split_profile::tokenizer",
            tokensaver_tokenizer::TIKTOKEN_RS_VERSION
        ),
    }
}

/// The client versions the project pins (`tests/agents/install.sh`, `requirements.txt`), as
/// built into this binary: evidence recorded with other versions is stale.
pub fn pinned_clients() -> std::collections::BTreeMap<String, String> {
    const INSTALL: &str = include_str!("../../tests/agents/install.sh");
    const REQUIREMENTS: &str = concat!(
        include_str!("../../tests/agents/requirements.txt"),
        "\n",
        include_str!("../../tests/sdk/requirements.txt")
    );
    let mut pins = std::collections::BTreeMap::new();
    for (program, var) in [("claude-code", "CLAUDE_CODE="), ("codex", "CODEX=")] {
        if let Some(v) = INSTALL.lines().find_map(|l| l.trim().strip_prefix(var)) {
            pins.insert(program.to_string(), v.trim().to_string());
        }
    }
    for package in ["openai-agents", "anthropic"] {
        let pin = format!("{package}==");
        if let Some(v) = REQUIREMENTS
            .lines()
            .find_map(|l| l.trim().strip_prefix(pin.as_str()))
        {
            pins.insert(package.to_string(), v.trim().to_string());
        }
    }
    pins
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
    summary(dir, query, now_unix_ms, &this_build(Some(config)))
}

/// Where each mechanism acted in one suite's latest evidence ([`replay::acted_on`]).
#[derive(Debug, serde::Serialize)]
pub struct Acted {
    pub suite: String,
    /// The evidence file, relative to `evidence/`.
    pub evidence_file: String,
    /// Treatment calls replayed.
    pub calls: usize,
    /// Mechanism → pair → calls decided or edited otherwise without it (pairs where it did
    /// nothing are absent).
    pub mechanisms: std::collections::BTreeMap<String, std::collections::BTreeMap<String, usize>>,
}

/// [`Acted`] for the latest evidence of every recorded suite (or of `suite` alone).
pub fn acted(config: &Config, dir: &Path, suite: Option<&str>) -> anyhow::Result<Vec<Acted>> {
    let loaded = load(dir);
    let m = loaded
        .methodology
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("{}: no methodology.json", dir.display()))?;
    let mut out = Vec::new();
    for decl in m.suites.iter().filter(|s| s.kind.is_recorded()) {
        if suite.is_some_and(|s| s != decl.id) {
            continue;
        }
        let Some((name, ev)) = latest_evidence(&loaded, &decl.id) else {
            continue;
        };
        let calls = config
            .decides_alike(ev, &m.treatment_key)
            .map_err(|why| anyhow::anyhow!("{name}: this build does not replay it alike: {why}"))?;
        let mut mechanisms = std::collections::BTreeMap::new();
        for mech in tokensaver_core::gate::Mechanism::ALL {
            let by_pair = replay::acted_on(config, ev, &m.treatment_key, mech)
                .map_err(|why| anyhow::anyhow!("{name}: {why}"))?;
            mechanisms.insert(mech.as_str().to_string(), by_pair);
        }
        out.push(Acted {
            suite: decl.id.clone(),
            evidence_file: name.clone(),
            calls,
            mechanisms,
        });
    }
    if out.is_empty() {
        anyhow::bail!(
            "no recorded evidence{}",
            suite.map(|s| format!(" of {s}")).unwrap_or_default()
        );
    }
    Ok(out)
}

/// The latest evidence file of a suite (what its summary judges).
pub fn latest_evidence<'l>(loaded: &'l Loaded, suite: &str) -> Option<&'l (String, EvidenceFile)> {
    loaded
        .evidence
        .iter()
        .filter(|(_, e)| e.suite == suite)
        .max_by_key(|(name, e)| (e.recorded_at_unix_ms, name.clone()))
}

/// [`Acted`] as text: per suite and mechanism, the pairs it acted on.
pub fn render_acted(acted: &[Acted]) -> String {
    let mut o = String::new();
    for a in acted {
        o.push_str(&format!(
            "{} ({}, {} treatment calls replayed)\n",
            a.suite, a.evidence_file, a.calls
        ));
        for (mech, pairs) in &a.mechanisms {
            let calls: usize = pairs.values().sum();
            o.push_str(&format!(
                "  {mech}: {calls} calls in {} pairs\n",
                pairs.len()
            ));
            for (pair, n) in pairs {
                o.push_str(&format!("    {pair}: {n}\n"));
            }
        }
    }
    o
}
