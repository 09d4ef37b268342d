//! Releasing a CHALLENGE the way an off-the-shelf agent client needs it (SPEC §2.7): through
//! the real `tokensaver serve` and the real `tokensaver holds` CLI. The client never sends a
//! tokensaver header; a person approves at the terminal; the same request then passes once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{json, Value};
use support::*;

/// An agent's long session: 40 turns, 24 tools, ~30 000 characters, no `max_tokens`.
/// Unattended it scores into the CHALLENGE band (0.55 ≤ score < 0.80), attended below it.
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

fn harness() -> Harness {
    Harness::start(Opts {
        budget_a: Some(1_000_000),
        ..Opts::default()
    })
}

fn config_path(h: &Harness) -> PathBuf {
    h.dir.path().join("tokensaver.toml")
}

/// Run `tokensaver holds ...` against the harness's config, with the admin key from the
/// environment (as an operator would export it).
fn holds_cli(config: &PathBuf, args: &[&str], admin_key: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokensaver"))
        .arg("holds")
        .args(args)
        .arg("--config")
        .arg(config)
        .env("TOKENSAVER_ADMIN_KEY", admin_key)
        .env("RUST_LOG", "error")
        .output()
        .expect("run tokensaver holds")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The agent's request, as the agent sends it: no tokensaver header at all.
fn held(h: &Harness, body: &Value) -> (Resp, String) {
    let r = h.post(CHAT, KEY_A, body, &[]);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.verdict(), Some("CHALLENGE"));
    assert_eq!(r.header("x-should-retry"), Some("false"));
    let hold = r
        .header("x-tokensaver-hold")
        .expect("hold header")
        .to_string();
    assert_eq!(r.json()["error"]["hold_id"], hold.as_str());
    (r, hold)
}

#[test]
fn a_person_approves_at_the_terminal_and_the_same_request_passes_once() {
    let h = harness();
    let config = config_path(&h);
    let body = agent_body("release");

    let (first, hold) = held(&h, &body);
    let err = first.json();
    assert_eq!(err["error"]["type"], "tokensaver_hold");
    assert_eq!(err["error"]["code"], "score_challenge");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("'tokensaver holds approve {hold}'")),
        "{message}"
    );
    assert!(
        message.contains(&format!("POST /holds/{hold}/approve")),
        "{message}"
    );
    assert!(message.contains("15 minutes"), "{message}");
    assert!(!message.contains("x-tokensaver-hold header"), "{message}");

    // The agent retries on its own: the same CHALLENGE, the same receipt, not counted.
    for _ in 0..4 {
        let (again, id) = held(&h, &body);
        assert_eq!(id, hold);
        assert_eq!(
            again.header("x-tokensaver-receipt"),
            first.header("x-tokensaver-receipt")
        );
    }
    // Digest mode sees the same: the central gate answers the digest with the same hold.
    let shape = tokensaver::request::parse(
        tokensaver::request::Route::OpenAiChat,
        body.to_string().as_bytes(),
        &tokensaver::auth::fingerprint_key(SECRET_A),
    )
    .unwrap()
    .shape;
    let digest = serde_json::to_vec(&tokensaver::request::Digest::new(shape)).unwrap();
    let gate = call(
        client::post(&h.api_url("/gate")).set("authorization", &format!("Bearer {KEY_A}")),
        Some(&digest),
    );
    assert_eq!(gate.status, 200, "{}", gate.text());
    let gate = gate.json();
    assert_eq!(gate["verdict"], "CHALLENGE");
    assert_eq!(gate["hold_id"], hold.as_str());
    assert_eq!(gate["hold_ttl_ms"], 900_000);
    assert!(gate["message"].as_str().unwrap().contains(&hold));
    assert_eq!(h.calls(CHAT), 0);
    assert_eq!(
        h.ledger(KEY_A)["total"]["requests"],
        1,
        "re-sends were counted"
    );

    // The operator lists the holds and approves this one with the real CLI.
    let list = holds_cli(&config, &["list"], ADMIN_KEY);
    assert!(list.status.success(), "{}", stderr(&list));
    let table = stdout(&list);
    let row = table
        .lines()
        .find(|l| l.contains(&hold))
        .unwrap_or_else(|| panic!("hold not listed:\n{table}"));
    assert!(row.contains("alpha") && row.contains("pending") && row.contains("score_challenge"));
    assert!(!table.contains("step 0"), "content leaked into the list");
    let approve = holds_cli(&config, &["approve", &hold], ADMIN_KEY);
    assert!(approve.status.success(), "{}", stderr(&approve));
    assert!(
        stdout(&approve).contains(&format!("approved {hold}")),
        "{}",
        stdout(&approve)
    );
    let list = stdout(&holds_cli(&config, &["list", "--key", "alpha"], ADMIN_KEY));
    assert!(
        list.lines()
            .any(|l| l.contains(&hold) && l.contains("approved")),
        "{list}"
    );

    // The agent's next identical request, still without any header, is forwarded once.
    let passed = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(passed.status, 200, "{}", passed.text());
    assert_eq!(passed.verdict(), Some("ALLOW"));
    assert_eq!(passed.receipt()["approved_hold"], hold.as_str());
    assert_eq!(h.calls(CHAT), 1);

    // Once: the next one is held afresh, under a new hold.
    let (_, next) = held(&h, &body);
    assert_ne!(next, hold);
    assert_eq!(h.calls(CHAT), 1);
    let again = holds_cli(&config, &["approve", &hold], ADMIN_KEY);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("no open hold"),
        "{}",
        stderr(&again)
    );

    // A person may deny instead: the hold closes.
    let deny = holds_cli(&config, &["deny", &next], ADMIN_KEY);
    assert!(deny.status.success(), "{}", stderr(&deny));
    assert!(stdout(&deny).contains(&format!("denied {next}")));
    let list = stdout(&holds_cli(&config, &["list"], ADMIN_KEY));
    assert!(list.contains("no pending or approved holds"), "{list}");

    // Closed-form errors: a wrong admin key, and no server on the configured admin listener.
    let wrong = holds_cli(&config, &["list"], "tsa_not-the-admin-key");
    assert!(!wrong.status.success());
    assert!(
        stderr(&wrong).contains("refused the admin key"),
        "{}",
        stderr(&wrong)
    );
    let text = std::fs::read_to_string(&config).unwrap();
    let elsewhere = text.replace(
        &h.admin.to_string(),
        &format!("127.0.0.1:{}", tokensaver::processes::free_port().unwrap()),
    );
    let down = h.dir.path().join("down.toml");
    std::fs::write(&down, elsewhere).unwrap();
    let none = holds_cli(&down, &["list"], ADMIN_KEY);
    assert!(!none.status.success());
    assert!(
        stderr(&none).contains("no tokensaver answers"),
        "{}",
        stderr(&none)
    );
    let unset = Command::new(env!("CARGO_BIN_EXE_tokensaver"))
        .args(["holds", "list", "--config"])
        .arg(&config)
        .env_remove("TOKENSAVER_ADMIN_KEY")
        .output()
        .unwrap();
    assert!(!unset.status.success());
    assert!(
        stderr(&unset).contains("TOKENSAVER_ADMIN_KEY"),
        "{}",
        stderr(&unset)
    );
}

#[test]
fn an_approval_with_attend_minutes_scores_the_key_as_attended() {
    let h = harness();
    let config = config_path(&h);
    let body = agent_body("attend");
    let (_, hold) = held(&h, &body);

    // A small sampled request, three times unattended: allowed; a 4th would be a runaway loop.
    let small = chat(
        "gpt-4o-mini",
        "Try again: fix the failing test.",
        json!({"temperature": 1, "max_tokens": 50}),
    );
    for i in 0..3 {
        let r = h.post(CHAT, KEY_A, &small, &[]);
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert!(r.receipt().get("attending_lease").is_none());
    }

    let out_of_range = holds_cli(
        &config,
        &["approve", &hold, "--attend-minutes", "0"],
        ADMIN_KEY,
    );
    assert!(!out_of_range.status.success());
    let approve = holds_cli(
        &config,
        &["approve", &hold, "--attend-minutes", "5"],
        ADMIN_KEY,
    );
    assert!(approve.status.success(), "{}", stderr(&approve));
    assert!(
        stdout(&approve).contains("attending"),
        "{}",
        stdout(&approve)
    );
    let list = stdout(&holds_cli(&config, &["list"], ADMIN_KEY));
    assert!(list.contains("attending: key alpha"), "{list}");

    // Attended now: the 4th identical request declares nothing and is not a runaway loop.
    let r = h.post(CHAT, KEY_A, &small, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    let receipt = r.receipt();
    assert_eq!(receipt["attending_lease"], hold.as_str());
    assert_eq!(receipt["signals"]["unattended"], 0.0);
    // Hard rules still apply to a request that declares no person.
    let r = h.post(CHAT, KEY_A, &small, &[("x-tokensaver-human", "0")]);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.receipt()["rule"], "runaway_loop_unattended");

    // The held request itself passes once, and its receipt names both approvals.
    let calls = h.calls(CHAT);
    let r = h.post(CHAT, KEY_A, &body, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.calls(CHAT), calls + 1);
    let receipt = r.receipt();
    assert_eq!(receipt["approved_hold"], hold.as_str());
    assert_eq!(receipt["attending_lease"], hold.as_str());

    // The lease is kept across a restart.
    let mut h = h;
    h.restart();
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o-mini", "after restart", json!({"max_tokens": 20})),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.receipt()["attending_lease"], hold.as_str());
}

#[test]
fn a_key_sees_only_its_own_holds_and_its_owner_decides_them_on_the_api_listener() {
    let h = harness();
    let (_, hold) = held(&h, &agent_body("owner"));
    let list =
        |auth: (&str, &str)| call(client::get(&h.api_url("/holds")).set(auth.0, auth.1), None);
    let mine = list(("authorization", &format!("Bearer {KEY_A}")));
    assert_eq!(mine.status, 200, "{}", mine.text());
    let holds = mine.json()["holds"].clone();
    assert_eq!(holds.as_array().unwrap().len(), 1);
    assert_eq!(holds[0]["hold_id"], hold.as_str());
    assert_eq!(holds[0]["reason"], "score_challenge");
    assert_eq!(holds[0]["fingerprint_prefix"].as_str().unwrap().len(), 16);
    let theirs = list(("authorization", &format!("Bearer {KEY_B}")));
    assert_eq!(theirs.json()["holds"], json!([]));
    let owner = format!("alpha:{OWNER_SECRET_A}");
    assert_eq!(list(("x-tokensaver-owner", &owner)).json()["holds"], holds);
    // The admin key does not open the API listener's hold routes; the admin listener's need it.
    assert_eq!(
        list(("authorization", &format!("Bearer {ADMIN_KEY}"))).status,
        401
    );
    let admin_list = call(
        client::get(&h.admin_url("/holds")).set("authorization", &format!("Bearer {KEY_A}")),
        None,
    );
    assert_eq!(admin_list.status, 401);

    let decide = |action: &str, owner: &str, body: &[u8]| {
        call(
            client::post(&h.api_url(&format!("/holds/{hold}/{action}")))
                .set("x-tokensaver-owner", owner),
            Some(body),
        )
    };
    // The automation's own key cannot decide; a lease is bounded.
    let by_key = call(
        client::post(&h.api_url(&format!("/holds/{hold}/deny")))
            .set("authorization", &format!("Bearer {KEY_A}")),
        Some(b""),
    );
    assert_eq!(by_key.status, 401);
    let too_long = decide("approve", &owner, br#"{"attend_minutes": 1441}"#);
    assert_eq!(too_long.status, 400, "{}", too_long.text());
    assert_eq!(too_long.json()["error"]["code"], "invalid_attend_minutes");
    let denied = decide("deny", &owner, b"");
    assert_eq!(denied.status, 200, "{}", denied.text());
    assert_eq!(denied.json()["state"], "denied");
    assert_eq!(decide("approve", &owner, b"").status, 404);
    // Counted as avoided, like an expired hold.
    let avoided = h.ledger(KEY_A)["total"]["worst_case_tokens_avoided"]
        .as_u64()
        .unwrap();
    assert!(avoided > 0);
}
