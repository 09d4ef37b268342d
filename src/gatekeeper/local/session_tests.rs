//! Sessions through the live gatekeeper (issue 24): a seen step counts for the repeat finding,
//! a temperature-0 rerun of a finished session is SERVEd to its end while a literal retry
//! storm is still stopped. The clock is passed in.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};

use super::tests::{block_on, open, shape_of, T0};
use super::*;
use crate::gatekeeper::*;
use crate::store::Ending;
use tokensaver_core::gate::Billed;
use tokensaver_core::gate::{FindingCode, Rule};

/// An agent's request after `steps` tool steps: the first `polls` steps poll a job (the same
/// call, the same result, a growing history), the later ones make progress.
fn session(steps: usize, polls: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a build agent."}),
        json!({"role": "user", "content": "Wait for job 7, then ship it."}),
    ];
    for i in 0..steps {
        let (name, args, result) = if i < polls {
            (
                "job_status",
                r#"{"job":7}"#.to_string(),
                "running".to_string(),
            )
        } else {
            ("run", format!(r#"{{"step":{i}}}"#), format!("step {i} ok"))
        };
        let id = format!("call_{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": args}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
    }
    json!({"model": "gpt-4o", "max_tokens": 100, "temperature": 0, "messages": messages})
}

fn decide(gk: &Gatekeeper, shape: &RequestShape, held: bool, now_ms: u64) -> GateOutcome {
    let key = gk.core.config.key("alpha").unwrap().clone();
    gk.local().gate(
        &gk.core,
        &GateRequest {
            key: &key,
            shape,
            human: None,
            held,
            hold_id: None,
            now_ms,
            recorded_by: RecordSource::Proxy,
        },
        Mode::Commit,
    )
}

/// The provider's complete answer to a forwarded decision, as the proxy records it.
fn record(gk: &Gatekeeper, o: &GateOutcome, now_ms: u64) {
    let report = UsageReport {
        key_id: "alpha".into(),
        decision_id: o.decision_id,
        usage: Some(Billed::from(Usage {
            input: 120,
            cache_write: 0,
            cache_read: 0,
            output: 20,
        })),
        served_model: "gpt-4o".into(),
        wire: WireForm::Json,
        ending: Ending::Complete,
    };
    block_on(
        gk.local()
            .record_usage(&gk.core, &report, now_ms, RecordSource::Proxy),
    )
    .unwrap();
}

#[test]
fn the_polls_of_a_session_share_one_step() {
    let a = shape_of(&session(1, 3));
    let b = shape_of(&session(2, 3));
    let c = shape_of(&session(4, 3));
    assert_ne!(a.fingerprint, b.fingerprint);
    assert_eq!(a.step_fingerprint, b.step_fingerprint);
    assert_ne!(a.step_fingerprint, c.step_fingerprint);
}

#[test]
fn a_seen_step_is_repeating_without_recording() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    let first = decide(&gk, &shape_of(&session(1, 3)), false, T0);
    let codes = |o: &GateOutcome| {
        o.decision
            .findings
            .iter()
            .map(|f| f.code)
            .collect::<Vec<_>>()
    };
    assert!(!codes(&first).contains(&FindingCode::RepeatingWithoutRecording));
    // The next poll: another fingerprint (a longer history), the same step.
    let second = decide(&gk, &shape_of(&session(2, 3)), false, T0 + 10_000);
    assert_eq!(second.decision.verdict, Verdict::Allow);
    assert!(codes(&second).contains(&FindingCode::RepeatingWithoutRecording));
    // A step that makes progress is no repeat.
    let third = decide(&gk, &shape_of(&session(4, 3)), false, T0 + 20_000);
    assert!(!codes(&third).contains(&FindingCode::RepeatingWithoutRecording));
}

#[test]
fn a_rerun_of_a_finished_session_is_served_to_its_end_and_a_literal_storm_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let gk = open(dir.path());
    // The session, unattended: 14 calls, three of them polls of one job (the 1st..3rd
    // identical step), each answered and its usage recorded.
    const STEPS: usize = 14;
    let shapes: Vec<RequestShape> = (0..STEPS).map(|i| shape_of(&session(i, 3))).collect();
    let mut now = T0;
    for shape in &shapes {
        let o = decide(&gk, shape, false, now);
        assert_eq!(o.decision.verdict, Verdict::Allow, "{:?}", o.decision);
        record(&gk, &o, now + 500);
        now += 2_000;
    }
    // The rerun at temperature 0, at once: every call is SERVEd — the polls too, whose
    // step was seen three times in the last 120 s (a SERVE buys nothing).
    for (i, shape) in shapes.iter().enumerate() {
        let o = decide(&gk, shape, true, now);
        assert_eq!(
            (o.decision.verdict, o.decision.rule),
            (Verdict::Serve, None),
            "rerun step {i}"
        );
        now += 100;
    }
    // A second rerun: still SERVEd (the 3rd literal repeat of each call).
    for shape in &shapes {
        assert_eq!(
            decide(&gk, shape, true, now).decision.verdict,
            Verdict::Serve
        );
        now += 100;
    }
    // A literal retry storm of the last call: its 4th in 120 s is stopped, servable or not.
    let last = &shapes[STEPS - 1];
    let o = decide(&gk, last, true, now);
    assert_eq!(
        (o.decision.verdict, o.decision.rule),
        (Verdict::Block, Some(Rule::RunawayLoopUnattended))
    );
    // The SERVEs left the step windows alone: a live repeat of the poll after the reruns is
    // the 4th identical step (the session's three polls), not the 10th.
    let poll = shape_of(&session(4, 5));
    assert_eq!(poll.step_fingerprint, shapes[1].step_fingerprint);
    let counts = lock(&gk.local().state).windows.observe_step(
        "alpha",
        &poll.fingerprint,
        &poll.step_fingerprint,
        "gpt-4o",
        now,
    );
    assert_eq!((counts.earlier_identical, counts.earlier_step_only), (3, 3));
}

#[test]
fn a_restart_counts_serves_as_the_live_gate_did() {
    let dir = tempfile::tempdir().unwrap();
    let shapes: Vec<RequestShape> = (0..3).map(|i| shape_of(&session(i, 3))).collect();
    let mut now = T0;
    {
        let gk = open(dir.path());
        for shape in &shapes {
            let o = decide(&gk, shape, false, now);
            record(&gk, &o, now + 100);
            now += 1_000;
        }
        for shape in &shapes {
            assert_eq!(
                decide(&gk, shape, true, now).decision.verdict,
                Verdict::Serve
            );
            now += 1_000;
        }
        block_on(gk.flush()).unwrap();
    }
    let gk = open(dir.path());
    let poll = shape_of(&session(3, 4));
    let counts = lock(&gk.local().state).windows.observe_step(
        "alpha",
        &poll.fingerprint,
        &poll.step_fingerprint,
        "gpt-4o",
        now,
    );
    // Two live polls (steps 1 and 2 of the session); their two SERVEs are not steps.
    assert_eq!((counts.earlier_identical, counts.earlier_step_only), (2, 2));
    assert_eq!(counts.earlier_key_minute, 6);
}
