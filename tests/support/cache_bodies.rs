//! Request bodies the cache tests send: long enough for every provider to cache, marked as
//! Claude Code marks its own breakpoints.

use serde_json::{json, Value};

pub const SONNET: &str = "claude-sonnet-4-5";
/// Claude Sonnet 4.5 at its list prices (the test harness prices its undated name flat).
pub const SONNET_LISTED: &str = "claude-sonnet-4-5-20250929";
pub const SONNET_LISTED_PRICES: &str = "\n[prices.\"claude-sonnet-4-5-20250929\"]\n\
    input = 3_000_000\ncache_write = 3_750_000\ncache_write_1h = 6_000_000\n\
    cache_read = 300_000\noutput = 15_000_000\nmax_output = 64_000\n";
/// Takes `prompt_cache_retention` and bills no cache write: the gate may set 24 h retention.
pub const GPT5_MINI: &str = "gpt-5-mini";

/// A system prompt well past every model's minimum cacheable prefix (4,096 tokens).
pub fn long_text(seed: &str) -> String {
    (0..900)
        .map(|i| format!("{seed} rule {i}: keep the answer short and cite the file. "))
        .collect()
}

/// An Anthropic call that marks its own breakpoints, as Claude Code does: the system block and
/// the last message, each `{"type":"ephemeral"}` (`ttl` given: the caller chose the lifetime).
pub fn marked_anthropic(ttl: Option<&str>) -> String {
    let marker = match ttl {
        Some(t) => format!(r#"{{"type":"ephemeral","ttl":"{t}"}}"#),
        None => r#"{"type":"ephemeral"}"#.to_string(),
    };
    format!(
        r#"{{"model":"{SONNET}","max_tokens":100,"system":[{{"type":"text","text":{},"cache_control":{marker}}}],"messages":[{{"role":"user","content":[{{"type":"text","text":"List the files.","cache_control":{marker}}}]}}]}}"#,
        serde_json::to_string(&long_text("system")).unwrap()
    )
}

pub fn openai_chat(model: &str, extra: &str) -> String {
    format!(
        r#"{{"model":"{model}","max_completion_tokens":100{extra},"messages":[{{"role":"system","content":{}}},{{"role":"user","content":"List the files."}}]}}"#,
        serde_json::to_string(&long_text("agent")).unwrap()
    )
}

/// The members the gate added before the body's closing brace, as an object; every other
/// byte must be the caller's.
pub fn added_members(sent: &str, seen: &[u8]) -> Value {
    let close = sent.rfind('}').unwrap();
    let (head, tail) = (&sent.as_bytes()[..close], &sent.as_bytes()[close..]);
    assert!(seen.starts_with(head), "the caller's bytes are kept");
    assert!(seen.ends_with(tail), "the caller's bytes are kept");
    let added = std::str::from_utf8(&seen[head.len()..seen.len() - tail.len()]).unwrap();
    if added.is_empty() {
        return json!({});
    }
    serde_json::from_str(&format!("{{{}}}", added.strip_prefix(',').unwrap())).unwrap()
}

/// Call `turn` of a session whose history grows, marking its own breakpoints as Claude Code
/// does (the system block and the newest message); `seed` keeps two runs' prefixes apart.
pub fn session_call(seed: &str, turn: usize) -> String {
    let marker = r#"{"type":"ephemeral"}"#;
    let mut messages = Vec::new();
    for t in 0..turn {
        messages.push(format!(
            r#"{{"role":"user","content":"Step {t}: what next?"}},{{"role":"assistant","content":"Run the tests of module {t} and report."}}"#
        ));
    }
    messages.push(format!(
        r#"{{"role":"user","content":[{{"type":"text","text":"Step {turn}: what next?","cache_control":{marker}}}]}}"#
    ));
    format!(
        r#"{{"model":"{SONNET_LISTED}","max_tokens":100,"system":[{{"type":"text","text":{},"cache_control":{marker}}}],"messages":[{}]}}"#,
        serde_json::to_string(&long_text(seed)).unwrap(),
        messages.join(",")
    )
}
