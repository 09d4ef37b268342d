//! The API and admin listeners: access, methods, bodies, digest mode, isolation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::*;
use support::{keyed_get as get, keyed_send as send};
use tokensaver::auth::fingerprint_key;
use tokensaver::request::{self, Digest, Route};

fn digest_for(secret: &str, body: &Value, held: bool) -> String {
    let parsed = request::parse(
        Route::OpenAiChat,
        body.to_string().as_bytes(),
        &fingerprint_key(secret),
    )
    .unwrap();
    let mut d = Digest::new(parsed.shape);
    d.human = Some(true);
    if held {
        d.held = vec![tokensaver::request::WireForm::Json];
    }
    serde_json::to_string(&d).unwrap()
}

#[test]
fn keyed_routes_refuse_missing_and_invalid_keys() {
    let h = Harness::default();
    let routes: &[(&str, &str)] = &[
        ("POST", "/estimate"),
        ("POST", "/gate"),
        ("POST", "/record"),
        ("GET", "/ledger"),
        ("GET", "/budget"),
        ("GET", "/prices"),
        ("POST", "/forget"),
    ];
    for (m, p) in routes {
        for key in [
            None,
            Some("tsk_alpha_wrong"),
            Some("tsk_ghost_abc"),
            Some(ADMIN_KEY),
            Some("garbage"),
        ] {
            let r = send(m, &h.api_url(p), key, b"{}");
            assert_eq!(r.status, 401, "{m} {p} with {key:?}: {}", r.text());
        }
        let r = send(m, &h.api_url(p), Some(KEY_A), b"{}");
        assert_ne!(r.status, 401, "{m} {p} with a valid key");
    }
}

#[test]
fn wrong_methods_are_405_and_public_routes_are_public() {
    let h = Harness::default();
    for (m, p) in [
        ("POST", "/spec"),
        ("POST", "/stats"),
        ("GET", "/verify"),
        ("GET", "/estimate"),
        ("GET", "/gate"),
        ("GET", "/record"),
        ("POST", "/ledger"),
        ("DELETE", "/budget"),
        ("PUT", "/prices"),
        ("GET", "/forget"),
    ] {
        let r = send(m, &h.api_url(p), Some(KEY_A), b"{}");
        assert_eq!(r.status, 405, "{m} {p}: {}", r.text());
    }
    let r = send("POST", &h.admin_url("/metrics"), Some(ADMIN_KEY), b"");
    assert_eq!(r.status, 405);
    let r = send("GET", &h.admin_url("/prices"), Some(ADMIN_KEY), b"");
    assert_eq!(r.status, 405);

    let stats = get(&h.api_url("/stats"), None);
    assert_eq!(stats.status, 200, "{}", stats.text());
    assert!(stats.json()["fleet"].is_object());
    assert!(
        !stats.text().contains("alpha"),
        "stats must carry no per-key data"
    );

    let spec = get(&h.api_url("/spec"), None);
    assert_eq!(spec.status, 200);
    let text = spec.text();
    let card = spec.json();
    let keys = card["receipt_keys"].as_array().expect("receipt_keys");
    assert!(!keys.is_empty());
    assert!(keys[0]["kid"].is_string(), "{}", keys[0]);
    for w in [
        "exposure",
        "size",
        "ask",
        "depth",
        "tools",
        "loop",
        "burst",
        "grind",
        "novelty",
        "unattended",
    ] {
        assert!(text.contains(&format!("\"{w}\"")), "spec lacks weight {w}");
    }
    assert!(
        text.contains("0.18") && text.contains("0.16"),
        "spec lacks the weight values"
    );
    // The step normalisation, listed from the rules the gate applies.
    let norm = &card["identity"]["step_normalisation"];
    assert_eq!(norm["version"], request::normalise::NORMALISATION_VERSION);
    let kinds: Vec<&str> = norm["replaced_by_their_kind"]
        .as_array()
        .expect("replaced_by_their_kind")
        .iter()
        .map(|r| r["kind"].as_str().expect("kind"))
        .collect();
    for kind in [
        "<time>",
        "<duration>",
        "<uuid>",
        "<hex>",
        "<id>",
        "<pid>",
        "<tmp>",
        "<envelope>",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    assert!(norm["kept"]
        .as_str()
        .is_some_and(|k| k.contains("exit codes")));
}

#[test]
fn malformed_json_is_400() {
    let h = Harness::default();
    for p in ["/gate", "/record", "/estimate"] {
        for body in [&b"{not json"[..], b"", b"[1,2]", b"{\"v\": 1}"] {
            let r = send("POST", &h.api_url(p), Some(KEY_A), body);
            assert_eq!(
                r.status,
                400,
                "{p} {:?}: {}",
                String::from_utf8_lossy(body),
                r.text()
            );
        }
    }
    let r = send("POST", &h.api_url("/verify"), None, b"{not json");
    assert!(
        r.status == 400 || (r.status == 200 && r.json()["valid"] == false),
        "{}",
        r.text()
    );
    for (m, p) in [("PUT", "/prices"), ("PUT", "/budget/alpha")] {
        let r = send(m, &h.admin_url(p), Some(ADMIN_KEY), b"{nope");
        assert_eq!(r.status, 400, "{m} {p}: {}", r.text());
    }
    let r = get(&h.api_url("/ledger?from=yesterday"), Some(KEY_A));
    assert_eq!(r.status, 400);
}

#[test]
fn estimate_moves_no_window() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "Estimate me, repeatedly.",
        json!({"temperature": 1}),
    );
    for _ in 0..10 {
        let r = send(
            "POST",
            &h.api_url("/estimate"),
            Some(KEY_A),
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["estimate"], true);
        assert!(r.json()["decision"]["verdict"].is_string());
    }
    let r = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(
        r.status,
        200,
        "estimate must not count as a loop: {}",
        r.text()
    );
    assert_eq!(r.verdict(), Some("ALLOW"));
    assert_eq!(h.calls(CHAT), 1);
    let l = h.ledger(KEY_A);
    assert_eq!(l["total"]["requests"], 1, "{l}");
}

#[test]
fn digest_gate_record_flow_and_isolation() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "Digest mode question.",
        json!({"temperature": 0}),
    );
    let d = digest_for(SECRET_A, &body, false);
    let r = send("POST", &h.api_url("/gate"), Some(KEY_A), d.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let g = r.json();
    assert_eq!(g["verdict"], "ALLOW", "{g}");
    let decision_id = g["decision_id"].as_str().unwrap().to_string();
    let v = send(
        "POST",
        &h.api_url("/verify"),
        None,
        g["receipt"].to_string().as_bytes(),
    );
    assert_eq!(v.json()["valid"], true, "{}", v.text());

    let rec = json!({
        "decision_id": decision_id,
        "wire": "json",
        "served_model": "gpt-4o-mini",
        "complete": true,
        "usage": {"input": 20, "cache_write": 0, "cache_read": 0, "output": 7},
    });
    // Key B cannot record A's decision.
    let r = send(
        "POST",
        &h.api_url("/record"),
        Some(KEY_B),
        rec.to_string().as_bytes(),
    );
    assert!(r.status == 404 || r.status == 403, "{}", r.text());
    let r = send(
        "POST",
        &h.api_url("/record"),
        Some(KEY_A),
        rec.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        "POST",
        &h.api_url("/record"),
        Some(KEY_A),
        rec.to_string().as_bytes(),
    );
    assert_eq!(r.status, 409, "{}", r.text());

    // With the answer held locally, the repeat is SERVE, worth the recorded usage.
    let d = digest_for(SECRET_A, &body, true);
    let r = send("POST", &h.api_url("/gate"), Some(KEY_A), d.as_bytes());
    let g = r.json();
    assert_eq!(g["verdict"], "SERVE", "{g}");
    assert_eq!(g["decision"]["tokens_not_bought"]["output"], 7, "{g}");

    let l = h.ledger(KEY_A);
    assert_eq!(l["total"]["usage"]["output"], 7, "{l}");
    assert_eq!(l["total"]["tokens_not_bought"], 27, "{l}");
    // B sees none of it.
    let lb = h.ledger(KEY_B);
    assert_eq!(lb["key_id"], "beta");
    assert_eq!(lb["total"]["requests"], 0, "{lb}");
    assert_eq!(lb["total"]["usage"]["output"], 0, "{lb}");
}

#[test]
fn key_b_is_never_served_key_a_answer() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "Shared prompt between keys.",
        json!({"temperature": 0}),
    );
    let a1 = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(a1.verdict(), Some("ALLOW"));
    settle();
    let a2 = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(a2.verdict(), Some("SERVE"));
    let b1 = h.post(CHAT, KEY_B, &body, &[HUMAN]);
    assert_eq!(b1.status, 200);
    assert_eq!(
        b1.verdict(),
        Some("ALLOW"),
        "B must not be served A's answer"
    );
    assert_eq!(h.calls(CHAT), 2);
    // B's forget does not touch A's store.
    let r = send("POST", &h.api_url("/forget"), Some(KEY_B), b"");
    assert_eq!(r.status, 200);
    let a3 = h.post(CHAT, KEY_A, &body, &[HUMAN]);
    assert_eq!(a3.verdict(), Some("SERVE"));
    let la = h.ledger(KEY_A);
    assert_eq!(la["total"]["requests"], 3, "{la}");
    assert_eq!(h.ledger(KEY_B)["total"]["requests"], 1);
}

#[test]
fn forget_stops_serve_but_not_the_loop_rules() {
    let h = Harness::default();
    let body = chat("gpt-4o-mini", "Forget me later.", json!({"temperature": 0}));
    let r = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(r.verdict(), Some("ALLOW"), "{}", r.text());
    settle();
    let r = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(r.verdict(), Some("SERVE"));
    let r = send("POST", &h.api_url("/forget"), Some(KEY_A), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(r.status, 200);
    assert_ne!(r.verdict(), Some("SERVE"), "forgotten answer served");
    assert_eq!(h.calls(CHAT), 2);
    // Fourth identical request, no human: the loop rule still counts the forgotten ones.
    let r = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.receipt()["rule"], "runaway_loop_unattended");
    assert_eq!(h.calls(CHAT), 2);
}

#[test]
fn admin_routes_need_admin_key_on_admin_listener() {
    let h = Harness::default();
    let budget = br#"{"ceiling_micro_usd": 1, "period": "day"}"#;
    // Not on the API listener.
    for key in [ADMIN_KEY, KEY_A] {
        let r = send("PUT", &h.api_url("/budget/alpha"), Some(key), budget);
        assert!(r.status == 404 || r.status == 405, "{}", r.text());
        let r = send("PUT", &h.api_url("/prices"), Some(key), b"{}");
        assert!(r.status == 404 || r.status == 405, "{}", r.text());
    }
    // Not without the admin key.
    for key in [None, Some(KEY_A), Some("tsa_wrong")] {
        let r = send("PUT", &h.admin_url("/budget/alpha"), key, budget);
        assert_eq!(r.status, 401, "{}", r.text());
        let r = send("PUT", &h.admin_url("/prices"), key, b"{}");
        assert_eq!(r.status, 401, "{}", r.text());
    }
    let r = send(
        "PUT",
        &h.admin_url("/budget/ghost"),
        Some(ADMIN_KEY),
        budget,
    );
    assert_eq!(r.status, 404);
    let before = get(&h.api_url("/budget"), Some(KEY_A)).json();

    let r = send(
        "PUT",
        &h.admin_url("/budget/alpha"),
        Some(ADMIN_KEY),
        budget,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let after = get(&h.api_url("/budget"), Some(KEY_A)).json();
    assert_ne!(before, after);
    // One micro-dollar: every call is over budget now.
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o-mini", "hi", json!({"max_tokens": 10})),
        &[],
    );
    assert_eq!(r.status, 402, "{}", r.text());
    assert_eq!(h.calls(CHAT), 0);
    // B untouched.
    let r = h.post(
        CHAT,
        KEY_B,
        &chat("gpt-4o-mini", "hi", json!({"max_tokens": 10})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());

    let prices = json!({"gpt-4o-mini": {"input": 1, "cache_write": 1, "cache_read": 1, "output": 1, "max_output": 100}});
    let r = send(
        "PUT",
        &h.admin_url("/prices"),
        Some(ADMIN_KEY),
        prices.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let p = get(&h.api_url("/prices"), Some(KEY_B)).json();
    assert_eq!(p["gpt-4o-mini"]["max_output"], 100, "{p}");
}

#[test]
fn metrics_count_requests_without_content() {
    let h = Harness::default();
    let marker = "SECRETMARKER42xyz";
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o-mini", marker, json!({})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200);
    let r = h.post_raw(
        CHAT,
        Some(KEY_A),
        format!("{{\"{marker}\":").as_bytes(),
        &[],
    );
    assert_eq!(r.status, 400);
    let m = get(&h.admin_url("/metrics"), Some(ADMIN_KEY));
    assert_eq!(m.status, 200);
    let text = m.text();
    assert!(text.contains("tokensaver_requests_total"), "{text}");
    assert!(!text.contains(marker));
    assert!(!text.contains(SECRET_A));
    // Not on the API listener.
    assert_eq!(get(&h.api_url("/metrics"), Some(ADMIN_KEY)).status, 404);
}

#[test]
fn ledger_and_admin_budget_survive_restart() {
    let mut h = Harness::default();
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o-mini", "persist me", json!({"max_tokens": 10})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        "PUT",
        &h.admin_url("/budget/beta"),
        Some(ADMIN_KEY),
        br#"{"ceiling_micro_usd": 1, "period": "day"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    settle();
    let before = h.ledger(KEY_A)["total"].clone();
    h.restart();
    let after = h.ledger(KEY_A)["total"].clone();
    assert_eq!(before, after);
    assert_eq!(after["requests"], 1);
    // The store wins over the config after a PUT.
    let r = h.post(
        CHAT,
        KEY_B,
        &chat("gpt-4o-mini", "hi", json!({"max_tokens": 10})),
        &[],
    );
    assert_eq!(r.status, 402, "{}", r.text());
}

/// `GET /` on the API and admin listeners sends a person to the page; other methods are 405.
#[test]
fn the_root_redirects_to_the_page_on_both_listeners() {
    let h = Harness::default();
    for url in [h.api_url("/"), h.admin_url("/")] {
        let r = call(client::get(&url).no_redirects(), None);
        assert_eq!(r.status, 303, "{url}: {}", r.text());
        assert_eq!(r.header("location"), Some("/page/"), "{url}");
        let followed = get(&url, None);
        assert_eq!(followed.status, 200, "{url} followed: {}", followed.text());
        assert!(
            followed.text().contains("<html"),
            "{url}: {}",
            followed.text()
        );
        assert_eq!(send("POST", &url, None, b"{}").status, 405, "{url}");
    }
}
