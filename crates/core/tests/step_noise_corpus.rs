//! The pinned corpus of real tool results (`corpus/step-noise/`, captured from Claude Code,
//! Codex CLI and the OpenAI Agents SDK by `corpus/step-noise/capture.py`): a step repeated
//! with nothing but its natural noise keeps its step fingerprint, a step that made progress
//! gets a new one.
//!
//! Each captured result is put back where its client sent it (an Anthropic `tool_result`
//! block's `content`, a Responses `function_call_output`'s `output`, a chat `tool` message's
//! `content`), after the call it answered, in a request of the client's route.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};
use tokensaver_core::request::normalise::normalise;
use tokensaver_core::request::{parse, Hash, Route};

const KEY: [u8; 32] = [5; 32];

fn corpus() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../corpus/step-noise/captures.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn route(name: &str) -> Route {
    match name {
        "anthropic_messages" => Route::AnthropicMessages,
        "openai_responses" => Route::OpenAiResponses,
        "openai_chat" => Route::OpenAiChat,
        other => panic!("unknown route {other}"),
    }
}

/// A request whose newest assistant turn is `call` and whose tail is `capture`'s result.
fn body(route: Route, capture: &Value) -> Value {
    let call = &capture["call"];
    let (name, arguments) = (&call["name"], &call["arguments"]);
    let result = &capture["result"];
    match route {
        Route::AnthropicMessages => {
            let mut block =
                json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": result});
            if let Some(e) = capture.get("is_error") {
                block["is_error"] = e.clone();
            }
            json!({
                "model": "claude-sonnet-5-5", "max_tokens": 100, "system": "sys",
                "tools": [{"name": name, "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}]},
                    {"role": "user", "content": [block]},
                ],
            })
        }
        Route::OpenAiResponses => json!({
            "model": "gpt-5.5", "instructions": "sys",
            "tools": [{"type": "function", "name": name, "parameters": {"type": "object"}}],
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
                {"type": "function_call", "call_id": "call_1", "name": name, "arguments": arguments},
                {"type": "function_call_output", "call_id": "call_1", "output": result},
            ],
        }),
        Route::OpenAiChat => json!({
            "model": "gpt-5.6-luna",
            "tools": [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}],
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": result},
            ],
        }),
    }
}

fn step(route: Route, capture: &Value) -> Hash {
    let bytes = serde_json::to_vec(&body(route, capture)).unwrap();
    parse(route, &bytes, &KEY).unwrap().shape.step_fingerprint
}

fn text(capture: &Value) -> String {
    match &capture["result"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn explain(a: &Value, b: &Value) -> String {
    format!(
        "\n--- {}\n+++ {}\n(normalised)\n--- {}\n+++ {}",
        text(a),
        text(b),
        normalise(&text(a)),
        normalise(&text(b))
    )
}

#[test]
fn the_corpus_has_every_client_and_both_kinds_of_case() {
    let corpus = corpus();
    let clients: BTreeSet<&str> = corpus["clients"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        clients,
        BTreeSet::from([
            "agents-sdk-chat",
            "agents-sdk-responses",
            "claude-code",
            "codex"
        ])
    );
    let cases = corpus["cases"].as_array().unwrap();
    assert!(cases.iter().any(|c| c["same"] == true) && cases.iter().any(|c| c["same"] == false));
    for (client, c) in corpus["clients"].as_object().unwrap() {
        assert!(
            c["version"].as_str().is_some_and(|v| v != "unavailable"),
            "{client}"
        );
        let sessions = c["sessions"].as_array().unwrap();
        assert!(sessions.len() >= 2, "{client}");
        for s in sessions {
            let n = corpus["repeats"].as_u64().unwrap() as usize;
            assert_eq!(s.as_array().unwrap().len(), cases.len() * n, "{client}");
        }
    }
}

/// Repeats of a noisy step (in one session and across sessions) read as one step, though
/// their bytes differ; the noise is real: without normalisation they would not.
#[test]
fn a_step_repeated_with_its_noise_keeps_its_step_fingerprint() {
    let corpus = corpus();
    let same: BTreeSet<&str> = corpus["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["same"] == true)
        .map(|c| c["case"].as_str().unwrap())
        .collect();
    for (client, c) in corpus["clients"].as_object().unwrap() {
        let route = route(c["route"].as_str().unwrap());
        let mut by_case: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
        for capture in c["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s.as_array().unwrap())
        {
            by_case
                .entry(capture["case"].as_str().unwrap())
                .or_default()
                .push(capture);
        }
        for case in &same {
            let captures = &by_case[case];
            let first = captures[0];
            let noisy = captures.iter().any(|c| c["result"] != first["result"]);
            assert!(
                noisy,
                "{client} {case}: every capture is byte-identical, so it tests nothing"
            );
            for other in &captures[1..] {
                assert_eq!(
                    step(route, first),
                    step(route, other),
                    "{client} {case}: noise changed the step{}",
                    explain(first, other)
                );
            }
        }
    }
}

/// A step that made progress (a count, a failing test, a listing, an exit code) is a new
/// step each time; the same state in another session is the same step again.
#[test]
fn a_step_that_made_progress_gets_a_new_step_fingerprint() {
    let corpus = corpus();
    let repeats = corpus["repeats"].as_u64().unwrap() as usize;
    let progress: BTreeSet<&str> = corpus["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["same"] == false)
        .map(|c| c["case"].as_str().unwrap())
        .collect();
    for (client, c) in corpus["clients"].as_object().unwrap() {
        let route = route(c["route"].as_str().unwrap());
        let sessions = c["sessions"].as_array().unwrap();
        for case in &progress {
            let of = |s: &Value| -> Vec<Value> {
                s.as_array()
                    .unwrap()
                    .iter()
                    .filter(|c| c["case"] == *case)
                    .cloned()
                    .collect()
            };
            let first = of(&sessions[0]);
            assert_eq!(first.len(), repeats);
            for pair in first.windows(2) {
                assert_ne!(
                    step(route, &pair[0]),
                    step(route, &pair[1]),
                    "{client} {case}: progress read as a repeat{}",
                    explain(&pair[0], &pair[1])
                );
            }
            for other in &sessions[1..] {
                for (a, b) in first.iter().zip(of(other).iter()) {
                    assert_eq!(
                        step(route, a),
                        step(route, b),
                        "{client} {case}: the same state in two sessions{}",
                        explain(a, b)
                    );
                }
            }
        }
    }
}

/// Different commands are different steps, and so are the states of a progressing one:
/// every (case, state) of a client has a step fingerprint of its own.
#[test]
fn different_steps_get_different_step_fingerprints() {
    let corpus = corpus();
    for (client, c) in corpus["clients"].as_object().unwrap() {
        let route = route(c["route"].as_str().unwrap());
        let mut seen: BTreeMap<Hash, (String, u64)> = BTreeMap::new();
        let session = c["sessions"][0].as_array().unwrap();
        for capture in session {
            let case = capture["case"].as_str().unwrap().to_string();
            let same = corpus["cases"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["case"] == case.as_str() && k["same"] == true);
            let state = if same {
                0
            } else {
                capture["repeat"].as_u64().unwrap()
            };
            let id = (case, state);
            if let Some(earlier) = seen.insert(step(route, capture), id.clone()) {
                assert_eq!(earlier, id, "{client}: two different steps read as one");
            }
        }
    }
}
