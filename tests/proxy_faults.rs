//! Provider faults through the proxy: passed through, never stored, never invented usage.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::*;
use tokensaver_mock_provider::expected_usage;

fn usage(h: &Harness) -> Value {
    settle();
    h.ledger(KEY_A)["total"]["usage"].clone()
}

fn assert_zero_usage(u: &Value) {
    for part in ["input", "cache_write", "cache_read", "output"] {
        assert_eq!(u[part].as_u64().unwrap(), 0, "{part} invented: {u}");
    }
}

#[test]
fn fault_500_and_429_pass_through_unstored() {
    let h = Harness::default();
    let body = chat("gpt-fault-500", "fail please", json!({"temperature": 0}));
    for i in 0..2 {
        let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
        assert_eq!(r.status, 500, "try {i}: {}", r.text());
        assert_ne!(r.verdict(), Some("SERVE"));
        settle();
    }
    assert_eq!(h.calls(CHAT), 2, "an error answer is never stored");

    let body = chat(
        "gpt-fault-429",
        "rate limit please",
        json!({"temperature": 0}),
    );
    for i in 0..2 {
        let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
        assert_eq!(r.status, 429, "try {i}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_ne!(r.verdict(), Some("SERVE"));
        assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
        settle();
    }
    assert_eq!(h.calls(CHAT), 4);
    assert_zero_usage(&usage(&h));
}

#[test]
fn fault_slow_times_out_504() {
    let h = Harness::start(Opts {
        upstream_timeout_secs: 1,
        slow_ms: 3000,
        ..Opts::default()
    });
    let body = chat(
        "gpt-fault-slow",
        "take your time",
        json!({"temperature": 0}),
    );
    let t = std::time::Instant::now();
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(t.elapsed() < std::time::Duration::from_millis(2900));
    assert!(r.json()["error"].is_object());
    assert_zero_usage(&usage(&h));
}

fn broken(r: &Resp) -> bool {
    r.transport_error.is_some() || !r.text().contains("[DONE]")
}

/// The same reproducible streamed call twice against a fault model: both answers break off,
/// neither is served from store (nothing was kept), both reached the provider, and no usage was
/// invented.
fn assert_broken_twice_and_nothing_kept(h: &Harness, model: &str, prompt: &str) {
    let body = chat(model, prompt, json!({"stream": true, "temperature": 0}));
    for i in 0..2 {
        let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
        assert!(broken(&r), "try {i} looked complete: {}", r.text());
        assert_ne!(r.verdict(), Some("SERVE"));
        settle();
    }
    assert_eq!(h.calls(CHAT), 2);
    assert_zero_usage(&usage(h));
}

#[test]
fn fault_reset_stream_is_broken_and_not_stored() {
    let h = Harness::default();
    assert_broken_twice_and_nothing_kept(&h, "gpt-fault-reset", "reset me");
}

#[test]
fn fault_truncated_streams_are_incomplete_and_not_stored() {
    let h = Harness::default();
    assert_broken_twice_and_nothing_kept(&h, "gpt-fault-truncated", "truncate me");

    // Non-streamed truncation: the client must not get a complete-looking JSON answer.
    let body = chat(
        "gpt-fault-truncated",
        "truncate json",
        json!({"temperature": 0}),
    );
    for i in 0..2 {
        let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
        assert!(
            r.transport_error.is_some() || serde_json::from_slice::<Value>(&r.body).is_err(),
            "try {i} looked complete: {}",
            r.text()
        );
        settle();
    }
    assert_eq!(h.calls(CHAT), 4);
    assert_zero_usage(&usage(&h));
}

#[test]
fn anthropic_faults_record_only_reported_usage() {
    let h = Harness::default();
    let body = anthropic(
        "claude-fault-reset",
        "reset me",
        json!({"stream": true, "temperature": 0}),
    );
    let r = h.post_raw(
        MESSAGES,
        None,
        body.to_string().as_bytes(),
        &[("x-api-key", KEY_A), HUMAN],
    );
    assert!(
        r.transport_error.is_some() || !r.text().contains("message_stop"),
        "{}",
        r.text()
    );
    settle();
    let r = h.post_raw(
        MESSAGES,
        None,
        body.to_string().as_bytes(),
        &[("x-api-key", KEY_A), HUMAN],
    );
    assert_ne!(r.verdict(), Some("SERVE"));
    assert_eq!(h.calls(MESSAGES), 2);

    let body = anthropic(
        "claude-fault-truncated",
        "truncate me",
        json!({"stream": true, "temperature": 0}),
    );
    let r = h.post_raw(
        MESSAGES,
        None,
        body.to_string().as_bytes(),
        &[("x-api-key", KEY_A), HUMAN],
    );
    assert!(
        r.transport_error.is_some() || !r.text().contains("message_stop"),
        "{}",
        r.text()
    );
    // message_start reports input tokens (and output_tokens: 1); nothing more was reported.
    let exp = expected_usage(body.to_string().as_bytes()).unwrap();
    let u = usage(&h);
    let reset_exp = expected_usage(
        anthropic(
            "claude-fault-reset",
            "reset me",
            json!({"stream": true, "temperature": 0}),
        )
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    assert!(
        u["input"].as_u64().unwrap() <= exp.input_tokens + 2 * reset_exp.input_tokens,
        "{u}"
    );
    assert!(
        u["output"].as_u64().unwrap() <= 3,
        "output beyond what was reported: {u}"
    );
}
