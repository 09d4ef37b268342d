//! The hostile caller: what an ordinary tokensaver key (or no key) can do to money and data
//! that is not its own, tried against the real binary and a local mock provider on 127.0.0.1.
//! It grows with every route: [`ROUTES`] lists each route of each listener, and the sweep at
//! the end gives every one of them no key, a foreign key, a huge number, a field written twice
//! and an `Expect: 100-continue` header.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use support::{keyed_get as get, keyed_send as send};
use tokensaver::auth::fingerprint_key;
use tokensaver::request::{self, Digest, Route};

fn digest_of(secret: &str, route: Route, body: &Value) -> String {
    let parsed =
        request::parse(route, body.to_string().as_bytes(), &fingerprint_key(secret)).unwrap();
    let mut d = Digest::new(parsed.shape);
    d.human = Some(true);
    serde_json::to_string(&d).unwrap()
}

fn budget(h: &Harness, key: &str) -> Value {
    let r = get(&h.api_url("/budget"), Some(key));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn decisions(h: &Harness, key: &str) -> Vec<Value> {
    let r = get(&h.api_url("/ledger/decisions"), Some(key));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["decisions"].as_array().unwrap().clone()
}

/// Issue "hostile" 1: a key could settle its own proxied call, in flight, at zero — and forge
/// the `tokens_not_bought` of its repeat. `/record` now settles only decisions made by
/// `POST /gate`.
#[test]
fn a_key_cannot_record_usage_for_a_call_the_proxy_forwarded() {
    let h = Harness::start(Opts {
        slow_ms: 1500,
        ..Opts::default()
    });
    let body = chat(
        "gpt-fault-slow",
        "Settle me at zero.",
        json!({"temperature": 0}),
    );
    let proxy = h.proxy_url(CHAT);
    let sent = body.clone();
    let call_in_flight = std::thread::spawn(move || {
        call(
            client::post(&proxy)
                .set("content-type", "application/json")
                .set("authorization", &format!("Bearer {KEY_A}")),
            Some(sent.to_string().as_bytes()),
        )
    });
    // The decision is committed before the provider answers: find it open.
    let mut open = None;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        open = decisions(&h, KEY_A)
            .into_iter()
            .find(|d| d["status"] == "open");
        if open.is_some() {
            break;
        }
    }
    let open = open.expect("the forwarded decision is listed open while in flight");
    let forged = json!({
        "decision_id": open["decision_id"],
        "wire": "json",
        "served_model": "gpt-fault-slow",
        "complete": true,
        "usage": {"input": 0, "cache_write": 0, "cache_read": 0, "output": 0},
    });
    let r = send(
        "POST",
        &h.api_url("/record"),
        Some(KEY_A),
        forged.to_string().as_bytes(),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(
        r.json()["error"]["code"],
        "unknown_decision",
        "{}",
        r.text()
    );
    let answered = call_in_flight.join().unwrap();
    assert_eq!(answered.status, 200, "{}", answered.text());
    settle();
    // The proxy recorded the provider's own figures: the row is complete and priced.
    let row = decisions(&h, KEY_A)
        .into_iter()
        .find(|d| d["decision_id"] == open["decision_id"])
        .unwrap();
    assert_eq!(row["status"], "complete", "{row}");
    assert!(row["spend_nano"].as_u64().unwrap() > 0, "{row}");
    assert!(row["input"].as_u64().unwrap() > 0, "{row}");
}

/// Issue "hostile" 2: a cache-read count near 2^64 / price wrapped the key's spend (its budget
/// reset) and `u64::MAX` parts put the totals near 9.2e18. A digest client's usage is bounded by
/// what its decision could have been billed.
#[test]
fn a_recorded_usage_is_bounded_by_its_decision_and_never_wraps_the_budget() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "A digest question.",
        json!({"max_tokens": 50}),
    );
    let record = |id: &str, usage: Value| {
        let rec = json!({
            "decision_id": id, "wire": "json", "served_model": "gpt-4o-mini",
            "complete": true, "usage": usage,
        });
        send(
            "POST",
            &h.api_url("/record"),
            Some(KEY_A),
            rec.to_string().as_bytes(),
        )
    };
    let gate = || {
        let d = digest_of(SECRET_A, Route::OpenAiChat, &body);
        let r = send("POST", &h.api_url("/gate"), Some(KEY_A), d.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["verdict"], "ALLOW", "{}", r.text());
        r.json()["decision_id"].as_str().unwrap().to_string()
    };
    let first = gate();
    let honest = record(
        &first,
        json!({"input": 12, "cache_write": 0, "cache_read": 0, "output": 9}),
    );
    assert_eq!(honest.status, 200, "{}", honest.text());
    let spend_before = budget(&h, KEY_A)["spend_nano"].as_u64().unwrap();
    assert!(spend_before > 0);

    let second = gate();
    for usage in [
        // The wrap of the issue: 2^64 / 1.25 µUSD-per-Mtok-in-nano, as cache reads.
        json!({"input": 0, "cache_write": 0, "cache_read": 14_757_395_258_967_641u64, "output": 0}),
        json!({"input": u64::MAX, "cache_write": u64::MAX, "cache_read": u64::MAX, "output": u64::MAX}),
        // More output than the decision's ceiling (max_tokens 50).
        json!({"input": 12, "cache_write": 0, "cache_read": 0, "output": 51}),
        // More input than every character of the request as a token, plus framing.
        json!({"input": 5_000, "cache_write": 0, "cache_read": 0, "output": 1}),
    ] {
        let r = record(&second, usage.clone());
        assert_eq!(r.status, 422, "{usage}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "usage_exceeds_decision");
    }
    // Nothing moved, and the decision can still be recorded honestly, once.
    assert_eq!(
        budget(&h, KEY_A)["spend_nano"].as_u64().unwrap(),
        spend_before
    );
    let r = record(
        &second,
        json!({"input": 12, "cache_write": 0, "cache_read": 0, "output": 50}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let total = &h.ledger(KEY_A)["total"];
    assert_eq!(total["usage"]["output"], 59, "{total}");
    assert!(budget(&h, KEY_A)["spend_nano"].as_u64().unwrap() > spend_before);
}

/// Issue "hostile" 4: 3,000 emoji reserved ~1,000 input tokens and were billed 9,030 each;
/// three concurrent calls on a small budget spent 8.1× its ceiling. Their worst case now
/// counts each byte beyond one per character, so the budget holds.
#[test]
fn dense_text_reserves_what_it_can_be_billed_and_the_budget_holds() {
    // 30,000 µUSD: one such call's worst case fits, two do not.
    let h = Harness::start(Opts {
        budget_a: Some(30_000),
        usage: UsageCounting::Cl100k,
        ..Opts::default()
    });
    let body = anthropic(
        "claude-sonnet-4-5",
        &"😀".repeat(3000),
        json!({"max_tokens": 1}),
    );
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let url = h.proxy_url(MESSAGES);
            // Three different requests (no loop rule between them).
            let mut b = body.clone();
            b["metadata"] = json!({"user_id": format!("u{i}")});
            b["system"] = json!(format!("call {i}"));
            std::thread::spawn(move || {
                call(
                    client::post(&url)
                        .set("content-type", "application/json")
                        .set("x-api-key", KEY_A),
                    Some(b.to_string().as_bytes()),
                )
            })
        })
        .collect();
    let statuses: Vec<u16> = threads
        .into_iter()
        .map(|t| t.join().unwrap().status)
        .collect();
    settle();
    let b = budget(&h, KEY_A);
    let (spend, ceiling) = (
        b["spend_nano"].as_u64().unwrap(),
        b["ceiling_nano"].as_u64().unwrap(),
    );
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(
        spend <= ceiling,
        "spend {spend} over ceiling {ceiling}: {statuses:?}"
    );
    // The provider billed more input than the old estimate (⌈chars ÷ 3⌉ = 1,000 tokens).
    let billed: u64 = decisions(&h, KEY_A)
        .iter()
        .filter_map(|d| d["input"].as_u64())
        .max()
        .unwrap();
    assert!(billed > 1_000, "billed {billed}");
}

/// Issue "hostile" 4: fifty high-detail images and one character reserved 1 input token.
#[test]
fn media_parts_count_in_the_worst_case() {
    let h = Harness::default();
    let image = json!({"type": "image_url", "image_url": {"url": "https://example.invalid/x.png", "detail": "high"}});
    let mut content = vec![json!({"type": "text", "text": "a"})];
    content.extend(std::iter::repeat_n(image, 50));
    let body = json!({"model": "gpt-4o", "max_tokens": 1,
        "messages": [{"role": "user", "content": content}]});
    let r = send(
        "POST",
        &h.api_url("/estimate"),
        Some(KEY_A),
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let input = r.json()["decision"]["worst_case"]["input_tokens_estimated"]
        .as_u64()
        .unwrap();
    assert_eq!(input, 1 + 50 * tokensaver::gate::rules::IMAGE_TOKENS_OPENAI);
}

/// Issue "hostile" 6: `{"model":"gpt-4o",…,"model":"gpt-4o-mini"}` was priced as one model
/// and reached the provider as both.
#[test]
fn a_field_written_twice_is_refused_before_the_provider() {
    let h = Harness::default();
    let body =
        br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"model":"gpt-4o-mini"}"#;
    let r = h.post_raw(CHAT, Some(KEY_A), body, &[]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "repeated_field", "{}", r.text());
    assert!(r.text().contains("`model`"), "{}", r.text());
    assert_eq!(h.calls(CHAT), 0);
}

/// Issue "hostile" 5 and 10: an unpriced model on a budgeted key, a person attending: the 409
/// is a CHALLENGE like any (hold id in body and header), and nobody can approve a spend with no
/// bound until the model has a price.
#[test]
fn an_unpriced_model_is_held_and_its_hold_cannot_be_approved_without_a_price() {
    let h = Harness::default();
    let body = chat("gpt-unpriced-x", "What would this cost?", json!({}));
    let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(r.status, 409, "{}", r.text());
    let hold = r.json()["error"]["hold_id"].as_str().unwrap().to_string();
    assert_eq!(r.header("x-tokensaver-hold"), Some(hold.as_str()));
    assert_eq!(r.json()["error"]["type"], "tokensaver_hold");
    assert_eq!(r.json()["error"]["code"], "unpriced_model");
    let a = h.approve(&hold);
    assert_eq!(a.status, 409, "{}", a.text());
    assert_eq!(a.json()["error"]["code"], "unpriced_model", "{}", a.text());
    // Nothing reached the provider, nothing was reserved.
    assert_eq!(h.calls(CHAT), 0);
    assert_eq!(budget(&h, KEY_A)["reserved_nano"], 0);
}

/// Issue "hostile" 5: on a key without a budget an unpriced model's call was recorded as
/// spend 0. Its spend is unknown: every total says so.
#[test]
fn unpriced_usage_is_shown_as_unpriced_not_as_free() {
    let h = Harness::start(Opts {
        budget_b: None,
        ..Opts::default()
    });
    let r = h.post(
        CHAT,
        KEY_B,
        &chat("gpt-unpriced-y", "Free, surely?", json!({})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    settle();
    let total = &h.ledger(KEY_B)["total"];
    assert_eq!(total["unpriced_calls"], 1, "{total}");
    assert_eq!(total["spend_nano"], 0, "{total}");
    assert!(total["usage"]["input"].as_u64().unwrap() > 0, "{total}");
    let row = &decisions(&h, KEY_B)[0];
    assert_eq!(row["basis"], "unpriced", "{row}");
}

/// Issue "hostile" 11: `/verify` called a split-profile pre-check document a valid receipt.
#[test]
fn verify_names_the_kind_of_document_it_checked() {
    let h = Harness::default();
    let r = h.post(CHAT, KEY_A, &chat("gpt-4o", "Receipt me.", json!({})), &[]);
    assert_eq!(r.status, 200);
    let v = send(
        "POST",
        &h.api_url("/verify"),
        None,
        r.envelope_json().as_bytes(),
    );
    assert_eq!(v.json()["valid"], true, "{}", v.text());
    assert_eq!(v.json()["kind"], "receipt", "{}", v.text());
    // A receipt's signature with another kind named fails: the domain is signed.
    let mut env: Value = serde_json::from_str(&r.envelope_json()).unwrap();
    env["kind"] = json!("split_profile_report");
    let v = send(
        "POST",
        &h.api_url("/verify"),
        None,
        env.to_string().as_bytes(),
    );
    assert_eq!(v.json()["valid"], false, "{}", v.text());
}

// ---- the sweep: every route, every listener ---------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum On {
    Api,
    Admin,
}

#[derive(Clone, Copy, PartialEq)]
enum Access {
    Public,
    /// A tokensaver key.
    Keyed,
    /// The admin key.
    Admin,
    /// The admin key gets the house check; anyone else the price terms (402): split-profile.
    HouseOrPaid,
}

/// Every route of the API and admin listeners (the proxy's are in the proxy tests).
const ROUTES: &[(On, &str, &str, Access)] = &[
    (On::Api, "GET", "/spec", Access::Public),
    (On::Api, "GET", "/stats", Access::Public),
    (On::Api, "POST", "/verify", Access::Public),
    (On::Api, "POST", "/estimate", Access::Keyed),
    (On::Api, "POST", "/gate", Access::Keyed),
    (On::Api, "POST", "/record", Access::Keyed),
    (On::Api, "GET", "/ledger", Access::Keyed),
    (On::Api, "GET", "/ledger/decisions", Access::Keyed),
    (On::Api, "GET", "/ledger/sessions", Access::Keyed),
    (On::Api, "GET", "/budget", Access::Keyed),
    (On::Api, "GET", "/prices", Access::Keyed),
    (On::Api, "POST", "/forget", Access::Keyed),
    (On::Admin, "PUT", "/budget/alpha", Access::Admin),
    (On::Admin, "PUT", "/prices", Access::Admin),
    // Scraped without a key: the admin listener (loopback by default) is its access control.
    (On::Admin, "GET", "/metrics", Access::Public),
    (On::Admin, "GET", "/economics", Access::Admin),
    (On::Admin, "GET", "/holds", Access::Admin),
    (
        On::Admin,
        "POST",
        "/split-profile/check",
        Access::HouseOrPaid,
    ),
];

fn url(h: &Harness, on: On, path: &str) -> String {
    match on {
        On::Api => h.api_url(path),
        On::Admin => h.admin_url(path),
    }
}

fn addr(h: &Harness, on: On) -> SocketAddr {
    match on {
        On::Api => h.api,
        On::Admin => h.admin,
    }
}

/// A word that must never come back: request content is never echoed.
const MARKER: &str = "zebra-marker-7f3a";

#[test]
fn every_route_refuses_the_wrong_key_and_survives_hostile_bodies() {
    let h = Harness::default();
    for &(on, method, path, access) in ROUTES {
        let u = url(&h, on, path);
        let name = format!("{method} {path}");
        // No key, a foreign key, a key of the wrong kind.
        let wrong: &[Option<&str>] = match access {
            Access::Public => &[],
            Access::Keyed => &[None, Some("tsk_alpha_wrongsecret"), Some(ADMIN_KEY)],
            Access::Admin | Access::HouseOrPaid => &[None, Some(KEY_A), Some("tsa_wrong")],
        };
        let refused = if access == Access::HouseOrPaid {
            402
        } else {
            401
        };
        for key in wrong {
            let r = send(method, &u, *key, b"{}");
            assert_eq!(r.status, refused, "{name} with {key:?}: {}", r.text());
        }
        let key = match access {
            Access::Public => None,
            Access::Keyed => Some(KEY_A),
            Access::Admin | Access::HouseOrPaid => Some(ADMIN_KEY),
        };
        // A huge number, a number past u64, and a field written twice: a closed-form answer
        // below 500 that never echoes what was sent.
        let bodies = [
            format!(
                r#"{{"n": 1e99999, "decision_id": "{MARKER}", "model": 18446744073709551616}}"#
            ),
            format!(r#"{{"usage": {{"input": 18446744073709551615}}, "x": "{MARKER}"}}"#),
            format!(
                r#"{{"model": "{MARKER}", "model": "{MARKER}-2", "ceiling_micro_usd": 1, "ceiling_micro_usd": 2}}"#
            ),
        ];
        for body in &bodies {
            if method == "GET" {
                break;
            }
            let r = send(method, &u, key, body.as_bytes());
            assert!(r.status < 500, "{name}: {} {}", r.status, r.text());
            assert!(!r.text().contains(MARKER), "{name} echoed: {}", r.text());
        }
        // `Expect: 100-continue`: at most one interim 100, then one final answer.
        let statuses = raw_exchange(addr(&h, on), method, path, key, b"{}");
        let finals: Vec<&u16> = statuses.iter().filter(|s| **s >= 200).collect();
        assert_eq!(finals.len(), 1, "{name}: {statuses:?}");
        assert!(
            statuses.iter().filter(|s| **s == 100).count() <= 1,
            "{name}: {statuses:?}"
        );
    }
    // The budget was never moved by any of it.
    assert_eq!(budget(&h, KEY_A)["spend_nano"], 0);
    assert_eq!(h.calls(CHAT) + h.calls(MESSAGES), 0);
}

/// One request with `Expect: 100-continue` over a raw socket; the status codes of every
/// response head that came back, interim ones included, in order.
fn raw_exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &[u8],
) -> Vec<u16> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = key
        .map(|k| format!("authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nexpect: 100-continue\r\n{auth}connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // A client waits a moment for the 100, then sends the body anyway (RFC 9110 §10.1.1).
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(body).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect()
}
