//! The demo's newer half: a coding session that pauses past the provider's cache lifetime (the
//! gate gives it one-hour entries) against the same session through a key whose bytes the gate
//! leaves alone, and an agent stuck on one step, paced and then stopped. Time is compressed 300
//! times on both sides: the provider's five minutes last 1 s (`--time-scale 300`), the gate
//! judges pauses by a 1 s lifetime, and its step schedule runs in seconds.

use std::net::SocketAddr;

use serde_json::{json, Value};

use super::{post, Seen};
use crate::http_client::BlockingClient;

/// How much the provider's clock runs ahead of the wall clock in the demo.
pub const TIME_SCALE: u64 = 300;
/// A pause of 7 scaled minutes: past the five-minute lifetime, well inside the hour.
const PAUSE: std::time::Duration = std::time::Duration::from_millis(1_400);
/// The paused session's calls, and the calls a pause comes before.
const SESSION_CALLS: usize = 10;
const PAUSED_BEFORE: [usize; 4] = [2, 4, 6, 8];

/// Two demo keys for the paused session: one with the gate's cache placement (the default,
/// `cache = "auto"`), one with `cache = "off"`, whose bytes reach the provider as sent. The
/// secret is shared and public: these keys exist only inside the demo's own config.
const SECRET: &str = "5e55104d3e3055104d3e3055104d3e3055104d3e3055104d3e30";
pub const GATED_KEY_ID: &str = "coder";
pub const PLAIN_KEY_ID: &str = "coder-plain";

fn key(id: &str) -> String {
    format!("tsk_{id}_{SECRET}")
}

/// The demo config's additions: the two session keys, the gate's windows for compressed time.
pub fn configure(doc: &mut toml::Table) {
    let keys = doc
        .entry("keys")
        .or_insert_with(|| toml::Value::Array(Vec::new()));
    if let toml::Value::Array(keys) = keys {
        for (id, cache) in [(GATED_KEY_ID, "auto"), (PLAIN_KEY_ID, "off")] {
            let mut k = toml::Table::new();
            k.insert("id".into(), id.into());
            k.insert(
                "secret_hash".into(),
                hex::encode(crate::auth::secret_hash(SECRET)).into(),
            );
            k.insert("human".into(), true.into());
            k.insert("cache".into(), cache.into());
            keys.push(k.into());
        }
    }
    let gate = doc
        .entry("gate")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(gate) = gate {
        // The provider's five-minute lifetime, at the provider's compressed clock.
        let windows = gate
            .entry("windows")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(w) = windows {
            w.insert("cache_secs".into(), 1.into());
        }
        // The step schedule in seconds: three steps per 2 s, then gaps of 1, 2 and 4 s; a run of
        // one step is stopped at 6 s (the defaults: 120 s, holds up to 240 s, 90 minutes).
        let mut steps = toml::Table::new();
        steps.insert("pace_window_secs".into(), 2.into());
        steps.insert("max_hold_secs".into(), 4.into());
        steps.insert("runaway_after_secs".into(), 6.into());
        gate.insert("steps".into(), steps.into());
    }
}

/// A long system prompt (about 12 k tokens), as a coding agent sends with every call.
fn system_prompt() -> String {
    (0..900)
        .map(|i| format!("Repository rule {i}: keep the change small and cite the file. "))
        .collect()
}

/// Call `turn` of a coding session whose history grows, marking its own breakpoints as Claude
/// Code does (the system block and the newest message, five-minute `{"type":"ephemeral"}`).
fn session_call(system: &str, turn: usize) -> Value {
    let marker = json!({"type": "ephemeral"});
    let mut messages = Vec::new();
    for t in 0..turn {
        messages.push(json!({"role": "user", "content": format!("Step {t}: what next?")}));
        messages.push(json!({"role": "assistant", "content": format!("Run the tests of module {t} and report.")}));
    }
    messages.push(json!({"role": "user", "content": [
        {"type": "text", "text": format!("Step {turn}: what next?"), "cache_control": marker}]}));
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "system": [{"type": "text", "text": system, "cache_control": marker}],
        "messages": messages,
    })
}

/// One key's run of the session: the calls' receipts.
fn run_session(proxy: &BlockingClient, key_id: &str) -> anyhow::Result<Vec<Seen>> {
    let system = system_prompt();
    let mut seen = Vec::with_capacity(SESSION_CALLS);
    for turn in 0..SESSION_CALLS {
        if PAUSED_BEFORE.contains(&turn) {
            std::thread::sleep(PAUSE);
        }
        let answer = post(
            proxy,
            &key(key_id),
            "/v1/messages",
            &session_call(&system, turn),
            &[
                ("anthropic-version", "2023-06-01"),
                ("x-tokensaver-session", "refactor-42"),
            ],
        )?;
        if answer.status != 200 {
            return Err(anyhow::anyhow!(
                "the paused session's call {turn} was answered {} ({})",
                answer.status,
                answer.reason
            ));
        }
        seen.push(answer);
    }
    Ok(seen)
}

/// A key's one session, as `GET /ledger/sessions` sums it from the provider's usage.
fn the_session(api: SocketAddr, key_id: &str) -> anyhow::Result<Value> {
    let sessions = super::keyed_get(api, &key(key_id), "/ledger/sessions")?;
    match sessions["sessions"].as_array().map(Vec::as_slice) {
        Some([one]) => Ok(one.clone()),
        _ => Err(anyhow::anyhow!(
            "the ledger does not show {key_id}'s one session"
        )),
    }
}

pub fn paused_session(proxy: &BlockingClient, api: SocketAddr) -> anyhow::Result<()> {
    println!(
        "\na coding session that pauses: {SESSION_CALLS} calls of Claude Sonnet 4.5 with Claude Code's own \
         five-minute cache markers, a 7-minute pause before {} of them (time runs {TIME_SCALE}x)",
        PAUSED_BEFORE.len()
    );
    // Straight first, then through the gate: one after the other, so that neither reads the
    // other's cache (the first's five-minute entries expire in the pause between them).
    run_session(proxy, PLAIN_KEY_ID)?;
    std::thread::sleep(PAUSE);
    let gated = run_session(proxy, GATED_KEY_ID)?;
    let one_hour = gated
        .iter()
        .position(|s| s.receipt["cache_lifetime"] == "1h");
    super::settle_ledger();
    let (plain, gate) = (
        the_session(api, PLAIN_KEY_ID)?,
        the_session(api, GATED_KEY_ID)?,
    );
    println!(
        "  {:<30} {:>10} {:>11} {:>9} {:>13} {:>11}",
        "", "spend", "cache read", "rebuilds", "rebuild cost", "1h premium"
    );
    for (label, s) in [
        ("as sent (key with cache off)", &plain),
        ("through the gate", &gate),
    ] {
        println!(
            "  {:<30} {:>10} {:>11} {:>9} {:>13} {:>11}",
            label,
            usd(&s["spend_nano"]),
            s["cache_read_share"]
                .as_f64()
                .map_or("-".into(), |r| format!("{:.1} %", r * 100.0)),
            s["cache_rebuilds"].as_u64().unwrap_or(0),
            usd(&s["cache_rebuild"]),
            usd(&s["cache_premium_1h"]),
        );
    }
    let (p, g) = (
        plain["spend_nano"].as_u64().unwrap_or(0),
        gate["spend_nano"].as_u64().unwrap_or(0),
    );
    match one_hour {
        Some(turn) => println!(
            "  the session paused before call {}; from then on the gate wrote its markers as one-hour \
             entries (receipt: cache_lifetime 1h), so the later pauses read the cache instead of \
             rebuilding it",
            turn + 1
        ),
        None => println!("  the gate placed no one-hour entries"),
    }
    if p > 0 {
        println!(
            "  the placed lifetime saved {} on this session: {:.1} % of its spend as sent \
             (the provider's own usage at list prices; the client sent both the same requests)",
            usd(&json!(p.saturating_sub(g))),
            (p as f64 - g as f64) / p as f64 * 100.0
        );
    }
    Ok(())
}

/// An agent's request after `steps` tool steps, each the same status check with the same
/// answer: a stuck agent, whose history grows while it makes no progress.
fn stuck_call(steps: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a deploy agent."}),
        json!({"role": "user", "content": "Wait for the deploy, then report."}),
    ];
    for i in 0..steps {
        let id = format!("call_{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "deploy_status", "arguments": "{}"}}]}));
        messages.push(
            json!({"role": "tool", "tool_call_id": id, "content": "error: permission denied"}),
        );
    }
    json!({"model": "gpt-4o", "max_tokens": 200, "messages": messages})
}

pub fn stuck_step(proxy: &BlockingClient) -> anyhow::Result<()> {
    println!(
        "\nan agent stuck on one step (the same tool call, the same result, its history growing), \
         unattended; the schedule compressed: three steps at once, then each held longer than \
         the one before, the run stopped once it is 6 s old (by default: 90 minutes)"
    );
    println!(
        "  {:<5} {:>6}  {:<9} {:<20} {:>9}",
        "step", "status", "verdict", "reason", "held s"
    );
    for step in 1..=12 {
        let seen = post(
            proxy,
            super::DEMO_KEY,
            "/v1/chat/completions",
            &stuck_call(step),
            &[("x-tokensaver-session", "deploy-7")],
        )?;
        let held = seen.receipt["paced_ms"].as_u64().unwrap_or(0);
        println!(
            "  {:<5} {:>6}  {:<9} {:<20} {:>9.1}",
            step,
            seen.status,
            seen.verdict,
            seen.reason,
            held as f64 / 1_000.0
        );
        if seen.status != 200 {
            break;
        }
    }
    Ok(())
}

fn usd(nano: &Value) -> String {
    let n = nano.as_u64().unwrap_or(0);
    format!("${}.{:06}", n / 1_000_000_000, (n % 1_000_000_000) / 1_000)
}
