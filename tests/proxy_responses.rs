//! The OpenAI Responses API through the proxy, the routes passed through after the key check,
//! the session fields left out of the identity, and a stuck agent caught by its step.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::*;

const RESPONSES: &str = "/v1/responses";

fn responses(model: &str, input: Value, extra: Value) -> Value {
    let mut body = json!({"model": model, "input": input, "max_output_tokens": 200});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The event types of an SSE body, in order.
fn event_types(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["type"].as_str().map(str::to_string))
        .collect()
}

/// The usage the provider reported in a Responses answer (JSON, or the terminal event).
fn reported_usage(body: &[u8]) -> (u64, u64, u64) {
    let text = String::from_utf8_lossy(body);
    let response = match serde_json::from_str::<Value>(&text) {
        Ok(v) => v,
        Err(_) => text
            .split("\n\n")
            .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| v["type"] == "response.completed")
            .map(|v| v["response"].clone())
            .unwrap(),
    };
    let u = &response["usage"];
    let input = u["input_tokens"].as_u64().unwrap();
    let cached = u["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (input - cached, cached, u["output_tokens"].as_u64().unwrap())
}

/// Sent to the provider: ALLOW, or DOWNGRADE for a small call with a person attending.
fn forwarded(r: &Resp) -> bool {
    matches!(r.verdict(), Some("ALLOW" | "DOWNGRADE"))
}

fn ledger_usage(h: &Harness, key: &str) -> (u64, u64, u64) {
    settle();
    let u = h.ledger(key)["total"]["usage"].clone();
    let part = |p: &str| u[p].as_u64().unwrap_or(0);
    (part("input"), part("cache_read"), part("output"))
}

#[test]
fn a_responses_call_is_gated_forwarded_and_its_usage_recorded() {
    let h = Harness::default();
    let body = responses(
        "gpt-4o",
        json!("Say something about lighthouses."),
        json!({}),
    );
    let r = h.post(RESPONSES, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(forwarded(&r), "{:?}", r.verdict());
    assert_eq!(r.json()["object"], "response");
    assert_eq!(h.calls(RESPONSES), 1);
    assert_eq!(ledger_usage(&h, KEY_A), reported_usage(&r.body));
    let receipt = r.receipt();
    assert_eq!(receipt["model_requested"], "gpt-4o");
}

#[test]
fn a_streamed_responses_call_ends_with_its_terminal_event_and_is_recorded() {
    let h = Harness::default();
    let body = responses(
        "gpt-4o",
        json!([{"role": "user", "content": [{"type": "input_text", "text": "Stream a haiku."}]}]),
        json!({"stream": true}),
    );
    let r = h.post(RESPONSES, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let types = event_types(&r.body);
    assert_eq!(types.first().map(String::as_str), Some("response.created"));
    assert_eq!(types.last().map(String::as_str), Some("response.completed"));
    assert!(types.iter().any(|t| t == "response.output_text.delta"));
    assert_eq!(ledger_usage(&h, KEY_A), reported_usage(&r.body));
}

#[test]
fn a_reproducible_responses_repeat_is_served_in_its_own_wire_form() {
    let h = Harness::default();
    for stream in [false, true] {
        let body = responses(
            "gpt-4o",
            json!(format!("Name three rivers (stream {stream}).")),
            json!({"temperature": 0, "stream": stream}),
        );
        let first = h.post(RESPONSES, KEY_A, &body, &[HUMAN]);
        assert!(forwarded(&first), "{}", first.text());
        settle();
        let second = h.post(RESPONSES, KEY_A, &body, &[HUMAN]);
        assert_eq!(second.verdict(), Some("SERVE"), "{}", second.text());
        assert_eq!(second.body, first.body, "served bytes are the stored bytes");
        let (input, cached, output) = reported_usage(&first.body);
        assert_eq!(
            second.receipt()["tokens_not_bought"].as_u64(),
            Some(input + cached + output),
            "the SERVE's saving is the usage the provider reported for the stored answer"
        );
    }
    assert_eq!(h.calls(RESPONSES), 2);
}

#[test]
fn a_continuation_of_provider_state_is_never_served() {
    let h = Harness::default();
    // A continuation names a response its own key created (an id the gate never saw created
    // is refused: tests/proxy_hostile.rs).
    let first = h.post(
        RESPONSES,
        KEY_A,
        &responses("gpt-4o", json!("Tell me a story."), json!({})),
        &[HUMAN],
    );
    assert!(forwarded(&first), "{}", first.text());
    let id = first.json()["id"].as_str().unwrap().to_string();
    let body = responses(
        "gpt-4o",
        json!("And then?"),
        json!({"temperature": 0, "previous_response_id": id}),
    );
    for _ in 0..2 {
        let r = h.post(RESPONSES, KEY_A, &body, &[HUMAN]);
        assert!(forwarded(&r), "{}", r.text());
        settle();
    }
    assert_eq!(h.calls(RESPONSES), 3);
}

#[test]
fn stored_response_routes_and_count_tokens_pass_through_after_the_key_check() {
    let h = Harness::default();
    let created = h.post(
        RESPONSES,
        KEY_A,
        &responses("gpt-4o", json!("Keep me."), json!({})),
        &[HUMAN],
    );
    assert_eq!(created.status, 200, "{}", created.text());
    let id = created.json()["id"].as_str().unwrap().to_string();

    let get = |path: &str, key: &str| {
        call(
            client::get(&h.proxy_url(path)).set("authorization", &format!("Bearer {key}")),
            None,
        )
    };
    let read = get(&format!("/v1/responses/{id}"), KEY_A);
    assert_eq!(read.status, 200, "{}", read.text());
    assert_eq!(read.json()["id"], id.as_str());
    let items = get(&format!("/v1/responses/{id}/input_items"), KEY_A);
    assert_eq!(items.status, 200, "{}", items.text());
    let refused = get(&format!("/v1/responses/{id}"), "tsk_alpha_wrong");
    assert_eq!(refused.status, 401);
    assert_eq!(
        h.mock.calls(&format!("/v1/responses/{id}")),
        1,
        "the refused read never went upstream"
    );

    let count = h.post(
        "/v1/messages/count_tokens",
        KEY_A,
        &json!({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "count me"}]}),
        &[],
    );
    assert_eq!(count.status, 200, "{}", count.text());
    assert!(count.json()["input_tokens"].as_u64().unwrap() > 0);
    assert!(count.verdict().is_none(), "count_tokens is not gated");

    // Still refused: billable paths this build does not gate.
    let embeddings = h.post(
        "/v1/embeddings",
        KEY_A,
        &json!({"model": "m", "input": "x"}),
        &[],
    );
    assert_eq!(embeddings.status, 404);
}

#[test]
fn a_query_string_on_a_gated_route_is_kept_upstream() {
    let h = Harness::default();
    let body = anthropic("claude-sonnet-4-5", "Hello with beta.", json!({}));
    let r = h.post("/v1/messages?beta=true", KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(forwarded(&r), "{:?}", r.verdict());
    let seen = h.mock.last_request().unwrap();
    assert_eq!(seen.target, "/v1/messages?beta=true");
}

#[test]
fn a_new_session_of_the_same_request_is_served_despite_its_session_fields() {
    let h = Harness::default();
    let session = |id: &str| {
        anthropic(
            "claude-sonnet-4-5",
            "What is the capital of Peru?",
            json!({"temperature": 0, "metadata": {"user_id": format!("user_x_session_{id}")}}),
        )
    };
    let first = h.post(MESSAGES, KEY_A, &session("one"), &[HUMAN]);
    assert!(forwarded(&first), "{}", first.text());
    settle();
    let rerun = h.post(MESSAGES, KEY_A, &session("two"), &[HUMAN]);
    assert_eq!(rerun.verdict(), Some("SERVE"), "{}", rerun.text());
    assert_eq!(rerun.body, first.body);

    let chat_session = |id: &str| {
        chat(
            "gpt-4o",
            "What is the capital of Chile?",
            json!({"temperature": 0, "user": id, "prompt_cache_key": id, "safety_identifier": id, "metadata": {"s": id}}),
        )
    };
    assert!(forwarded(&h.post(
        CHAT,
        KEY_A,
        &chat_session("a"),
        &[HUMAN]
    )));
    settle();
    assert_eq!(
        h.post(CHAT, KEY_A, &chat_session("b"), &[HUMAN]).verdict(),
        Some("SERVE")
    );
}

/// A chat history in which the model asked `steps` times for the same tool call; the newest
/// tool result is `result`.
fn stuck_agent(steps: usize, result: &str) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Is the build green yet?"})];
    for i in 0..steps {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}"), "type": "function", "function": {"name": "run", "arguments": "{\"cmd\":\"make\"}"}}
        ]}));
        let out = if i + 1 == steps {
            result.to_string()
        } else {
            format!("output {i}")
        };
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": out}));
    }
    json!({
        "model": "gpt-4o",
        "max_tokens": 100,
        "tools": [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}],
        "messages": messages,
    })
}

#[test]
fn a_stuck_agent_is_paced_then_stopped_and_a_progressing_one_is_not() {
    // The step windows scaled down: pace in 2 s, hold at most 4 s, stop a run 4 s old (which
    // the 5th repeat would be: the 4th waits 2 s for the window, the 5th 2 s more).
    let h = Harness::start(Opts {
        extra_config: "\n[gate.steps]\npace_window_secs = 2\nmax_hold_secs = 4\n\
                            runaway_after_secs = 4\n"
            .into(),
        ..Opts::default()
    });
    // Unattended: three identical steps pass at once (SPEC §2.3).
    for step in 1..=3 {
        let r = h.post(
            CHAT,
            KEY_A,
            &stuck_agent(step, "make: nothing to be done"),
            &[],
        );
        assert!(
            r.status < 400 || r.status == 409,
            "step {step}: {}",
            r.text()
        );
        assert!(r.receipt().get("paced_ms").is_none(), "step {step}");
    }
    // The 4th is held until the 1st is 2 s old, then forwarded.
    let fourth = h.post(
        CHAT,
        KEY_A,
        &stuck_agent(4, "make: nothing to be done"),
        &[],
    );
    assert_eq!(fourth.status, 200, "{}", fourth.text());
    assert!(
        fourth.receipt()["paced_ms"].as_u64().unwrap() >= 1_500,
        "{}",
        fourth.envelope_json()
    );
    // The 5th repeat would be decided 4 s into the run: a runaway, however it is paced.
    let fifth = h.post(
        CHAT,
        KEY_A,
        &stuck_agent(5, "make: nothing to be done"),
        &[],
    );
    assert_eq!(fifth.status, 429, "{}", fifth.text());
    assert_eq!(fifth.json()["error"]["code"], "runaway_step");

    // Progress: a new result every step, from another key with the same budget.
    for step in 1..=6 {
        let r = h.post(
            CHAT,
            KEY_B,
            &stuck_agent(step, &format!("progress {step}")),
            &[],
        );
        assert_ne!(r.status, 429, "step {step}: {}", r.text());
    }
}
