//! `GET /ledger/decisions`: per-decision reconciliation lines (a key's own on the API listener,
//! every key's on the admin listener), paged by time, as JSON or CSV, never content; and
//! settlement through the real binary: a broken answer is charged its worst case, an answer
//! the provider refused costs nothing, a digest client's incomplete record likewise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::keyed_get as get;
use support::*;
use tokensaver::auth::fingerprint_key;
use tokensaver::request::{self, Digest, Route};

fn post_json(url: &str, key: &str, body: &Value) -> Resp {
    call(
        client::post(url)
            .set("content-type", "application/json")
            .set("authorization", &format!("Bearer {key}")),
        Some(body.to_string().as_bytes()),
    )
}

fn decisions(h: &Harness, query: &str) -> Value {
    let r = get(
        &h.api_url(&format!("/ledger/decisions{query}")),
        Some(KEY_A),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn receipt_decision_id(r: &Resp) -> String {
    let env =
        tokensaver::receipt::Envelope::from_header_value(r.header("x-tokensaver-receipt").unwrap())
            .unwrap();
    tokensaver::receipt::decision_id(&env.body_bytes().unwrap()).to_string()
}

#[test]
fn each_decision_is_listed_with_its_settlement_and_never_its_content() {
    let h = Harness::default();
    let secret_prompt = "the quarterly numbers are confidential";
    let ok = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o", secret_prompt, json!({})),
        &[HUMAN],
    );
    assert_eq!(ok.status, 200);
    let reset = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-fault-reset", "reset me", json!({"stream": true})),
        &[HUMAN],
    );
    assert!(reset.transport_error.is_some() || !reset.text().contains("[DONE]"));
    let refused = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-fault-500", "fail", json!({})),
        &[HUMAN],
    );
    assert_eq!(refused.status, 500);
    let other = h.post(
        CHAT,
        KEY_B,
        &chat("gpt-4o", "beta's own", json!({})),
        &[HUMAN],
    );
    assert_eq!(other.status, 200);
    settle();

    let page = decisions(&h, "");
    let lines = page["decisions"].as_array().unwrap();
    assert_eq!(lines.len(), 3, "{page}");
    assert!(page["next_after"].is_null());
    let by_id = |r: &Resp| {
        let id = receipt_decision_id(r);
        lines
            .iter()
            .find(|l| l["decision_id"] == id.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{id} not listed: {page}"))
    };
    let ok_line = by_id(&ok);
    assert_eq!(ok_line["status"], "complete");
    assert_eq!(ok_line["ending"], "complete");
    assert_eq!(ok_line["basis"], "reported");
    assert!(ok_line["input"].as_u64().unwrap() > 0);
    assert!(ok_line["spend_nano"].as_u64().unwrap() > 0);

    // The reset stream reported nothing: charged the decision's reserved worst case.
    let reset_line = by_id(&reset);
    assert_eq!(reset_line["status"], "incomplete", "{reset_line}");
    assert_eq!(reset_line["ending"], "reset");
    assert_eq!(reset_line["basis"], "worst_case");
    assert_eq!(reset_line["spend_nano"], reset_line["reserved_nano"]);
    assert!(reset_line["spend_nano"].as_u64().unwrap() > 0);

    let refused_line = by_id(&refused);
    assert_eq!(refused_line["status"], "not_billed");
    assert_eq!(refused_line["ending"], "provider_error");
    assert_eq!(refused_line["spend_nano"], 0);

    // The ledger's spend is the sum of the lines.
    let total: u64 = lines
        .iter()
        .map(|l| l["spend_nano"].as_u64().unwrap())
        .sum();
    assert_eq!(h.ledger(KEY_A)["total"]["spend_nano"], total);

    // Never content: neither the prompt nor the answer text.
    let text = page.to_string();
    assert!(!text.contains("quarterly") && !text.contains("confidential"));
    let csv = get(&h.api_url("/ledger/decisions?format=csv"), Some(KEY_A));
    assert_eq!(csv.status, 200);
    assert_eq!(csv.header("content-type"), Some("text/csv"));
    let csv = csv.text();
    assert!(!csv.contains("quarterly"));
    let mut rows = csv.lines();
    let header: Vec<&str> = rows.next().unwrap().split(',').collect();
    for col in [
        "decision_id",
        "input",
        "cache_write",
        "cache_write_1h",
        "cache_read",
        "output",
        "web_search_requests",
        "spend_nano",
        "spend_usd",
        "status",
        "ending",
        "basis",
    ] {
        assert!(header.contains(&col), "{col} missing from {header:?}");
    }
    assert_eq!(rows.count(), 3);

    // The admin listener lists every key's decisions, or one key's.
    let admin_url = h.admin_url("/ledger/decisions");
    assert_eq!(get(&admin_url, None).status, 401);
    assert_eq!(get(&admin_url, Some(KEY_A)).status, 401);
    let all = get(&admin_url, Some(ADMIN_KEY)).json();
    assert_eq!(all["decisions"].as_array().unwrap().len(), 4, "{all}");
    let beta = get(&format!("{admin_url}?key=beta"), Some(ADMIN_KEY)).json();
    let beta = beta["decisions"].as_array().unwrap();
    assert_eq!(beta.len(), 1);
    assert_eq!(beta[0]["key_id"], "beta");
    // A key never sees another key's lines.
    let r = get(&h.api_url("/ledger/decisions"), Some(KEY_B)).json();
    assert!(r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["key_id"] == "beta"));
}

#[test]
fn pages_follow_time_and_bad_queries_are_refused() {
    let h = Harness::default();
    ask_attended(&h, "question number", 5);
    settle();
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page = decisions(&h, &format!("?limit=2&after={after}"));
        for l in page["decisions"].as_array().unwrap() {
            seen.push((
                l["decided_at_ms"].as_u64().unwrap(),
                l["decision_id"].as_str().unwrap().to_string(),
            ));
        }
        match page["next_after"].as_str() {
            Some(next) => after = next.to_string(),
            None => break,
        }
    }
    assert_eq!(seen.len(), 5);
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    let first_ms = seen[0].0;
    let later = decisions(&h, &format!("?from={}", first_ms + 1));
    assert!(later["decisions"].as_array().unwrap().len() < 5 || seen[1].0 == first_ms);
    let today = tokensaver::store::utc_day(first_ms);
    assert_eq!(
        decisions(&h, &format!("?from={today}&to={today}"))["decisions"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert!(decisions(&h, "?to=1")["decisions"]
        .as_array()
        .unwrap()
        .is_empty());

    for (query, code) in [
        ("?limit=0", "invalid_limit"),
        ("?limit=1001", "invalid_limit"),
        ("?from=yesterday", "invalid_time"),
        ("?to=2026-02-30", "invalid_time"),
        ("?after=not-a-decision", "unknown_cursor"),
    ] {
        let r = get(
            &h.api_url(&format!("/ledger/decisions{query}")),
            Some(KEY_A),
        );
        assert_eq!(r.status, 400, "{query}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], code, "{query}");
    }
    // Another key's decision is no cursor for this one.
    let r = get(
        &h.api_url(&format!("/ledger/decisions?after={}", seen[0].1)),
        Some(KEY_B),
    );
    assert_eq!(r.status, 400);
    assert_eq!(get(&h.api_url("/ledger/decisions"), None).status, 401);
}

/// A decision's id begins with its decision time (milliseconds, 12 hex digits), so ids sort as
/// the decisions were made: the ledger's unique index on them grows at its end (docs/storage.md).
#[test]
fn decision_ids_begin_with_the_decision_time() {
    let h = Harness::default();
    let ids: Vec<_> = ask_attended(&h, "ordered question", 4)
        .iter()
        .map(receipt_decision_id)
        .collect();
    settle();
    let page = decisions(&h, "");
    let lines = page["decisions"].as_array().unwrap();
    assert_eq!(lines.len(), 4, "{page}");
    for l in lines {
        let id = l["decision_id"].as_str().unwrap();
        let at = l["decided_at_ms"].as_u64().unwrap();
        assert_eq!(u64::from_str_radix(&id[..12], 16).unwrap(), at, "{l}");
    }
    // In the order the requests were sent, each id sorts after the one before.
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

/// `n` distinct attended chat calls as key A (`"{prefix} {i}"`), each answered 200.
fn ask_attended(h: &Harness, prefix: &str, n: usize) -> Vec<Resp> {
    (0..n)
        .map(|i| {
            let r = h.post(
                CHAT,
                KEY_A,
                &chat("gpt-4o-mini", &format!("{prefix} {i}"), json!({})),
                &[HUMAN],
            );
            assert_eq!(r.status, 200);
            r
        })
        .collect()
}

fn digest(body: &Value) -> String {
    let parsed = request::parse(
        Route::OpenAiChat,
        body.to_string().as_bytes(),
        &fingerprint_key(SECRET_A),
    )
    .unwrap();
    let mut d = Digest::new(parsed.shape);
    d.human = Some(true);
    serde_json::to_string(&d).unwrap()
}

#[test]
fn a_digest_client_reports_how_its_answer_ended() {
    let h = Harness::default();
    let gate = |text: &str| {
        let body = chat("gpt-4o-mini", text, json!({"max_tokens": 100}));
        let r = call(
            client::post(&h.api_url("/gate")).set("authorization", &format!("Bearer {KEY_A}")),
            Some(digest(&body).as_bytes()),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let g = r.json();
        assert_eq!(g["verdict"], "ALLOW", "{g}");
        g["decision_id"].as_str().unwrap().to_string()
    };
    let record = |id: &str, extra: Value| {
        let mut rec = json!({"decision_id": id, "wire": "json", "served_model": "gpt-4o-mini"});
        for (k, v) in extra.as_object().unwrap() {
            rec[k] = v.clone();
        }
        post_json(&h.api_url("/record"), KEY_A, &rec)
    };

    // A stream that broke off after the provider's first figures: worst case, not the figures.
    let broken = gate("a stream that breaks");
    let r = record(
        &broken,
        json!({"complete": false, "ending": "error_event",
               "usage": {"input": 12, "cache_write": 0, "cache_read": 0, "output": 1}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let spend = r.json()["spend_nano"].as_u64().unwrap();
    // 12 input tokens at $2.50/M and the 100-token ceiling at $10/M bound it.
    assert_eq!(spend, 30_000 + 1_000_000);

    // A complete answer with its billed items.
    let done = gate("a complete answer");
    let r = record(
        &done,
        json!({"complete": true, "usage": {"input": 10, "cache_write": 4, "cache_read": 0, "output": 5},
               "cache_write_1h": 4, "web_search_requests": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // 10 × 2.5 + 4 one-hour writes at 2 × input (no 1-hour price configured) + 5 × 10;
    // the search is recorded but gpt-4o-mini has no web search price here.
    assert_eq!(r.json()["spend_nano"], 25_000 + 20_000 + 50_000);

    // Contradictions are refused.
    let odd = gate("a contradictory record");
    let r = record(&odd, json!({"complete": true, "ending": "reset"}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "inconsistent_ending");

    let lines = decisions(&h, "");
    let line = |id: &str| {
        lines["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["decision_id"] == id)
            .cloned()
            .unwrap()
    };
    let b = line(&broken);
    assert_eq!(
        (b["status"].as_str(), b["ending"].as_str()),
        (Some("incomplete"), Some("error_event"))
    );
    assert_eq!(b["input"], 12);
    let d = line(&done);
    assert_eq!(
        (
            d["cache_write_1h"].as_u64(),
            d["web_search_requests"].as_u64()
        ),
        (Some(4), Some(1))
    );
    assert_eq!(line(&odd)["status"], "open");
    // Nothing incomplete counts as not bought.
    assert_eq!(h.ledger(KEY_A)["total"]["tokens_not_bought"], 0);
}

#[test]
fn the_price_table_says_what_providers_bill_and_spec_lists_it() {
    let mut h = Harness::default();
    let prices = json!({"claude-sonnet-4-5": {
        "input": 3_000_000, "cache_write": 3_750_000, "cache_read": 300_000,
        "output": 15_000_000, "max_output": 64_000,
        "cache_write_1h": 6_000_000, "web_search_per_1k": 10_000_000}});
    let r = call(
        client::put(&h.admin_url("/prices"))
            .set("content-type", "application/json")
            .set("authorization", &format!("Bearer {ADMIN_KEY}")),
        Some(prices.to_string().as_bytes()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Survives a restart (schema 5 keeps the two new prices).
    h.restart();
    let listed = get(&h.api_url("/prices"), Some(KEY_A)).json();
    assert_eq!(
        listed["claude-sonnet-4-5"], prices["claude-sonnet-4-5"],
        "{listed}"
    );
    // A model without them shows neither.
    assert!(listed["gpt-4o"].get("cache_write_1h").is_none(), "{listed}");

    let spec = get(&h.api_url("/spec"), None).json();
    let pricing = &spec["pricing"];
    let sonnet = &pricing["models"]["claude-sonnet-4-5"];
    assert_eq!(sonnet["cache_write_1h"], 6_000_000);
    assert_eq!(sonnet["cache_write_1h_from"], "price table");
    assert_eq!(sonnet["web_search_per_1k_requests"], 10_000_000);
    let gpt = &pricing["models"]["gpt-4o"];
    assert_eq!(gpt["cache_write_1h"], 5_000_000, "twice the input price");
    assert!(gpt["web_search_per_1k_requests"].is_null());
    let unpriced: Vec<&str> = pricing["web_search_not_priced_for"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(unpriced.contains(&"gpt-4o") && !unpriced.contains(&"claude-sonnet-4-5"));
    for item in [
        "input",
        "cache_write_5m",
        "cache_write_1h",
        "cache_read",
        "output",
        "web_search_requests",
    ] {
        assert!(pricing["billed_items"][item].is_string(), "{item}");
    }
}
