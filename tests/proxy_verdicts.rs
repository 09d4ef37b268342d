//! Every verdict through the real proxy against the mock provider.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::*;

#[test]
fn allow_forwards_with_provider_credential_and_serve_repeats_exact_bytes() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "What is the capital of France? marker-allow-1",
        json!({"temperature": 0}),
    );
    let first = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.verdict(), Some("ALLOW"));
    assert_eq!(h.calls(CHAT), 1);
    let seen = h.mock.last_request().unwrap();
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {PROVIDER_CREDENTIAL}").as_str())
    );
    for (_, v) in &seen.headers {
        assert!(!v.contains(SECRET_A), "tokensaver key leaked upstream");
    }
    assert_eq!(seen.body_json().unwrap(), body);

    settle();
    let second = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(second.status, 200);
    assert_eq!(second.verdict(), Some("SERVE"));
    assert!(second.header("x-tokensaver-receipt").is_some());
    assert_eq!(
        second.body, first.body,
        "SERVE must return the exact stored bytes"
    );
    assert_eq!(h.calls(CHAT), 1, "SERVE must not call upstream");
    let r = second.receipt();
    assert_eq!(r["verdict"], "SERVE");
    assert!(r["tokens_not_bought"].as_u64().unwrap() > 0);
}

#[test]
fn downgrade_rewrites_model_and_receipt_names_both() {
    let h = Harness::default();
    let body = chat("gpt-4o", "Say hello in French.", json!({"max_tokens": 100}));
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.verdict(), Some("DOWNGRADE"));
    let seen = h.mock.last_request().unwrap();
    assert_eq!(seen.body_json().unwrap()["model"], "gpt-4o-mini");
    let receipt = r.receipt();
    assert_eq!(receipt["model_requested"], "gpt-4o");
    assert_eq!(receipt["model_served"], "gpt-4o-mini");
    assert_eq!(r.json()["model"], "gpt-4o-mini");
}

#[test]
fn downgrade_changes_only_the_model_bytes_and_a_repeated_model_key_is_written_once() {
    let h = Harness::default();
    // Spacing, key order and escapes as a caller might write them: the provider must receive
    // these bytes with the model's string replaced and nothing else touched.
    let body = "{ \"messages\" : [ {\"role\":\"user\", \"content\":\"Say h\\u00e9llo.\"} ],\n  \
                \"model\":  \"gpt-4o\" , \"max_tokens\": 100 }";
    let r = h.post_raw(CHAT, Some(KEY_A), body.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.verdict(), Some("DOWNGRADE"));
    let seen = h.mock.last_request().unwrap();
    assert_eq!(
        seen.body_text(),
        body.replace("\"gpt-4o\" ,", "\"gpt-4o-mini\" ,")
    );

    // Written twice, the model would be one model for a reader keeping the first value and
    // another for one keeping the last: since issue "hostile" 6 the gate refuses the body
    // (it used to forward it with each key once), and nothing reaches the provider.
    let calls = h.calls(CHAT);
    let body = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hi."}],
                   "model":"gpt-4o","max_tokens":100}"#;
    let r = h.post_raw(CHAT, Some(KEY_A), body.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "repeated_field", "{}", r.text());
    assert_eq!(h.calls(CHAT), calls);
}

/// A streamed DOWNGRADE whose caller did not ask for usage: the provider gets the caller's
/// bytes with the model's string replaced and the usage option added before the closing brace,
/// nothing else touched; the caller's stream carries no usage chunk.
#[test]
fn a_streamed_downgrade_edits_the_model_and_asks_for_usage_in_the_callers_bytes() {
    let h = Harness::default();
    let body = "{ \"model\" : \"gpt-4o\", \"stream\": true,\n  \"messages\": [{\"role\":\"user\", \
                \"content\":\"Say hi.\"}], \"max_tokens\": 100 }";
    let r = h.post_raw(CHAT, Some(KEY_A), body.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.verdict(), Some("DOWNGRADE"));
    let sent = h.mock.last_request().unwrap().body_text();
    let expected = body.replace("\"gpt-4o\"", "\"gpt-4o-mini\"").replace(
        " 100 }",
        " 100 ,\"stream_options\":{\"include_usage\":true}}",
    );
    assert_eq!(sent, expected);
    assert!(r.text().contains("[DONE]"), "{}", r.text());
    assert!(!r.text().contains("\"prompt_tokens\""), "{}", r.text());
}

/// Key A with a $0.01 ceiling, and a call held for the person who declared themselves:
/// max_tokens 10 000 on gpt-4o could cost $0.10 (exceeds_remaining_budget). Returns the
/// harness, the body, the 409 and its hold id.
fn held_call(prompt: &str) -> (Harness, Value, Resp, String) {
    let h = Harness::start(Opts {
        budget_a: Some(10_000),
        ..Opts::default()
    });
    let body = chat("gpt-4o", prompt, json!({"max_tokens": 10_000}));
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 409, "{}", r.text());
    let hold = r
        .header("x-tokensaver-hold")
        .expect("hold header")
        .to_string();
    (h, body, r, hold)
}

#[test]
fn challenge_hold_approve_and_retry_once() {
    let (h, body, r, hold) = held_call("Write a long essay.");
    assert_eq!(r.verdict(), Some("CHALLENGE"));
    assert_eq!(r.header("x-should-retry"), Some("false"));
    let err = r.json();
    assert_eq!(err["error"]["hold_id"], hold.as_str());
    assert_eq!(err["error"]["type"], "tokensaver_hold");
    assert_eq!(h.calls(CHAT), 0);

    // Not approved yet: the retry is still held.
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN, ("x-tokensaver-hold", &hold)]);
    assert_eq!(r.status, 409);
    assert_eq!(h.calls(CHAT), 0);

    let a = h.approve(&hold);
    assert_eq!(a.status, 200, "{}", a.text());
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN, ("x-tokensaver-hold", &hold)]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.calls(CHAT), 1);

    // Single use.
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN, ("x-tokensaver-hold", &hold)]);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(h.calls(CHAT), 1);
}

#[test]
fn approve_needs_admin_key_on_admin_listener() {
    let (h, _, _, hold) = held_call("Write a long essay.");
    // The automation's own key cannot approve.
    let r = call(
        client::post(&h.admin_url(&format!("/holds/{hold}/approve")))
            .set("authorization", &format!("Bearer {KEY_A}")),
        Some(b""),
    );
    assert_eq!(r.status, 401);
    let r = call(
        client::post(&h.api_url(&format!("/holds/{hold}/approve")))
            .set("authorization", &format!("Bearer {ADMIN_KEY}")),
        Some(b""),
    );
    assert_eq!(r.status, 401);
    let r = h.approve("no-such-hold");
    assert_eq!(r.status, 404);
}

#[test]
fn block_runaway_loop_unattended_429() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "Try again: fix the failing test.",
        json!({"temperature": 1}),
    );
    for i in 0..3 {
        let r = h.post(CHAT, KEY_A, &body, &[]);
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    assert_eq!(h.calls(CHAT), 3);
    let r = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.verdict(), Some("BLOCK"));
    assert_eq!(r.header("x-should-retry"), Some("false"));
    assert_eq!(r.receipt()["rule"], "runaway_loop_unattended");
    assert_eq!(h.calls(CHAT), 3, "a BLOCK never reaches the provider");
}

#[test]
fn block_budget_402_and_receipt_verifies() {
    let h = Harness::start(Opts {
        budget_a: Some(10_000),
        ..Opts::default()
    });
    let body = chat(
        "gpt-4o",
        "Write the whole book.",
        json!({"max_tokens": 200_000}),
    );
    let r = h.post(CHAT, KEY_A, &body, &[("x-tokensaver-human", "0")]);
    assert_eq!(r.status, 402, "{}", r.text());
    assert_eq!(r.verdict(), Some("BLOCK"));
    assert_eq!(r.header("x-should-retry"), Some("false"));
    assert_eq!(h.calls(CHAT), 0);

    let v = call(
        client::post(&h.api_url("/verify")),
        Some(r.envelope_json().as_bytes()),
    );
    assert_eq!(v.status, 200);
    assert_eq!(v.json()["valid"], true, "{}", v.text());
    assert_eq!(v.json()["receipt"]["verdict"], "BLOCK");

    // A tampered envelope does not verify.
    let mut env: serde_json::Value = serde_json::from_str(&r.envelope_json()).unwrap();
    let other = h.post(CHAT, KEY_A, &chat("gpt-4o-mini", "hi", json!({})), &[HUMAN]);
    let other_env: serde_json::Value = serde_json::from_str(&other.envelope_json()).unwrap();
    env["body"] = other_env["body"].clone();
    let v = call(
        client::post(&h.api_url("/verify")),
        Some(env.to_string().as_bytes()),
    );
    assert_eq!(v.json()["valid"], false, "{}", v.text());
}

#[test]
fn unknown_key_401_ungated_404_models_pass_through() {
    let h = Harness::default();
    let body = chat("gpt-4o-mini", "hello", json!({}));
    let r = h.post(CHAT, "tsk_alpha_wrongsecret", &body, &[]);
    assert_eq!(r.status, 401);
    let r = h.post(CHAT, "tsk_nobody_abc", &body, &[]);
    assert_eq!(r.status, 401);
    let r = h.post_raw(CHAT, None, body.to_string().as_bytes(), &[]);
    assert_eq!(r.status, 401);
    // Anthropic key header with a wrong key.
    let r = h.post_raw(
        MESSAGES,
        None,
        anthropic("claude-haiku-4-5", "hi", json!({}))
            .to_string()
            .as_bytes(),
        &[("x-api-key", "tsk_alpha_nope")],
    );
    assert_eq!(r.status, 401);
    assert_eq!(h.calls(CHAT) + h.calls(MESSAGES), 0);

    let r = h.post(
        "/v1/embeddings",
        KEY_A,
        &json!({"model": "text-embedding-3-small", "input": "x"}),
        &[],
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "not_gated");
    assert_eq!(h.mock.total_calls(), 0);

    let r = call(
        client::get(&h.proxy_url("/v1/models")).set("authorization", &format!("Bearer {KEY_A}")),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["data"].is_array());
    assert_eq!(h.calls("/v1/models"), 1);
    let seen = h.mock.last_request().unwrap();
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {PROVIDER_CREDENTIAL}").as_str())
    );

    let r = call(client::get(&h.proxy_url("/v1/models")), None);
    assert_eq!(r.status, 401);
    assert_eq!(h.calls("/v1/models"), 1);
}

#[test]
fn anthropic_allow_uses_x_api_key_upstream() {
    let h = Harness::default();
    let body = anthropic("claude-haiku-4-5", "Name three primes.", json!({}));
    let r = h.post_raw(
        MESSAGES,
        None,
        body.to_string().as_bytes(),
        &[
            ("x-api-key", KEY_A),
            ("anthropic-version", "2023-06-01"),
            HUMAN,
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.verdict(), Some("ALLOW"));
    let seen = h.mock.last_request().unwrap();
    assert_eq!(seen.header("x-api-key"), Some(PROVIDER_CREDENTIAL));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(r.json()["type"], "message");
}

#[test]
fn the_keys_owner_approves_its_hold_on_the_api_listener() {
    let (h, body, _, hold) = held_call("Write a long report.");
    let approve = |owner: &str| {
        call(
            client::post(&h.api_url(&format!("/holds/{hold}/approve")))
                .set("x-tokensaver-owner", owner),
            Some(b""),
        )
    };
    // The wrong secret, and another key's name, are refused; the owner's secret approves.
    assert_eq!(approve("alpha:not-the-secret").status, 401);
    assert_eq!(approve(&format!("beta:{OWNER_SECRET_A}")).status, 401);
    let ok = approve(&format!("alpha:{OWNER_SECRET_A}"));
    assert_eq!(ok.status, 200, "{}", ok.text());
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN, ("x-tokensaver-hold", &hold)]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.calls(CHAT), 1);
}
