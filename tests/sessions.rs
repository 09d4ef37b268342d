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

/// Windows scaled down for a test (the defaults: a 120 s window, holds up to 240 s, a run
/// stopped at 90 minutes): 3 steps per 2 s, then gaps of 1, 2 and 4 s, stopped at 10 s.
const SCALED_STEPS: &str = "\n[gate.steps]\npace_window_secs = 2\nmax_hold_secs = 4\n\
                            runaway_after_secs = 10\n";

fn scaled() -> Harness {
    Harness::start(Opts {
        extra_config: SCALED_STEPS.into(),
        ..Opts::default()
    })
}

/// The times (ms since the first) at which the provider received the calls to `path`.
fn received_ms(h: &Harness, path: &str) -> Vec<u64> {
    let times: Vec<std::time::SystemTime> = h.mock.requests_to(path).iter().map(|r| r.at).collect();
    let first = times[0];
    times
        .iter()
        .map(|t| t.duration_since(first).unwrap_or_default().as_millis() as u64)
        .collect()
}

#[test]
fn a_job_polled_past_the_loop_limit_is_paced_not_stopped_and_the_task_completes() {
    let h = scaled();
    // Unattended: a session that polls one job 6 times (5 identical steps after the first
    // poll's), then ships it. Without pacing the 4th identical step is BLOCKed.
    let polls = 6;
    let mut paced = Vec::new();
    for i in 0..=polls + 1 {
        let r = h.post(CHAT, KEY_A, &session("poll", i, polls), &[]);
        assert_eq!(r.status, 200, "call {i}: {}", r.text());
        assert!(
            matches!(r.verdict(), Some("ALLOW" | "DOWNGRADE")),
            "call {i}: {}",
            r.text()
        );
        paced.push(r.receipt()["paced_ms"].as_u64().unwrap_or(0));
    }
    assert_eq!(h.calls(CHAT), polls + 2, "every call reached the provider");
    // Calls 1..=6 are the 1st..6th identical step: the 4th waited until the 1st was 2 s old,
    // the 5th and 6th the schedule's growing gaps after it.
    assert_eq!(&paced[..4], &[0, 0, 0, 0], "{paced:?}");
    assert!(paced[4] >= 1_500, "{paced:?}");
    assert!(paced[5] >= 1_500 && paced[6] >= 3_500, "{paced:?}");
    assert_eq!(paced[7], 0, "a new step is not held: {paced:?}");
    // At most 3 identical steps reached the provider in any 2 s (the scaled window), as
    // the provider saw them arrive.
    let steps = &received_ms(&h, CHAT)[1..=6];
    for w in steps.windows(4) {
        assert!(
            w[3] - w[0] >= 1_900,
            "4 identical steps within 2 s: {steps:?}"
        );
    }
    // The ledger says how long the session waited and that nothing ended it.
    let sessions = keyed_get(&h.api_url("/ledger/sessions"), Some(KEY_A)).json();
    let s = &sessions["sessions"][0];
    assert_eq!(s["calls"], (polls + 2) as u64, "{sessions}");
    assert_eq!(s["steps_repeated"], (polls - 1) as u64, "{sessions}");
    assert_eq!(s["paced_ms"], paced.iter().sum::<u64>(), "{sessions}");
    assert_eq!(s["ended_by"], Value::Null, "{sessions}");
    let forwarded = ["ALLOW", "DOWNGRADE"]
        .iter()
        .map(|v| s["by_verdict"][v].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert_eq!(forwarded, (polls + 2) as u64, "{sessions}");
}

#[test]
fn a_stuck_agent_is_paced_then_stopped_by_runaway_step() {
    let h = scaled();
    // The same tool call and result forever (an agent stuck on `ls`), unattended.
    let mut verdicts = Vec::new();
    let mut last = None;
    for i in 0..12 {
        let r = h.post(CHAT, KEY_A, &session("stuck", i + 1, 100), &[]);
        verdicts.push(r.verdict().map(str::to_string));
        if r.status != 200 {
            last = Some(r);
            break;
        }
    }
    let r = last.expect("the stuck agent was stopped");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.receipt()["rule"], "runaway_step");
    assert_eq!(r.header("x-should-retry"), Some("false"));
    // Three at once, then 2 s, 2 s and 4 s apart: the 7th would be decided 12 s into the run,
    // past its 10 s bound, and is refused at once: 6 reached the provider, paced.
    assert_eq!(verdicts.len(), 7, "{verdicts:?}");
    assert_eq!(h.calls(CHAT), 6);
    let steps = received_ms(&h, CHAT);
    for w in steps.windows(4) {
        assert!(
            w[3] - w[0] >= 1_900,
            "4 identical steps within 2 s: {steps:?}"
        );
    }
    let sessions = keyed_get(&h.api_url("/ledger/sessions"), Some(KEY_A)).json();
    let s = &sessions["sessions"][0];
    assert_eq!(s["ended_by"], "runaway_step", "{sessions}");
    assert_eq!(s["calls"], 7, "{sessions}");
    assert_eq!(s["steps_repeated"], 6, "{sessions}");
    assert!(s["paced_ms"].as_u64().unwrap() > 0, "{sessions}");
    // The decisions of that session alone, where it stopped.
    let id = s["session"].as_str().unwrap();
    let page = keyed_get(
        &h.api_url(&format!("/ledger/decisions?session={id}")),
        Some(KEY_A),
    )
    .json();
    let decisions = page["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 7);
    assert_eq!(decisions[6]["reason"], "runaway_step");
    assert!(decisions.iter().all(|d| d["session"] == id));
    let bad = keyed_get(&h.api_url("/ledger/decisions?session=nothex"), Some(KEY_A));
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.json()["error"]["code"],
        "invalid_session",
        "{}",
        bad.text()
    );
}

#[test]
fn a_session_header_names_the_session() {
    let h = Harness::default();
    // Two runs of the same task: one prefix, two sessions by the client's header.
    for run in ["run-1", "run-2"] {
        for i in 0..2 {
            let r = h.post(
                CHAT,
                KEY_A,
                &session("named", i, 0),
                &[("x-claude-code-session-id", run)],
            );
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    // And one without a header: grouped by its prefix.
    let r = h.post(CHAT, KEY_A, &session("unnamed", 0, 0), &[]);
    assert_eq!(r.status, 200);
    let sessions = keyed_get(&h.api_url("/ledger/sessions"), Some(KEY_A)).json();
    let calls: Vec<u64> = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["calls"].as_u64().unwrap())
        .collect();
    assert_eq!(calls, vec![1, 2, 2], "{sessions}");
    // Another key sees none of them.
    let other = keyed_get(&h.api_url("/ledger/sessions"), Some(KEY_B)).json();
    assert_eq!(other["sessions"], json!([]), "{other}");
}
