//! `tokensaver demo`: the quick start. Starts the deterministic mock provider (the
//! `tokensaver-mock-provider` binary beside this one) on 127.0.0.1, runs `tokensaver serve`
//! with the example config pointed at it, sends a short scripted agent session through the
//! proxy over real HTTP, and prints each verdict, its reason and findings, then the spend and
//! savings from the ledger. No network, no setup.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::http_client::{BlockingClient, Request};
use crate::processes::{free_port, free_ports, mock_provider_binary, wait_for_port};

mod newer;

/// The example config's demo key (its hash is in `config/tokensaver.toml`).
pub const DEMO_KEY: &str = "tsk_demo_0123456789abcdef0123456789abcdef0123456789abcdef";
/// The credential the demo provider expects: the proxy must swap it in for the caller's key.
const PROVIDER_CREDENTIAL: &str = "sk-demo-provider-credential";

/// One scripted request: its label, body, path on the proxy and extra headers.
type Step<'a> = (String, Value, &'a str, Vec<(&'a str, &'a str)>);

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One answer as the demo shows it.
struct Seen {
    status: u16,
    verdict: String,
    reason: String,
    findings: Vec<String>,
    /// The signed receipt's body (null when the answer carried none).
    receipt: Value,
}

/// How long the demo waits for one answer from its local servers.
const TIMEOUT: Duration = Duration::from_secs(30);

fn post(
    proxy: &BlockingClient,
    key: &str,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> anyhow::Result<Seen> {
    let mut request = Request::post(path, body.to_string())
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(k, *v);
    }
    let answer = proxy
        .send(&request)
        .map_err(|e| anyhow::anyhow!("request failed: {e}"))?;
    let receipt = answer
        .header("x-tokensaver-receipt")
        .and_then(|h| crate::receipt::Envelope::from_header_value(h).ok())
        .and_then(|e| e.body_bytes().ok())
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .unwrap_or(Value::Null);
    Ok(Seen {
        status: answer.status,
        verdict: answer
            .header("x-tokensaver-verdict")
            .unwrap_or("-")
            .to_string(),
        reason: receipt["reason"].as_str().unwrap_or("-").to_string(),
        findings: receipt["findings"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        receipt,
    })
}

/// Requests the mock provider received, over every path (its `GET /__mock/calls`).
fn provider_calls(mock_url: &str) -> anyhow::Result<u64> {
    let mock = BlockingClient::new(mock_url, Duration::from_secs(10))?;
    let answer = mock
        .send(&Request::get("/__mock/calls"))
        .ok()
        .filter(|a| !a.is_error())
        .ok_or_else(|| anyhow::anyhow!("the local provider did not answer /__mock/calls"))?;
    let calls: Value = serde_json::from_slice(&answer.body)
        .map_err(|_| anyhow::anyhow!("the local provider's /__mock/calls is not JSON"))?;
    Ok(calls
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum()))
}

/// A keyed route on the API listener (`/ledger`, `/ledger/sessions`); null if it is not JSON.
fn keyed_get(api: SocketAddr, key: &str, path: &str) -> anyhow::Result<Value> {
    let client = BlockingClient::new(&format!("http://{api}"), TIMEOUT)?;
    let request = Request::get(path).header("authorization", format!("Bearer {key}"));
    let answer = client
        .send(&request)
        .map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    if answer.is_error() {
        return Err(anyhow::anyhow!("{path}: HTTP {}", answer.status));
    }
    Ok(serde_json::from_slice(&answer.body).unwrap_or(Value::Null))
}

/// Usage is recorded as the answer ends; give the last one's settlement a moment to land.
fn settle_ledger() {
    std::thread::sleep(Duration::from_millis(200));
}

fn chat(model: &str, text: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": text}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

pub fn run(config_path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config_path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {}", config_path.display(), e.kind()))?;
    let mut doc: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("example config: {}", e.message()))?;

    let mock_addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let mock = Command::new(mock_provider_binary()?)
        .arg("--listen")
        .arg(mock_addr.to_string())
        .arg("--expected-credential")
        .arg(PROVIDER_CREDENTIAL)
        .arg("--time-scale")
        .arg(newer::TIME_SCALE.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the local provider: {}", e.kind()))?;
    let _mock_guard = ChildGuard(mock);
    if !wait_for_port(mock_addr, Duration::from_secs(10)) {
        return Err(anyhow::anyhow!(
            "the local provider did not start listening"
        ));
    }
    let mock_url = format!("http://{mock_addr}");
    let dir = std::env::temp_dir().join(format!("tokensaver-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(anyhow::Error::from)?;
    let [proxy, api, admin] = free_ports::<3>()?;
    let [proxy, api, admin]: [SocketAddr; 3] =
        [proxy, api, admin].map(|port| ([127, 0, 0, 1], port).into());
    let mut listen = toml::Table::new();
    listen.insert("proxy".into(), proxy.to_string().into());
    listen.insert("api".into(), api.to_string().into());
    listen.insert("admin".into(), admin.to_string().into());
    doc.insert("listen".into(), listen.into());
    let mut data = toml::Table::new();
    data.insert("dir".into(), dir.join("data").display().to_string().into());
    doc.insert("data".into(), data.into());
    if let Some(toml::Value::Table(ups)) = doc.get_mut("upstreams") {
        for (_, up) in ups.iter_mut() {
            if let toml::Value::Table(up) = up {
                up.insert("base_url".into(), mock_url.clone().into());
            }
        }
    }
    newer::configure(&mut doc);
    let demo_config = dir.join("tokensaver.toml");
    std::fs::write(
        &demo_config,
        toml::to_string(&doc).map_err(anyhow::Error::from)?,
    )
    .map_err(anyhow::Error::from)?;

    let exe = std::env::current_exe().map_err(anyhow::Error::from)?;
    let child = Command::new(exe)
        .arg("serve")
        .arg("--config")
        .arg(&demo_config)
        .env("OPENAI_API_KEY", PROVIDER_CREDENTIAL)
        .env("ANTHROPIC_API_KEY", PROVIDER_CREDENTIAL)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start tokensaver serve: {e}"))?;
    let guard = ChildGuard(child);
    if !wait_for_port(proxy, Duration::from_secs(15)) || !wait_for_port(api, Duration::from_secs(5))
    {
        return Err(anyhow::anyhow!("tokensaver serve did not start listening"));
    }

    println!("tokensaver demo: proxy {proxy}, local provider {mock_url}\n");
    let proxy_client = BlockingClient::new(&format!("http://{proxy}"), TIMEOUT)?;
    let chat_path = "/v1/chat/completions";
    let messages_path = "/v1/messages";
    let reproducible = chat(
        "gpt-4o",
        "Summarise the release notes for version 4.2 in three bullet points.",
        json!({"temperature": 0, "max_tokens": 1500}),
    );
    let mut steps: Vec<Step> = vec![
        (
            "a normal call (sampled output)".into(),
            chat(
                "gpt-4o",
                "Draft a friendly greeting for new users.",
                json!({"temperature": 0.7, "max_tokens": 1500}),
            ),
            chat_path,
            vec![],
        ),
        (
            "a temperature-0 call".into(),
            reproducible.clone(),
            chat_path,
            vec![],
        ),
        (
            "the same temperature-0 call again".into(),
            reproducible,
            chat_path,
            vec![],
        ),
    ];
    for i in 1..=4 {
        steps.push((
            format!("an agent retrying a sampled call ({i}/4)"),
            chat(
                "gpt-4o",
                "Try again: fix the failing test.",
                json!({"temperature": 1, "max_tokens": 1200}),
            ),
            chat_path,
            vec![],
        ));
    }
    steps.push((
        "an over-budget call (max_tokens 200000)".into(),
        chat(
            "gpt-4o",
            "Write the whole book.",
            json!({"max_tokens": 200_000}),
        ),
        chat_path,
        vec![],
    ));
    steps.push((
        "a small call, a person attending".into(),
        chat("gpt-4o", "Capital of France?", json!({"max_tokens": 50})),
        chat_path,
        vec![("x-tokensaver-human", "1")],
    ));
    steps.push((
        "an Anthropic call".into(),
        json!({"model": "claude-sonnet-4-5", "max_tokens": 2000, "system": "You are terse.", "messages": [{"role": "user", "content": "Name three prime numbers."}]}),
        messages_path,
        vec![("anthropic-version", "2023-06-01")],
    ));

    println!(
        "{:<3} {:<40} {:>6}  {:<10} {:<28} findings",
        "#", "step", "status", "verdict", "reason"
    );
    for (i, (name, body, path, headers)) in steps.iter().enumerate() {
        let seen = post(&proxy_client, DEMO_KEY, path, body, headers)?;
        println!(
            "{:<3} {:<40} {:>6}  {:<10} {:<28} {}",
            i + 1,
            name,
            seen.status,
            seen.verdict,
            seen.reason,
            if seen.findings.is_empty() {
                "-".to_string()
            } else {
                seen.findings.join(", ")
            }
        );
    }
    println!(
        "\nthe provider was called {} times for {} requests",
        provider_calls(&mock_url)?,
        steps.len()
    );

    settle_ledger();
    let ledger = keyed_get(api, DEMO_KEY, "/ledger")?;
    let total = &ledger["total"];
    let nano = total["spend_nano"].as_u64().unwrap_or(0);
    println!(
        "\nledger: spend ${}.{:06} (provider-reported usage x prices)\n  tokens_not_bought         {:>8}  (exact: the provider-reported usage of answers served from store)\n  worst_case_tokens_avoided {:>8}  (a ceiling on refused calls, never added to savings)\n  findings (estimated)      {:>8}  (character estimates, never in any total)",
        nano / 1_000_000_000,
        (nano % 1_000_000_000) / 1_000,
        total["tokens_not_bought"],
        total["worst_case_tokens_avoided"],
        total["findings_tokens_estimated"],
    );

    newer::paused_session(&proxy_client, api)?;
    newer::stuck_step(&proxy_client)?;

    // The session table is `tokensaver ledger --sessions` on the demo's data, once the server
    // has drained and closed its ledger.
    let mut server = guard;
    crate::lifecycle::terminate(&mut server.0, Duration::from_secs(10))?;
    let config = crate::config::Config::load(&demo_config)
        .map_err(|e| anyhow::anyhow!("demo config: {e}"))?;
    println!();
    super::ledger::print(&config, None, true)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
