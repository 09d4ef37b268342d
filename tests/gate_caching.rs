//! Prompt caching placed by the gate (SPEC §2.11b, issue 25), through the real binary against
//! the built-in provider, which bills caching as Anthropic does (`crates/mock-provider`,
//! "Prompt caching"; here in cl100k counting, every token of the body).
//!
//! Costs are the provider-reported usage of each answer at Anthropic's Claude Sonnet 4.5
//! prices ($3 input, $3.75 5-minute cache write, $0.30 cache read, $15 output per million
//! tokens), summed by the test itself: nothing here reads the gate's own figures to decide
//! whether the gate saved. The bodies are written by hand, as the `anthropic` SDK sends them
//! (compact JSON, its key order); a marked body is the same text with the marker written where
//! a person would write it. Run with `--nocapture` for the measured figures (README quotes them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::Value;
use support::*;
use tokensaver_mock_provider::MockProvider;

/// Priced at Sonnet 4.5's list prices (`config/prices-builtin.toml`) and mapped to no cheaper
/// model, so no call is DOWNGRADEd: the cache is the only lever. Minimum cacheable: 1,024.
const MODEL: &str = "claude-sonnet-4-5-20250929";
const INPUT: u64 = 3_000_000;
const WRITE_5M: u64 = 3_750_000;
const READ: u64 = 300_000;
const OUTPUT: u64 = 15_000_000;
const MARK: &str = r#","cache_control":{"type":"ephemeral"}"#;
const SECRET_C: &str = "cccccccccccccccccccccccccccccccccccccccccccccccc";
const KEY_C: &str = "tsk_gamma_cccccccccccccccccccccccccccccccccccccccccccccccc";
const SECRET_D: &str = "dddddddddddddddddddddddddddddddddddddddddddddddd";
const SECRET_E: &str = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
const KEY_E: &str = "tsk_epsilon_eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
const KEY_D: &str = "tsk_delta_dddddddddddddddddddddddddddddddddddddddddddddddd";
const STEPS: usize = 20;

fn secret_hash_hex(secret: &str) -> String {
    tokensaver::auth::secret_hash(secret)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn prices_toml() -> String {
    format!(
        "\n[prices.\"{MODEL}\"]\ninput = {INPUT}\ncache_write = {WRITE_5M}\ncache_read = {READ}\n\
         output = {OUTPUT}\nmax_output = 64_000\ncache_write_1h = 6_000_000\n"
    )
}

fn harness() -> Harness {
    let extra = format!(
        "{}\n[[keys]]\nid = \"gamma\"\nsecret_hash = \"{}\"\nhuman = true\ncache = \"off\"\n\n\
         [[keys]]\nid = \"delta\"\nsecret_hash = \"{}\"\nhuman = true\n\n\
         [[keys]]\nid = \"epsilon\"\nsecret_hash = \"{}\"\nhuman = true\n\
         without = [\"breakpoints\"]\n",
        prices_toml(),
        secret_hash_hex(SECRET_C),
        secret_hash_hex(SECRET_D),
        secret_hash_hex(SECRET_E)
    );
    Harness::start(Opts {
        usage: UsageCounting::Cl100k,
        extra_config: extra,
        ..Opts::default()
    })
}

/// A JSON string literal.
fn s(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// A coding agent's system prompt: about 18,000 characters, the same on every step.
fn system_prompt() -> String {
    (0..120)
        .map(|i| {
            format!(
                "Rule {i}: when you edit file number {i}, read it first, keep its style, run the \
                 tests of module {}, and report what changed. ",
                i * 7 % 13
            )
        })
        .collect()
}

const TOOLS: &str = r#"[{"name":"read_file","description":"Read a file of the repository.","input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}},{"name":"run_tests","description":"Run the test suite and print its summary.","input_schema":{"type":"object","properties":{"filter":{"type":"string"}}}}]"#;

/// What `read_file` printed at step `i`: about 2,400 characters of source, different each step.
fn tool_output(i: usize) -> String {
    (0..40)
        .map(|l| {
            format!(
                "fn item_{i}_{l}(x: u64) -> u64 {{ x * {} + {} }}\n",
                l + 3,
                i * 31 + l
            )
        })
        .collect()
}

/// The messages of step `step` (1-based) of the loop: the task, then one tool call and its
/// result per earlier step; a message whose index is in `marked` carries the marker on its
/// last block (a string content is written as one text block for it).
fn messages(step: usize, marked: &[usize]) -> String {
    let mut out = Vec::new();
    let task = "Find why the tests of module 4 fail and fix it.";
    out.push(if marked.contains(&0) {
        format!(
            r#"{{"role":"user","content":[{{"type":"text","text":{}{MARK}}}]}}"#,
            s(task)
        )
    } else {
        format!(r#"{{"role":"user","content":{}}}"#, s(task))
    });
    for i in 1..step {
        let call = 2 * i - 1;
        let mark = |m: usize| if marked.contains(&m) { MARK } else { "" };
        out.push(format!(
            r#"{{"role":"assistant","content":[{{"type":"text","text":{}}},{{"type":"tool_use","id":"toolu_{i:02}","name":"read_file","input":{{"path":"src/module_{i}.rs"}}{}}}]}}"#,
            s(&format!("I will read module {i}.")),
            mark(call)
        ));
        out.push(format!(
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"toolu_{i:02}","content":{}{}}}]}}"#,
            s(&tool_output(i)),
            mark(call + 1)
        ));
    }
    format!("[{}]", out.join(","))
}

/// Step `step`'s body, as the SDK writes it; `system` as a string (the caller's) or already
/// as a marked block.
fn body(step: usize, marked: &[usize], system_marked: bool) -> String {
    let system = if system_marked {
        format!(
            r#"[{{"type":"text","text":{}{MARK}}}]"#,
            s(&system_prompt())
        )
    } else {
        s(&system_prompt())
    };
    format!(
        r#"{{"max_tokens":1024,"messages":{},"model":"{MODEL}","system":{system},"tools":{TOOLS}}}"#,
        messages(step, marked)
    )
}

/// The provider-reported usage of an answer, and its cost at the prices above (nano-USD).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Bill {
    input: u64,
    write: u64,
    read: u64,
    output: u64,
}

impl Bill {
    fn of(answer: &Value) -> Bill {
        let u = &answer["usage"];
        let n = |k: &str| u[k].as_u64().unwrap_or(0);
        assert_eq!(
            u["cache_creation"]["ephemeral_1h_input_tokens"]
                .as_u64()
                .unwrap_or(0),
            0
        );
        Bill {
            input: n("input_tokens"),
            write: n("cache_creation_input_tokens"),
            read: n("cache_read_input_tokens"),
            output: n("output_tokens"),
        }
    }

    /// Tokens × price per million: micro-USD per Mtok ÷ 1,000 = nano-USD per token (exact
    /// for these prices).
    fn cost_nano(&self) -> u64 {
        (self.input * INPUT + self.write * WRITE_5M + self.read * READ + self.output * OUTPUT)
            / 1000
    }

    /// What the cached tokens would have cost uncached minus what they did (SPEC §2.11b).
    fn cache_saving_nano(&self) -> i64 {
        (self.read * (INPUT - READ)) as i64 / 1000 - (self.write * (WRITE_5M - INPUT)) as i64 / 1000
    }

    fn add(&mut self, b: Bill) {
        self.input += b.input;
        self.write += b.write;
        self.read += b.read;
        self.output += b.output;
    }
}

fn usd(nano: u64) -> f64 {
    nano as f64 / 1e9
}

/// Through the gate; the provider must have received `expected`, byte for byte.
fn gated(h: &Harness, key: &str, body: &str, expected: &str) -> (Value, Value) {
    gated_to(h, &h.mock, key, body, expected)
}

/// [`gated`] for a gate whose upstream is `provider`.
fn gated_to(
    h: &Harness,
    provider: &MockProvider,
    key: &str,
    body: &str,
    expected: &str,
) -> (Value, Value) {
    let r = h.post_raw(MESSAGES, Some(key), body.as_bytes(), &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.verdict(), Some("ALLOW"));
    let seen = provider.last_request().unwrap();
    assert!(
        seen.body_text() == expected,
        "the provider received other bytes than expected (len {} vs {})",
        seen.body_len,
        expected.len()
    );
    (r.json(), r.receipt())
}

/// Where the placement rule (SPEC §2.11b) puts breakpoints on step `step` of the naive loop:
/// at the end of the previous step's prompt (the longest prefix this key sent before: its last
/// message, index 2·step − 4), and, read back, at up to three earlier ends where the gate
/// placed one (the previous steps' ends, every two messages back).
fn expected_marks(step: usize) -> Vec<usize> {
    if step < 2 {
        return Vec::new();
    }
    let write = 2 * step - 4;
    let mut marks: Vec<usize> = (0..=write).rev().step_by(2).take(4).collect();
    marks.sort_unstable();
    marks
}

/// The target: a caching-naive 20-step tool-use loop costs at least 50 % less through the gate
/// with `cache = "auto"` than straight to the provider; every forwarded body is the caller's
/// with markers at the placed points only; the ledger's `cache_saving` is the saving of the
/// gate-placed calls, derived here from the provider's figures, and in no other total.
#[test]
fn a_naive_agent_loop_costs_at_least_half_less_through_the_gate() {
    let h = harness();
    let mut direct = Bill::default();
    let mut direct_nano = 0;
    for step in 1..=STEPS {
        let b = Bill::of(&h.straight_anthropic(body(step, &[], false).as_bytes()));
        assert_eq!(
            (b.write, b.read),
            (0, 0),
            "an unmarked call is never cached"
        );
        direct_nano += b.cost_nano();
        direct.add(b);
    }
    assert_eq!(h.mock.prompt_cache_entries(), 0);

    let mut through = Bill::default();
    let mut through_nano = 0;
    let mut saving = 0i64;
    let mut added = 0;
    for step in 1..=STEPS {
        let marks = expected_marks(step);
        let (answer, receipt) = gated(
            &h,
            KEY_A,
            &body(step, &[], false),
            &body(step, &marks, false),
        );
        let b = Bill::of(&answer);
        added += marks.len() as u64;
        assert_eq!(
            receipt["cache_breakpoints_added"].as_u64(),
            (!marks.is_empty()).then_some(marks.len() as u64),
            "step {step}"
        );
        if step >= 3 {
            assert!(b.read > 0, "step {step} read nothing: {b:?}");
        }
        through_nano += b.cost_nano();
        saving += b.cache_saving_nano();
        through.add(b);
    }
    // The provider counted the same prompts, but for the markers themselves: the mock's
    // cl100k counting reads the whole body, `cache_control` included (a few tokens each).
    let extra = through.input + through.write + through.read - direct.input;
    assert!(
        extra <= 20 * added,
        "{extra} more prompt tokens for {added} markers"
    );
    let cut = 1.0 - through_nano as f64 / direct_nano as f64;
    println!(
        "naive {STEPS}-step loop: straight ${:.4} (input {} tokens), through the gate ${:.4} \
         (input {}, cache write {}, cache read {}; {added} breakpoints added, {extra} marker \
         tokens); {:.1} % less; cache saving ${:.4}",
        usd(direct_nano),
        direct.input,
        usd(through_nano),
        through.input,
        through.write,
        through.read,
        cut * 100.0,
        saving as f64 / 1e9
    );
    assert!(cut >= 0.5, "only {:.1} % less", cut * 100.0);
    // (The output differs a little: the mock's reply words are drawn from the body's digest,
    // markers included; it is in both costs as billed.)

    settle();
    let ledger = h.ledger(KEY_A);
    assert_eq!(
        ledger["total"]["cache_saving"].as_i64(),
        Some(saving),
        "{ledger}"
    );
    // Never in a savings total: nothing was SERVEd or blocked.
    assert_eq!(
        ledger["total"]["tokens_not_bought"].as_u64(),
        Some(0),
        "{ledger}"
    );
    assert!(ledger["tiers"]["cache_saving"]
        .as_str()
        .unwrap()
        .contains("counterfactual"));

    // The finding says the gate acted on it; an estimate places as the call would, books nothing.
    let r = keyed_send(
        "POST",
        &h.api_url("/estimate?route=anthropic_messages"),
        Some(KEY_A),
        body(STEPS + 1, &[], false).as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let decision = &r.json()["decision"];
    assert_eq!(
        decision["cache_breakpoints"].as_array().map(Vec::len),
        Some(expected_marks(STEPS + 1).len())
    );
    let resent = decision["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "large_system_prompt_resent")
        .expect("the system prompt is resent");
    assert!(
        resent["acted"].as_str().unwrap().contains("cache"),
        "{resent}"
    );

    // Each decision row carries its own, where the gate placed breakpoints (not on step 1).
    let r = keyed_get(&h.api_url("/ledger/decisions?limit=100"), Some(KEY_A));
    assert_eq!(r.status, 200, "{}", r.text());
    let rows = r.json()["decisions"].as_array().unwrap().clone();
    assert_eq!(rows.len(), STEPS);
    assert!(rows[0].get("cache_saving").is_none(), "{}", rows[0]);
    let per_row: i64 = rows.iter().filter_map(|d| d["cache_saving"].as_i64()).sum();
    assert_eq!(per_row, saving);
    assert_eq!(
        rows.iter()
            .filter(|d| d.get("cache_saving").is_some())
            .count(),
        STEPS - 1
    );

    // `tokensaver ledger` prints it, in dollars, beside the tiers.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokensaver"))
        .args(["ledger", "--key", "alpha", "--config"])
        .arg(h.config_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total = text.lines().find(|l| l.starts_with("total")).unwrap();
    let dollars = format!(
        "${}.{:06}",
        saving / 1_000_000_000,
        saving % 1_000_000_000 / 1_000
    );
    assert!(total.ends_with(&dollars), "{total} vs {dollars}");
    assert!(text.contains("cache saving (derived)") && text.contains("counterfactual"));

    // The page shows it: the key's card and its ledger row carry the same figure.
    let html = page_of(&h, KEY_A);
    for cell in [
        format!(r#"data-scope="total" data-figure="cache_saving" data-value="{saving}""#),
        format!(r#"data-key="alpha" data-figure="cache_saving" data-value="{saving}""#),
    ] {
        assert!(html.contains(&cell), "the page lacks {cell}");
    }
    assert!(html.contains("prompt-cache saving") && html.contains(&dollars));
}

/// The ledger page (`/page/` on the API listener) as the key's holder sees it once signed in.
fn page_of(h: &Harness, key: &str) -> String {
    let base = h.api_url("");
    let base = base.trim_end_matches('/');
    let signed = client::post(&format!("{base}/page/login"))
        .no_redirects()
        .set("content-type", "application/x-www-form-urlencoded")
        .set("origin", base)
        .set("sec-fetch-site", "same-origin")
        .send(format!("key={key}").as_bytes());
    assert_eq!(signed.status, 303);
    let cookie = signed.header("set-cookie").unwrap();
    let cookie = cookie.split(';').next().unwrap().to_string();
    let page = client::get(&format!("{base}/page/"))
        .no_redirects()
        .set("cookie", &cookie)
        .call();
    assert!(
        page.status < 400 && page.transport_error.is_none(),
        "{} {:?}",
        page.status,
        page.transport_error
    );
    page.text()
}

/// A one-off request: nothing seen before, so no breakpoint, no write premium; the same cost
/// as straight to the provider, the caller's bytes forwarded as sent.
#[test]
fn a_one_off_request_costs_exactly_the_same() {
    let h = harness();
    let one = body(3, &[], false);
    let direct = Bill::of(&h.straight_anthropic(one.as_bytes()));
    h.mock.reset_prompt_cache();
    let (answer, receipt) = gated(&h, KEY_D, &one, &one);
    let through = Bill::of(&answer);
    println!(
        "one-off request: straight ${:.6}, through the gate ${:.6}",
        usd(direct.cost_nano()),
        usd(through.cost_nano())
    );
    assert_eq!(through, direct);
    assert!(
        receipt.get("cache_breakpoints_added").is_none(),
        "{receipt}"
    );
    settle();
    assert_eq!(h.ledger(KEY_D)["total"]["cache_saving"].as_i64(), Some(0));
}

/// A client that marks its own breakpoints (as Claude Code does: the system prompt and the
/// newest message) is forwarded byte-identical and costs what it costs straight.
#[test]
fn a_self_marking_client_is_forwarded_as_sent_and_costs_the_same() {
    let h = harness();
    let steps = 6;
    let own = |step: usize| body(step, &[2 * step - 2], true);
    let mut direct = 0;
    for step in 1..=steps {
        direct += Bill::of(&h.straight_anthropic(own(step).as_bytes())).cost_nano();
    }
    h.mock.reset_prompt_cache();
    let mut through = 0;
    let mut read = 0;
    for step in 1..=steps {
        let (answer, receipt) = gated(&h, KEY_D, &own(step), &own(step));
        assert!(receipt.get("cache_breakpoints_added").is_none());
        let b = Bill::of(&answer);
        read += b.read;
        through += b.cost_nano();
    }
    println!(
        "self-marking client, {steps} steps: straight ${:.6}, through the gate ${:.6}",
        usd(direct),
        usd(through)
    );
    assert!(read > 0, "the client's own caching works");
    assert_eq!(through, direct);
    settle();
    assert_eq!(h.ledger(KEY_D)["total"]["cache_saving"].as_i64(), Some(0));
}

/// `cache = "off"`: the gate adds nothing, and the loop costs what it costs straight.
#[test]
fn cache_off_adds_nothing() {
    let h = harness();
    // `cache = "off"`, and a key that goes without placed breakpoints alone (an ablation arm).
    for key in [KEY_C, KEY_E] {
        for step in 1..=5 {
            let one = body(step, &[], false);
            let (answer, receipt) = gated(&h, key, &one, &one);
            assert!(receipt.get("cache_breakpoints_added").is_none());
            let b = Bill::of(&answer);
            assert_eq!((b.write, b.read), (0, 0), "step {step}");
        }
    }
    assert_eq!(h.mock.prompt_cache_entries(), 0);
    settle();
    assert_eq!(h.ledger(KEY_C)["total"]["cache_saving"].as_i64(), Some(0));
    assert_eq!(h.ledger(KEY_E)["total"]["cache_saving"].as_i64(), Some(0));

    let r = keyed_send(
        "POST",
        &h.api_url("/estimate?route=anthropic_messages"),
        Some(KEY_C),
        body(6, &[], false).as_bytes(),
    );
    let decision = &r.json()["decision"];
    assert!(decision.get("cache_breakpoints").is_none(), "{decision}");
    let findings = decision["findings"].as_array().unwrap();
    assert!(findings
        .iter()
        .any(|f| f["code"] == "large_system_prompt_resent"));
    assert!(findings.iter().all(|f| f.get("acted").is_none()));

    // `/spec` states the rule and what the saving is.
    let spec = keyed_get(&h.api_url("/spec"), None).json();
    let rule = &spec["prompt_caching"]["rule"];
    assert_eq!(rule["max_breakpoints"], 4);
    assert_eq!(rule["lifetime_ms"], 300_000);
    let tier = spec["certainty_tiers"]["cache_saving"].as_str().unwrap();
    assert!(tier.contains("counterfactual") && tier.contains("only where the gate placed"));
}

/// Digest mode: the central gate says where (from the digest's prefix hashes, no content), the
/// local instance puts the markers in the caller's bytes before it calls the provider, and the
/// central ledger's `cache_saving` is the saving of those calls, derived here.
#[test]
fn in_digest_mode_the_central_gate_says_where_and_the_local_instance_applies() {
    let h = harness();
    let client = start_client(&h, h.api, KEY_A);
    let mut saving = 0i64;
    let mut read = 0;
    for step in 1..=6 {
        let r = call(
            client::post(&format!("http://{}{MESSAGES}", client.1))
                .set("content-type", "application/json")
                .set("x-api-key", KEY_A)
                .set(HUMAN.0, HUMAN.1),
            Some(body(step, &[], false).as_bytes()),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let seen = h.mock.last_request().unwrap();
        assert!(
            seen.body_text() == body(step, &expected_marks(step), false),
            "step {step}: not the caller's bytes with the placed markers"
        );
        let b = Bill::of(&r.json());
        read += b.read;
        saving += b.cache_saving_nano();
    }
    assert!(read > 0);
    // The record travels in the background: wait for the central ledger to have all six.
    let mut ledger = Value::Null;
    for _ in 0..50 {
        settle();
        ledger = h.ledger(KEY_A);
        if ledger["total"]["usage"]["cache_read"].as_u64() == Some(read) {
            break;
        }
    }
    println!(
        "digest mode, 6 steps: cache read {read} tokens, cache saving ${:.6}",
        saving as f64 / 1e9
    );
    assert_eq!(
        ledger["total"]["cache_saving"].as_i64(),
        Some(saving),
        "{ledger}"
    );
}

/// A fleet places as one gate: what one instance saw of a key's prefixes is what the next
/// instance places by (the memory is in the fleet's PostgreSQL), so a loop spread over three
/// instances gets the breakpoints a single node gives it, and the fleet's ledger carries the
/// cache saving of every placed call. Needs `TOKENSAVER_TEST_PG_URL` (`scripts/ci-fleet.sh`).
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn a_fleet_places_breakpoints_as_one_gate() {
    let url = std::env::var("TOKENSAVER_TEST_PG_URL")
        .expect("TOKENSAVER_TEST_PG_URL is not set: run the fleet tests with scripts/ci-fleet.sh");
    // A key of its own per run: the fleet's memory outlives a run by the cache's lifetime.
    let id = format!("cachefleet{:x}", tokensaver::now_ms() % 0xff_ffff);
    let secret = format!("{:0>48}", blake3::hash(id.as_bytes()).to_hex());
    let bearer = format!("tsk_{id}_{secret}");
    let extra = format!(
        "{}\n[[keys]]\nid = \"{id}\"\nsecret_hash = \"{}\"\nhuman = true\n\n\
         [store]\nkind = \"postgres\"\nurl = \"{url}\"\nmax_connections = 8\n",
        prices_toml(),
        secret_hash_hex(&secret)
    );
    // One provider for the fleet (the first instance's), as a real fleet has.
    let opts = |upstream: Option<String>| Opts {
        usage: UsageCounting::Cl100k,
        rust_log: "warn",
        extra_config: extra.clone(),
        upstream,
        ..Opts::default()
    };
    let first = Harness::start(opts(None));
    let provider = first.mock.base_url();
    let mut fleet = vec![first];
    for _ in 0..2 {
        fleet.push(Harness::start(opts(Some(provider.clone()))));
    }
    const FLEET_STEPS: usize = 7;
    let mut saving = 0i64;
    for step in 1..=FLEET_STEPS {
        let marks = expected_marks(step);
        let h = &fleet[step % 3];
        let (answer, receipt) = gated_to(
            h,
            &fleet[0].mock,
            &bearer,
            &body(step, &[], false),
            &body(step, &marks, false),
        );
        assert_eq!(
            receipt["cache_breakpoints_added"].as_u64(),
            (!marks.is_empty()).then_some(marks.len() as u64),
            "step {step}"
        );
        let bill = Bill::of(&answer);
        if step >= 3 {
            assert!(bill.read > 0, "step {step} read nothing: {bill:?}");
        }
        saving += bill.cache_saving_nano();
    }
    settle();
    for h in &fleet {
        let ledger = h.ledger(&bearer);
        assert_eq!(
            ledger["total"]["cache_saving"].as_i64(),
            Some(saving),
            "{ledger}"
        );
    }
}
