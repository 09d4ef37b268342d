//! The page's templates against a view with every region filled: numbers, notices, and
//! every value escaped on every page.

use super::*;

/// A view with every region filled: keys with and without a ceiling (one over it, one
/// with unpriced calls), every decision shape, holds pending and approved, a lease, a
/// session and the economics verdict. `text` goes into every string the view carries.
fn full_view(text: &str) -> View {
    use super::super::model::KeyLine;
    use crate::gatekeeper::{BudgetView, LeaseView};
    use crate::report::SessionSummary;
    use crate::store::{DecisionListing, DecisionRow, RecordSource, VerdictCount};
    use tokensaver_core::request::{Hash, WireForm};
    let now = 1_795_991_949_000;
    let totals = |n: u64, unpriced: u64, saving: i64| LedgerTotals {
        requests: n,
        by_verdict: [("ALLOW".to_string(), n - 1), ("BLOCK".to_string(), 1)].into(),
        spend_nano: 1_234_567_891_000 * n,
        tokens_not_bought: 1_000 * n,
        worst_case_tokens_avoided: 20_000 * n,
        findings_tokens_estimated: 300 * n,
        unpriced_calls: unpriced,
        cache_saving_nano: saving,
        ..LedgerTotals::default()
    };
    let key =
        |id: String, ceiling: Option<u64>, spend: u64, left: Option<i128>, unpriced| KeyLine {
            key_id: id.clone(),
            budget: BudgetView {
                key_id: id,
                ceiling_nano: ceiling,
                period: "day",
                spend_nano: spend,
                reserved_nano: 25_000_000,
                left_nano: left,
            },
            today: totals(3, 0, 0),
            total: totals(7, unpriced, -5_000),
            has_owner: true,
        };
    let row =
        |verdict: Verdict, served: Option<String>, fp: Option<Hash>, score: f64| DecisionRow {
            decision_id: DecisionId([7; 32]),
            key_id: format!("alpha{text}"),
            fingerprint: fp,
            verdict,
            reason: format!("runaway_loop{text}"),
            score,
            model_requested: format!("gpt-4o{text}"),
            model_served: served,
            wire: WireForm::Json,
            decided_at_ms: now - 5_000,
            reserved_nano: 0,
            worst_case_tokens: Some(100),
            tokens_not_bought: 1_500,
            worst_case_tokens_avoided: 2_500,
            findings_tokens: 40,
            hold_id: None,
            step_fingerprint: None,
            recorded_by: RecordSource::default(),
            session: None,
            paced_ms: 0,
            cache_edits: Default::default(),
        };
    let decisions = vec![
        DecisionLine {
            listing: DecisionListing {
                row: row(Verdict::Block, None, Some(Hash([0xab; 32])), 0.875),
                spend_nano: None,
            },
            finding_codes: Some(vec![format!("old_turns{text}"), "unused_tools".into()]),
        },
        DecisionLine {
            listing: DecisionListing {
                row: row(
                    Verdict::Allow,
                    Some(format!("gpt-4o-mini{text}")),
                    None,
                    f64::NAN,
                ),
                spend_nano: Some(12_345),
            },
            finding_codes: Some(vec![]),
        },
        DecisionLine {
            listing: DecisionListing {
                row: row(Verdict::Downgrade, Some(format!("gpt-4o{text}")), None, 0.1),
                spend_nano: None,
            },
            finding_codes: None,
        },
    ];
    let hold = |id: String, state: HoldState| HoldView {
        hold_id: id,
        key_id: format!("alpha{text}"),
        state,
        reason: Some("score_challenge"),
        created_ms: now - 60_000,
        expires_ms: now + 600_000,
        worst_case_tokens: 12_345,
        fingerprint_prefix: "abababababababab".into(),
    };
    View {
        scope: Scope::Admin,
        now_ms: now,
        today: utc_day(now),
        range: Range::Hour,
        keys: vec![
            key(
                format!("alpha{text}"),
                Some(1_000_000_000),
                500_000_000,
                Some(475_000_000),
                0,
            ),
            key(
                format!("beta{text}"),
                Some(1_000_000_000),
                2_000_000_000,
                Some(-1),
                2,
            ),
            key(format!("gamma{text}"), None, 10, None, 0),
        ],
        fleet: Some(totals(21, 2, 9_000)),
        verdict_counts: vec![
            VerdictCount {
                bucket_start_ms: Range::Hour.first_ms(now),
                verdict: Verdict::Allow,
                reason: format!("allow{text}"),
                count: 3,
            },
            VerdictCount {
                bucket_start_ms: Range::Hour.first_ms(now) + 120_000,
                verdict: Verdict::Block,
                reason: format!("runaway_loop{text}"),
                count: 2,
            },
        ],
        verdict_filter: Some(Verdict::Block),
        decisions,
        holds: vec![
            hold("h_1234".into(), HoldState::Pending),
            hold(format!("h_5678{text}"), HoldState::Pending),
            hold("h_9".into(), HoldState::Approved),
        ],
        leases: vec![LeaseView {
            key_id: format!("alpha{text}"),
            hold_id: format!("h_9{text}"),
            granted_ms: now - 1_000,
            until_ms: now + 900_000,
        }],
        economics: Some(EconomicsBrief {
            statement: format!("In a simulation{text}, the median …"),
            publishable: false,
            simulation: true,
            metric: Some(format!("token_reduction{text}")),
            status: Some(format!("preliminary{text}")),
            value: Some(0.31),
            interval: Some((0.2, 0.4, 9_500)),
        }),
        sessions: vec![SessionSummary {
            session: Hash([0xcd; 32]),
            key_id: format!("alpha{text}"),
            first_ms: now - 3_600_000,
            last_ms: now - 1_000,
            calls: 12,
            spend_nano: 99_000,
            by_verdict: [("ALLOW", 10), ("BLOCK", 2)].into(),
            steps_repeated: 3,
            paced_ms: 4_500,
            last_progress_ms: now - 60_000,
            decisions_since_progress: 4,
            ended_by: Some(format!("runaway_loop{text}")),
            cache: Default::default(),
        }],
    }
}

fn receipt_body(text: &str) -> Value {
    serde_json::json!({
        "verdict": "BLOCK",
        "reason": format!("runaway_loop{text}"),
        "score": 0.875,
        "signals": {"repeat": 0.5, format!("s{text}"): format!("v{text}")},
        "decided_at_ms": 1_795_991_949_000u64,
        "fingerprint": format!("abcdefabcdef0123{text}"),
        "key_id": format!("alpha{text}"),
        "findings": [format!("old_turns{text}")],
        "hold_id": null,
        format!("extra{text}"): true,
    })
}

/// Every page the module renders, from `full_view(text)`.
fn every_page(text: &str) -> Vec<(&'static str, Markup)> {
    let view = full_view(text);
    let key_view = View {
        scope: Scope::Key(format!("alpha{text}")),
        fleet: None,
        economics: None,
        verdict_filter: None,
        range: Range::Month,
        holds: vec![],
        leases: vec![],
        decisions: vec![],
        sessions: vec![],
        verdict_counts: vec![],
        ..full_view(text)
    };
    let id = DecisionId([7; 32]);
    let csrf = format!("c0ffee{text}");
    let body = receipt_body(text);
    vec![
        (
            "dashboard",
            dashboard(Listener::Admin, &view, &csrf, notice(Some("approved"))),
        ),
        (
            "dashboard_error",
            dashboard(Listener::Admin, &view, &csrf, notice(Some("expired"))),
        ),
        (
            "key_dashboard",
            dashboard(Listener::Api, &key_view, &csrf, None),
        ),
        ("panel", panel(&view, &csrf)),
        ("login", login(Listener::Admin, None)),
        ("login_error", login(Listener::Api, Some("Invalid key."))),
        (
            "message",
            message(
                Listener::Api,
                &format!("Refused{text}"),
                &format!("No{text}"),
            ),
        ),
        (
            "receipt",
            receipt(
                Listener::Admin,
                &Scope::Key(format!("alpha{text}")),
                &id,
                &format!("kid{text}"),
                &body,
                true,
            ),
        ),
        (
            "receipt_mismatch",
            receipt(Listener::Api, &Scope::Admin, &id, "kid", &body, false),
        ),
    ]
}

#[test]
fn every_value_is_escaped_on_every_page() {
    let hostile = r#"<script>&"x"#;
    for (name, page) in every_page(hostile) {
        let html = page.into_string();
        assert!(
            !html.contains("<script>"),
            "{name}: a value reached the page unescaped"
        );
        if name != "login" && name != "login_error" {
            assert!(html.contains("&lt;script&gt;&amp;&quot;x"), "{name}");
        }
    }
}

#[test]
fn numbers_and_times() {
    assert_eq!(num(0), "0");
    assert_eq!(num(999), "999");
    assert_eq!(num(1000), "1,000");
    assert_eq!(num(1_234_567), "1,234,567");
    assert_eq!(usd(1_500), "$0.000001");
    assert_eq!(usd(1_234_567_891_000), "$1,234.567891");
    assert_eq!(clock(1_795_991_949_000), "22:39:09");
    assert_eq!(datetime(1_795_991_949_000), "2026-11-29 22:39:09");
}

#[test]
fn notices_are_fixed_texts() {
    assert!(notice(Some("approved")).is_some_and(|(_, ok)| ok));
    assert!(notice(Some("owner_secret")).is_some_and(|(_, ok)| !ok));
    assert_eq!(notice(Some("<script>")), None);
    assert_eq!(notice(None), None);
}
