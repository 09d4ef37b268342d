//! The ledger survives SIGKILL, budgets hold under concurrency, and the gate's memory
//! (windows, spend) comes back on restart.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

/// Total tokens the provider reported in an OpenAI JSON answer.
fn reported_tokens(resp: &Resp) -> u64 {
    let usage = &resp.json()["usage"];
    usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
}

fn ledger_tokens(h: &Harness, key: &str) -> u64 {
    let u = &h.ledger(key)["total"]["usage"];
    ["input", "cache_write", "cache_read", "output"]
        .iter()
        .map(|p| u[p].as_u64().unwrap())
        .sum()
}

#[test]
fn sigkill_loses_no_acknowledged_usage_and_memory_comes_back() {
    let mut h = Harness::start(Opts {
        budget_a: None,
        ..Opts::default()
    });

    // Phase 1: quiet traffic, then a SIGKILL well after the last commit interval (5 ms).
    let mut reported = 0;
    for i in 0..20 {
        let r = h.post(
            CHAT,
            KEY_A,
            &chat(
                "gpt-4o",
                &format!("durability prompt {i}"),
                json!({"max_tokens": 50}),
            ),
            &[HUMAN],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        reported += reported_tokens(&r);
    }
    // Three identical sampled requests: the 4th, unattended, must still be a loop after restart.
    let looped = chat(
        "gpt-4o",
        "looping agent",
        json!({"temperature": 1, "max_tokens": 30}),
    );
    for _ in 0..3 {
        let r = h.post(CHAT, KEY_A, &looped, &[]);
        assert_eq!(r.status, 200);
        reported += reported_tokens(&r);
    }
    std::thread::sleep(Duration::from_millis(300));
    let spend_before = h.ledger(KEY_A)["total"]["spend_nano"].as_u64().unwrap();
    h.restart(); // SIGKILL + start on the same data dir

    assert_eq!(
        ledger_tokens(&h, KEY_A),
        reported,
        "usage rows lost or invented across SIGKILL"
    );
    assert_eq!(
        h.ledger(KEY_A)["total"]["spend_nano"].as_u64().unwrap(),
        spend_before
    );
    let r = h.post(CHAT, KEY_A, &looped, &[]);
    assert_eq!(r.status, 429, "windows were not rebuilt: {}", r.text());
    assert_eq!(r.receipt()["rule"], "runaway_loop_unattended");

    // Phase 2: SIGKILL under load. Every answer a client received complete at least 500 ms
    // (100 commit intervals) before the kill must be in the ledger; nothing beyond what the
    // provider reported may be.
    let before = ledger_tokens(&h, KEY_A);
    let done: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let proxy = h.proxy_url(CHAT);
    let stop_at = Instant::now() + Duration::from_millis(1500);
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (done, proxy) = (done.clone(), proxy.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while Instant::now() < stop_at + Duration::from_secs(1) {
                    i += 1;
                    let body = chat(
                        "gpt-4o",
                        &format!("load w{w} i{i}"),
                        json!({"max_tokens": 40}),
                    );
                    let r = call(
                        client::post(&proxy)
                            .set("authorization", &format!("Bearer {KEY_A}"))
                            .set("x-tokensaver-human", "1"),
                        Some(body.to_string().as_bytes()),
                    );
                    if r.status == 200 && r.transport_error.is_none() {
                        done.lock()
                            .unwrap()
                            .push((Instant::now(), reported_tokens(&r)));
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(stop_at - Instant::now());
    let killed_at = Instant::now();
    h.restart();
    for w in workers {
        w.join().unwrap();
    }
    let done = done.lock().unwrap();
    let acknowledged: u64 = done
        .iter()
        .filter(|(t, _)| *t + Duration::from_millis(500) <= killed_at)
        .map(|(_, n)| n)
        .sum();
    let all_received: u64 = done.iter().map(|(_, n)| n).sum();
    let after = ledger_tokens(&h, KEY_A) - before;
    assert!(acknowledged > 0, "the load produced no answers");
    assert!(
        after >= acknowledged,
        "ledger lost committed usage: {after} < {acknowledged}"
    );
    // Answers completed after the restart also land; all of them came from the provider.
    let provider_total: u64 = h
        .mock
        .requests_to(CHAT)
        .iter()
        .filter_map(|r| tokensaver_mock_provider::expected_usage(&r.body).ok())
        .map(|u| u.total_tokens())
        .sum();
    assert!(
        after <= all_received.max(provider_total),
        "ledger holds usage no provider reported"
    );
}

#[test]
fn fifty_concurrent_requests_never_overshoot_a_small_ceiling() {
    // Each call's worst case: input ⌈chars/3⌉ at $2.50/M + 1000 output at $10/M ≈ $0.01.
    // A $0.05 ceiling admits at most 5 concurrent reservations. The provider takes 3 s to
    // answer, so every admitted call is still in flight (its reservation open) while the
    // others are decided; a settled call would free its reservation and let more in.
    let h = Harness::start(Opts {
        budget_a: Some(50_000),
        slow_ms: 3_000,
        ..Opts::default()
    });
    let barrier = Arc::new(Barrier::new(50));
    let proxy = h.proxy_url(CHAT);
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let (barrier, proxy) = (barrier.clone(), proxy.clone());
            std::thread::spawn(move || {
                let body = chat(
                    "gpt-fault-slow",
                    &format!("concurrent {i}"),
                    json!({"max_tokens": 1000}),
                );
                barrier.wait();
                let r = call(
                    client::post(&proxy)
                        .set("authorization", &format!("Bearer {KEY_A}"))
                        .set("x-tokensaver-human", "0"),
                    Some(body.to_string().as_bytes()),
                );
                (r.status, r.verdict().map(str::to_string))
            })
        })
        .collect();
    let results: Vec<(u16, Option<String>)> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    let forwarded = results
        .iter()
        .filter(|(_, v)| matches!(v.as_deref(), Some("ALLOW") | Some("DOWNGRADE")))
        .count();
    let refused = results.iter().filter(|(s, _)| *s == 402).count();
    assert!(forwarded >= 1, "nothing was admitted: {results:?}");
    assert!(
        forwarded <= 5,
        "{forwarded} calls admitted at once against a ceiling for 5 worst cases"
    );
    assert_eq!(forwarded + refused, 50, "{results:?}");
    settle();
    let ledger = h.ledger(KEY_A);
    let spend = ledger["total"]["spend_nano"].as_u64().unwrap();
    assert!(spend <= 50_000 * 1000, "spend {spend} overshot the ceiling");
    let budget: &Value = &ledger["budget"];
    assert_eq!(
        budget["reserved_nano"], 0,
        "reservations not settled: {budget}"
    );
}
