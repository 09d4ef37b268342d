//! Settling forwarded decisions (docs/usage-accounting.md): complete answers at their
//! reported usage and billed items, incomplete ones never below what may have been billed,
//! refusals at nothing; and the per-decision listing a finance team reconciles against.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;

use super::tests::{block_on, config, gate, open, shape_of, T0};
use super::*;
use crate::config::Prices;
use crate::gatekeeper::*;
use crate::store::{DecisionLine, DecisionQuery};
use crate::store::{Ending, SpendBasis};
use tokensaver_core::gate::Billed;

fn prices() -> Prices {
    config().prices["gpt-4o"]
}

fn billed(input: u64, cache_write: u64, cache_read: u64, output: u64) -> Billed {
    Billed::from(Usage {
        input,
        cache_write,
        cache_read,
        output,
    })
}

#[test]
fn settlement_rules() {
    let p = prices();
    let reported = billed(1_000, 0, 0, 100);
    let priced = reported.cost_nano(&p);
    // Complete: exactly what was reported.
    assert_eq!(
        settlement(
            Ending::Complete,
            Some(&reported),
            Some(&p),
            9_999_999,
            Some(50)
        ),
        (priced, SpendBasis::Reported)
    );
    // Failed with the provider's final figures: those figures.
    assert_eq!(
        settlement(
            Ending::Failed,
            Some(&reported),
            Some(&p),
            9_999_999,
            Some(50)
        ),
        (priced, SpendBasis::Reported)
    );
    // Refused or never sent: nothing (or what the provider reported, if it did).
    assert_eq!(
        settlement(Ending::ProviderError, None, Some(&p), 9_999_999, Some(50)),
        (0, SpendBasis::None)
    );
    assert_eq!(
        settlement(Ending::NotSent, None, Some(&p), 9_999_999, Some(50)),
        (0, SpendBasis::None)
    );
    // Incomplete without usage: the reservation.
    for e in [
        Ending::ErrorEvent,
        Ending::Truncated,
        Ending::NoUsage,
        Ending::Reset,
        Ending::Timeout,
        Ending::ClientGone,
        Ending::Unanswered,
        Ending::ClientReported,
        Ending::Failed,
    ] {
        assert_eq!(
            settlement(e, None, Some(&p), 522_500, Some(50)),
            (522_500, SpendBasis::WorstCase),
            "{e:?}"
        );
    }
    // Incomplete with partial figures: the larger of the reservation and those figures with
    // output at the ceiling (a large cache write can exceed an input estimate).
    let partial = billed(10, 100_000, 0, 1);
    let bound = billed(10, 100_000, 0, 50).cost_nano(&p);
    assert!(bound > 522_500);
    assert_eq!(
        settlement(
            Ending::ErrorEvent,
            Some(&partial),
            Some(&p),
            522_500,
            Some(50)
        ),
        (bound, SpendBasis::WorstCase)
    );
    assert_eq!(
        settlement(
            Ending::Reset,
            Some(&billed(1, 0, 0, 1)),
            Some(&p),
            522_500,
            Some(50)
        ),
        (522_500, SpendBasis::WorstCase)
    );
}

#[test]
fn billed_items_are_priced_apart() {
    let p = Prices {
        input: 3_000_000,
        cache_write: 3_750_000,
        cache_read: 300_000,
        output: 15_000_000,
        max_output: 64_000,
        cache_write_1h: Some(6_000_000),
        web_search_per_1k: Some(10_000_000),
    };
    let mut b = billed(13, 3_913, 100, 4);
    b.cache_write_1h = 3_000;
    b.web_search_requests = 2;
    // 13×3 + 913×3.75 + 3000×6 + 100×0.3 + 4×15 (micro-USD per token ÷ 1000 → nano) + 2 × $0.01.
    let expected = 39_000 + 3_423_750 + 18_000_000 + 30_000 + 60_000 + 20_000_000;
    assert_eq!(b.cost_nano(&p), expected);
    // Without a 1-hour price: twice the input price. Without a search price: not priced.
    let bare = Prices {
        cache_write_1h: None,
        web_search_per_1k: None,
        ..p
    };
    assert_eq!(b.cost_nano(&bare), expected - 20_000_000);
}

fn forward(gk: &Gatekeeper, tag: &str, at: u64) -> GateOutcome {
    let body = json!({"model": "gpt-4o", "max_tokens": 50, "temperature": 0,
        "messages": [{"role": "user", "content": format!("summarise the report {tag}")}]});
    let o = gate(gk, &shape_of(&body), at);
    assert!(o.decision.verdict.forwards(), "{:?}", o.decision.verdict);
    o
}

fn report(o: &GateOutcome, usage: Option<Billed>, ending: Ending) -> UsageReport {
    UsageReport {
        key_id: "alpha".into(),
        decision_id: o.decision_id,
        usage,
        served_model: "gpt-4o".into(),
        wire: WireForm::Json,
        ending,
    }
}

#[test]
fn an_incomplete_answer_is_charged_its_worst_case_and_never_counts_as_bought() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let o = forward(&gk, "a", T0);
    let reserved = o.decision.worst_case.cost_nano.unwrap();
    assert!(reserved > 0);
    let row = block_on(gk.local().record_usage(
        &gk.core,
        &report(&o, None, Ending::ErrorEvent),
        T0 + 5,
        RecordSource::Proxy,
    ))
    .unwrap();
    assert_eq!(row.spend_nano, reserved);
    assert_eq!(row.basis, SpendBasis::WorstCase);
    assert_eq!(row.ending, Some(Ending::ErrorEvent));
    assert!(!row.complete);
    assert_eq!(gk.local().budget_view("alpha", T0 + 6).spend_nano, reserved);
    assert_eq!(gk.local().budget_view("alpha", T0 + 6).reserved_nano, 0);

    // The identical request again: nothing recorded, so nothing can be served.
    let again = forward(&gk, "a", T0 + 10);
    assert_eq!(again.decision.verdict, Verdict::Allow);
    assert!(again.decision.tokens_not_bought.is_none());
    let (_, total) = block_on(gk.ledger_report(Some("alpha"), None, None)).unwrap();
    assert_eq!(total.tokens_not_bought, 0);
    assert_eq!(total.spend_nano, reserved);
}

#[test]
fn a_refused_or_unsent_call_is_not_billed_and_a_complete_one_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let refused = forward(&gk, "r", T0);
    let row = block_on(gk.local().record_usage(
        &gk.core,
        &report(&refused, None, Ending::ProviderError),
        T0 + 1,
        RecordSource::Proxy,
    ))
    .unwrap();
    assert_eq!((row.spend_nano, row.basis), (0, SpendBasis::None));

    let done = forward(&gk, "d", T0 + 2);
    let mut b = billed(40, 0, 10, 30);
    b.web_search_requests = 1;
    let row = block_on(gk.local().record_usage(
        &gk.core,
        &report(&done, Some(b), Ending::Complete),
        T0 + 3,
        RecordSource::Proxy,
    ))
    .unwrap();
    // gpt-4o has no web search price in this config: the search is recorded, not priced.
    assert_eq!(row.spend_nano, b.cost_nano(&prices()));
    assert_eq!(row.web_search_requests, 1);
    assert_eq!(row.basis, SpendBasis::Reported);
    // A "complete" report without usage is an answer that reported none.
    let silent = forward(&gk, "s", T0 + 4);
    let row = block_on(gk.local().record_usage(
        &gk.core,
        &report(&silent, None, Ending::Complete),
        T0 + 5,
        RecordSource::Proxy,
    ))
    .unwrap();
    assert_eq!(row.ending, Some(Ending::NoUsage));
    assert_eq!(
        row.spend_nano,
        silent.decision.worst_case.cost_nano.unwrap()
    );
}

#[test]
fn the_decisions_listing_pages_by_time_and_names_each_settlement() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let complete = forward(&gk, "1", T0);
    let broken = forward(&gk, "2", T0 + 1_000);
    let refused = forward(&gk, "3", T0 + 2_000);
    let open_call = forward(&gk, "4", T0 + 3_000);
    let mut b = billed(40, 20, 10, 30);
    b.cache_write_1h = 5;
    block_on(gk.local().record_usage(
        &gk.core,
        &report(&complete, Some(b), Ending::Complete),
        T0 + 10,
        RecordSource::Proxy,
    ))
    .unwrap();
    block_on(gk.local().record_usage(
        &gk.core,
        &report(&broken, Some(billed(40, 0, 0, 1)), Ending::Reset),
        T0 + 1_010,
        RecordSource::Proxy,
    ))
    .unwrap();
    block_on(gk.local().record_usage(
        &gk.core,
        &report(&refused, None, Ending::ProviderError),
        T0 + 2_010,
        RecordSource::Proxy,
    ))
    .unwrap();

    let query = |after: Option<DecisionId>, limit| DecisionQuery {
        key_id: Some("alpha".into()),
        from_ms: Some(T0),
        to_ms: None,
        after,
        limit,
        session: None,
    };
    let first = block_on(gk.decision_page(&query(None, 2))).unwrap();
    assert_eq!(first.decisions.len(), 2);
    assert_eq!(first.next_after, Some(broken.decision_id));
    let rest = block_on(gk.decision_page(&query(first.next_after, 2))).unwrap();
    assert_eq!(rest.next_after, None);
    let all: Vec<&DecisionLine> = first.decisions.iter().chain(&rest.decisions).collect();
    let ids: Vec<DecisionId> = all.iter().map(|d| d.decision_id).collect();
    assert_eq!(
        ids,
        [
            complete.decision_id,
            broken.decision_id,
            refused.decision_id,
            open_call.decision_id
        ]
    );
    let statuses: Vec<&str> = all.iter().map(|d| d.status).collect();
    assert_eq!(statuses, ["complete", "incomplete", "not_billed", "open"]);
    assert_eq!(
        (
            all[0].input,
            all[0].cache_write,
            all[0].cache_write_1h,
            all[0].cache_read,
            all[0].output
        ),
        (40, 20, 5, 10, 30)
    );
    assert_eq!(all[0].spend_nano, b.cost_nano(&prices()));
    assert_eq!(all[1].basis, Some(SpendBasis::WorstCase));
    assert_eq!(all[1].ending, Some(Ending::Reset));
    // The reported 40 input tokens with output at the 50-token ceiling exceed the reserved
    // estimate: the larger figure is charged.
    let bound = billed(40, 0, 0, 50).cost_nano(&prices());
    assert!(bound > broken.decision.worst_case.cost_nano.unwrap());
    assert_eq!(all[1].spend_nano, bound);
    assert_eq!(
        (all[2].spend_nano, all[2].basis),
        (0, Some(SpendBasis::None))
    );
    assert_eq!(all[3].settled_at_ms, None);

    // Time bounds; another key sees nothing, and may not page with this key's cursor.
    let late = block_on(gk.decision_page(&DecisionQuery {
        from_ms: Some(T0 + 1_500),
        ..query(None, 10)
    }))
    .unwrap();
    assert_eq!(late.decisions.len(), 2);
    let other = DecisionQuery {
        key_id: Some("beta".into()),
        ..query(None, 10)
    };
    assert!(block_on(gk.decision_page(&other))
        .unwrap()
        .decisions
        .is_empty());
    assert!(matches!(
        block_on(gk.decision_page(&DecisionQuery {
            after: Some(complete.decision_id),
            ..other
        })),
        Err(StoreError::UnknownCursor)
    ));

    // An unsettled reservation past its TTL is listed as expired, charged its reservation.
    gk.local()
        .tick(T0 + 3_000 + gk.core.config.reservation_ttl_ms + 1_000);
    let last = block_on(gk.decision_page(&DecisionQuery {
        from_ms: Some(T0 + 3_000),
        ..query(None, 10)
    }))
    .unwrap();
    assert_eq!(last.decisions[0].status, "expired");
    assert_eq!(
        last.decisions[0].spend_nano,
        open_call.decision.worst_case.cost_nano.unwrap()
    );

    let csv = crate::report::decisions_csv(&first);
    let mut lines = csv.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("decision_id,key_id,decided_at_ms,decided_at,"));
    assert_eq!(lines.count(), 2);
}

#[test]
fn a_renewed_reservation_outlives_its_ttl_and_an_abandoned_one_expires() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let ttl = gk.core.config.reservation_ttl_ms;
    let relayed = forward(&gk, "relayed", T0);
    let abandoned = forward(&gk, "abandoned", T0);
    // The relayed one is renewed within each TTL; the abandoned one once, early.
    gk.local()
        .renew_reservation(&gk.core, &abandoned.decision_id, T0 + 1_000);
    gk.local()
        .renew_reservation(&gk.core, &relayed.decision_id, T0 + ttl - 1_000);
    gk.local().tick(T0 + ttl + 1_000);
    gk.local()
        .renew_reservation(&gk.core, &relayed.decision_id, T0 + 2 * ttl - 1_000);
    gk.local().tick(T0 + 2 * ttl + 1_000);

    let usage = billed(100, 0, 0, 10);
    let row = block_on(gk.local().record_usage(
        &gk.core,
        &report(&relayed, Some(usage), Ending::Complete),
        T0 + 2 * ttl + 2_000,
        RecordSource::Proxy,
    ))
    .unwrap();
    assert_eq!(row.spend_nano, usage.cost_nano(&prices()));
    // Expired a TTL after its one renewal, at its worst case: its usage finds no reservation.
    assert!(matches!(
        block_on(gk.local().record_usage(
            &gk.core,
            &report(&abandoned, Some(usage), Ending::Complete),
            T0 + 2 * ttl + 2_000,
            RecordSource::Proxy,
        )),
        Err(RecordError::UnknownDecision)
    ));
}
