//! Agent sessions through the real binary against the mock provider (issue 24): a
//! temperature-0 rerun of a finished session completes SERVEd, a literal retry storm is still
//! stopped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::{json, Value};
use support::*;

/// An agent's request after `steps` tool steps: the first `polls` steps poll a job (the same
/// call and result on a growing history: one step fingerprint), the later ones make progress.
fn session(tag: &str, steps: usize, polls: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": format!("You are a build agent ({tag}).")}),
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
        let id = format!("call_{tag}_{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": args}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
    }
    json!({"model": "gpt-4o", "max_tokens": 100, "temperature": 0, "messages": messages})
}

#[test]
fn a_rerun_of_a_finished_session_completes_served_and_a_retry_storm_is_stopped() {
    let h = Harness::default();
    // Unattended (the key's default): a 12-call session whose first three tool steps poll one
    // job (the 1st..3rd identical step in 120 s).
    let calls: Vec<Value> = (0..12).map(|i| session("rerun", i, 3)).collect();
    for (i, body) in calls.iter().enumerate() {
        let r = h.post(CHAT, KEY_A, body, &[]);
        assert_eq!(r.status, 200, "call {i}: {}", r.text());
        assert!(
            matches!(r.verdict(), Some("ALLOW" | "DOWNGRADE")),
            "call {i}: {:?}",
            r.verdict()
        );
        settle();
    }
    assert_eq!(h.calls(CHAT), 12);
    // The rerun, at once: every call SERVEd from store, the polls too; nothing upstream.
    for (i, body) in calls.iter().enumerate() {
        let r = h.post(CHAT, KEY_A, body, &[]);
        assert_eq!(r.status, 200, "rerun {i}: {}", r.text());
        assert_eq!(r.verdict(), Some("SERVE"), "rerun {i}: {}", r.text());
    }
    assert_eq!(h.calls(CHAT), 12);
    // A literal retry storm of one call: the 4th identical request in 120 s, unattended, is
    // stopped although an answer is held.
    let last = &calls[11];
    assert_eq!(h.post(CHAT, KEY_A, last, &[]).verdict(), Some("SERVE"));
    let r = h.post(CHAT, KEY_A, last, &[]);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.verdict(), Some("BLOCK"));
    assert_eq!(r.receipt()["rule"], "runaway_loop_unattended");
    assert_eq!(r.header("x-should-retry"), Some("false"));
    assert_eq!(h.calls(CHAT), 12);
}
