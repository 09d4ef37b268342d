//! Cache lifetimes and routes placed by the gate (issue "cache lifetimes", SPEC §2.11b), through
//! the real binary in front of the built-in provider: what reaches the provider, byte for byte,
//! and what the receipt and the provider's bill say.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::Value;
use support::cache_bodies::*;
use support::*;

fn key_with(extra: &str) -> Harness {
    Harness::start(Opts {
        key_b_extra: extra.to_string(),
        ..Opts::default()
    })
}

fn send_anthropic(h: &Harness, key: &str, body: &str) -> Resp {
    let r = h.post_raw(
        MESSAGES,
        None,
        body.as_bytes(),
        &[("x-api-key", key), HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

fn upstream_bytes(h: &Harness) -> Vec<u8> {
    h.mock.last_request().unwrap().body.to_vec()
}

/// An Anthropic call forwarded byte for byte, with no lifetime placed.
fn assert_forwarded_as_sent(h: &Harness, key: &str, sent: &str) {
    let r = send_anthropic(h, key, sent);
    assert!(
        r.receipt().get("cache_lifetime").is_none(),
        "{}",
        r.receipt()
    );
    assert_eq!(upstream_bytes(h), sent.as_bytes());
}

#[test]
fn a_one_hour_key_gets_one_hour_entries_on_its_own_markers_and_nothing_else_changes() {
    let h = key_with("cache_ttl = \"1h\"\n");
    let sent = marked_anthropic(None);
    let r = send_anthropic(&h, KEY_B, &sent);
    assert_eq!(r.receipt()["cache_lifetime"], "1h", "{}", r.receipt());
    // The caller's markers, each with the one-hour lifetime inserted, and not a byte more.
    let expected = sent.replace(
        r#"{"type":"ephemeral"}"#,
        r#"{"type":"ephemeral","ttl":"1h"}"#,
    );
    assert_eq!(String::from_utf8(upstream_bytes(&h)).unwrap(), expected);
    // The provider wrote the prefix as a one-hour entry, and bills it so.
    let usage = &r.json()["usage"];
    let written_1h = usage["cache_creation"]["ephemeral_1h_input_tokens"]
        .as_u64()
        .unwrap();
    assert!(written_1h > 4_000, "{usage}");
    assert_eq!(
        usage["cache_creation"]["ephemeral_5m_input_tokens"].as_u64(),
        Some(0),
        "{usage}"
    );
    settle();
    let rows = keyed_get(&h.api_url("/ledger/decisions"), Some(KEY_B)).json();
    assert_eq!(
        rows["decisions"][0]["cache_write_1h"].as_u64(),
        Some(written_1h)
    );
}

#[test]
fn a_caller_that_sets_its_own_lifetime_is_forwarded_as_sent() {
    let h = key_with("cache_ttl = \"1h\"\n");
    for ttl in ["5m", "1h"] {
        assert_forwarded_as_sent(&h, KEY_B, &marked_anthropic(Some(ttl)));
    }
}

#[test]
fn a_session_that_never_paused_keeps_five_minute_entries() {
    // The default lifetime policy: one-hour entries only once a session has shown a pause.
    let h = Harness::default();
    let sent = marked_anthropic(None);
    for _ in 0..3 {
        assert_forwarded_as_sent(&h, KEY_A, &sent);
    }
}

#[test]
fn an_openai_call_gets_a_routing_key_and_retention_and_a_callers_own_are_kept() {
    let h = Harness::default();
    let sent = openai_chat(GPT5_MINI, "");
    let r = h.post_raw(CHAT, Some(KEY_A), sent.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    let added = added_members(&sent, &upstream_bytes(&h));
    let key = added["prompt_cache_key"].as_str().unwrap().to_string();
    assert!(key.starts_with("ts_") && key.len() == 27, "{key}");
    assert_eq!(added["prompt_cache_retention"], "24h");
    assert_eq!(added.as_object().unwrap().len(), 2, "{added}");
    let receipt = r.receipt();
    assert_eq!(receipt["cache_routing_key"], key.as_str());
    assert_eq!(receipt["cache_retention"], "24h");

    // Another session of the same prefix, at a rate one route takes: the same route, so the
    // prefix it shares is read, not written again.
    let r = h.post_raw(
        CHAT,
        Some(KEY_A),
        sent.as_bytes(),
        &[HUMAN, ("x-tokensaver-session", "another")],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        added_members(&sent, &upstream_bytes(&h))["prompt_cache_key"],
        key.as_str()
    );

    // A caller that names its own key and retention: forwarded as sent, nothing in the receipt.
    let own = openai_chat(
        GPT5_MINI,
        r#","prompt_cache_key":"mine","prompt_cache_retention":"in_memory""#,
    );
    let r = h.post_raw(CHAT, Some(KEY_A), own.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(upstream_bytes(&h), own.as_bytes());
    assert!(r.receipt().get("cache_routing_key").is_none());
    assert!(r.receipt().get("cache_retention").is_none());
}

/// Step `turn` of an OpenAI agent session: one long shared system prompt, then its own turns.
fn openai_step(turn: usize) -> String {
    format!(
        r#"{{"model":"{GPT5_MINI}","max_completion_tokens":100,"messages":[{{"role":"system","content":{}}},{{"role":"user","content":"Step {turn}: what next?"}}]}}"#,
        serde_json::to_string(&long_text("agent")).unwrap()
    )
}

/// The routing key the gate gave a call of `session` (the provider saw the same one).
fn routed(h: &Harness, session: &str, turn: usize) -> String {
    let sent = openai_step(turn);
    let r = h.post_raw(
        CHAT,
        Some(KEY_A),
        sent.as_bytes(),
        &[HUMAN, ("x-tokensaver-session", session)],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let key = r.receipt()["cache_routing_key"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        added_members(&sent, &upstream_bytes(h))["prompt_cache_key"],
        key.as_str()
    );
    key
}

#[test]
fn a_lone_session_keeps_one_route_at_any_rate_and_sessions_past_the_rate_get_their_own() {
    let h = Harness::default();
    // 30 calls of one session within the minute: well past the 12 a minute one route takes,
    // yet one key throughout (one session spread over routes would only miss its own cache).
    let lone: std::collections::BTreeSet<String> = (0..30).map(|t| routed(&h, "lone", t)).collect();
    assert_eq!(lone.len(), 1, "{lone:?}");
    // Six more sessions of the same prefix in that minute, past the rate: each a route of its
    // own, kept on every call (its history stays where it was cached).
    let mut by_session =
        std::collections::BTreeMap::<usize, std::collections::BTreeSet<String>>::new();
    for turn in 0..4 {
        for s in 0..6 {
            by_session
                .entry(s)
                .or_default()
                .insert(routed(&h, &format!("session-{s}"), turn));
        }
    }
    assert!(by_session.values().all(|k| k.len() == 1), "{by_session:?}");
    let keys: std::collections::BTreeSet<&String> = by_session.values().flatten().collect();
    assert_eq!(keys.len(), 6, "{keys:?}");
    assert!(!keys.contains(lone.iter().next().unwrap()), "{keys:?}");
}

#[test]
fn retention_only_where_the_model_takes_it_and_nothing_below_the_cacheable_minimum() {
    let h = Harness::default();
    // gpt-4o-mini takes no `prompt_cache_retention`: a routing key only.
    let sent = openai_chat("gpt-4o-mini", "");
    let r = h.post_raw(CHAT, Some(KEY_A), sent.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    let added = added_members(&sent, &upstream_bytes(&h));
    assert_eq!(added.as_object().unwrap().len(), 1, "{added}");
    assert!(added["prompt_cache_key"].is_string());
    // A prompt OpenAI would not cache (under 1,024 tokens): the caller's bytes, untouched.
    let short = r#"{"model":"gpt-5-mini","max_completion_tokens":50,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = h.post_raw(CHAT, Some(KEY_A), short.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(upstream_bytes(&h), short.as_bytes());
}

#[test]
fn cache_off_leaves_every_byte_alone() {
    let h = key_with("cache = \"off\"\ncache_ttl = \"1h\"\n");
    let sent = openai_chat(GPT5_MINI, "");
    let r = h.post_raw(CHAT, Some(KEY_B), sent.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(upstream_bytes(&h), sent.as_bytes());
    assert_forwarded_as_sent(&h, KEY_B, &marked_anthropic(None));
}

/// What a call cost at Claude Sonnet 4.5's list prices (nano-USD per token: $3 input, $3.75
/// 5-minute write, $6 one-hour write, $0.30 read, $15 output per MTok), from the usage the
/// provider reported.
fn cost_nano(usage: &Value) -> u64 {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let c = &usage["cache_creation"];
    n(&usage["input_tokens"]) * 3_000
        + n(&c["ephemeral_5m_input_tokens"]) * 3_750
        + n(&c["ephemeral_1h_input_tokens"]) * 6_000
        + n(&usage["cache_read_input_tokens"]) * 300
        + n(&usage["output_tokens"]) * 15_000
}

/// Time compressed 300 times on both sides: the provider's five minutes last 1 s and its hour
/// 12 s (`--time-scale 300`), and the gate judges pauses by a lifetime of 1 s
/// (`[gate.windows] cache_secs = 1`).
fn compressed() -> Harness {
    Harness::start(Opts {
        time_scale: 300,
        extra_config: format!("\n[gate.windows]\ncache_secs = 1\n{SONNET_LISTED_PRICES}"),
        ..Opts::default()
    })
}

const PAUSE: std::time::Duration = std::time::Duration::from_millis(1_400);

/// One call of a session: what it cost, its receipt (`Null` straight to the provider) and the
/// usage the provider answered.
struct Call {
    cost: u64,
    receipt: Value,
    usage: Value,
}

/// Runs a session of 10 calls, pausing (7 scaled minutes) before those in `pauses`; straight
/// to the provider or through the gate.
fn run_session(h: &Harness, seed: &str, pauses: &[usize], gated: bool) -> Vec<Call> {
    let mut out = Vec::new();
    for turn in 0..10 {
        if pauses.contains(&turn) {
            std::thread::sleep(PAUSE);
        }
        let sent = session_call(seed, turn);
        let (answer, receipt) = if gated {
            let r = h.post_raw(
                MESSAGES,
                None,
                sent.as_bytes(),
                &[("x-api-key", KEY_A), HUMAN, ("x-tokensaver-session", seed)],
            );
            assert_eq!(r.status, 200, "{}", r.text());
            let receipt = r.receipt();
            // The caller's bytes, with at most the lifetime written into its own markers.
            let seen = String::from_utf8(upstream_bytes(h)).unwrap();
            let expected = if receipt["cache_lifetime"] == "1h" {
                sent.replace(
                    r#"{"type":"ephemeral"}"#,
                    r#"{"type":"ephemeral","ttl":"1h"}"#,
                )
            } else {
                sent.clone()
            };
            assert_eq!(seen, expected, "turn {turn}");
            (r.json(), receipt)
        } else {
            (h.straight_anthropic(sent.as_bytes()), Value::Null)
        };
        out.push(Call {
            cost: cost_nano(&answer["usage"]),
            receipt,
            usage: answer["usage"].clone(),
        });
    }
    out
}

#[test]
fn a_session_that_pauses_gets_one_hour_entries_and_costs_far_less() {
    // The same session twice, each against a provider of its own: straight, then through
    // the gate.
    let (plain, gate) = (compressed(), compressed());
    let pauses = [2, 4, 5, 7, 9];
    let straight = run_session(&plain, "pauses", &pauses, false);
    let gated = run_session(&gate, "pauses", &pauses, true);
    // Five-minute entries until the session has paused; one-hour entries from its first pause.
    for (turn, call) in gated.iter().enumerate() {
        let one_hour = call.receipt.get("cache_lifetime").is_some();
        assert_eq!(one_hour, turn >= 2, "turn {turn}: {}", call.receipt);
    }
    assert_cache_health_shown(&gate, &gated, &pauses);
    let total = |run: &[Call]| run.iter().map(|c| c.cost).sum::<u64>();
    let (s, g) = (total(&straight), total(&gated));
    let saved = 1.0 - g as f64 / s as f64;
    println!(
        "a session of 10 calls with 5 pauses: straight ${:.6}, through the gate ${:.6}: {:.1} % less",
        s as f64 / 1e9,
        g as f64 / 1e9,
        saved * 100.0
    );
    assert!(saved >= 0.30, "{:.1} %", saved * 100.0);
}

#[test]
fn a_session_without_pauses_costs_the_same() {
    let (plain, gate) = (compressed(), compressed());
    let straight = run_session(&plain, "steady", &[], false);
    let gated = run_session(&gate, "steady", &[], true);
    assert!(gated
        .iter()
        .all(|c| c.receipt.get("cache_lifetime").is_none()));
    let costs = |run: &[Call]| run.iter().map(|c| c.cost).collect::<Vec<_>>();
    assert_eq!(costs(&straight), costs(&gated));
}

/// The session's cache health on `/ledger/sessions`, `/ledger` and `/metrics`, against figures
/// derived here from the usage the provider answered, at Sonnet 4.5's list prices.
fn assert_cache_health_shown(h: &Harness, calls: &[Call], pauses: &[usize]) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let (mut prompt, mut read, mut premium, mut rebuilds, mut rebuild_cost) = (0, 0, 0, 0, 0);
    for (turn, c) in calls.iter().enumerate() {
        let (w5, w1) = (
            n(&c.usage["cache_creation"]["ephemeral_5m_input_tokens"]),
            n(&c.usage["cache_creation"]["ephemeral_1h_input_tokens"]),
        );
        prompt += n(&c.usage["input_tokens"]) + w5 + w1 + n(&c.usage["cache_read_input_tokens"]);
        read += n(&c.usage["cache_read_input_tokens"]);
        premium += w1 * (6_000 - 3_750);
        // A rebuild: after a pause, the prefix written again (more written than read).
        if pauses.contains(&turn) && w5 + w1 > n(&c.usage["cache_read_input_tokens"]) {
            rebuilds += 1;
            rebuild_cost += w5 * 3_750 + w1 * 6_000;
        }
    }
    // The first pause rebuilds (five-minute entries had expired); later pauses are bridged by
    // the one-hour entries and write only what the session grew.
    assert!(rebuilds == 1 && premium > 0, "{rebuilds} {premium}");
    let sessions = keyed_get(&h.api_url("/ledger/sessions"), Some(KEY_A)).json();
    let s = &sessions["sessions"][0];
    assert_eq!(s["calls"], 10, "{sessions}");
    assert_eq!(s["prompt_tokens"], prompt, "{s}");
    assert_eq!(s["cache_read_tokens"], read, "{s}");
    let share = s["cache_read_share"].as_f64().unwrap();
    assert!((share - read as f64 / prompt as f64).abs() < 1e-12, "{s}");
    assert_eq!(s["cache_premium_1h"], premium, "{s}");
    assert_eq!(s["cache_rebuild"], rebuild_cost, "{s}");
    assert!(s["cache_saving_lifetimes"].as_i64().unwrap() > 0, "{s}");
    assert_eq!(s["cache_saving_routing"], 0, "{s}");
    let ledger = h.ledger(KEY_A);
    assert_eq!(ledger["total"]["cache_premium_1h"], premium, "{ledger}");
    assert_eq!(
        ledger["total"]["cache_rebuilds"], s["cache_rebuilds"],
        "{ledger}"
    );
    assert_eq!(
        ledger["total"]["cache_saving_lifetimes"],
        s["cache_saving_lifetimes"]
    );
    assert_eq!(
        ledger["cache_read_share"], s["cache_read_share"],
        "{ledger}"
    );
    let metrics = keyed_get(&h.admin_url("/metrics"), Some(ADMIN_KEY)).text();
    for line in [
        format!("tokensaver_prompt_tokens_total{{billed_as=\"cache_read\"}} {read}"),
        format!("tokensaver_cache_cost_nano_usd_total{{part=\"premium_1h\"}} {premium}"),
        format!("tokensaver_cache_cost_nano_usd_total{{part=\"rebuild\"}} {rebuild_cost}"),
        format!(
            "tokensaver_cache_saving_derived_nano_usd{{mechanism=\"lifetimes\"}} {}",
            s["cache_saving_lifetimes"]
        ),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
}
