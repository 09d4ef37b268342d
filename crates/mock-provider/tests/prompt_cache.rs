//! Prompt caching of the mock provider, over the socket (module docs, "Prompt caching").
//!
//! Every expectation is derived here by hand from the documented rule: token counts come from
//! the pinned tokenizer (`tokensaver_tokenizer::count`) over JSON serialised by `serde_json`
//! (compact, object keys sorted: the workspace does not enable `preserve_order`), and the
//! arithmetic (sums, the 1024 + 128·k rounding, the TTL windows) is written out in each test.
//! Nothing here calls the mock's own cache code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use tokensaver_mock_provider::{MockProvider, ProviderOptions, UsageCounting};

// ------------------------------------------------------------------------------------------
// Helpers: the client, and the hand-derived token counts
// ------------------------------------------------------------------------------------------

const SONNET: &str = "claude-sonnet-4-5";
const KEY: &str = "sk-ant-one";
const MIN: u64 = 60_000;
const SEC: u64 = 1_000;

fn start_with(opts: ProviderOptions) -> MockProvider {
    MockProvider::start_background(opts).unwrap()
}

/// The mock counting P (and prefixes) with cl100k, caching on.
fn start() -> MockProvider {
    start_with(ProviderOptions {
        usage: UsageCounting::Cl100k,
        ..ProviderOptions::default()
    })
}

struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    fn usage(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.body);
        self.json()["usage"].clone()
    }
}

fn post_to(base: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    let mut req = ureq::post(&format!("{base}{path}")).set("content-type", "application/json");
    for (n, v) in headers {
        req = req.set(n, v);
    }
    match req.send_string(&body.to_string()) {
        Ok(r) => Answer {
            status: r.status(),
            body: r.into_string().unwrap(),
        },
        Err(ureq::Error::Status(status, r)) => Answer {
            status,
            body: r.into_string().unwrap(),
        },
        Err(e) => panic!("{e}"),
    }
}

fn post(p: &MockProvider, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    post_to(&p.base_url(), path, headers, body)
}

/// An Anthropic call with credential `key` at clock `now` (ms).
fn messages(p: &MockProvider, key: &str, now: u64, body: &Value) -> Answer {
    let now = now.to_string();
    post(
        p,
        "/v1/messages",
        &[("x-api-key", key), ("x-mock-now-ms", &now)],
        body,
    )
}

/// An OpenAI call (`path`) with bearer `key` at clock `now` (ms).
fn openai(p: &MockProvider, path: &str, key: &str, now: u64, body: &Value) -> Answer {
    let auth = format!("Bearer {key}");
    let now = now.to_string();
    post(
        p,
        path,
        &[("authorization", &auth), ("x-mock-now-ms", &now)],
        body,
    )
}

fn tok(s: &str) -> u64 {
    tokensaver_tokenizer::count(s).unwrap()
}

/// Tokens of a JSON value's compact, key-sorted serialisation.
fn tok_json(v: &Value) -> u64 {
    tok(&serde_json::to_string(v).unwrap())
}

/// `P` under cl100k: the body without `stream` / `stream_options` and without what only bills
/// caching (`cache_control` anywhere; `prompt_cache_key`, `prompt_cache_retention`,
/// `prompt_cache_options` at the top).
fn prompt_tokens(body: &Value) -> u64 {
    fn strip_markers(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("cache_control");
                m.values_mut().for_each(strip_markers);
            }
            Value::Array(items) => items.iter_mut().for_each(strip_markers),
            _ => {}
        }
    }
    let mut b = body.clone();
    let m = b.as_object_mut().unwrap();
    for field in [
        "stream",
        "stream_options",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
    ] {
        m.remove(field);
    }
    strip_markers(&mut b);
    tok_json(&b)
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

fn marked(t: &str, cc: Value) -> Value {
    json!({"type": "text", "text": t, "cache_control": cc})
}

fn eph() -> Value {
    json!({"type": "ephemeral"})
}

fn eph_ttl(ttl: &str) -> Value {
    json!({"type": "ephemeral", "ttl": ttl})
}

/// Distinct filler text whose text block has at least `min_tokens` tokens.
fn filler(tag: &str, min_tokens: u64) -> String {
    let mut words = Vec::new();
    let mut i = 0;
    loop {
        words.push(format!("{tag}{i}"));
        i += 1;
        if i % 50 == 0 && tok_json(&text(&words.join(" "))) >= min_tokens {
            return words.join(" ");
        }
    }
}

/// Tokens a text block adds to a prefix (its JSON without `cache_control`).
fn tb(t: &str) -> u64 {
    tok_json(&text(t))
}

/// The Anthropic usage as the rule gives it for a prompt of `p` tokens.
fn anthropic_usage(u: &Value, p: u64, read: u64, w5: u64, w1: u64) {
    assert_eq!(u["cache_read_input_tokens"], read, "{u}");
    assert_eq!(u["cache_creation_input_tokens"], w5 + w1, "{u}");
    assert_eq!(
        u["cache_creation"],
        json!({"ephemeral_5m_input_tokens": w5, "ephemeral_1h_input_tokens": w1}),
        "{u}"
    );
    assert_eq!(u["input_tokens"], p - read - w5 - w1, "{u}");
}

/// OpenAI's rounding, restated: 0 below 1024, else 1024 + 128·⌊(n − 1024)/128⌋.
fn round_openai(n: u64) -> u64 {
    if n < 1024 {
        0
    } else {
        1024 + (n - 1024) / 128 * 128
    }
}

fn sse_data(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

// ------------------------------------------------------------------------------------------
// Anthropic
// ------------------------------------------------------------------------------------------

fn system_body(model: &str, sys: &str, question: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 64,
        "system": [marked(sys, eph())],
        "messages": [{"role": "user", "content": question}],
    })
}

#[test]
fn anthropic_writes_then_reads_at_a_breakpoint() {
    let p = start();
    let sys = filler("sys", 1500);
    let s = tb(&sys);
    assert!(s >= 1024);
    let first = system_body(SONNET, &sys, "What is one?");
    let u = messages(&p, KEY, 0, &first).usage();
    // Written: the prefix up to and including the system block.
    anthropic_usage(&u, prompt_tokens(&first), 0, s, 0);
    let u = messages(&p, KEY, 10 * SEC, &first).usage();
    anthropic_usage(&u, prompt_tokens(&first), s, 0, 0);
    // A different question after the breakpoint still reads it.
    let second = system_body(SONNET, &sys, "And what is two?");
    let u = messages(&p, KEY, 20 * SEC, &second).usage();
    anthropic_usage(&u, prompt_tokens(&second), s, 0, 0);
    // A change before the breakpoint does not.
    let changed = system_body(SONNET, &format!("{sys} extra"), "What is one?");
    let u = messages(&p, KEY, 30 * SEC, &changed).usage();
    anthropic_usage(
        &u,
        prompt_tokens(&changed),
        0,
        tb(&format!("{sys} extra")),
        0,
    );

    // Streamed: message_start carries the same figures as the JSON answer.
    let mut streamed = second.clone();
    streamed["stream"] = json!(true);
    let r = messages(&p, KEY, 40 * SEC, &streamed);
    assert_eq!(r.status, 200);
    let events = sse_data(&r.body);
    let start = &events[0]["message"]["usage"];
    assert_eq!(events[0]["type"], "message_start");
    assert_eq!(start["cache_read_input_tokens"], s);
    assert_eq!(start["cache_creation_input_tokens"], 0);
    assert_eq!(
        start["cache_creation"],
        json!({"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0})
    );
    assert_eq!(start["input_tokens"], prompt_tokens(&second) - s);
    assert_eq!(start["output_tokens"], 1);
}

#[test]
fn anthropic_second_breakpoint_extends_the_prefix() {
    let p = start();
    let tools = json!([{"name": "lookup", "description": filler("tool", 300),
                        "input_schema": {"type": "object", "properties": {}}}]);
    let sys = filler("sys", 1100);
    let doc = filler("doc", 1200);
    let t = tok_json(&tools[0]);
    let s = tb(&sys);
    let d = tb(&doc);
    let one = json!({"model": SONNET, "max_tokens": 64, "tools": tools,
                     "system": [marked(&sys, eph())],
                     "messages": [{"role": "user", "content": "hi"}]});
    // The prefix is tools, then system: the breakpoint on the system block covers both.
    let u = messages(&p, KEY, 0, &one).usage();
    anthropic_usage(&u, prompt_tokens(&one), 0, t + s, 0);
    let two = json!({"model": SONNET, "max_tokens": 64, "tools": tools,
                     "system": [marked(&sys, eph())],
                     "messages": [{"role": "user", "content": [marked(&doc, eph()), text("q?")]}]});
    // Read up to the first breakpoint, write from there to the second.
    let u = messages(&p, KEY, SEC, &two).usage();
    anthropic_usage(&u, prompt_tokens(&two), t + s, d, 0);
    let u = messages(&p, KEY, 2 * SEC, &two).usage();
    anthropic_usage(&u, prompt_tokens(&two), t + s + d, 0, 0);
    // Moving the breakpoint off the system block does not change the prefix it read.
    let three = json!({"model": SONNET, "max_tokens": 64, "tools": tools,
                       "system": [text(&sys)],
                       "messages": [{"role": "user", "content": [marked(&doc, eph()), text("again")]}]});
    let u = messages(&p, KEY, 3 * SEC, &three).usage();
    anthropic_usage(&u, prompt_tokens(&three), t + s + d, 0, 0);
}

#[test]
fn anthropic_below_the_minimum_nothing_is_cached() {
    let p = start();
    let small = filler("small", 300);
    assert!(tb(&small) < 1024);
    let body = system_body(SONNET, &small, "q");
    for now in [0, SEC] {
        let u = messages(&p, KEY, now, &body).usage();
        anthropic_usage(&u, prompt_tokens(&body), 0, 0, 0);
    }
    // 1500 tokens: enough for Sonnet 4.5 (1024), not for Haiku 3.5 (2048) or Haiku 4.5 (4096).
    let mid = filler("mid", 1500);
    let m = tb(&mid);
    assert!((1024..2048).contains(&m));
    for model in ["claude-3-5-haiku-20241022", "claude-haiku-4-5"] {
        let body = system_body(model, &mid, "q");
        for now in [0, SEC] {
            let u = messages(&p, KEY, now, &body).usage();
            anthropic_usage(&u, prompt_tokens(&body), 0, 0, 0);
        }
    }
    let big = filler("big", 2100);
    let b = tb(&big);
    assert!((2048..4096).contains(&b));
    let haiku3 = system_body("claude-3-5-haiku-20241022", &big, "q");
    anthropic_usage(
        &messages(&p, KEY, 0, &haiku3).usage(),
        prompt_tokens(&haiku3),
        0,
        b,
        0,
    );
    let haiku4 = system_body("claude-haiku-4-5", &big, "q");
    anthropic_usage(
        &messages(&p, KEY, 0, &haiku4).usage(),
        prompt_tokens(&haiku4),
        0,
        0,
        0,
    );
    // A short first breakpoint is ignored; the long second one is written whole.
    let two = json!({"model": SONNET, "max_tokens": 64,
                     "system": [marked(&small, eph()), marked(&mid, eph())],
                     "messages": [{"role": "user", "content": "q"}]});
    let u = messages(&p, KEY, 0, &two).usage();
    anthropic_usage(&u, prompt_tokens(&two), 0, tb(&small) + m, 0);
}

#[test]
fn anthropic_five_breakpoints_are_refused() {
    let p = start();
    let blocks = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| marked(&format!("part {i}"), eph()))
            .collect()
    };
    let body = |content: Vec<Value>, top: bool| {
        let mut b = json!({"model": SONNET, "max_tokens": 64,
                           "messages": [{"role": "user", "content": content}]});
        if top {
            b["cache_control"] = eph();
        }
        b
    };
    let r = messages(&p, KEY, 0, &body(blocks(5), false));
    assert_eq!(r.status, 400);
    let e = r.json();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("Found 5"),
        "{e}"
    );
    assert_eq!(messages(&p, KEY, 0, &body(blocks(4), false)).status, 200);
    // The automatic form takes a fifth slot when the last block has no marker of its own.
    let mut four_and_plain = blocks(4);
    four_and_plain.push(text("tail"));
    assert_eq!(
        messages(&p, KEY, 0, &body(four_and_plain.clone(), true)).status,
        400
    );
    assert_eq!(messages(&p, KEY, 0, &body(blocks(4), true)).status, 200);
    // A nested marker (inside a tool_result) counts too.
    let mut nested = blocks(4);
    nested.push(json!({"type": "tool_result", "tool_use_id": "toolu_1",
                       "content": [marked("out", eph())]}));
    assert_eq!(messages(&p, KEY, 0, &body(nested, false)).status, 400);
    // A 1h breakpoint after a 5m one, and an unknown ttl, are refused as the API does.
    let order = json!({"model": SONNET, "max_tokens": 64,
                       "system": [marked("a", eph_ttl("5m")), marked("b", eph_ttl("1h"))],
                       "messages": [{"role": "user", "content": "q"}]});
    assert_eq!(messages(&p, KEY, 0, &order).status, 400);
    let ttl = json!({"model": SONNET, "max_tokens": 64,
                     "system": [marked("a", eph_ttl("10m"))],
                     "messages": [{"role": "user", "content": "q"}]});
    assert_eq!(messages(&p, KEY, 0, &ttl).status, 400);
    // Nothing was written: the accepted ones are far below the minimum.
    assert_eq!(p.prompt_cache_entries(), 0);
}

#[test]
fn anthropic_five_minute_entries_expire_and_reads_refresh_them() {
    let p = start();
    let sys = filler("sys", 1200);
    let s = tb(&sys);
    let body = system_body(SONNET, &sys, "q");
    let pt = prompt_tokens(&body);
    let t0 = 1_700_000_000_000;
    anthropic_usage(&messages(&p, KEY, t0, &body).usage(), pt, 0, s, 0);
    // Alive until t0 + 5 min (exclusive); each read restarts the 5 minutes.
    let t1 = t0 + 5 * MIN - 1;
    anthropic_usage(&messages(&p, KEY, t1, &body).usage(), pt, s, 0, 0);
    let t2 = t1 + 5 * MIN - 1;
    anthropic_usage(&messages(&p, KEY, t2, &body).usage(), pt, s, 0, 0);
    // 5 minutes after the last read, exactly: gone, written again.
    let t3 = t2 + 5 * MIN;
    anthropic_usage(&messages(&p, KEY, t3, &body).usage(), pt, 0, s, 0);

    // The same through the admin clock instead of the header.
    let base = p.base_url();
    let clock = |b: Value| post_to(&base, "/__mock/clock", &[], &b).json();
    assert_eq!(
        clock(json!({"now_ms": t3 + MIN})),
        json!({"now_ms": t3 + MIN, "fixed": true})
    );
    let plain = |p: &MockProvider| post(p, "/v1/messages", &[("x-api-key", KEY)], &body).usage();
    anthropic_usage(&plain(&p), pt, s, 0, 0);
    assert_eq!(
        clock(json!({"advance_ms": 5 * MIN}))["now_ms"],
        t3 + 6 * MIN
    );
    anthropic_usage(&plain(&p), pt, 0, s, 0);
    assert_eq!(p.clock_ms(), t3 + 6 * MIN);
    let real = clock(json!({"now_ms": null}));
    assert_eq!(real["fixed"], false);
}

#[test]
fn anthropic_one_hour_entries() {
    let p = start();
    let sys = filler("sys", 1200);
    let doc = filler("doc", 1100);
    let (s, d) = (tb(&sys), tb(&doc));
    let long = json!({"model": SONNET, "max_tokens": 64, "system": [marked(&sys, eph_ttl("1h"))],
                      "messages": [{"role": "user", "content": [marked(&doc, eph()), text("q")]}]});
    let pt = prompt_tokens(&long);
    // Written: the 1h part up to the system block, the 5m part from there to the last one.
    anthropic_usage(&messages(&p, KEY, 0, &long).usage(), pt, 0, d, s);
    anthropic_usage(&messages(&p, KEY, 4 * MIN, &long).usage(), pt, s + d, 0, 0);
    // 10 minutes after that read the 5m entry is gone, the 1h one is read.
    let t = 14 * MIN;
    anthropic_usage(&messages(&p, KEY, t, &long).usage(), pt, s, d, 0);
    // Reads refresh the hour: 59 minutes later still there, an hour after that not.
    let only = system_body(SONNET, &sys, "q");
    let only = {
        let mut b = only;
        b["system"] = json!([marked(&sys, eph_ttl("1h"))]);
        b
    };
    let po = prompt_tokens(&only);
    anthropic_usage(&messages(&p, KEY, t + 59 * MIN, &only).usage(), po, s, 0, 0);
    anthropic_usage(
        &messages(&p, KEY, t + 59 * MIN + 60 * MIN, &only).usage(),
        po,
        0,
        0,
        s,
    );
}

#[test]
fn anthropic_top_level_automatic_caching() {
    let p = start();
    let sys = filler("sys", 700);
    let a = filler("ask", 600);
    let turn1 = json!({"model": SONNET, "max_tokens": 64, "cache_control": eph(),
                       "system": sys,
                       "messages": [{"role": "user", "content": a}]});
    // The breakpoint goes on the last block: the whole prompt (system, first message) is
    // written. A string system or content is one text block.
    let w1 = tb(&sys) + tb(&a);
    let u = messages(&p, KEY, 0, &turn1).usage();
    anthropic_usage(&u, prompt_tokens(&turn1), 0, w1, 0);
    // Next turn: the old last block sits two blocks before the new one (within the
    // lookback), so it is read and only the new turns are written.
    let reply = "a short answer";
    let next = "and a follow-up question";
    let turn2 = json!({"model": SONNET, "max_tokens": 64, "cache_control": eph(),
                       "system": sys,
                       "messages": [{"role": "user", "content": a},
                                    {"role": "assistant", "content": reply},
                                    {"role": "user", "content": next}]});
    let u = messages(&p, KEY, SEC, &turn2).usage();
    anthropic_usage(&u, prompt_tokens(&turn2), w1, tb(reply) + tb(next), 0);
    // The automatic form's TTL applies to its breakpoint. Entries exist only where a
    // breakpoint was: after the first message and after the last one of turn 2, so a changed
    // last message reads the first and writes the rest.
    let mut hour = turn2.clone();
    hour["cache_control"] = eph_ttl("1h");
    hour["messages"][2]["content"] = json!("another question");
    let u = messages(&p, KEY, 2 * SEC, &hour).usage();
    anthropic_usage(
        &u,
        prompt_tokens(&hour),
        w1,
        0,
        tb(reply) + tb("another question"),
    );
}

#[test]
fn anthropic_lookback_is_twenty_blocks() {
    let p = start();
    let sys = filler("sys", 1100);
    let s = tb(&sys);
    let parts: Vec<String> = (0..30).map(|i| format!("block number {i}")).collect();
    // The user turn: 30 text blocks; a breakpoint on block `at` (0-based within the turn).
    let body = |at: usize, model: &str| {
        let content: Vec<Value> = parts
            .iter()
            .enumerate()
            .map(|(i, t)| if i == at { marked(t, eph()) } else { text(t) })
            .collect();
        json!({"model": model, "max_tokens": 64, "system": sys,
               "messages": [{"role": "user", "content": content}]})
    };
    let upto = |at: usize| s + parts[..=at].iter().map(|t| tb(t)).sum::<u64>();
    // Written at block 5 of the turn; then the breakpoint at 24: the window of 20 blocks
    // (24 back to 5) still holds it.
    let b = body(5, SONNET);
    anthropic_usage(
        &messages(&p, KEY, 0, &b).usage(),
        prompt_tokens(&b),
        0,
        upto(5),
        0,
    );
    let b = body(24, SONNET);
    anthropic_usage(
        &messages(&p, KEY, SEC, &b).usage(),
        prompt_tokens(&b),
        upto(5),
        upto(24) - upto(5),
        0,
    );
    // Another model (its own cache): written at 5, then the breakpoint at 25: out of reach.
    let other = "claude-opus-4-1";
    let b = body(5, other);
    messages(&p, KEY, 0, &b).usage();
    let b = body(25, other);
    anthropic_usage(
        &messages(&p, KEY, SEC, &b).usage(),
        prompt_tokens(&b),
        0,
        upto(25),
        0,
    );
}

#[test]
fn caches_are_per_credential_and_model() {
    let p = start();
    let sys = filler("sys", 1200);
    let s = tb(&sys);
    let body = system_body(SONNET, &sys, "q");
    let pt = prompt_tokens(&body);
    anthropic_usage(&messages(&p, "sk-a", 0, &body).usage(), pt, 0, s, 0);
    anthropic_usage(&messages(&p, "sk-b", SEC, &body).usage(), pt, 0, s, 0);
    anthropic_usage(&messages(&p, "sk-a", 2 * SEC, &body).usage(), pt, s, 0, 0);
    // The Authorization bearer is the credential when there is no x-api-key.
    let r = post(
        &p,
        "/v1/messages",
        &[("authorization", "Bearer sk-b"), ("x-mock-now-ms", "3000")],
        &body,
    );
    anthropic_usage(&r.usage(), pt, s, 0, 0);
    let r = post(&p, "/v1/messages", &[("x-mock-now-ms", "3000")], &body);
    anthropic_usage(&r.usage(), pt, 0, s, 0);
    // Another model does not share it.
    let opus = system_body("claude-opus-4-1", &sys, "q");
    anthropic_usage(
        &messages(&p, "sk-a", 4 * SEC, &opus).usage(),
        prompt_tokens(&opus),
        0,
        s,
        0,
    );
    // OpenAI: per bearer too.
    let chat = json!({"model": "gpt-4o", "messages": [{"role": "system", "content": sys},
                                                      {"role": "user", "content": "q"}]});
    let path = "/v1/chat/completions";
    let pc = prompt_tokens(&chat);
    let full = tok_json(&chat["messages"][0]) + tok_json(&chat["messages"][1]);
    let cached = |r: Answer| r.usage()["prompt_tokens_details"]["cached_tokens"].clone();
    assert_eq!(cached(openai(&p, path, "sk-a", 0, &chat)), 0);
    assert_eq!(cached(openai(&p, path, "sk-b", 0, &chat)), 0);
    assert_eq!(
        cached(openai(&p, path, "sk-a", SEC, &chat)),
        round_openai(full.min(pc))
    );
}

#[test]
fn character_rule_examples_of_the_docs() {
    // Under the default character counting a prefix has ceil(its characters / 4) tokens.
    let p = start_with(ProviderOptions::default());
    let sys = "x".repeat(5000);
    let body = system_body(SONNET, &sys, "Hello!");
    let pt = (5000u64 + 6).div_ceil(4) + 8;
    assert_eq!(pt, 1260);
    let u = messages(&p, KEY, 0, &body).usage();
    anthropic_usage(&u, pt, 0, 1250, 0);
    assert_eq!(u["input_tokens"], 10);
    let u = messages(&p, KEY, SEC, &body).usage();
    anthropic_usage(&u, pt, 1250, 0, 0);
    // OpenAI: 6000 characters of system message, then "hi"; then the same and "ho".
    let path = "/v1/chat/completions";
    let sys = "y".repeat(6000);
    let u = openai(&p, path, KEY, 0, &chat_body(&sys, "hi")).usage();
    assert_eq!(u["prompt_tokens"], 1509);
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
    let u = openai(&p, path, KEY, SEC, &chat_body(&sys, "ho")).usage();
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 1408);
    assert_eq!(round_openai(1500), 1408);
}

// ------------------------------------------------------------------------------------------
// OpenAI
// ------------------------------------------------------------------------------------------

fn chat_body(sys: &str, question: &str) -> Value {
    json!({"model": "gpt-4o", "messages": [{"role": "system", "content": sys},
                                           {"role": "user", "content": question}]})
}

#[test]
fn openai_chat_caches_prefixes_in_128_token_steps() {
    let p = start();
    let path = "/v1/chat/completions";
    let sys = filler("sys", 1300);
    let first = chat_body(&sys, "What is one?");
    let m0 = tok_json(&first["messages"][0]);
    assert!(m0 >= 1024 && !(m0 - 1024).is_multiple_of(128), "{m0}");
    let u = openai(&p, path, KEY, 0, &first).usage();
    assert_eq!(u["prompt_tokens"], prompt_tokens(&first));
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
    // A new question: the system message matches; its tokens rounded down.
    let second = chat_body(&sys, "And what is two?");
    let u = openai(&p, path, KEY, SEC, &second).usage();
    assert_eq!(
        u["prompt_tokens_details"]["cached_tokens"],
        round_openai(m0)
    );
    assert_eq!(u["prompt_tokens"], prompt_tokens(&second));
    assert_eq!(
        u["total_tokens"],
        prompt_tokens(&second) + u["completion_tokens"].as_u64().unwrap()
    );
    // The same request again: both messages match.
    let both = m0 + tok_json(&second["messages"][1]);
    let mut streamed = second.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = openai(&p, path, KEY, 2 * SEC, &streamed);
    assert_eq!(r.status, 200);
    let chunks = sse_data(&r.body);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"],
        round_openai(both)
    );
    assert_eq!(last["usage"]["prompt_tokens"], prompt_tokens(&second));
    // Prompts under 1024 tokens are never cached.
    let short = chat_body("Be brief.", "hi");
    for now in [3 * SEC, 4 * SEC] {
        let u = openai(&p, path, KEY, now, &short).usage();
        assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
    }
    // In-memory retention: 5 minutes after the last use.
    let u = openai(&p, path, KEY, 2 * SEC + 5 * MIN - 1, &second).usage();
    assert_eq!(
        u["prompt_tokens_details"]["cached_tokens"],
        round_openai(both)
    );
    let u = openai(&p, path, KEY, 2 * SEC + 10 * MIN - 1, &second).usage();
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
}

#[test]
fn openai_entries_live_at_most_an_hour_unless_retained_a_day() {
    let p = start();
    let path = "/v1/chat/completions";
    let sys = filler("sys", 1200);
    let body = chat_body(&sys, "q");
    let both = tok_json(&body["messages"][0]) + tok_json(&body["messages"][1]);
    let cached = |now: u64, b: &Value| {
        openai(&p, path, KEY, now, b).usage()["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached(0, &body), 0);
    // Used every 4 minutes: alive, but never past an hour after the write.
    let mut t = 0;
    while t + 4 * MIN < 60 * MIN {
        t += 4 * MIN;
        assert_eq!(cached(t, &body), round_openai(both), "at {t}");
    }
    assert_eq!(cached(60 * MIN, &body), 0);
    // prompt_cache_retention "24h" (another model, so a cache of its own): a day after the
    // write, whatever the use.
    let mut day = chat_body(&sys, "q2");
    day["model"] = json!("gpt-4.1");
    day["prompt_cache_retention"] = json!("24h");
    let both = tok_json(&day["messages"][0]) + tok_json(&day["messages"][1]);
    let t0 = 100 * MIN;
    assert_eq!(cached(t0, &day), 0);
    assert_eq!(cached(t0 + 23 * 60 * MIN, &day), round_openai(both));
    assert_eq!(cached(t0 + 24 * 60 * MIN, &day), 0);
}

#[test]
fn openai_responses_cached_tokens_streamed_and_not() {
    let p = start();
    let path = "/v1/responses";
    let instructions = filler("inst", 1400);
    let body =
        |input: &str| json!({"model": "gpt-4.1", "instructions": instructions, "input": input});
    // Segments: instructions (a JSON string), then the input as a user message.
    let i = tok(&serde_json::to_string(&instructions).unwrap());
    let first = body("first question");
    let u = openai(&p, path, KEY, 0, &first).usage();
    assert_eq!(u["input_tokens"], prompt_tokens(&first));
    assert_eq!(u["input_tokens_details"]["cached_tokens"], 0);
    let second = body("second question");
    let u = openai(&p, path, KEY, SEC, &second).usage();
    assert_eq!(u["input_tokens_details"]["cached_tokens"], round_openai(i));
    let mut streamed = second.clone();
    streamed["stream"] = json!(true);
    let r = openai(&p, path, KEY, 2 * SEC, &streamed);
    let events = sse_data(&r.body);
    let done = events.last().unwrap();
    assert_eq!(done["type"], "response.completed");
    let whole = i + tok_json(&json!({"content": "second question", "role": "user"}));
    assert_eq!(
        done["response"]["usage"]["input_tokens_details"]["cached_tokens"],
        round_openai(whole)
    );
    // Item inputs: one segment per item.
    let items = json!({"model": "gpt-4.1", "instructions": instructions, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "second question"}]}]});
    let u = openai(&p, path, KEY, 3 * SEC, &items).usage();
    assert_eq!(u["input_tokens_details"]["cached_tokens"], round_openai(i));
    // The kept answer carries the same usage.
    let id = openai(&p, path, KEY, 4 * SEC, &items).json()["id"].clone();
    let kept = p.stored_response(id.as_str().unwrap()).unwrap();
    let item = tok_json(&items["input"][0]);
    assert_eq!(
        kept["usage"]["input_tokens_details"]["cached_tokens"],
        round_openai(i + item)
    );
}

#[test]
fn openai_prompt_cache_key_partitions_the_cache() {
    let p = start();
    let path = "/v1/chat/completions";
    let sys = filler("sys", 1200);
    let keyed = |k: Option<&str>, q: &str| {
        let mut b = chat_body(&sys, q);
        if let Some(k) = k {
            b["prompt_cache_key"] = json!(k);
        }
        b
    };
    let m0 = tok_json(&keyed(None, "x")["messages"][0]);
    let cached = |now: u64, b: &Value| {
        openai(&p, path, KEY, now, b).usage()["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached(0, &keyed(Some("session-a"), "q1")), 0);
    // Same key: shared. Another key, or none: a partition of its own.
    assert_eq!(
        cached(SEC, &keyed(Some("session-a"), "q2")),
        round_openai(m0)
    );
    assert_eq!(cached(2 * SEC, &keyed(Some("session-b"), "q3")), 0);
    assert_eq!(cached(3 * SEC, &keyed(None, "q4")), 0);
    assert_eq!(cached(4 * SEC, &keyed(None, "q5")), round_openai(m0));
    assert_eq!(
        cached(5 * SEC, &keyed(Some("session-b"), "q6")),
        round_openai(m0)
    );
}

/// Routing: one prefix and key take 15 requests a minute on their machine; the next ones
/// overflow, in turn, to 7 other machines, each with its own cache (the 16th request reads
/// nothing, though the prefix was cached). A routing key of its own puts a session on a
/// machine of its own, where its prefix stays cached whatever the others send.
#[test]
fn openai_routes_overflow_past_15_a_minute_and_keys_spread_them() {
    let p = start();
    let path = "/v1/chat/completions";
    let sys = filler("sys", 1200);
    let m0 = tok_json(&chat_body(&sys, "x")["messages"][0]);
    let cached = |now: u64, b: &Value| {
        openai(&p, path, KEY, now, b).usage()["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached(0, &chat_body(&sys, "q0")), 0);
    for i in 1..15 {
        assert_eq!(
            cached(i * SEC, &chat_body(&sys, &format!("q{i}"))),
            round_openai(m0)
        );
    }
    // The 16th within the minute overflows to a machine that never saw the prefix.
    assert_eq!(cached(15 * SEC, &chat_body(&sys, "q15")), 0);
    // A minute after the first, the route takes requests again.
    assert_eq!(cached(61 * SEC, &chat_body(&sys, "q16")), round_openai(m0));
    // A key of its own: another route, not crowded by the unkeyed traffic.
    let mut keyed = chat_body(&sys, "k0");
    keyed["prompt_cache_key"] = json!("ts_session_a");
    assert_eq!(cached(62 * SEC, &keyed), 0);
    keyed["messages"][1]["content"] = json!("k1");
    assert_eq!(cached(63 * SEC, &keyed), round_openai(m0));
}

/// GPT-5.6 and later bill cache writes: `cache_write_tokens` reports what was written beyond
/// the read, and the uncached input excludes it; an earlier model reports no writes.
#[test]
fn openai_writes_are_reported_where_the_model_bills_them() {
    let p = start();
    let path = "/v1/chat/completions";
    let sys = filler("sys", 1200);
    let with_model = |model: &str, q: &str| {
        let mut b = chat_body(&sys, q);
        b["model"] = json!(model);
        b
    };
    let first = with_model("gpt-5.6-luna", "q");
    let boundaries: Vec<u64> = {
        let m0 = tok_json(&first["messages"][0]);
        let m1 = tok_json(&first["messages"][1]);
        vec![m0, m0 + m1]
    };
    let u = openai(&p, path, KEY, 0, &first).usage();
    let details = &u["prompt_tokens_details"];
    assert_eq!(details["cached_tokens"], 0, "{u}");
    assert_eq!(details["cache_write_tokens"], boundaries[1], "{u}");
    let u = openai(&p, path, KEY, SEC, &with_model("gpt-5.6-luna", "other")).usage();
    let details = &u["prompt_tokens_details"];
    let read = round_openai(boundaries[0]);
    assert_eq!(details["cached_tokens"], read, "{u}");
    let m1 = tok_json(&with_model("gpt-5.6-luna", "other")["messages"][1]);
    assert_eq!(
        details["cache_write_tokens"],
        boundaries[0] + m1 - read,
        "{u}"
    );
    let u = openai(&p, path, KEY, 2 * SEC, &with_model("gpt-5.5", "q")).usage();
    assert!(
        u["prompt_tokens_details"]
            .get("cache_write_tokens")
            .is_none(),
        "{u}"
    );
}

/// `--time-scale N`: the cache's lifetimes pass N times faster (a 5-minute entry is gone after
/// 5 minutes ÷ N of request time).
#[test]
fn a_time_scale_divides_the_lifetimes() {
    let p = start_with(ProviderOptions {
        usage: UsageCounting::Cl100k,
        time_scale: 60,
        ..ProviderOptions::default()
    });
    let sys = filler("sys", 1200);
    let body = system_body(SONNET, &sys, "q");
    let pt = prompt_tokens(&body);
    let s = tb(&sys);
    anthropic_usage(&messages(&p, KEY, 0, &body).usage(), pt, 0, s, 0);
    // 4 s is 4 minutes at 60×: still there; 5 s after that read, gone.
    anthropic_usage(&messages(&p, KEY, 4 * SEC, &body).usage(), pt, s, 0, 0);
    anthropic_usage(&messages(&p, KEY, 9 * SEC, &body).usage(), pt, 0, s, 0);
}

/// A cache marker or a routing key is billing, not content: the reply and `P` are those of the
/// same request without it.
#[test]
fn markers_and_routing_keys_change_no_answer() {
    let p = start();
    let sys = filler("sys", 1200);
    let plain = json!({"model": SONNET, "max_tokens": 64, "system": [text(&sys)],
                       "messages": [{"role": "user", "content": "q"}]});
    let marked = json!({"model": SONNET, "max_tokens": 64,
                        "system": [marked(&sys, eph_ttl("1h"))],
                        "messages": [{"role": "user", "content": "q"}]});
    let (a, b) = (
        messages(&p, "k1", 0, &plain).json(),
        messages(&p, "k2", 0, &marked).json(),
    );
    assert_eq!(a["content"], b["content"]);
    let mut keyed = chat_body(&sys, "q");
    keyed["prompt_cache_key"] = json!("ts_x");
    keyed["prompt_cache_retention"] = json!("24h");
    let (c, d) = (
        openai(&p, "/v1/chat/completions", "k3", 0, &chat_body(&sys, "q")).json(),
        openai(&p, "/v1/chat/completions", "k4", 0, &keyed).json(),
    );
    assert_eq!(c["choices"], d["choices"]);
    assert_eq!(c["usage"]["prompt_tokens"], d["usage"]["prompt_tokens"]);
}

// ------------------------------------------------------------------------------------------
// Precedence, the off switch, introspection
// ------------------------------------------------------------------------------------------

#[test]
fn cached_models_keep_their_fixed_rule() {
    let p = start();
    let sys = filler("sys", 1500);
    let body = system_body("claude-cached", &sys, "q");
    let pt = prompt_tokens(&body);
    for now in [0, SEC] {
        let u = messages(&p, KEY, now, &body).usage();
        // R = P/2, W = P/4 whatever the cache: the fixed rule takes precedence.
        anthropic_usage(&u, pt, pt / 2, pt / 4, 0);
    }
    let chat = json!({"model": "gpt-cached", "messages": [{"role": "system", "content": sys}]});
    let pc = prompt_tokens(&chat);
    for now in [0, SEC] {
        let u = openai(&p, "/v1/chat/completions", KEY, now, &chat).usage();
        assert_eq!(u["prompt_tokens_details"]["cached_tokens"], pc / 2);
    }
    // An unmarked request keeps the usage shape of old: no cache_creation object.
    let plain = json!({"model": "claude-cached", "max_tokens": 10,
                       "messages": [{"role": "user", "content": "Hello there, mock!"}]});
    let u = messages(&p, KEY, 0, &plain).usage();
    assert!(u.get("cache_creation").is_none(), "{u}");
    assert_eq!(p.prompt_cache_entries(), 0);
}

#[test]
fn the_off_switch_restores_the_old_figures() {
    let p = start_with(ProviderOptions {
        usage: UsageCounting::Cl100k,
        prompt_cache: false,
        ..ProviderOptions::default()
    });
    let sys = filler("sys", 1500);
    let body = system_body(SONNET, &sys, "q");
    let pt = prompt_tokens(&body);
    for now in [0, SEC] {
        let u = messages(&p, KEY, now, &body).usage();
        assert_eq!(
            u,
            json!({"input_tokens": pt, "output_tokens": u["output_tokens"],
                   "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
        );
    }
    let chat = chat_body(&sys, "q");
    for now in [0, SEC] {
        let u = openai(&p, "/v1/chat/completions", KEY, now, &chat).usage();
        assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
    }
    // Markers are not checked either.
    let five: Vec<Value> = (0..5).map(|i| marked(&format!("p{i}"), eph())).collect();
    let many = json!({"model": SONNET, "max_tokens": 8,
                      "messages": [{"role": "user", "content": five}]});
    assert_eq!(messages(&p, KEY, 0, &many).status, 200);
    assert_eq!(p.prompt_cache_entries(), 0);
    let state = post(&p, "/__mock/cache", &[], &json!({}));
    assert_eq!(state.status, 405);
}

/// Starts the binary with `args`/`env` and returns it with its base URL.
fn spawn_binary(args: &[&str], env: &[(&str, &str)]) -> (std::process::Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tokensaver-mock-provider"));
    cmd.args(["--listen", "127.0.0.1:0", "--usage", "cl100k"])
        .args(args)
        .env_remove("TOKENSAVER_MOCK_NO_PROMPT_CACHE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("mock provider listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    (child, url)
}

#[test]
fn the_binary_flag_and_environment_turn_caching_off() {
    let sys = filler("sys", 1500);
    let body = system_body(SONNET, &sys, "q");
    let s = tb(&sys);
    let second_read = |args: &[&str], env: &[(&str, &str)]| {
        let (mut child, url) = spawn_binary(args, env);
        let headers = [("x-api-key", KEY)];
        post_to(&url, "/v1/messages", &headers, &body).usage();
        let u = post_to(&url, "/v1/messages", &headers, &body).usage();
        let enabled = ureq::get(&format!("{url}/__mock/cache"))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        let enabled = serde_json::from_str::<Value>(&enabled).unwrap()["enabled"].clone();
        child.kill().unwrap();
        child.wait().unwrap();
        (u["cache_read_input_tokens"].as_u64().unwrap(), enabled)
    };
    assert_eq!(second_read(&[], &[]), (s, json!(true)));
    assert_eq!(second_read(&["--no-prompt-cache"], &[]), (0, json!(false)));
    assert_eq!(
        second_read(&[], &[("TOKENSAVER_MOCK_NO_PROMPT_CACHE", "1")]),
        (0, json!(false))
    );
}

#[test]
fn introspection_reports_the_billed_usage_and_resets_the_cache() {
    let p = start();
    let base = p.base_url();
    let sys = filler("sys", 1200);
    let s = tb(&sys);
    let body = system_body(SONNET, &sys, "q");
    let pt = prompt_tokens(&body);
    messages(&p, KEY, 0, &body).usage();
    messages(&p, KEY, SEC, &body).usage();
    let get = |path: &str| -> Value {
        let body = ureq::get(&format!("{base}{path}"))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        serde_json::from_str(&body).unwrap()
    };
    let recs = get("/__mock/requests?path=/v1/messages");
    let usage = |i: usize| recs[i]["reported_usage"].clone();
    assert_eq!(usage(0)["cache_creation_input_tokens"], s);
    assert_eq!(
        usage(0)["cache_creation"],
        json!({"ephemeral_5m_input_tokens": s, "ephemeral_1h_input_tokens": 0})
    );
    assert_eq!(usage(0)["input_tokens"], pt - s);
    assert_eq!(usage(1)["cache_read_input_tokens"], s);
    assert_eq!(usage(1)["cached_tokens"], s);
    assert_eq!(usage(1)["cache_creation_input_tokens"], 0);
    assert_eq!(p.requests()[1].usage.unwrap().cache_read_input_tokens, s);
    let state = get("/__mock/cache");
    assert_eq!(state, json!({"enabled": true, "entries": 1}));
    // Dropping the cache: the next call writes again.
    let reset = post_to(&base, "/__mock/cache/reset", &[], &json!({})).json();
    assert_eq!(reset, json!({"ok": true, "dropped": 1}));
    let u = messages(&p, KEY, 2 * SEC, &body).usage();
    anthropic_usage(&u, pt, 0, s, 0);
    // POST /__mock/reset drops it too.
    post_to(&base, "/__mock/reset", &[], &json!({}));
    assert_eq!(p.prompt_cache_entries(), 0);
    let u = messages(&p, KEY, 3 * SEC, &body).usage();
    anthropic_usage(&u, pt, 0, s, 0);
    // A refused call records no billed usage; a fault-500 neither reads nor writes.
    let fault = system_body("fault-500", &sys, "q");
    assert_eq!(messages(&p, KEY, 4 * SEC, &fault).status, 500);
    assert_eq!(messages(&p, KEY, 5 * SEC, &fault).status, 500);
    assert!(p.last_request().unwrap().usage.is_none());
    assert_eq!(p.prompt_cache_entries(), 1);
    assert_eq!(
        post_to(&base, "/__mock/clock", &[], &json!({"later": 1})).status,
        400
    );
}
