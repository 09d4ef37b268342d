//! What the soak (`scripts/soak.sh`) found, each kept as a regression test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::json;
use support::*;

/// An agent hammering one request gets BLOCKed with every signal saturated; two such BLOCKs
/// decided in the same millisecond have byte-identical receipts, hence the same decision id,
/// and the ledger's `decisions.decision_id UNIQUE` rejects the second: the BLOCK (and its
/// `worst_case_tokens_avoided`) is missing from the ledger, and the next flush reports the lost
/// event, so an unrelated `GET /ledger` or `/stats` answers 503 (and `/readyz` says the store
/// is not writable). In the soak: 7 errors in 30 000 requests.
#[test]
fn every_decision_of_a_hammering_agent_is_in_the_ledger() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o-mini",
        "the same thing again",
        json!({"temperature": 0.7}),
    );
    let sent = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..150 {
                    let r = h.post(CHAT, KEY_B, &body, &[("x-tokensaver-human", "0")]);
                    assert!(r.status == 200 || r.status == 429, "{}", r.text());
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let ledger = call(
        client::get(&h.api_url("/ledger")).set("authorization", &format!("Bearer {KEY_B}")),
        None,
    );
    assert_eq!(ledger.status, 200, "{}", ledger.text());
    let db = rusqlite::Connection::open(h.db_path()).unwrap();
    let rows: usize = db
        .query_row("SELECT count(*) FROM decisions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, sent.into_inner(), "decisions missing from the ledger");
}
