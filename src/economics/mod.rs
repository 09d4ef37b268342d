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
use model::{EconomicsQuery, EconomicsSummary, EvidenceFile, TaskDecl, TreatmentKeyDecl};

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

/// A declaration file (`methodology.json`, `ablations.json`) and the BLAKE3 of its bytes;
/// `None` when it is absent or unreadable (then a diagnostic says why).
fn read_declaration<T: serde::de::DeserializeOwned>(
    path: &Path,
    diagnostics: &mut Vec<String>,
) -> Option<(T, String)> {
    if !path.exists() {
        return None;
    }
    match read_json::<T>(path) {
        Ok((v, bytes)) => Some((v, blake3::hash(&bytes).to_hex().to_string())),
        Err(e) => {
            diagnostics.push(e.to_string());
            None
        }
    }
}

/// Every JSON file under `dir/folder`, in path order, with its path relative to it: those in
/// this build's `format`; the others, and the unreadable, become diagnostics.
fn read_all<T: serde::de::DeserializeOwned>(
    dir: &Path,
    folder: &str,
    format_of: impl Fn(&T) -> u32,
    format: u32,
    diagnostics: &mut Vec<String>,
) -> Vec<(String, T)> {
    let root = dir.join(folder);
    let mut files = Vec::new();
    json_files(&root, &mut files);
    files.sort();
    let mut out = Vec::new();
    for p in files {
        let rel = p
            .strip_prefix(&root)
            .map(|r| r.to_string_lossy().into_owned())
            .unwrap_or_default();
        match read_json::<T>(&p) {
            Ok((v, _)) if format_of(&v) == format => out.push((rel, v)),
            Ok((v, _)) => diagnostics.push(format!(
                "{folder}/{rel}: format {} is not this build's {format}; not read",
                format_of(&v)
            )),
            Err(e) => diagnostics.push(e.to_string()),
        }
    }
    out
}

/// Read the methodology, tasks and evidence under `dir`. Problems become diagnostics.
pub fn load(dir: &Path) -> Loaded {
    let mut out = Loaded::default();
    if let Some((m, hash)) = read_declaration(&dir.join("methodology.json"), &mut out.diagnostics) {
        out.methodology = Some(m);
        out.methodology_blake3 = Some(hash);
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
    out.evidence = read_all(
        dir,
        "evidence",
        |e: &EvidenceFile| e.format,
        EVIDENCE_FORMAT,
        &mut out.diagnostics,
    );
    if let Some((a, hash)) = read_declaration(&dir.join("ablations.json"), &mut out.diagnostics) {
        out.ablation = Some(a);
        out.ablation_blake3 = Some(hash);
    }
    out.ablations = read_all(
        dir,
        "ablation",
        |a: &ablation::AblationFile| a.format,
        ablation::ABLATION_FORMAT,
        &mut out.diagnostics,
    );
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
        let all = tokensaver_core::gate::Mechanism::ALL;
        let acted = replay::acted_on(config, ev, &m.treatment_key, &all)
            .map_err(|why| anyhow::anyhow!("{name}: {why}"))?;
        let mechanisms = all
            .iter()
            .map(|mech| mech.as_str().to_string())
            .zip(acted)
            .collect();
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
