//! Stored Responses objects against a hostile key (issue 20.7, 20.4c): each response id is
//! bound to the key whose call created it, every pass-through route that names an id refuses
//! any other key and any unknown id with one closed-form 404, the binding survives a SIGKILL
//! and restart, and a call chained with `previous_response_id` reserves the context the
//! provider bills again. Real binary, real mock provider, real sockets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::*;

const RESPONSES: &str = "/v1/responses";
const NEVER_SEEN: &str = "resp_0123456789abcdef01234567";

fn responses_body(input: &str, extra: Value) -> Value {
    let mut body = json!({"model": "gpt-4o", "input": input, "max_output_tokens": 60});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The data of each SSE event of a stream, parsed.
fn events(r: &Resp) -> Vec<Value> {
    r.text()
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .collect()
}

/// The stored object's id in a Responses answer: the JSON body's, or the stream's
/// `response.created` event's.
fn answer_id(r: &Resp) -> String {
    let id = match serde_json::from_slice::<Value>(&r.body) {
        Ok(v) => v["id"].clone(),
        Err(_) => events(r)
            .into_iter()
            .find(|v| v["type"] == "response.created")
            .map(|v| v["response"]["id"].clone())
            .unwrap_or_else(|| panic!("no response.created in {}", r.text())),
    };
    id.as_str().unwrap().to_string()
}

fn create(h: &Harness, key: &str, input: &str, extra: Value) -> String {
    let r = h.post(RESPONSES, key, &responses_body(input, extra), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    answer_id(&r)
}

fn stored_call(h: &Harness, method: &str, path: &str, key: &str) -> Resp {
    let req =
        client::request(method, &h.proxy_url(path)).set("authorization", &format!("Bearer {key}"));
    if method == "POST" {
        call(req.set("content-type", "application/json"), Some(b"{}"))
    } else {
        call(req, None)
    }
}

/// The four pass-through routes that name a stored response.
fn routes(id: &str) -> [(&'static str, String); 4] {
    [
        ("GET", format!("/v1/responses/{id}")),
        ("GET", format!("/v1/responses/{id}/input_items")),
        ("POST", format!("/v1/responses/{id}/cancel")),
        ("DELETE", format!("/v1/responses/{id}")),
    ]
}

/// The one refusal: 404 `unknown_response`, nothing of the caller's request in it.
fn refusal(r: &Resp, what: &str) -> String {
    assert_eq!(r.status, 404, "{what}: {}", r.text());
    assert_eq!(r.json()["error"]["code"], "unknown_response", "{what}");
    assert!(!r.text().contains("resp_"), "{what}: the id is echoed");
    r.text()
}

/// Issue 20.7: bob cannot read, list, cancel or delete alice's stored response (created as
/// JSON, streamed, or in the background), nor any id the gate never saw created; the mock
/// provider receives none of those requests; the refusal is the same for a foreign and an
/// unknown id; alice's own calls pass; and the bindings survive a SIGKILL and restart.
#[test]
fn a_stored_response_answers_only_the_key_that_created_it() {
    let mut h = Harness::default();
    let ids = [
        create(&h, KEY_A, "Alice's secret plan, kept.", json!({})),
        create(&h, KEY_A, "Alice's streamed plan.", json!({"stream": true})),
        create(
            &h,
            KEY_A,
            "Alice's background plan.",
            json!({"background": true}),
        ),
    ];
    for id in &ids {
        assert!(h.mock.stored_response(id).is_some(), "the mock keeps {id}");
    }
    let mut bodies = Vec::new();
    for round in 0..2 {
        for id in &ids {
            for (method, path) in routes(id) {
                let upstream_before = h.mock.call_counts();
                let what = format!("round {round}: beta {method} {path}");
                bodies.push(refusal(&stored_call(&h, method, &path, KEY_B), &what));
                assert_eq!(
                    h.mock.call_counts(),
                    upstream_before,
                    "{what} went upstream"
                );
            }
            // Alice's own reads pass (her DELETE waits for the end).
            for (method, path) in routes(id).into_iter().take(3) {
                let upstream_before = h.mock.calls(&path);
                let r = stored_call(&h, method, &path, KEY_A);
                assert_eq!(
                    r.status,
                    200,
                    "round {round}: alpha {method} {path}: {}",
                    r.text()
                );
                assert_eq!(h.mock.calls(&path), upstream_before + 1);
            }
            let read = stored_call(&h, "GET", &format!("/v1/responses/{id}"), KEY_A);
            assert_eq!(read.json()["id"], id.as_str(), "alice reads her own object");
        }
        for key in [KEY_A, KEY_B] {
            for (method, path) in routes(NEVER_SEEN) {
                let what = format!("round {round}: never seen, {method} {path}");
                bodies.push(refusal(&stored_call(&h, method, &path, key), &what));
                assert_eq!(h.mock.calls(&path), 0, "{what} went upstream");
            }
        }
        // Right after the answers, no settling: the binding was committed before the id
        // reached alice, so a SIGKILL (Harness::restart) cannot lose it.
        h.restart();
    }
    // One refusal, whatever the id and whoever asks: nothing tells them apart.
    bodies.dedup();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    for id in &ids {
        let r = stored_call(&h, "DELETE", &format!("/v1/responses/{id}"), KEY_A);
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(h.mock.stored_response(id).is_none(), "alice deleted {id}");
    }
    // A malformed id is refused the same way, and goes nowhere.
    let before = h.mock.call_counts();
    refusal(
        &stored_call(&h, "GET", "/v1/responses/resp%20x", KEY_A),
        "malformed id",
    );
    assert_eq!(h.mock.call_counts(), before);
}

/// The context the mock provider itself reports for a stored response: the input plus
/// output tokens of its kept object's `usage` (the mock's record, not the gate's).
fn mock_context(h: &Harness, id: &str) -> (u64, u64) {
    let kept = h.mock.stored_response(id).unwrap();
    let u = kept.get("response").unwrap_or(&kept)["usage"].clone();
    (
        u["input_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    )
}

fn estimate(r: &Resp) -> u64 {
    r.receipt()["worst_case"]["input_tokens_estimated"]
        .as_u64()
        .unwrap()
}

/// Issue 20.4c: a call continuing a stored response with `previous_response_id` reserves the
/// context the provider bills again (the earlier response's input plus output tokens, as the
/// mock reported them), streamed or not, across a restart; another key may not continue it,
/// nor may anyone continue an unknown id, and nothing goes upstream for either.
#[test]
fn a_chained_call_reserves_the_context_it_continues() {
    let mut h = Harness::default();
    let long = "The lighthouse keeper counted every wave that night. ".repeat(150);
    let control = h.post(
        RESPONSES,
        KEY_A,
        &responses_body("And then?", json!({})),
        &[HUMAN],
    );
    assert_eq!(control.status, 200, "{}", control.text());
    let unchained = estimate(&control);

    for stream in [false, true] {
        let id = create(&h, KEY_A, &long, json!({"stream": stream}));
        let (input, output) = mock_context(&h, &id);
        assert!(input > 1000, "the first call is long: {input}");
        for round in 0..2 {
            let what = format!("stream {stream}, round {round}");
            let chained = h.post(
                RESPONSES,
                KEY_A,
                &responses_body("And then?", json!({"previous_response_id": id})),
                &[HUMAN],
            );
            assert_eq!(chained.status, 200, "{what}: {}", chained.text());
            let worst = estimate(&chained);
            assert!(
                worst >= input,
                "{what}: {worst} < the earlier call's input {input}"
            );
            assert_eq!(worst, unchained + input + output, "{what}");
            // Another key may not continue it: refused before it reaches the provider.
            let before = h.calls(RESPONSES);
            let foreign = h.post(
                RESPONSES,
                KEY_B,
                &responses_body("And then?", json!({"previous_response_id": id})),
                &[HUMAN],
            );
            refusal(&foreign, &format!("{what}: beta continues alice's"));
            assert_eq!(h.calls(RESPONSES), before, "{what}");
            h.restart();
        }
    }

    // An id nobody created here is refused the same way.
    let before = h.calls(RESPONSES);
    let unknown = h.post(
        RESPONSES,
        KEY_A,
        &responses_body("And then?", json!({"previous_response_id": NEVER_SEEN})),
        &[HUMAN],
    );
    refusal(&unknown, "unknown previous id");
    assert_eq!(h.calls(RESPONSES), before);

    // A stream cut short never reported its usage: its continuation has no bound and is
    // refused before anything is sent.
    let cut = h.post(
        RESPONSES,
        KEY_A,
        &json!({"model": "gpt-fault-truncated", "input": "Cut me short.", "stream": true,
                "max_output_tokens": 60}),
        &[HUMAN],
    );
    let cut_id = answer_id(&cut);
    let before_cut = h.calls(RESPONSES);
    let after_cut = h.post(
        RESPONSES,
        KEY_A,
        &responses_body("And then?", json!({"previous_response_id": cut_id})),
        &[HUMAN],
    );
    assert_eq!(after_cut.status, 409, "{}", after_cut.text());
    assert_eq!(after_cut.json()["error"]["code"], "chained_context_unknown");
    assert_eq!(h.calls(RESPONSES), before_cut);
}
