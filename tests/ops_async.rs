//! No blocking inside async handlers: while the store's writer is stalled on the disk (another
//! connection holds SQLite's write lock), routes that wait for a commit wait without holding a
//! worker thread, so `/spec`, the admin listener and the proxy keep answering.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

#[test]
fn a_stalled_store_write_does_not_stall_other_requests() {
    let h = Harness::default();
    // Warm up: the first requests open pools and load the card.
    assert_eq!(call(client::get(&h.api_url("/spec")), None).status, 200);

    // Stall the writer: hold SQLite's write lock from outside (as a slow or busy disk would);
    // its next commit waits up to its busy timeout (5 s).
    let locker = rusqlite::Connection::open(h.db_path()).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();

    // More commit-waiting requests than the API listener has worker threads (2).
    let waiting: Vec<_> = (0..6)
        .map(|_| {
            let url = h.api_url("/forget");
            std::thread::spawn(move || {
                let started = Instant::now();
                let r = call(
                    client::post(&url).set("authorization", &format!("Bearer {KEY_A}")),
                    Some(b""),
                );
                (r.status, started.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));

    // Meanwhile every listener answers at once.
    let timed = |f: &dyn Fn() -> Resp| {
        let started = Instant::now();
        let r = f();
        (r, started.elapsed())
    };
    let (spec, t_spec) = timed(&|| call(client::get(&h.api_url("/spec")), None));
    let (budget, t_budget) = timed(&|| {
        call(
            client::get(&h.api_url("/budget")).set("authorization", &format!("Bearer {KEY_B}")),
            None,
        )
    });
    let (health, t_health) = timed(&|| call(client::get(&h.admin_url("/healthz")), None));
    let (proxied, t_proxy) = timed(&|| {
        h.post(
            CHAT,
            KEY_B,
            &chat("gpt-4o-mini", "answer me while the disk is slow", json!({})),
            &[HUMAN],
        )
    });
    assert_eq!(spec.status, 200);
    assert_eq!(budget.status, 200);
    assert_eq!(health.status, 200);
    assert_eq!(proxied.status, 200, "{}", proxied.text());
    for (what, t) in [
        ("/spec", t_spec),
        ("/budget", t_budget),
        ("/healthz", t_health),
        ("proxy", t_proxy),
    ] {
        assert!(t < Duration::from_millis(1000), "{what} took {t:?}");
    }
    // The forgets are still waiting for their commit.
    assert!(waiting.iter().all(|t| !t.is_finished()));

    // The disk comes back: every waiting request gets its acknowledgement.
    std::thread::sleep(Duration::from_millis(1500));
    locker.execute_batch("ROLLBACK").unwrap();
    for w in waiting {
        let (status, took) = w.join().unwrap();
        assert_eq!(status, 200);
        assert!(
            took > Duration::from_millis(1500),
            "answered before its commit: {took:?}"
        );
    }
}
