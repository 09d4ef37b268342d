//! Digest mode end to end: mock provider + central gate + a local client instance. The central
//! gate must receive no prompt or answer text, and decide as the request path does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::json;
use support::*;

/// A TCP relay in front of the central gate that keeps every byte the client sends it.
fn recording_relay(target: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let Ok(mut upstream) = TcpStream::connect(target) else {
                continue;
            };
            let (mut c2, mut u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            let log = log.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                while let Ok(n) = client.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    log.lock().unwrap().extend_from_slice(&buf[..n]);
                    if upstream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = upstream.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut u2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (addr, seen)
}

fn post_to(
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> Resp {
    let mut req = client::post(&format!("http://{addr}{path}"))
        .set("authorization", &format!("Bearer {key}"))
        .set("content-type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    call(req, Some(body.to_string().as_bytes()))
}

#[test]
fn the_central_gate_sees_no_text_and_decides_as_the_request_path() {
    let h = Harness::default();
    let (relay, seen) = recording_relay(h.api);
    let client = start_client(&h, relay, KEY_A);

    let marker = "zqxjmarkerprompt7731";
    let session = [
        (
            "plain",
            chat(
                "gpt-4o",
                &format!("{marker} plain question"),
                json!({"max_tokens": 1500}),
            ),
            vec![],
        ),
        (
            "reproducible",
            chat(
                "gpt-4o",
                &format!("{marker} reproducible"),
                json!({"temperature": 0, "max_tokens": 1500}),
            ),
            vec![],
        ),
        (
            "repeat",
            chat(
                "gpt-4o",
                &format!("{marker} reproducible"),
                json!({"temperature": 0, "max_tokens": 1500}),
            ),
            vec![],
        ),
        (
            "small",
            chat(
                "gpt-4o",
                &format!("{marker} tiny"),
                json!({"max_tokens": 20}),
            ),
            vec![HUMAN],
        ),
        (
            "loop 1",
            chat(
                "gpt-4o",
                &format!("{marker} loop"),
                json!({"temperature": 1, "max_tokens": 1500}),
            ),
            vec![],
        ),
        (
            "loop 2",
            chat(
                "gpt-4o",
                &format!("{marker} loop"),
                json!({"temperature": 1, "max_tokens": 1500}),
            ),
            vec![],
        ),
        (
            "loop 3",
            chat(
                "gpt-4o",
                &format!("{marker} loop"),
                json!({"temperature": 1, "max_tokens": 1500}),
            ),
            vec![],
        ),
        (
            "loop 4",
            chat(
                "gpt-4o",
                &format!("{marker} loop"),
                json!({"temperature": 1, "max_tokens": 1500}),
            ),
            vec![],
        ),
        (
            "stream",
            chat(
                "gpt-4o",
                &format!("{marker} stream"),
                json!({"temperature": 0, "max_tokens": 1500, "stream": true}),
            ),
            vec![],
        ),
        (
            "stream again",
            chat(
                "gpt-4o",
                &format!("{marker} stream"),
                json!({"temperature": 0, "max_tokens": 1500, "stream": true}),
            ),
            vec![],
        ),
    ];

    let mut digest_answers = Vec::new();
    for (name, body, headers) in &session {
        let r = post_to(client.1, CHAT, KEY_A, body, headers);
        assert!(
            r.transport_error.is_none(),
            "{name}: {:?}",
            r.transport_error
        );
        digest_answers.push((r.status, r.verdict().map(str::to_string), r.receipt()));
        settle();
    }
    let calls_after_digest = h.calls(CHAT);

    // The same session on the request path, with key B (its own windows and store).
    let mut request_answers = Vec::new();
    for (_, body, headers) in &session {
        let r = h.post(CHAT, KEY_B, body, headers);
        request_answers.push((r.status, r.verdict().map(str::to_string), r.receipt()));
        settle();
    }

    for (i, ((ds, dv, dr), (rs, rv, rr))) in digest_answers.iter().zip(&request_answers).enumerate()
    {
        let name = session[i].0;
        assert_eq!(
            (ds, dv),
            (rs, rv),
            "{name}: digest and request paths disagree"
        );
        for field in [
            "reason",
            "rule",
            "band",
            "findings",
            "model_served",
            "score",
            "signals",
            "worst_case",
        ] {
            assert_eq!(
                dr[field], rr[field],
                "{name}: receipt field {field} differs"
            );
        }
    }
    let verdicts: Vec<_> = digest_answers
        .iter()
        .map(|(_, v, _)| v.clone().unwrap_or_default())
        .collect();
    assert_eq!(verdicts[2], "SERVE", "{verdicts:?}");
    assert_eq!(verdicts[3], "DOWNGRADE", "{verdicts:?}");
    assert_eq!(verdicts[7], "BLOCK", "{verdicts:?}");
    assert_eq!(verdicts[9], "SERVE", "{verdicts:?}");
    // SERVE and BLOCK never reached the provider: 10 requests, 7 upstream calls.
    assert_eq!(calls_after_digest, 7);

    // Receipts of the digest path verify at the gate.
    let r = call(
        client::post(&h.api_url("/verify")),
        Some(
            serde_json::to_string(&digest_answers[0].2)
                .unwrap()
                .as_bytes(),
        ),
    );
    assert_eq!(r.status, 200);

    // Every byte the client sent the gate: no prompt, no answer text.
    let sent = seen.lock().unwrap().clone();
    let sent = String::from_utf8_lossy(&sent);
    assert!(sent.contains("POST /gate"), "the relay saw no gate traffic");
    assert!(
        sent.contains("POST /record"),
        "the relay saw no usage records"
    );
    assert!(
        !sent.contains(marker),
        "the central gate received prompt text"
    );
    for req in h.mock.requests_to(CHAT) {
        let reply = tokensaver_mock_provider::reply_for(&req.body).unwrap();
        assert!(
            !sent.contains(&reply.text),
            "the central gate received answer text"
        );
    }

    // The gate's ledger has the client's usage, recorded over /record.
    settle();
    let ledger = h.ledger(KEY_A);
    assert!(
        ledger["total"]["usage"]["output"].as_u64().unwrap() > 0,
        "{ledger}"
    );
    assert!(
        ledger["total"]["tokens_not_bought"].as_u64().unwrap() > 0,
        "{ledger}"
    );
}

/// Issue 20.4c in digest mode: the local client binds the response ids it relays and fills
/// the digest's `chained_input_tokens` from them, so the central gate's worst case for a call
/// chained with `previous_response_id` covers the context the provider reported; an id the
/// client never saw created is refused locally and reaches neither the gate nor the provider.
#[test]
fn a_digest_client_reports_the_chained_context() {
    let h = Harness::default();
    let (relay, seen) = recording_relay(h.api);
    let client = start_client(&h, relay, KEY_A);
    let body = |text: &str, extra: serde_json::Value| {
        let mut b = json!({"model": "gpt-4o", "input": text, "max_output_tokens": 60});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let long = "A quiet river carried the boats down to the sea. ".repeat(120);
    let first = post_to(
        client.1,
        "/v1/responses",
        KEY_A,
        &body(&long, json!({})),
        &[HUMAN],
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let id = first.json()["id"].as_str().unwrap().to_string();
    let usage = h.mock.stored_response(&id).unwrap()["usage"].clone();
    let context =
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap();
    assert!(context > 1000, "{context}");

    let chained = post_to(
        client.1,
        "/v1/responses",
        KEY_A,
        &body("And then?", json!({"previous_response_id": id})),
        &[HUMAN],
    );
    assert_eq!(chained.status, 200, "{}", chained.text());
    let worst = chained.receipt()["worst_case"]["input_tokens_estimated"]
        .as_u64()
        .unwrap();
    assert!(worst >= context, "{worst} < {context}");
    let sent = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(
        sent.contains(&format!("\"chained_input_tokens\":{context}")),
        "the digest carries the chained context"
    );

    // The chained call's usage goes to the gate after its answer: let it land first.
    settle();
    let gate_bytes = seen.lock().unwrap().len();
    let calls = h.calls("/v1/responses");
    let unknown = post_to(
        client.1,
        "/v1/responses",
        KEY_A,
        &body(
            "And then?",
            json!({"previous_response_id": "resp_0123456789abcdef01234567"}),
        ),
        &[HUMAN],
    );
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    assert_eq!(unknown.json()["error"]["code"], "unknown_response");
    assert_eq!(h.calls("/v1/responses"), calls);
    assert_eq!(
        seen.lock().unwrap().len(),
        gate_bytes,
        "nothing went to the gate"
    );
}

#[test]
fn a_repeated_step_is_paced_by_the_central_gate_as_in_request_mode() {
    // The central gate's step windows scaled down: pace in 2 s, stop a run 4 s old (the 5th
    // repeat).
    let h = Harness::start(Opts {
        extra_config: "\n[gate.steps]\npace_window_secs = 2\nmax_hold_secs = 4\n\
                            runaway_after_secs = 4\n"
            .into(),
        ..Opts::default()
    });
    let client = start_client(&h, h.api, KEY_A);
    let mut paced = Vec::new();
    for step in 1..=4 {
        let r = post_to(
            client.1,
            CHAT,
            KEY_A,
            &polling("Wait for job 7.", step, 100),
            &[],
        );
        assert_eq!(r.status, 200, "step {step}: {}", r.text());
        paced.push(r.receipt()["paced_ms"].as_u64().unwrap_or(0));
    }
    // The 4th identical step (unattended) waited for the window, as the proxy would have.
    assert_eq!(&paced[..3], &[0, 0, 0], "{paced:?}");
    assert!(paced[3] >= 1_500, "{paced:?}");
    let r = post_to(
        client.1,
        CHAT,
        KEY_A,
        &polling("Wait for job 7.", 5, 100),
        &[],
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.receipt()["rule"], "runaway_step");
    assert_eq!(h.calls(CHAT), 4, "the refused step reached no provider");
}

/// A raw body through the local instance's proxy, as a client sends it.
fn post_raw_to(addr: SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req =
        client::post(&format!("http://{addr}{path}")).set("content-type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    call(req, Some(body.as_bytes()))
}

#[test]
fn the_central_gate_places_lifetimes_and_routes_and_the_local_instance_writes_them() {
    use support::cache_bodies::*;
    // KEY_B takes one-hour entries at once, so the lifetime needs no pause here.
    let h = Harness::start(Opts {
        key_b_extra: "cache_ttl = \"1h\"\n".into(),
        ..Opts::default()
    });
    let (relay, seen) = recording_relay(h.api);
    let client = start_client(&h, relay, KEY_B);
    let upstream = || h.mock.last_request().unwrap().body.to_vec();

    // Anthropic: the caller's own markers get the one-hour lifetime, not a byte more.
    let sent = marked_anthropic(None);
    let r = post_raw_to(client.1, MESSAGES, &sent, &[("x-api-key", KEY_B), HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.receipt()["cache_lifetime"], "1h", "{}", r.receipt());
    let expected = sent.replace(
        r#"{"type":"ephemeral"}"#,
        r#"{"type":"ephemeral","ttl":"1h"}"#,
    );
    assert_eq!(String::from_utf8(upstream()).unwrap(), expected);

    // OpenAI: a routing key of the gate's making and 24-hour retention, added and nothing more.
    let sent = openai_chat(GPT5_MINI, "");
    let r = post_raw_to(
        client.1,
        CHAT,
        &sent,
        &[("authorization", &format!("Bearer {KEY_B}")), HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let added = added_members(&sent, &upstream());
    let key = added["prompt_cache_key"].as_str().unwrap();
    assert!(key.starts_with("ts_") && key.len() == 27, "{key}");
    assert_eq!(added["prompt_cache_retention"], "24h");
    assert_eq!(added.as_object().unwrap().len(), 2, "{added}");
    assert_eq!(r.receipt()["cache_routing_key"], key);

    // The central gate decided all of it from counts and hashes: no prompt text reached it.
    let central = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(
        !central.contains("keep the answer short"),
        "prompt text reached the gate"
    );
    assert!(
        !central.contains("List the files"),
        "prompt text reached the gate"
    );
}
