//! The ledger page over HTTP, against the real `tokensaver serve`: signing in (cookie
//! attributes, which key signs in where), CSRF, deciding a hold with the owner secret, a key's
//! view holding no other key's data — and no page response ever carrying request content.
//! The browser test (`tests/page/`) drives the same page in headless Chromium.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::page::*;
use support::*;

/// Planted in every prompt of the session: no page response may contain it.
const MARKER: &str = "quokkamarker7f3a";

/// An agent's long session (as in `holds_release.rs`): unattended it scores into CHALLENGE.
fn agent_body(tag: &str) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": format!("You are a coding agent {tag} {MARKER}.")}),
    ];
    for i in 0..40 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(
            json!({"role": role, "content": format!("step {i} {MARKER}: {}", "x".repeat(700))}),
        );
    }
    let tools: Vec<Value> = (0..24)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
                "description": "does a thing", "parameters": {"type": "object", "properties": {}}}})
        })
        .collect();
    json!({"model": "gpt-4o", "messages": messages, "tools": tools})
}

fn harness() -> Harness {
    Harness::start(Opts {
        budget_a: Some(1_000_000),
        ..Opts::default()
    })
}

/// A session with every verdict the page lists: ALLOW, SERVE, a loop BLOCK, a CHALLENGE.
/// Returns the hold id and the full keyed fingerprint of the first request.
fn session(h: &Harness) -> (String, String) {
    let ask = chat(
        "gpt-4o",
        &format!("what is a cost gate? {MARKER}"),
        json!({"temperature": 0, "max_tokens": 100}),
    );
    let first = h.post(CHAT, KEY_A, &ask, &[]);
    assert_eq!(first.status, 200, "{}", first.text());
    let fingerprint = first.receipt()["fingerprint"].as_str().unwrap().to_string();
    assert_eq!(fingerprint.len(), 64);
    settle();
    for _ in 0..4 {
        h.post(CHAT, KEY_A, &ask, &[]);
    }
    let b = chat(
        "gpt-4o",
        &format!("beta's own {MARKER}"),
        json!({"max_tokens": 50}),
    );
    assert_eq!(h.post(CHAT, KEY_B, &b, &[HUMAN]).status, 200);
    let held = h.post(CHAT, KEY_A, &agent_body("page"), &[]);
    assert_eq!(held.status, 409, "{}", held.text());
    (
        held.header("x-tokensaver-hold").unwrap().to_string(),
        fingerprint,
    )
}

#[test]
fn signing_in_sets_a_strict_http_only_cookie_per_listener() {
    let h = harness();
    let (admin, api) = (format!("http://{}", h.admin), format!("http://{}", h.api));

    // Signed out: the form, and the live panel is refused.
    let r = get(&format!("{admin}/page/"), None);
    assert_eq!(r.status, 200);
    assert!(r.text().contains(r#"action="/page/login""#));
    assert_eq!(get(&format!("{admin}/page/panel"), None).status, 401);
    for (name, want) in [
        ("content-security-policy", "script-src 'self'"),
        ("x-frame-options", "DENY"),
        ("cache-control", "no-store"),
    ] {
        assert!(r.header(name).is_some_and(|v| v.contains(want)), "{name}");
    }

    let r = post_form(
        &format!("{admin}/page/login"),
        None,
        Some(&admin),
        &[("key", ADMIN_KEY)],
    );
    assert_eq!(r.status, 303);
    let set = r.header("set-cookie").unwrap();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/page", "Max-Age=28800"] {
        assert!(set.contains(part), "{set} lacks {part}");
    }
    assert!(
        !set.contains(ADMIN_KEY),
        "the cookie is a session token, not the key"
    );
    let admin_cookie = set.split(';').next().unwrap().to_string();
    let page = get(&format!("{admin}/page/"), Some(&admin_cookie));
    assert_eq!(page.status, 200);
    assert!(page.text().contains("admin · every key"));

    // Wrong keys; the admin key on the API listener; a cross-origin sign-in.
    for (base, key) in [
        (&admin, "tsk_alpha_wrong"),
        (&admin, "garbage"),
        (&api, ADMIN_KEY),
    ] {
        let r = post_form(
            &format!("{base}/page/login"),
            None,
            Some(base),
            &[("key", key)],
        );
        assert_eq!(r.status, 401, "{base} {key}");
        assert!(r.header("set-cookie").is_none());
    }
    let r = post_form(
        &format!("{admin}/page/login"),
        None,
        Some("http://evil.example"),
        &[("key", ADMIN_KEY)],
    );
    assert_eq!(r.status, 403);

    // A key signs in on the API listener; the admin session's token is worth nothing there.
    let key_cookie = sign_in(&api, KEY_A);
    assert!(key_cookie.starts_with("tokensaver_page_key="));
    assert!(get(&format!("{api}/page/"), Some(&key_cookie))
        .text()
        .contains("key <b>alpha</b>"));
    let token = admin_cookie.split_once('=').unwrap().1;
    let moved = format!("tokensaver_page_key={token}");
    assert_eq!(get(&format!("{api}/page/panel"), Some(&moved)).status, 401);

    // Signing out needs the CSRF token, then ends the session.
    let csrf = csrf_of(&page.text());
    let r = post_form(
        &format!("{admin}/page/logout"),
        Some(&admin_cookie),
        Some(&admin),
        &[],
    );
    assert_eq!(r.status, 403);
    let r = post_form(
        &format!("{admin}/page/logout"),
        Some(&admin_cookie),
        Some(&admin),
        &[("csrf", &csrf)],
    );
    assert_eq!(r.status, 303);
    assert!(r.header("set-cookie").unwrap().contains("Max-Age=0"));
    assert_eq!(
        get(&format!("{admin}/page/panel"), Some(&admin_cookie)).status,
        401
    );
}

#[test]
fn holds_are_decided_with_csrf_and_the_routes_rules_and_no_page_carries_content() {
    let h = harness();
    let (admin, api) = (format!("http://{}", h.admin), format!("http://{}", h.api));
    let (hold, fingerprint) = session(&h);
    let body = agent_body("page");

    // The key's own view, on the API listener: the hold, with an owner-secret field.
    let key_cookie = sign_in(&api, KEY_A);
    let page = get(&format!("{api}/page/"), Some(&key_cookie)).text();
    assert!(page.contains(&hold));
    assert!(page.contains(r#"name="owner_secret""#));
    let csrf = csrf_of(&page);
    let approve = format!("{api}/page/holds/{hold}/approve");

    // No CSRF token, another session's token, another origin: refused, the hold stays pending.
    let admin_cookie = sign_in(&admin, ADMIN_KEY);
    let admin_page = get(&format!("{admin}/page/"), Some(&admin_cookie)).text();
    let admin_csrf = csrf_of(&admin_page);
    for (form, from) in [
        (vec![("owner_secret", OWNER_SECRET_A)], origin(&api)),
        (
            vec![
                ("csrf", admin_csrf.as_str()),
                ("owner_secret", OWNER_SECRET_A),
            ],
            origin(&api),
        ),
        (
            vec![("csrf", csrf.as_str()), ("owner_secret", OWNER_SECRET_A)],
            "http://evil.example".into(),
        ),
        (
            vec![("csrf", csrf.as_str()), ("owner_secret", OWNER_SECRET_A)],
            origin(&admin),
        ),
    ] {
        let r = post_form(&approve, Some(&key_cookie), Some(&from), &form);
        assert_eq!(r.status, 403, "{form:?} from {from}");
    }
    // The key's session without the owner secret, or with a wrong one: not approved.
    for secret in ["", "not-the-owner"] {
        let r = post_form(
            &approve,
            Some(&key_cookie),
            Some(&api),
            &[("csrf", &csrf), ("owner_secret", secret)],
        );
        assert_eq!(r.header("location"), Some("/page/?done=owner_secret"));
    }
    assert_eq!(h.post(CHAT, KEY_A, &body, &[]).status, 409, "still held");

    // The owner approves from the key's page: the agent's plain retry passes once.
    let r = post_form(
        &approve,
        Some(&key_cookie),
        Some(&api),
        &[
            ("csrf", &csrf),
            ("owner_secret", OWNER_SECRET_A),
            ("attend_minutes", ""),
        ],
    );
    assert_eq!(
        r.header("location"),
        Some("/page/?done=approved"),
        "{}",
        r.text()
    );
    let retry = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(h.post(CHAT, KEY_A, &body, &[]).status, 409, "once only");

    // Key beta's session never sees alpha's data, not even its id.
    let beta_cookie = sign_in(&api, KEY_B);
    for path in [
        "/page/",
        "/page/panel",
        "/page/?range=30d",
        "/page/?verdict=CHALLENGE",
    ] {
        let text = get(&format!("{api}{path}"), Some(&beta_cookie)).text();
        assert!(text.contains("beta"), "{path}");
        assert!(!text.contains("alpha"), "{path} shows another key");
    }

    // Every page route, both listeners, every view and every receipt: no request content.
    let mut responses = Vec::new();
    for (base, cookie) in [
        (&admin, Some(admin_cookie.as_str())),
        (&api, Some(key_cookie.as_str())),
        (&api, Some(beta_cookie.as_str())),
        (&admin, None),
    ] {
        for path in [
            "/page",
            "/page/",
            "/page/panel",
            "/page/?range=1h",
            "/page/?range=24h",
            "/page/?range=30d",
            "/page/?verdict=SERVE",
            "/page/?verdict=BLOCK",
            "/page/?verdict=CHALLENGE",
            "/page/?done=approved",
            "/page/panel?range=1h&verdict=ALLOW",
            "/page/assets/page.css",
            "/page/assets/page.js",
            "/page/assets/icon.svg",
            "/page/receipt/unknown",
            "/page/nowhere",
        ] {
            let r = get(&format!("{base}{path}"), cookie);
            assert!(r.status < 500, "{base}{path}: {}", r.status);
            let text = r.text();
            let receipts: Vec<String> = text
                .match_indices("/page/receipt/")
                .map(|(i, _)| text[i..].split('"').next().unwrap().to_string())
                .collect();
            responses.push((format!("{base}{path}"), text));
            for receipt in receipts {
                let r = get(&format!("{base}{receipt}"), cookie);
                assert_eq!(r.status, 200, "{receipt}");
                assert!(r.text().contains("Signature valid"));
                responses.push((format!("{base}{receipt}"), r.text()));
            }
        }
    }
    assert!(
        responses
            .iter()
            .filter(|(u, _)| u.contains("/receipt/"))
            .count()
            >= 8
    );
    for (url, text) in &responses {
        assert!(!text.contains(MARKER), "{url} carries request content");
        // Fingerprints are cut to 12 hex digits; 13 never appear.
        assert!(
            !text.contains(&fingerprint[..13]),
            "{url} shows a whole fingerprint"
        );
    }
    assert!(responses
        .iter()
        .any(|(_, t)| t.contains(&fingerprint[..12])));
}
