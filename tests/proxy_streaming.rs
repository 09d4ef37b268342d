//! Streaming through the proxy: usage capture, the usage chunk, SSE replays.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::*;
use tokensaver_mock_provider::expected_usage;

/// The `data:` payloads of an SSE body, parsed where JSON.
fn sse_events(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|ev| {
            ev.lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(str::to_string)
        })
        .collect()
}

fn has_usage_chunk(body: &[u8]) -> bool {
    sse_events(body).iter().any(|d| {
        serde_json::from_str::<Value>(d)
            .ok()
            .is_some_and(|v| v.get("usage").is_some_and(|u| !u.is_null()))
    })
}

fn usage_total(h: &Harness, key: &str) -> Value {
    settle();
    h.ledger(key)["total"]["usage"].clone()
}

#[test]
fn openai_stream_without_include_usage_hides_chunk_but_ledger_records() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "Stream me a short answer please.",
        json!({"stream": true, "temperature": 0.5}),
    );
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    assert!(
        !has_usage_chunk(&r.body),
        "client did not ask for usage: {}",
        r.text()
    );
    assert!(sse_events(&r.body).iter().any(|d| d == "[DONE]"));
    // The proxy asked upstream for usage on the client's behalf.
    let seen = h.mock.last_request().unwrap().body_json().unwrap();
    assert_eq!(seen["stream_options"]["include_usage"], true);

    let exp = expected_usage(body.to_string().as_bytes()).unwrap();
    let u = usage_total(&h, KEY_A);
    assert_eq!(
        u["input"].as_u64().unwrap() + u["cache_read"].as_u64().unwrap(),
        exp.prompt_tokens,
        "{u}"
    );
    assert_eq!(u["output"].as_u64().unwrap(), exp.completion_tokens, "{u}");
}

#[test]
fn asking_for_usage_upstream_adds_one_member_to_the_callers_body() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "Stream me a third answer.",
        json!({"stream": true, "temperature": 0.5}),
    );
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    let mut seen = h.mock.last_request().unwrap().body_json().unwrap();
    let added = seen.as_object_mut().unwrap().remove("stream_options");
    assert_eq!(added, Some(json!({"include_usage": true})));
    assert_eq!(seen, body);
}

#[test]
fn openai_stream_options_without_usage_are_kept_and_usage_asked_for() {
    // The caller's other stream options are merged with the one the proxy adds.
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "Stream me another short answer.",
        json!({"stream": true, "temperature": 0.5,
               "stream_options": {"include_usage": false, "include_obfuscation": false}}),
    );
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!has_usage_chunk(&r.body), "{}", r.text());
    let seen = h.mock.last_request().unwrap().body_json().unwrap();
    assert_eq!(seen["stream_options"]["include_usage"], true);
    assert_eq!(seen["stream_options"]["include_obfuscation"], false);
    assert_eq!(seen["messages"], body["messages"]);
}

#[test]
fn openai_stream_with_include_usage_shows_chunk() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "Stream with usage please.",
        json!({"stream": true, "temperature": 0.5, "stream_options": {"include_usage": true}}),
    );
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(has_usage_chunk(&r.body), "{}", r.text());
    let exp = expected_usage(body.to_string().as_bytes()).unwrap();
    let u = usage_total(&h, KEY_A);
    assert_eq!(u["output"].as_u64().unwrap(), exp.completion_tokens, "{u}");
}

#[test]
fn anthropic_stream_usage_recorded() {
    let h = Harness::default();
    let body = anthropic(
        "claude-haiku-4-5",
        "Stream three primes.",
        json!({"stream": true, "temperature": 0.5}),
    );
    let r = h.post_raw(
        MESSAGES,
        None,
        body.to_string().as_bytes(),
        &[("x-api-key", KEY_A), HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("message_stop"));
    let exp = expected_usage(body.to_string().as_bytes()).unwrap();
    let u = usage_total(&h, KEY_A);
    assert_eq!(u["input"].as_u64().unwrap(), exp.input_tokens, "{u}");
    assert_eq!(u["output"].as_u64().unwrap(), exp.completion_tokens, "{u}");
}

#[test]
fn repeated_stream_is_served_as_sse_and_never_to_json_request() {
    let h = Harness::default();
    let streamed = chat(
        "gpt-4o-mini",
        "Deterministic stream.",
        json!({"stream": true, "temperature": 0}),
    );
    let first = h.post(CHAT, KEY_A, &streamed, &[HUMAN]);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.verdict(), Some("ALLOW"));
    settle();
    let second = h.post(CHAT, KEY_A, &streamed, &[HUMAN]);
    assert_eq!(second.status, 200);
    assert_eq!(second.verdict(), Some("SERVE"));
    assert!(second
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(
        second.body, first.body,
        "replay must match the live answer the client saw"
    );
    assert!(!has_usage_chunk(&second.body));
    assert_eq!(h.calls(CHAT), 1);

    // The same content, not streamed: a JSON answer is not held, so it goes upstream.
    let mut plain = streamed.clone();
    plain.as_object_mut().unwrap().remove("stream");
    let third = h.post(CHAT, KEY_A, &plain, &[HUMAN]);
    assert_eq!(third.status, 200, "{}", third.text());
    assert_ne!(third.verdict(), Some("SERVE"));
    assert_eq!(third.json()["object"], "chat.completion");
    assert_eq!(h.calls(CHAT), 2);
}

#[test]
fn stream_served_with_usage_when_asked() {
    let h = Harness::default();
    let streamed = chat(
        "gpt-4o-mini",
        "Deterministic stream with usage.",
        json!({"stream": true, "temperature": 0, "stream_options": {"include_usage": true}}),
    );
    let first = h.post(CHAT, KEY_A, &streamed, &[HUMAN]);
    assert_eq!(first.status, 200);
    settle();
    let second = h.post(CHAT, KEY_A, &streamed, &[HUMAN]);
    assert_eq!(second.verdict(), Some("SERVE"));
    assert!(has_usage_chunk(&second.body));
    assert_eq!(second.body, first.body);
    assert_eq!(h.calls(CHAT), 1);
}
