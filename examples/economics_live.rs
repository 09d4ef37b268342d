//! The economics live-suite harness (SPEC §6): replays every recorded session of
//! `corpus/economics/sessions/` in two arms — control straight to the deterministic mock
//! provider, treatment through the real gate (`target/debug/tokensaver serve`) — for R
//! repetitions, and writes the evidence file the summary reads.
//!
//! ```text
//! cargo build && cargo run --example economics_live -- [--dir corpus/economics] [--reps 3]
//!     [--bin target/debug/tokensaver] [--out corpus/economics/evidence/agent-sessions.json]
//! cargo run --example economics_live -- --summary    # print the summary of what is recorded
//! ```
//!
//! Everything listens on 127.0.0.1. One fresh tokensaver key per task × repetition, so the
//! gate's windows and answer store never leak between pairs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokensaver::demo::provider::{MockProvider, ProviderOptions};
use tokensaver::demo::{free_port, wait_for_port};
use tokensaver::economics::model::{EvidenceFile, RunRecord, Session, StepRecord, StepUsage};

const PROVIDER_CREDENTIAL: &str = "sk-economics-provider-credential";
const ADMIN_HASH: &str = "ca9b790a34f739223b65bdd9124d2c340ee7ff59bc0140af9576813fb4cf82a8";
const SUITE: &str = "agent-sessions";
const HARNESS: &str = "examples/economics_live.rs v1";
const SETTLE_MS: u64 = 150;

struct Gate(Child);
impl Drop for Gate {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn path_of(s: &Session) -> &'static str {
    if s.provider == "anthropic" {
        "/v1/messages"
    } else {
        "/v1/chat/completions"
    }
}

/// The four-part usage of a provider answer (OpenAI or Anthropic shape).
fn usage_of(body: &Value) -> Option<StepUsage> {
    let u = body.get("usage")?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    if let Some(p) = n("prompt_tokens") {
        let cached = u
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        return Some(StepUsage {
            input_uncached: p.saturating_sub(cached),
            cache_write: 0,
            cache_read: cached,
            output: n("completion_tokens")?,
        });
    }
    Some(StepUsage {
        input_uncached: n("input_tokens")?,
        cache_write: n("cache_creation_input_tokens").unwrap_or(0),
        cache_read: n("cache_read_input_tokens").unwrap_or(0),
        output: n("output_tokens")?,
    })
}

fn findings_of(receipt_header: Option<&str>) -> Vec<String> {
    let Some(h) = receipt_header else {
        return vec![];
    };
    let Ok(env) = tokensaver::receipt::Envelope::from_header_value(h) else {
        return vec![];
    };
    let Ok(bytes) = env.body_bytes() else {
        return vec![];
    };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
        return vec![];
    };
    v.get("findings")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

struct Answer {
    status: u16,
    body: Option<Value>,
    verdict: Option<String>,
    receipt: Option<String>,
}

fn post(url: &str, auth: (&str, String), body: &Value) -> Answer {
    let req = ureq::post(url)
        .timeout(Duration::from_secs(60))
        .set("content-type", "application/json")
        .set(auth.0, &auth.1);
    let resp = match req.send_string(&body.to_string()) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(_) => {
            return Answer {
                status: 0,
                body: None,
                verdict: None,
                receipt: None,
            }
        }
    };
    let status = resp.status();
    let verdict = resp.header("x-tokensaver-verdict").map(str::to_string);
    let receipt = resp.header("x-tokensaver-receipt").map(str::to_string);
    let body = resp
        .into_string()
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    Answer {
        status,
        body,
        verdict,
        receipt,
    }
}

fn auth_for(s: &Session, key: &str) -> (&'static str, String) {
    if s.provider == "anthropic" {
        ("x-api-key", key.to_string())
    } else {
        ("authorization", format!("Bearer {key}"))
    }
}

fn run_arm(s: &Session, digest: &str, arm: &str, rep: u32, base: &str, key: &str) -> RunRecord {
    let mut steps = Vec::new();
    for (i, step) in s.steps.iter().enumerate() {
        let a = post(
            &format!("{base}{}", path_of(s)),
            auth_for(s, key),
            &step.body,
        );
        let ok = (200..300).contains(&a.status);
        let usage = a.body.as_ref().filter(|_| ok).and_then(usage_of);
        let served = a.verdict.as_deref() == Some("SERVE");
        steps.push(StepRecord {
            index: i,
            needed: step.needed,
            status: a.status,
            answered: ok && a.body.is_some(),
            verdict: a.verdict.clone(),
            usage: if served { None } else { usage.clone() },
            served_usage: if served { usage } else { None },
            model_reported: a
                .body
                .as_ref()
                .filter(|_| ok)
                .and_then(|b| b.get("model"))
                .and_then(Value::as_str)
                .map(str::to_string),
            findings: findings_of(a.receipt.as_deref()),
        });
        // Let the gate record usage and store the answer before the next request.
        std::thread::sleep(Duration::from_millis(SETTLE_MS));
    }
    RunRecord {
        id: format!(
            "{}--{}--r{rep}",
            s.task,
            if arm == "control" { "direct" } else { "gate" }
        ),
        task: s.task.clone(),
        category: s.category.clone(),
        model: s.model.clone(),
        arm: arm.to_string(),
        variant: if arm == "control" { "direct" } else { "gate" }.to_string(),
        repetition: rep,
        session_digest: digest.to_string(),
        steps,
    }
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(arg(&args, "--dir").unwrap_or_else(|| "corpus/economics".into()));
    let reps: u32 = arg(&args, "--reps")
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let bin = arg(&args, "--bin").unwrap_or_else(|| "target/debug/tokensaver".into());
    let out = PathBuf::from(
        arg(&args, "--out").unwrap_or_else(|| format!("{}/evidence/{SUITE}.json", dir.display())),
    );
    if args.iter().any(|a| a == "--summary") {
        // Print the summary of what is recorded, without running anything.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_millis() as u64;
        let s = tokensaver::economics::summary(
            &dir,
            &tokensaver::economics::model::EconomicsQuery::default(),
            now,
        );
        print!("{}", tokensaver::economics::render_text(&s));
        return Ok(());
    }
    let loaded = tokensaver::economics::load(&dir);
    let Some(m) = loaded.methodology.as_ref() else {
        return Err(format!("no methodology: {:?}", loaded.diagnostics));
    };
    if loaded.sessions.is_empty() {
        return Err(format!("no sessions: {:?}", loaded.diagnostics));
    }
    let mock = MockProvider::start_background(ProviderOptions {
        expected_credential: Some(PROVIDER_CREDENTIAL.into()),
        ..Default::default()
    })
    .map_err(|e| format!("mock provider: {e}"))?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = || free_port().map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p)));
    let (proxy, api, admin) = (port()?, port()?, port()?);

    // One fresh key per task × repetition.
    let mut keys = std::collections::BTreeMap::new();
    let mut cfg = format!(
        "[listen]\nproxy = \"{proxy}\"\napi = \"{api}\"\nadmin = \"{admin}\"\n\n[data]\ndir = \"{}\"\n\n",
        tmp.path().join("data").display()
    );
    for (up, env) in [
        ("openai", "OPENAI_API_KEY"),
        ("anthropic", "ANTHROPIC_API_KEY"),
    ] {
        cfg.push_str(&format!(
            "[upstreams.{up}]\nbase_url = \"{}\"\ncredential_env = \"{env}\"\n\n",
            mock.base_url()
        ));
    }
    cfg.push_str(&format!("[admin]\nkey_hash = \"{ADMIN_HASH}\"\n\n"));
    let mut n = 0u32;
    for (s, _) in &loaded.sessions {
        for rep in 1..=reps {
            n += 1;
            let id = format!("econ-{n}");
            let secret = hex(blake3::hash(format!("{}/{rep}", s.task).as_bytes()).as_bytes())[..48]
                .to_string();
            cfg.push_str(&format!(
                "[[keys]]\nid = \"{id}\"\nsecret_hash = \"{}\"\nhuman = false\n\n",
                hex(&tokensaver::auth::secret_hash(&secret))
            ));
            keys.insert((s.task.clone(), rep), format!("tsk_{id}_{secret}"));
        }
    }
    let models: std::collections::BTreeSet<&str> = loaded
        .sessions
        .iter()
        .map(|(s, _)| s.model.as_str())
        .collect();
    for model in models {
        cfg.push_str(&format!(
            "[prices.\"{model}\"]\ninput = 2_500_000\ncache_write = 2_500_000\ncache_read = 1_250_000\noutput = 10_000_000\nmax_output = 16_384\n\n"
        ));
    }
    cfg.push_str("[limits]\ncommit_interval_ms = 5\n");
    let cfg_path = tmp.path().join("tokensaver.toml");
    std::fs::write(&cfg_path, cfg).map_err(|e| e.to_string())?;
    let child = Command::new(&bin)
        .arg("serve")
        .arg("--config")
        .arg(&cfg_path)
        .env("OPENAI_API_KEY", PROVIDER_CREDENTIAL)
        .env("ANTHROPIC_API_KEY", PROVIDER_CREDENTIAL)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawn {bin}: {e} (run `cargo build` first)"))?;
    let _gate = Gate(child);
    for a in [proxy, api, admin] {
        if !wait_for_port(a, Duration::from_secs(30)) {
            return Err(format!("the gate did not listen on {a}"));
        }
    }
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_millis() as u64;
    let mut runs = Vec::new();
    for rep in 1..=reps {
        for (s, digest) in &loaded.sessions {
            let key = keys
                .get(&(s.task.clone(), rep))
                .ok_or("missing key")?
                .clone();
            runs.push(run_arm(
                s,
                digest,
                "control",
                rep,
                &mock.base_url(),
                PROVIDER_CREDENTIAL,
            ));
            runs.push(run_arm(
                s,
                digest,
                "treatment",
                rep,
                &format!("http://{proxy}"),
                &key,
            ));
            eprintln!("{} r{rep}: done", s.task);
        }
    }
    let ev = EvidenceFile {
        suite: SUITE.into(),
        methodology: m.version,
        gate_version: tokensaver::economics::GATE_VERSION.into(),
        harness: HARNESS.into(),
        provider: format!(
            "tokensaver::demo::provider::MockProvider (tokensaver {})",
            tokensaver::economics::GATE_VERSION
        ),
        recorded_at_unix_ms: started,
        repetitions: reps,
        runs,
    };
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    let mut text = serde_json::to_string_pretty(&ev).map_err(|e| e.to_string())?;
    text.push('\n');
    std::fs::write(&out, text).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out.display());
    Ok(())
}
