//! Request bodies: big ones forwarded byte for byte, oversize and malformed ones refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

#[test]
fn four_mib_prompt_arrives_byte_for_byte() {
    let h = Harness::default();
    let prompt: String = "lorem ipsum dolor sit amet ".repeat(4 * 1024 * 1024 / 27 + 1);
    // Odd formatting on purpose: the proxy must forward the caller's bytes, not a re-serialisation.
    let raw = format!(
        "{{ \"model\" :\"gpt-4o-mini\",\n  \"max_tokens\": 10, \"messages\": [ {{\"role\":\"user\",\"content\":\"{prompt}\"}} ] }}"
    );
    assert!(raw.len() > 4 * 1024 * 1024);
    let r = h.post_raw(CHAT, Some(KEY_A), raw.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.verdict(), Some("ALLOW"));
    assert_eq!(h.calls(CHAT), 1);
    let seen = h.mock.last_request().unwrap();
    // A prompt this size is one OpenAI caches, and the caller set no `prompt_cache_key`: the
    // gate adds one (and nothing else) just before the body's closing brace; every other byte
    // is the caller's, odd spacing included.
    let close = raw.rfind('}').unwrap();
    let (head, tail) = (&raw.as_bytes()[..close], &raw.as_bytes()[close..]);
    let body = seen.body.as_ref();
    assert!(body.len() > raw.len());
    assert!(body.starts_with(head), "the caller's bytes are kept");
    assert!(body.ends_with(tail));
    let added = std::str::from_utf8(&body[head.len()..body.len() - tail.len()]).unwrap();
    let added: serde_json::Value = serde_json::from_str(&format!("{{{}}}", &added[1..])).unwrap();
    let key = added["prompt_cache_key"].as_str().unwrap();
    assert_eq!(added.as_object().unwrap().len(), 1, "{added}");
    assert!(key.starts_with("ts_") && key.len() == 27, "{key}");
}

#[test]
fn body_over_cap_is_413_without_upstream_call() {
    let h = Harness::start(Opts {
        max_body_bytes: Some(64 * 1024),
        ..Opts::default()
    });
    let body = chat("gpt-4o-mini", &"x".repeat(80 * 1024), serde_json::json!({}));
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 413, "{:?} {}", r.transport_error, r.text());
    assert_eq!(h.calls(CHAT), 0);
    settle();
    assert_eq!(h.ledger(KEY_A)["total"]["requests"], 0);
}

#[test]
fn malformed_bodies_are_400_without_echo_or_record() {
    let h = Harness::default();
    let marker = "MARKER7f3a9";
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("malformed json", format!("{{\"model\": \"gpt-4o-mini\", \"messages\": [{marker}").into_bytes()),
        ("wrong types", format!("{{\"model\": 5, \"messages\": \"{marker}\"}}").into_bytes()),
        ("messages wrong type", format!("{{\"model\": \"gpt-4o-mini\", \"messages\": [{{\"role\": \"user\", \"content\": 7}}], \"{marker}\": 1, \"temperature\": \"{marker}\"}}").into_bytes()),
        ("not an object", format!("[\"{marker}\"]").into_bytes()),
        ("invalid utf-8", {
            let mut b = format!("{{\"model\": \"gpt-4o-mini\", \"messages\": [{{\"role\": \"user\", \"content\": \"{marker}").into_bytes();
            b.extend_from_slice(&[0xff, 0xfe, 0x80]);
            b.extend_from_slice(b"\"}]}");
            b
        }),
        ("empty", Vec::new()),
    ];
    for (name, body) in &cases {
        let r = h.post_raw(CHAT, Some(KEY_A), body, &[HUMAN]);
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        let err = r.json();
        assert!(
            err["error"]["message"].is_string(),
            "{name}: not provider-shaped: {}",
            r.text()
        );
        assert!(
            !r.text().contains(marker),
            "{name}: echoed input: {}",
            r.text()
        );
        // Anthropic shape on the Anthropic route.
        let r = h.post_raw(MESSAGES, None, body, &[("x-api-key", KEY_A), HUMAN]);
        assert_eq!(r.status, 400, "{name} (anthropic): {}", r.text());
        assert_eq!(r.json()["type"], "error", "{name}: {}", r.text());
        assert!(!r.text().contains(marker));
    }
    assert_eq!(h.mock.total_calls(), 0);
    settle();
    let l = h.ledger(KEY_A);
    assert_eq!(l["total"]["requests"], 0, "{l}");
}

#[test]
fn an_answer_larger_than_the_store_is_relayed_but_never_stored() {
    let h = Harness::start(Opts {
        answer_store_bytes: Some(64),
        ..Opts::default()
    });
    let body = chat(
        "gpt-4o",
        "store me if you can",
        serde_json::json!({"temperature": 0, "max_tokens": 50}),
    );
    let first = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(first.status, 200);
    assert!(
        first.body.len() > 64,
        "the answer must exceed the store for this test"
    );
    settle();
    let again = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(again.status, 200);
    assert_ne!(
        again.verdict(),
        Some("SERVE"),
        "a partial or oversized answer was stored"
    );
    assert_eq!(h.calls(CHAT), 2);
}
