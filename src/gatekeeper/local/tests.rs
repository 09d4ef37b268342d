//! Holds released without a header, pending re-sends, attending leases, denial, expiry and
//! persistence across a restart (SPEC §2.3, §2.7), through the live gatekeeper over SQLite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::gatekeeper::*;
use crate::receipt::ReceiptSigner;
use crate::store::sqlite::SqliteStore;
use tokensaver_core::gate::{Band, Rule};
use tokensaver_core::request::{self, Digest, Route};

const SECRET: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
/// 2026-11-29T22:39:09Z
pub(super) const T0: u64 = 1_795_991_949_000;
const TTL_MS: u64 = 900_000;

/// An async call of the gatekeeper, awaited on a runtime of the test's own (the store's
/// writer is a thread of its own, so nothing here waits on this runtime).
pub(super) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

pub(super) fn config() -> Config {
    let hash = hex::encode(crate::auth::secret_hash(SECRET));
    let text = format!(
        r#"
[[keys]]
id = "alpha"
secret_hash = "{hash}"
human = false
budget = {{ ceiling_micro_usd = 1000000, period = "day" }}

[prices."gpt-4o"]
input = 2_500_000
cache_write = 2_500_000
cache_read = 1_250_000
output = 10_000_000
max_output = 16_384

[limits]
hold_ttl_secs = 900
"#
    );
    Config::parse(&text).unwrap()
}

pub(super) fn open(dir: &Path) -> Gatekeeper {
    let store = SqliteStore::open(dir, 1).unwrap();
    Gatekeeper::new(
        config(),
        ReceiptSigner::from_seed([7; 32]),
        Arc::new(store),
        T0,
    )
    .unwrap()
}

pub(super) fn shape_of(body: &Value) -> RequestShape {
    let key = crate::auth::fingerprint_key(SECRET);
    request::parse(Route::OpenAiChat, body.to_string().as_bytes(), &key)
        .unwrap()
        .shape
}

/// An agent's long session: 40 turns, 24 tools, ~30 000 characters, no `max_tokens`.
/// Unattended it scores into the CHALLENGE band, attended below it.
fn agent_body(tag: &str) -> Value {
    let mut messages =
        vec![json!({"role": "system", "content": format!("You are a coding agent {tag}.")})];
    for i in 0..40 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": format!("step {i}: {}", "x".repeat(700))}));
    }
    let tools: Vec<Value> = (0..24)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
                "description": "does a thing", "parameters": {"type": "object", "properties": {}}}})
        })
        .collect();
    json!({"model": "gpt-4o", "messages": messages, "tools": tools})
}

/// A small sampled request: ALLOWed, but the 4th identical one unattended is a runaway loop.
fn small_body(tag: &str) -> Value {
    json!({"model": "gpt-4o", "max_tokens": 50, "temperature": 1,
           "messages": [{"role": "user", "content": format!("fix the failing test {tag}")}]})
}

fn gate_at(
    gk: &Gatekeeper,
    shape: &RequestShape,
    human: Option<bool>,
    hold_id: Option<&str>,
    now_ms: u64,
    mode: Mode,
) -> GateOutcome {
    let key = gk.core.config.key("alpha").unwrap().clone();
    gk.local().gate(
        &gk.core,
        &GateRequest {
            key: &key,
            shape,
            human,
            held: false,
            hold_id,
            now_ms,
            recorded_by: RecordSource::Proxy,
        },
        mode,
    )
}

pub(super) fn gate(gk: &Gatekeeper, shape: &RequestShape, now_ms: u64) -> GateOutcome {
    gate_at(gk, shape, None, None, now_ms, Mode::Commit)
}

fn receipt(o: &GateOutcome) -> Value {
    serde_json::from_slice(&o.envelope.body_bytes().unwrap()).unwrap()
}

fn requests(gk: &Gatekeeper) -> u64 {
    block_on(gk.ledger_report(Some("alpha"), None, None))
        .unwrap()
        .1
        .requests
}

fn approve(gk: &Gatekeeper, id: &str, attend_minutes: Option<u64>, now_ms: u64) -> HoldDecided {
    gk.local()
        .decide_hold(
            &gk.core,
            id,
            None,
            HoldAction::Approve { attend_minutes },
            now_ms,
        )
        .unwrap()
}

fn challenged(gk: &Gatekeeper, shape: &RequestShape, now_ms: u64) -> (GateOutcome, String) {
    let o = gate(gk, shape, now_ms);
    assert_eq!(o.decision.verdict, Verdict::Challenge, "{:?}", o.decision);
    assert_eq!(o.decision.band, Some(Band::ScoreChallenge));
    let id = o.decision.hold_id.clone().unwrap();
    (o, id)
}

#[test]
fn an_approval_releases_the_next_identical_request_once_without_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let shape = shape_of(&agent_body("release"));
    let (first, hold) = challenged(&gk, &shape, T0);
    assert!(receipt(&first).get("approved_hold").is_none());

    let decided = approve(&gk, &hold, None, T0 + 1_000);
    assert_eq!(decided.state, HoldState::Approved);
    assert_eq!(decided.expires_ms, T0 + TTL_MS);
    assert_eq!(decided.attending_until_ms, None);

    // The central gate answering `POST /gate` sees only the digest: same key, same
    // fingerprint, no header, no hold id. The approval releases it.
    let digest = Digest::parse(&serde_json::to_vec(&Digest::new(shape.clone())).unwrap()).unwrap();
    assert_eq!(digest.hold_id, None);
    // An estimate shows the release and uses nothing up.
    let estimate = gate_at(
        &gk,
        &digest.request,
        digest.human,
        None,
        T0 + 2_000,
        Mode::Estimate,
    );
    assert_eq!(estimate.decision.verdict, Verdict::Allow);
    let released = gate_at(
        &gk,
        &digest.request,
        digest.human,
        None,
        T0 + 2_000,
        Mode::Commit,
    );
    assert_eq!(
        released.decision.verdict,
        Verdict::Allow,
        "{:?}",
        released.decision
    );
    assert_eq!(
        released.decision.approved_hold.as_deref(),
        Some(hold.as_str())
    );
    assert_eq!(receipt(&released)["approved_hold"], hold.as_str());
    assert!(receipt(&released).get("attending_lease").is_none());
    // The score is still computed and stated, whatever released the request.
    assert!(
        released.decision.score >= 0.55,
        "{}",
        released.decision.score
    );

    // Once: the third identical request is challenged afresh, with a new hold.
    let (_, again) = challenged(&gk, &shape, T0 + 3_000);
    assert_ne!(again, hold);
    assert_eq!(
        gk.local()
            .decide_hold(&gk.core, &hold, None, HoldAction::Deny, T0 + 4_000),
        Err(HoldError::Unknown)
    );
    assert_eq!(requests(&gk), 3);

    // The header still works, once, as before.
    approve(&gk, &again, None, T0 + 5_000);
    // (Declared attended: three identical requests are already in the window.)
    let with_header = gate_at(
        &gk,
        &shape,
        Some(true),
        Some(&again),
        T0 + 6_000,
        Mode::Commit,
    );
    assert_eq!(with_header.decision.verdict, Verdict::Allow);
    assert_eq!(
        with_header.decision.approved_hold.as_deref(),
        Some(again.as_str())
    );
}

#[test]
fn an_approval_never_skips_the_runaway_rules_and_survives_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let shape = shape_of(&agent_body("runaway"));
    let (_, hold) = challenged(&gk, &shape, T0);
    // Two more identical requests before anyone approves: the re-sends of the pending hold
    // are not counted; other requests with this fingerprint cannot exist while it pends.
    // Approve, then push the loop count up with the key's windows directly.
    approve(&gk, &hold, None, T0 + 1_000);
    {
        let mut st = lock(&gk.local().state);
        for t in 1..=3 {
            st.windows
                .record("alpha", &shape.fingerprint, "gpt-4o", T0 + 1_000 + t);
        }
    }
    // Four identical requests in the window, none attended: runaway_loop_unattended.
    let refused = gate(&gk, &shape, T0 + 2_000);
    assert_eq!(refused.decision.verdict, Verdict::Block);
    assert_eq!(refused.decision.rule, Some(Rule::RunawayLoopUnattended));
    assert!(refused.decision.approved_hold.is_none());
    assert!(receipt(&refused).get("approved_hold").is_none());
    // The approval was not used up by a request it did not release.
    let (holds, _) = gk.local().holds(Some("alpha"), T0 + 2_000);
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].state, HoldState::Approved);
}

#[test]
fn holds_expire_and_an_expired_approval_releases_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let shape = shape_of(&agent_body("expiry"));
    let (first, hold) = challenged(&gk, &shape, T0);
    approve(&gk, &hold, None, T0 + 1_000);
    // At the TTL exactly the hold is gone (half-open, like the windows).
    let late = T0 + TTL_MS;
    assert_eq!(
        gk.local().decide_hold(
            &gk.core,
            &hold,
            None,
            HoldAction::Approve {
                attend_minutes: None
            },
            late
        ),
        Err(HoldError::Unknown)
    );
    let (after, next) = challenged(&gk, &shape, late);
    assert_ne!(next, hold);
    assert!(after.decision.approved_hold.is_none());
    // A pending hold expires the same way: its worst case counts as avoided.
    let (_, _) = gk.local().holds(None, late + TTL_MS);
    let totals = block_on(gk.ledger_report(Some("alpha"), None, None))
        .unwrap()
        .1;
    let worst = first.decision.worst_case.tokens().unwrap();
    assert_eq!(totals.worst_case_tokens_avoided, 2 * worst);
}

#[test]
fn a_resend_of_a_pending_hold_is_the_same_challenge_and_is_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let shape = shape_of(&agent_body("resend"));
    let (first, hold) = challenged(&gk, &shape, T0);
    // An unattended key: a 4th identical request within 120 s would be runaway_loop_unattended.
    for i in 1..=5 {
        let again = gate(&gk, &shape, T0 + i * 1_000);
        assert_eq!(again.decision, first.decision, "re-send {i}");
        assert_eq!(again.decision_id, first.decision_id);
        assert_eq!(again.envelope, first.envelope);
        assert_eq!(again.decision.hold_id.as_deref(), Some(hold.as_str()));
    }
    // With the header of the pending hold, too.
    let named = gate_at(&gk, &shape, None, Some(&hold), T0 + 6_000, Mode::Commit);
    assert_eq!(named.decision_id, first.decision_id);
    // Counted once: one ledger row, one request in the windows.
    assert_eq!(requests(&gk), 1);
    let counts =
        lock(&gk.local().state)
            .windows
            .observe("alpha", &shape.fingerprint, "gpt-4o", T0 + 7_000);
    assert_eq!(counts.earlier_identical, 1);
    assert_eq!(gk.core.metrics.hold_resends.get(), 6);
    let (holds, _) = gk.local().holds(None, T0 + 7_000);
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].reason, Some("score_challenge"));
}

#[test]
fn a_denied_hold_counts_as_avoided_and_the_next_request_is_decided_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let shape = shape_of(&agent_body("deny"));
    let (first, hold) = challenged(&gk, &shape, T0);
    // An owner decides only its own key's holds.
    assert_eq!(
        gk.local()
            .decide_hold(&gk.core, &hold, Some("beta"), HoldAction::Deny, T0 + 500),
        Err(HoldError::Unknown)
    );
    let denied = gk
        .local()
        .decide_hold(&gk.core, &hold, Some("alpha"), HoldAction::Deny, T0 + 1_000)
        .unwrap();
    assert_eq!(denied.state, HoldState::Denied);
    assert_eq!(
        gk.local()
            .decide_hold(&gk.core, &hold, None, HoldAction::Deny, T0 + 1_100),
        Err(HoldError::Unknown)
    );
    let totals = block_on(gk.ledger_report(Some("alpha"), None, None))
        .unwrap()
        .1;
    assert_eq!(
        totals.worst_case_tokens_avoided,
        first.decision.worst_case.tokens().unwrap()
    );
    // Decided afresh: counted, a new hold.
    let (_, next) = challenged(&gk, &shape, T0 + 2_000);
    assert_ne!(next, hold);
    assert_eq!(requests(&gk), 2);
    // Only a pending hold can be denied.
    approve(&gk, &next, None, T0 + 3_000);
    assert_eq!(
        gk.local()
            .decide_hold(&gk.core, &next, None, HoldAction::Deny, T0 + 3_100),
        Err(HoldError::NotPending)
    );
    assert!(gk
        .local()
        .holds(None, T0 + 3_200)
        .0
        .iter()
        .all(|h| h.hold_id != hold));
}

#[test]
fn an_attending_lease_scores_undeclared_requests_as_attended() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let big = shape_of(&agent_body("lease"));
    let (_, hold) = challenged(&gk, &big, T0);
    for bad in [0, 1441] {
        assert_eq!(
            gk.local().decide_hold(
                &gk.core,
                &hold,
                None,
                HoldAction::Approve {
                    attend_minutes: Some(bad)
                },
                T0
            ),
            Err(HoldError::AttendMinutes)
        );
    }
    let decided = approve(&gk, &hold, Some(10), T0 + 1_000);
    let until = T0 + 1_000 + 10 * 60_000;
    assert_eq!(decided.attending_until_ms, Some(until));

    // Four identical small requests that declare nothing: attended, so no runaway_loop_unattended.
    let small = shape_of(&small_body("lease"));
    for i in 0..4 {
        let o = gate(&gk, &small, T0 + 2_000 + i);
        assert_eq!(
            o.decision.verdict,
            Verdict::Allow,
            "request {i}: {:?}",
            o.decision
        );
        assert_eq!(o.decision.signals.unattended, 0.0);
        assert_eq!(receipt(&o)["attending_lease"], hold.as_str());
    }
    // A request that says `x-tokensaver-human: 0` stays unattended; hard rules still apply.
    let declared = gate_at(&gk, &small, Some(false), None, T0 + 3_000, Mode::Commit);
    assert_eq!(declared.decision.rule, Some(Rule::RunawayLoopUnattended));
    assert!(receipt(&declared).get("attending_lease").is_none());
    // The held request itself passes once (released, and attended).
    let released = gate(&gk, &big, T0 + 4_000);
    assert_eq!(released.decision.verdict, Verdict::Allow);
    assert_eq!(
        released.decision.approved_hold.as_deref(),
        Some(hold.as_str())
    );
    assert_eq!(
        released.decision.attending_lease.as_deref(),
        Some(hold.as_str())
    );

    let (_, leases) = gk.local().holds(Some("alpha"), T0 + 5_000);
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].until_ms, until);
    // When the lease ends, the key is unattended again.
    let other = shape_of(&small_body("after the lease"));
    let after = gate(&gk, &other, until);
    assert_eq!(after.decision.signals.unattended, 1.0);
    assert!(after.decision.attending_lease.is_none());
    assert!(gk.local().holds(Some("alpha"), until).1.is_empty());
}

#[test]
fn holds_and_leases_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let approved_shape = shape_of(&agent_body("restart approved"));
    let pending_shape = shape_of(&agent_body("restart pending"));
    let (pending, pending_hold);
    let approved_hold;
    {
        let gk = open(dir.path());
        let (_, id) = challenged(&gk, &approved_shape, T0);
        approved_hold = id;
        let (o, id) = challenged(&gk, &pending_shape, T0 + 1_000);
        (pending, pending_hold) = (o, id);
        approve(&gk, &approved_hold, Some(60), T0 + 2_000);
        block_on(gk.flush()).unwrap();
    }
    let gk = open(dir.path());
    let (holds, leases) = gk.local().holds(None, T0 + 3_000);
    let states: Vec<(&str, HoldState)> = holds
        .iter()
        .map(|h| (h.hold_id.as_str(), h.state))
        .collect();
    assert_eq!(
        states,
        [
            (approved_hold.as_str(), HoldState::Approved),
            (pending_hold.as_str(), HoldState::Pending)
        ]
    );
    assert_eq!(holds[1].reason, Some("score_challenge"));
    assert_eq!(leases.len(), 1);

    // The pending hold's re-send is the same answer, byte for byte, and is not counted.
    let again = gate(&gk, &pending_shape, T0 + 4_000);
    assert_eq!(again.decision_id, pending.decision_id);
    assert_eq!(again.envelope, pending.envelope);
    assert_eq!(requests(&gk), 2);

    // The approval still releases the next identical request, under the lease.
    let small = shape_of(&small_body("restart"));
    let attended = gate(&gk, &small, T0 + 5_000);
    assert_eq!(
        attended.decision.attending_lease.as_deref(),
        Some(approved_hold.as_str())
    );
    let released = gate(&gk, &approved_shape, T0 + 6_000);
    assert_eq!(released.decision.verdict, Verdict::Allow);
    assert_eq!(
        released.decision.approved_hold.as_deref(),
        Some(approved_hold.as_str())
    );
    block_on(gk.flush()).unwrap();
    drop(gk);

    // Used stays used across the next restart.
    let gk = open(dir.path());
    let (holds, _) = gk.local().holds(None, T0 + 7_000);
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].hold_id, pending_hold);
}
