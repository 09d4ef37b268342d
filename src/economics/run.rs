//! `tokensaver economics run`: record a new evidence file for a live suite.
//!
//! The clients are external programs (Claude Code and Codex CLI from npm, the Agents SDK in
//! Python), so driving them — processes, workspaces, the recording taps — is a Python script,
//! `scripts/economics_harness.py`, which the agent tests' client runner
//! (`tests/agents/clients.py`) is shared with. This command owns everything the evidence must be
//! trusted for: it reads the methodology and tasks, plans the pairs and their seeds, makes one
//! fresh tokensaver key per pair, writes the treatment gate's config (the policy of the config
//! it is given; listeners, data dir, upstreams and keys replaced) and checks its policy hash,
//! runs the harness, then turns what the harness saw into the evidence file: costs at the
//! price table, the context counts of every treatment request (cl100k_base), the identities
//! (build, gate config, methodology, tasks, harness), and writes it under
//! `evidence/<suite>/` as a new file — history appends, nothing is overwritten.
//!
//! Without `--upstream` the provider is the built-in scripted one (`tokensaver mock-provider
//! --usage cl100k --tasks <dir>/tasks`), and the evidence is a simulation. With `--upstream URL
//! --credential-env VAR` the same harness runs against the user's provider: the control arm's
//! clients get the credential from `$VAR`, the gate swaps it in for the treatment's keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::{json, Value};

use super::ablation::{AblationArm, AblationFile, ABLATION_FORMAT};
use super::model::*;
use super::{identity, pair_id, EVIDENCE_FORMAT};
use crate::config::Config;
use tokensaver_core::gate::Mechanism;

/// `tokensaver economics run` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The recorded suite to run (`healthy-work`, `stuck-agents`); default: every one, each
    /// written to its own evidence file.
    #[arg(long)]
    pub suite: Option<String>,
    /// The economics directory (methodology.json, tasks/, evidence/).
    #[arg(long, default_value = "corpus/economics")]
    pub dir: PathBuf,
    /// The gate config whose policy the treatment runs with (its listeners, data dir,
    /// upstreams and keys are replaced by the harness's own).
    #[arg(long, default_value = "config/tokensaver.toml")]
    pub config: PathBuf,
    /// A real provider's base URL (scheme://host[:port]): record against it instead of the
    /// built-in scripted provider.
    #[arg(long, requires = "credential_env")]
    pub upstream: Option<String>,
    /// The environment variable that holds the real provider's credential.
    #[arg(long, requires = "upstream")]
    pub credential_env: Option<String>,
    /// Repetitions of every task and client (default: the suite's).
    #[arg(long)]
    pub reps: Option<u32>,
    /// Only these tasks, or task:client pairs, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// A client's model, CLIENT=MODEL (repeatable; default: the methodology's).
    #[arg(long = "model", value_name = "CLIENT=MODEL")]
    pub models: Vec<String>,
    /// The Python that runs the harness and the Agents SDK (default: .venv/bin/python when it
    /// exists, else python3).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The harness script.
    #[arg(long, default_value = "scripts/economics_harness.py")]
    pub harness: PathBuf,
    /// Keep the scratch directory (logs, workspaces' request bodies) and print its path.
    #[arg(long)]
    pub keep_scratch: bool,
    /// Record an ablation arm (`ablations.json`): the pairs of `--suite`'s latest evidence on
    /// which this mechanism acted (found by replaying it with and without), again, with the
    /// treatment's key going without it; written to `ablation/<suite>/`.
    #[arg(long, value_parser = parse_mechanism, requires = "suite")]
    pub without: Option<Mechanism>,
}

fn parse_mechanism(s: &str) -> Result<Mechanism, String> {
    Mechanism::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Mechanism::ALL.iter().map(|m| m.as_str()).collect();
        format!("not a mechanism; one of {}", names.join(", "))
    })
}

/// An ablation arm being recorded: its declaration, and the evidence it is paired with.
struct Ablating<'a> {
    arm: &'a AblationArm,
    against: &'a str,
    against_recorded_at_unix_ms: u64,
    acted: BTreeMap<String, usize>,
}

/// The ablation arm `--without` asks for, and the pairs of the suite's latest evidence on
/// which its mechanism acted; `args` narrowed to those pairs' tasks, clients and repetitions.
fn plan_ablation<'l>(
    args: &RunArgs,
    mech: Mechanism,
    loaded: &'l super::Loaded,
    m: &Methodology,
    config: &Config,
) -> anyhow::Result<(Ablating<'l>, RunArgs)> {
    let suite = args.suite.as_deref().unwrap_or_default();
    let arm = loaded
        .ablation
        .as_ref()
        .and_then(|a| a.arms.iter().find(|arm| arm.without == mech))
        .ok_or_else(|| {
            anyhow::anyhow!("ablations.json declares no arm without {}", mech.as_str())
        })?;
    let (name, ev) = super::latest_evidence(loaded, suite)
        .ok_or_else(|| anyhow::anyhow!("suite {suite} has no evidence to take apart"))?;
    use super::GateConfigInForce;
    config.decides_alike(ev, &m.treatment_key).map_err(|why| {
        anyhow::anyhow!(
            "evidence/{name} is not this build's gate's (record the suite again first): {why}"
        )
    })?;
    let acted = super::replay::acted_on(config, ev, &m.treatment_key, &[mech])
        .map_err(|why| anyhow::anyhow!("evidence/{name}: {why}"))?
        .remove(0);
    let mut narrowed = args.clone();
    narrowed.only = ev
        .runs
        .iter()
        .filter(|r| acted.contains_key(&r.pair))
        .map(|r| format!("{}:{}", r.task, r.client))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    // `--reps N`: the first N repetitions of each pair it acted on (the rest are left out of
    // its figure, and the summary says so); default: every one.
    narrowed.reps = Some(args.reps.unwrap_or(ev.repetitions).min(ev.repetitions));
    Ok((
        Ablating {
            arm,
            against: name,
            against_recorded_at_unix_ms: ev.recorded_at_unix_ms,
            acted,
        },
        narrowed,
    ))
}

/// One planned pair.
struct Planned {
    id: String,
    task: String,
    client: String,
    model: String,
    repetition: u32,
    key: String,
    key_lines: String,
}

fn git_describe() -> Option<String> {
    let out = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn selected(only: &[String], task: &str, client: &str) -> bool {
    only.is_empty()
        || only.iter().any(|o| match o.split_once(':') {
            Some((t, c)) => t == task && c == client,
            None => o == task,
        })
}

/// Every pair of `tasks` (each with its suite's repetitions) that `--only` selects.
fn plan_pairs(
    args: &RunArgs,
    m: &Methodology,
    tasks: &[(&String, &TaskDecl, u32)],
    real: bool,
) -> anyhow::Result<Vec<Planned>> {
    let mut overrides = BTreeMap::new();
    for s in &args.models {
        let (c, model) = s
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--model {s}: expected CLIENT=MODEL"))?;
        overrides.insert(c.to_string(), model.to_string());
    }
    let profile = m.treatment_key.profile.as_deref();
    let mut out = Vec::new();
    for &(task, t, reps) in tasks {
        for client in &t.clients {
            if !selected(&args.only, task, client) {
                continue;
            }
            let decl = m.clients.get(client).ok_or_else(|| {
                anyhow::anyhow!(
                    "task {task} names client {client}, which methodology.json does not declare"
                )
            })?;
            let model = overrides.get(client).cloned().unwrap_or_else(|| {
                if real {
                    decl.real_model
                        .clone()
                        .unwrap_or_else(|| decl.model.clone())
                } else {
                    decl.model.clone()
                }
            });
            for rep in 1..=reps {
                let n = out.len() + 1;
                let (key, mut lines) = crate::auth::new_key(&format!("econ-{n}"), profile)
                    .ok_or_else(|| anyhow::anyhow!("cannot make a key for the treatment"))?;
                lines = lines
                    .lines()
                    .map(|l| l.split("   #").next().unwrap_or(l).trim_end().to_string())
                    .collect::<Vec<_>>()
                    .join("\n");
                lines.push_str(&format!("\nhuman = {}\n", m.treatment_key.human));
                if let Some(b) = m.treatment_key.budget_micro_usd_per_day {
                    lines.push_str(&format!(
                        "budget = {{ ceiling_micro_usd = {b}, period = \"day\" }}\n"
                    ));
                }
                out.push(Planned {
                    id: pair_id(task, client, rep),
                    task: task.clone(),
                    client: client.clone(),
                    model: model.clone(),
                    repetition: rep,
                    key,
                    key_lines: lines,
                });
            }
        }
    }
    for o in &args.only {
        let (t, c) = o
            .split_once(':')
            .map_or((o.as_str(), None), |(t, c)| (t, Some(c)));
        if !out
            .iter()
            .any(|p| p.task == t && c.is_none_or(|c| p.client == c))
        {
            return Err(anyhow::anyhow!(
                "--only {o}: no declared task (and client) matches"
            ));
        }
    }
    if out.is_empty() {
        return Err(anyhow::anyhow!("no pair selected"));
    }
    Ok(out)
}

/// The treatment gate's config: the given config's policy, with the harness's listeners,
/// data dir, upstreams (the provider tap, named by `placeholder`) and keys.
fn treatment_config(
    base: &Path,
    scratch: &Path,
    ports: &BTreeMap<&str, u16>,
    placeholder: &str,
    credential_env: &str,
    planned: &[Planned],
) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(base).map_err(|e| anyhow::anyhow!("{}: {e}", base.display()))?;
    let mut v: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", base.display()))?;
    for k in ["listen", "data", "upstreams", "keys", "client", "admin"] {
        v.remove(k);
    }
    let mut listen = toml::Table::new();
    for (name, port) in ports {
        listen.insert(
            (*name).to_string(),
            toml::Value::String(format!("127.0.0.1:{port}")),
        );
    }
    v.insert("listen".into(), toml::Value::Table(listen));
    let mut data = toml::Table::new();
    data.insert(
        "dir".into(),
        toml::Value::String(scratch.join("gate-data").display().to_string()),
    );
    v.insert("data".into(), toml::Value::Table(data));
    let mut ups = toml::Table::new();
    for name in ["openai", "anthropic"] {
        let mut u = toml::Table::new();
        u.insert("base_url".into(), toml::Value::String(placeholder.into()));
        u.insert(
            "credential_env".into(),
            toml::Value::String(credential_env.into()),
        );
        ups.insert(name.into(), toml::Value::Table(u));
    }
    v.insert("upstreams".into(), toml::Value::Table(ups));
    let mut out = toml::to_string(&v).map_err(anyhow::Error::from)?;
    for p in planned {
        out.push('\n');
        out.push_str(&p.key_lines);
    }
    Ok(out)
}

/// What the harness writes back.
#[derive(Deserialize)]
struct HarnessOut {
    harness: HarnessId,
    clients: BTreeMap<String, String>,
    runs: Vec<HarnessRun>,
}

#[derive(Deserialize)]
struct HarnessId {
    path: String,
    version: String,
}

#[derive(Deserialize)]
struct HarnessRun {
    id: String,
    pair: String,
    task: String,
    client: String,
    model: String,
    arm: String,
    repetition: u32,
    seed: u64,
    order: u32,
    started_at_unix_ms: u64,
    seconds: f64,
    sessions: Vec<SessionRecord>,
    check: CheckRecord,
    calls: Vec<TapRecord>,
    provider_calls: Vec<TapRecord>,
}

#[derive(Deserialize)]
struct TapRecord {
    session: u32,
    path: String,
    status: u16,
    #[serde(default)]
    verdict: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    findings: Vec<String>,
    #[serde(default)]
    paced_ms: Option<u64>,
    #[serde(default)]
    usage: Option<StepUsage>,
    #[serde(default)]
    tool_calls: u64,
    #[serde(default)]
    model_requested: Option<String>,
    #[serde(default)]
    model_reported: Option<String>,
    #[serde(default)]
    body_file: Option<String>,
    /// What the provider's answer said it is (`x-mock-provider`), if it said.
    #[serde(default)]
    provider_identity: Option<String>,
    /// When the request reached the tap, and how long until its answer ended.
    #[serde(default)]
    at_unix_ms: Option<u64>,
    #[serde(default)]
    ms: Option<u64>,
}

fn cost(config: &Config, model: Option<&str>, u: Option<&StepUsage>) -> Option<u64> {
    Some(step_cost_nano(config.prices.get(model?)?, u?))
}

/// One answer's cost at `prices`, its one-hour cache writes at their own price (the ledger's
/// own pricing, [`tokensaver_core::gate::Billed::cost_nano`]).
fn step_cost_nano(prices: &crate::config::Prices, u: &StepUsage) -> u64 {
    super::billed(u).cost_nano(prices)
}

fn context_of(m: &Methodology, t: &TapRecord, body: &[u8]) -> Option<ContextCount> {
    let body: Value = serde_json::from_slice(body).ok()?;
    let c = super::context::count_request(
        &body,
        &t.findings,
        m.context.keep_recent_turns,
        &m.context.removable_findings,
    )?;
    Some(ContextCount {
        counted: c.counted,
        removable: c.removable,
        by_finding: c.by_finding,
    })
}

/// The digest the gate decided a recorded request on (`tokensaver digest`, under the pair's
/// key): fingerprints and counts, no content.
fn digest_of(key: &str, t: &TapRecord, body: &[u8]) -> Option<Value> {
    let route = match t.path.as_str() {
        "/v1/messages" => crate::request::Route::AnthropicMessages,
        "/v1/chat/completions" => crate::request::Route::OpenAiChat,
        "/v1/responses" => crate::request::Route::OpenAiResponses,
        _ => return None,
    };
    let fp_key = crate::auth::fingerprint_key(crate::auth::parse_key(key)?.secret);
    let parsed = crate::request::parse(route, body, &fp_key).ok()?;
    serde_json::to_value(crate::request::Digest::new(parsed.shape)).ok()
}

/// One call of a run as the evidence keeps it; `body`: a treatment call's request body.
fn step_record(
    i: usize,
    c: &TapRecord,
    r: &HarnessRun,
    m: &Methodology,
    body: Option<&[u8]>,
    keys: &BTreeMap<&str, &str>,
) -> StepRecord {
    StepRecord {
        index: i,
        session: c.session,
        path: c.path.clone(),
        status: c.status,
        verdict: c.verdict.clone(),
        reason: c.reason.clone(),
        findings: c.findings.clone(),
        paced_ms: c.paced_ms,
        usage: c.usage.clone(),
        tool_calls: c.tool_calls,
        model_requested: c.model_requested.clone(),
        model_reported: c.model_reported.clone(),
        context: body.and_then(|b| context_of(m, c, b)),
        at_ms: c
            .at_unix_ms
            .map(|at| at.saturating_sub(r.started_at_unix_ms)),
        round_trip_ms: c.ms,
        digest: body.and_then(|b| keys.get(r.pair.as_str()).and_then(|k| digest_of(k, c, b))),
    }
}

fn to_record(
    r: HarnessRun,
    m: &Methodology,
    config: &Config,
    tasks: &BTreeMap<String, (TaskDecl, String)>,
    keys: &BTreeMap<&str, &str>,
) -> RunRecord {
    let (category, digest) = tasks
        .get(&r.task)
        .map(|(t, d)| (t.category.clone(), d.clone()))
        .unwrap_or_default();
    let treatment = r.arm == "treatment";
    let steps = r
        .calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            // A treatment call's body, read once: what its context and its digest count.
            let body = c
                .body_file
                .as_ref()
                .filter(|_| treatment)
                .and_then(|f| std::fs::read(f).ok());
            step_record(i, c, &r, m, body.as_deref(), keys)
        })
        .collect();
    let bought = r
        .provider_calls
        .iter()
        .map(|c| {
            let model = c
                .model_reported
                .clone()
                .or_else(|| c.model_requested.clone());
            BoughtCall {
                session: c.session,
                path: c.path.clone(),
                status: c.status,
                usage: c.usage.clone(),
                cost_nano_usd: cost(config, model.as_deref(), c.usage.as_ref()),
                model,
            }
        })
        .collect();
    RunRecord {
        variant: if treatment { "gate" } else { "direct" }.into(),
        id: r.id,
        pair: r.pair,
        task: r.task,
        category,
        client: r.client,
        model: r.model,
        arm: r.arm,
        repetition: r.repetition,
        seed: r.seed,
        order: r.order,
        task_digest: digest,
        started_at_unix_ms: r.started_at_unix_ms,
        seconds: r.seconds,
        sessions: r.sessions,
        check: r.check,
        steps,
        bought,
    }
}

fn python(args: &RunArgs) -> PathBuf {
    args.python.clone().unwrap_or_else(|| {
        let venv = PathBuf::from(".venv/bin/python");
        if venv.exists() {
            venv
        } else {
            PathBuf::from("python3")
        }
    })
}

/// Record a new evidence file (see the module docs). Prints the file and the statement.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let loaded = super::load(&args.dir);
    let m = loaded.methodology.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "no methodology in {}: {:?}",
            args.dir.display(),
            loaded.diagnostics
        )
    })?;
    if !loaded.diagnostics.is_empty() {
        return Err(anyhow::anyhow!(
            "{} cannot be read: {}",
            args.dir.display(),
            loaded.diagnostics.join("; ")
        ));
    }
    let decls: Vec<&SuiteDecl> = m
        .suites
        .iter()
        .filter(|s| s.kind.is_recorded())
        .filter(|s| args.suite.as_ref().is_none_or(|id| &s.id == id))
        .collect();
    if decls.is_empty() {
        return Err(anyhow::anyhow!(
            "methodology.json declares no recorded suite {:?}",
            args.suite.as_deref().unwrap_or("at all")
        ));
    }
    let config = Config::load(&args.config).map_err(anyhow::Error::from)?;
    let policy = identity::gate_policy_blake3(&config, &m.treatment_key)?;
    let real = args.upstream.is_some();
    let (ablating, narrowed) = match args.without {
        None => (None, args.clone()),
        Some(mech) => {
            let (a, narrowed) = plan_ablation(args, mech, &loaded, &m, &config)?;
            if a.acted.is_empty() {
                println!(
                    "{} acted on no pair of the suite's latest evidence: its saving there is 0 by construction, nothing to record",
                    mech.as_str()
                );
                return Ok(());
            }
            (Some(a), narrowed)
        }
    };
    let args = &narrowed;
    let mut planned = plan_pairs(args, &m, &tasks_for(args, &decls, &loaded), real)?;
    if let Some(a) = &ablating {
        planned.retain(|p| a.acted.contains_key(&p.id));
        for p in &mut planned {
            p.key_lines
                .push_str(&format!("without = [\"{}\"]\n", a.arm.without.as_str()));
        }
    }
    let root = identity::repo_root(&args.dir).unwrap_or_else(|| PathBuf::from("."));
    let harness_blake3 = identity::harness_blake3(&root)
        .ok_or_else(|| anyhow::anyhow!("the harness files are not under {}", root.display()))?;

    let scratch = super::scratch_dir("economics").map_err(|e| anyhow::anyhow!(e))?;
    let result = record(
        args,
        &m,
        &decls,
        &loaded,
        &config,
        &policy,
        &planned,
        &scratch,
        real,
        &harness_blake3,
    );
    if args.keep_scratch {
        eprintln!("scratch kept: {}", scratch.display());
    } else {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    // Signed with the receipt key of the config's data dir, like the gate's receipts.
    let signer = crate::receipt::load_or_create(&config.data_dir)
        .map_err(|e| anyhow::anyhow!("the receipt key: {e}"))?;
    let mut paths = Vec::new();
    for mut ev in result? {
        match &ablating {
            None => paths.push(write_evidence(&args.dir, &ev, &signer)?),
            Some(a) => {
                for r in ev.runs.iter_mut().filter(|r| r.arm == "treatment") {
                    r.variant = a.arm.id.clone();
                }
                let file = AblationFile {
                    format: ABLATION_FORMAT,
                    arm: a.arm.id.clone(),
                    without: a.arm.without,
                    ablations_blake3: loaded.ablation_blake3.clone().unwrap_or_default(),
                    against: a.against.to_string(),
                    against_recorded_at_unix_ms: a.against_recorded_at_unix_ms,
                    acted: a.acted.clone(),
                    evidence: ev,
                };
                paths.push(write_ablation(&args.dir, &file, &signer)?);
            }
        }
    }
    let now = crate::now_ms();
    let s = super::summary(
        &args.dir,
        &EconomicsQuery::default(),
        now,
        &super::this_build(Some(&config)),
    );
    for path in paths {
        println!("wrote {}", path.display());
    }
    println!("{}", s.verdict.statement);
    Ok(())
}

const PROVIDER_PLACEHOLDER: &str = "http://tokensaver-economics-provider-tap:1";
const GATE_CREDENTIAL_ENV: &str = "TOKENSAVER_ECONOMICS_PROVIDER_KEY";

#[allow(clippy::too_many_arguments)]
fn record(
    args: &RunArgs,
    m: &Methodology,
    decls: &[&SuiteDecl],
    loaded: &super::Loaded,
    config: &Config,
    policy: &str,
    planned: &[Planned],
    scratch: &Path,
    real: bool,
    harness_blake3: &str,
) -> anyhow::Result<Vec<EvidenceFile>> {
    // Five distinct ports: the gate's three listeners and the simulated providers' (one per
    // arm, so that the arms share no prompt cache).
    let [proxy, api, admin, mock_port, treatment_mock_port] = crate::processes::free_ports::<5>()?;
    let ports = BTreeMap::from([("proxy", proxy), ("api", api), ("admin", admin)]);
    let gate_toml = treatment_config(
        &args.config,
        scratch,
        &ports,
        PROVIDER_PLACEHOLDER,
        GATE_CREDENTIAL_ENV,
        planned,
    )?;
    let gate_config =
        Config::parse(&gate_toml).map_err(|e| anyhow::anyhow!("the treatment config: {e}"))?;
    let generated = identity::gate_policy_blake3(&gate_config, &m.treatment_key)?;
    if generated != policy {
        return Err(anyhow::anyhow!(
            "the treatment config's policy ({generated}) is not the config's ({policy})"
        ));
    }
    let config_path = scratch.join("gate.toml");
    std::fs::write(&config_path, gate_toml).map_err(anyhow::Error::from)?;
    let tasks_dir = std::fs::canonicalize(args.dir.join("tasks")).map_err(anyhow::Error::from)?;
    let mut credential = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut credential);
    let credential: String = credential.iter().map(|b| format!("{b:02x}")).collect();
    let provider = match (&args.upstream, &args.credential_env) {
        (Some(u), Some(env)) => json!({"kind": "real", "upstream": u, "credential_env": env}),
        _ => json!({"kind": "simulated", "mock": {
            "port": mock_port, "treatment_port": treatment_mock_port,
            "credential": format!("sk-economics-{credential}"),
            "tasks": tasks_dir, "usage": "cl100k"}}),
    };
    let runs: Vec<Value> = planned
        .iter()
        .filter_map(|p| {
            let (t, _) = loaded.tasks.get(&p.task)?;
            // A new seed per pair and recording (both arms share it): recordings replicate,
            // rather than replay one another.
            let seed = u64::from(rand::RngCore::next_u32(&mut rand::rngs::OsRng).max(1));
            let mut prompt = t.prompt.clone();
            if !real {
                prompt.push_str(&format!("\n\ntokensaver-mock:task={},seed={seed}", p.task));
            }
            Some(json!({
                "id": p.id, "task": p.task, "client": p.client, "model": p.model,
                "repetition": p.repetition, "seed": seed, "key": p.key,
                "task_dir": tasks_dir.join(&p.task), "prompt": prompt, "sessions": t.sessions,
                "max_turns": t.max_turns, "timeout_s": t.timeout_s, "temperature": t.temperature,
                "setup": t.setup, "check": t.check,
            }))
        })
        .collect();
    let out_path = scratch.join("runs.json");
    let bin = std::env::current_exe().map_err(anyhow::Error::from)?;
    let plan = json!({
        "scratch": scratch, "out": out_path, "bin": bin,
        "provider": provider,
        "gate": {"config": config_path, "ports": ports, "credential_env": GATE_CREDENTIAL_ENV,
                 "upstream_placeholder": PROVIDER_PLACEHOLDER},
        "runs": runs,
    });
    let plan_path = scratch.join("plan.json");
    std::fs::write(
        &plan_path,
        serde_json::to_vec_pretty(&plan).map_err(anyhow::Error::from)?,
    )
    .map_err(anyhow::Error::from)?;
    let recorded_at = crate::now_ms();
    let status = Command::new(python(args))
        .arg(&args.harness)
        .arg(&plan_path)
        .status()
        .map_err(|e| {
            anyhow::anyhow!("cannot start the harness ({}): {e}", args.harness.display())
        })?;
    if !status.success() {
        return Err(anyhow::anyhow!(
            "the harness failed ({status}); its logs are in {}",
            scratch.display()
        ));
    }
    let mut out: HarnessOut = serde_json::from_slice(
        &std::fs::read(&out_path).map_err(|e| anyhow::anyhow!("{}: {e}", out_path.display()))?,
    )
    .map_err(|e| anyhow::anyhow!("the harness's output: {e}"))?;
    // Each pair's treatment key: the digests are computed under it, as the gate computed them.
    let keys: BTreeMap<&str, &str> = planned
        .iter()
        .map(|p| (p.id.as_str(), p.key.as_str()))
        .collect();
    let mut written = Vec::new();
    // One evidence file per suite, each with its own tasks' runs.
    for decl in decls {
        let (mine, rest): (Vec<HarnessRun>, Vec<HarnessRun>) =
            std::mem::take(&mut out.runs).into_iter().partition(|r| {
                loaded
                    .tasks
                    .get(&r.task)
                    .is_some_and(|(t, _)| t.suite == decl.id)
            });
        out.runs = rest;
        if mine.is_empty() {
            continue;
        }
        let ev = evidence(
            m,
            decl,
            loaded,
            config,
            policy,
            (&out.harness, &out.clients, mine),
            &keys,
            recorded_at,
            real,
            args,
            harness_blake3,
        );
        written.push(ev);
    }
    Ok(written)
}

#[allow(clippy::too_many_arguments)]
fn evidence(
    m: &Methodology,
    decl: &SuiteDecl,
    loaded: &super::Loaded,
    config: &Config,
    policy: &str,
    (harness, client_versions, runs): (&HarnessId, &BTreeMap<String, String>, Vec<HarnessRun>),
    keys: &BTreeMap<&str, &str>,
    recorded_at: u64,
    real: bool,
    args: &RunArgs,
    harness_blake3: &str,
) -> EvidenceFile {
    let mut clients: BTreeMap<String, ClientInfo> = BTreeMap::new();
    for r in &runs {
        let program = m
            .clients
            .get(&r.client)
            .map(|c| c.program.clone())
            .unwrap_or_else(|| r.client.clone());
        let version_key = super::client_package(&r.client);
        clients
            .entry(r.client.clone())
            .or_insert_with(|| ClientInfo {
                id: r.client.clone(),
                program,
                version: client_versions
                    .get(version_key)
                    .cloned()
                    .unwrap_or_else(|| "unknown".into()),
                model: r.model.clone(),
            });
    }
    // The built-in provider names itself on its answers: what was recorded against it is a
    // simulation, whatever `--upstream` said.
    let identified = runs
        .iter()
        .flat_map(|r| r.calls.iter().chain(r.provider_calls.iter()))
        .find_map(|c| c.provider_identity.clone());
    let provider = if real && identified.is_none() {
        ProviderInfo {
            kind: ProviderKind::Real,
            name: "a real provider named by the user".into(),
            upstream: args.upstream.clone().unwrap_or_default(),
            usage_counting: "as the provider reported it".into(),
        }
    } else {
        ProviderInfo {
            kind: ProviderKind::Simulated,
            name: match (&identified, real) {
                (Some(id), true) => format!(
                    "{id} (named as a real provider with --upstream; its answers say it is the built-in one)"
                ),
                _ => format!(
                    "tokensaver mock-provider {} (scripted from the task plans)",
                    env!("CARGO_PKG_VERSION")
                ),
            },
            upstream: match real {
                true => args.upstream.clone().unwrap_or_default(),
                false => "127.0.0.1 (built in)".into(),
            },
            usage_counting: super::SIMULATED_USAGE_COUNTING.into(),
        }
    };
    let runs = runs
        .into_iter()
        .map(|r| to_record(r, m, config, &loaded.tasks, keys))
        .collect();
    EvidenceFile {
        format: EVIDENCE_FORMAT,
        suite: decl.id.clone(),
        methodology: m.version,
        methodology_blake3: loaded.methodology_blake3.clone().unwrap_or_default(),
        recorded_at_unix_ms: recorded_at,
        build: identity::build(git_describe()),
        gate_config_blake3: policy.to_string(),
        provider,
        clients: clients.into_values().collect(),
        harness: HarnessInfo {
            path: harness.path.clone(),
            version: harness.version.clone(),
            blake3: harness_blake3.to_string(),
        },
        tasks: loaded
            .tasks_of(&decl.id)
            .map(|(id, (_, d))| (id.clone(), d.clone()))
            .collect(),
        repetitions: args.reps.unwrap_or(decl.repetitions),
        tokenizer: super::context_tokenizer(),
        runs,
    }
}

/// Every task of the suites with its repetitions (`--reps`, else the suite's).
fn tasks_for<'l>(
    args: &RunArgs,
    decls: &[&'l SuiteDecl],
    loaded: &'l super::Loaded,
) -> Vec<(&'l String, &'l TaskDecl, u32)> {
    decls
        .iter()
        .flat_map(|d| {
            let reps = args.reps.unwrap_or(d.repetitions).max(1);
            loaded
                .tasks_of(&d.id)
                .map(move |(id, (t, _))| (id, t, reps))
        })
        .collect()
}

/// Write an ablation arm's recording: `ablation/<suite>/<UTC>-<blake3>.json`, signed beside.
fn write_ablation(
    dir: &Path,
    file: &AblationFile,
    signer: &crate::receipt::ReceiptSigner,
) -> anyhow::Result<PathBuf> {
    write_signed(
        &dir.join("ablation").join(&file.evidence.suite),
        file.evidence.recorded_at_unix_ms,
        file,
        signer,
    )
}

/// Write a new evidence file (never overwriting one): `evidence/<suite>/<UTC>-<blake3>.json`.
/// The file, and beside it `<file>.sig`: the receipt key's signature over its exact bytes
/// (`tokensaver verify <file>.sig --document <file>`).
fn write_evidence(
    dir: &Path,
    ev: &EvidenceFile,
    signer: &crate::receipt::ReceiptSigner,
) -> anyhow::Result<PathBuf> {
    write_signed(
        &dir.join("evidence").join(&ev.suite),
        ev.recorded_at_unix_ms,
        ev,
        signer,
    )
}

/// `<folder>/<UTC>-<blake3>.json` with `doc` as pretty JSON, never overwriting a file, and
/// beside it `<file>.sig`: the receipt key's signature over its exact bytes.
fn write_signed(
    folder: &Path,
    recorded_at_unix_ms: u64,
    doc: &impl serde::Serialize,
    signer: &crate::receipt::ReceiptSigner,
) -> anyhow::Result<PathBuf> {
    let mut text = serde_json::to_string_pretty(doc).map_err(anyhow::Error::from)?;
    text.push('\n');
    let stamp: String = super::format_utc(recorded_at_unix_ms)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let hash = blake3::hash(text.as_bytes()).to_hex();
    std::fs::create_dir_all(folder).map_err(|e| anyhow::anyhow!("{}: {e}", folder.display()))?;
    let path = folder.join(format!("{stamp}-{}.json", &hash[..8]));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(anyhow::Error::from)?;
    let envelope = signer.sign_as(crate::receipt::DocumentKind::Evidence, text.as_bytes());
    let sig = path.with_extension("json.sig");
    let signed = serde_json::to_string(&envelope).map_err(anyhow::Error::from)? + "\n";
    std::fs::write(&sig, signed).map_err(|e| anyhow::anyhow!("{}: {e}", sig.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hour_writes_cost_the_one_hour_price() {
        // Claude Sonnet 4.5 at list prices, per token in nano-USD: $3.75 a million for five-
        // minute writes, $6 for one-hour ones, $3 input, $0.30 read, $15 output.
        let prices = crate::config::Prices {
            input: 3_000_000,
            cache_write: 3_750_000,
            cache_read: 300_000,
            output: 15_000_000,
            max_output: 64_000,
            cache_write_1h: Some(6_000_000),
            web_search_per_1k: None,
        };
        let u = StepUsage {
            input_uncached: 10,
            cache_write: 1_000,
            cache_read: 2_000,
            output: 5,
            cache_write_1h: 600,
        };
        let expected = 10 * 3_000 + 400 * 3_750 + 600 * 6_000 + 2_000 * 300 + 5 * 15_000;
        assert_eq!(step_cost_nano(&prices, &u), expected);
    }
}
