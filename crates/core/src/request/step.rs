//! The step fingerprint (SPEC §2.1): a request's identity without its growing middle.
//!
//! An agent that is stuck sends, step after step, a longer history that ends the same way:
//! the model asked for the same tool call and got the same result. Its fingerprints all
//! differ; its step fingerprints do not. The step input is the route, model, system and
//! tools, then the tail from the newest assistant turn on: that turn's tool calls (names and
//! arguments — not its text or thinking, which vary) and every turn after it (tool results,
//! user turns). Ids that the provider or the client generate per call, and cache hints, are
//! left out of the tail: they differ between two identical steps. The tool results in the
//! tail are [normalised](super::normalise): a clock, a duration, an id or the client's own
//! envelope in a command's output reads as its kind, so a stuck agent whose tool prints one
//! still repeats its step. Only the step input is normalised: the fingerprint and the bytes
//! forwarded are the caller's.

use std::borrow::Cow;

use super::canonical::{keyed_in_place, PAD_TO};
use super::json::{write_compact, write_key, write_without_keys, Json, Object};
use super::normalise::{normalise, NORMALISATION_VERSION};
use super::{Hash, Route};

/// v3: tool results normalised (normalisation 1). v2 hashed them as sent.
const STEP_DOMAIN: &[u8] = b"tokensaver step v3\0";
/// The normalisation the step domain stands for: a new normalisation is a new step identity.
const STEP_NORMALISATION: u32 = 1;
const _: () = assert!(
    NORMALISATION_VERSION == STEP_NORMALISATION,
    "the normalisation moved: move STEP_DOMAIN (and the digest version) with it"
);

/// Keys that vary between identical steps without changing what is asked: per-call ids,
/// item status and prompt-cache hints.
const VOLATILE: &[&str] = &[
    "cache_control",
    "call_id",
    "id",
    "status",
    "tool_call_id",
    "tool_use_id",
];

/// The step fingerprint, or `None` when the request has no assistant turn (it is then the
/// fingerprint itself).
pub(super) fn step_fingerprint(route: Route, body: &Object, key: &[u8; 32]) -> Option<Hash> {
    // A typical step (system, tools, the tail) fits the padded size of one block.
    let mut buf = Vec::with_capacity(PAD_TO);
    buf.extend_from_slice(STEP_DOMAIN);
    buf.extend_from_slice(route.as_str().as_bytes());
    buf.push(0);
    // One JSON array: [model, system, tools, calls, after].
    buf.push(b'[');
    write_compact(&mut buf, body.get("model").unwrap_or(&Json::Null));
    buf.push(b',');
    let found = match route {
        Route::OpenAiChat => chat(&mut buf, body),
        Route::AnthropicMessages => anthropic(&mut buf, body),
        Route::OpenAiResponses => responses(&mut buf, body),
    };
    if !found {
        return None;
    }
    buf.push(b']');
    Some(keyed_in_place(key, &mut buf))
}

fn items<'b>(body: &'b Object, field: &str) -> &'b [Json<'b>] {
    match body.get(field) {
        Some(Json::Array(items)) => items,
        _ => &[],
    }
}

fn string_field<'b>(value: &'b Json, field: &str) -> Option<std::borrow::Cow<'b, str>> {
    value
        .get(field)
        .and_then(Json::as_string)
        .map(|s| s.to_cow())
}

/// Writes `tools, [calls], [after]` after the system part has been written.
fn tools_calls_after<'b>(
    buf: &mut Vec<u8>,
    body: &Object,
    calls: impl Iterator<Item = &'b Json<'b>>,
    write_call: impl Fn(&mut Vec<u8>, &Json),
    after: impl Iterator<Item = &'b Json<'b>>,
) {
    write_without_keys(
        buf,
        body.get("tools").unwrap_or(&Json::Null),
        &["cache_control"],
    );
    buf.push(b',');
    buf.push(b'[');
    for (i, call) in calls.enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write_call(buf, call);
    }
    buf.extend_from_slice(b"],[");
    for (i, turn) in after.enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write_tail(buf, turn);
    }
    buf.push(b']');
}

/// A turn of the tail: [`write_without_keys`] with [`VOLATILE`], the tool results in it
/// normalised.
fn write_tail(buf: &mut Vec<u8>, value: &Json) {
    match value {
        Json::Array(items) => {
            buf.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                write_tail(buf, item);
            }
            buf.push(b']');
        }
        Json::Object(object) => {
            let result = result_member(value);
            write_object(buf, object, |buf, key, member| {
                if Some(key) == result {
                    write_result(buf, member);
                } else {
                    write_tail(buf, member);
                }
            });
        }
        scalar => write_compact(buf, scalar),
    }
}

/// Which member of an object holds a tool result: a chat `role: "tool"` (or legacy
/// `"function"`) message's `content`, an Anthropic `tool_result` block's `content`, a
/// Responses `*_output` item's `output` (`function_call_output`, `custom_tool_call_output`,
/// `local_shell_call_output`, …).
fn result_member(value: &Json) -> Option<&'static str> {
    if role_is(value, &["tool", "function"]) {
        return Some("content");
    }
    let kind = value.get("type").and_then(Json::as_string)?;
    let kind = kind.to_cow();
    if kind == "tool_result" || kind.ends_with("_tool_result") {
        Some("content")
    } else if kind.ends_with("_output") {
        Some("output")
    } else {
        None
    }
}

/// A tool result: a string, or a list of parts whose `text` is; each normalised. Other parts
/// (images, files) are written as sent.
fn write_result(buf: &mut Vec<u8>, value: &Json) {
    match value {
        Json::String(_) => write_normalised(buf, value),
        Json::Array(parts) => {
            buf.push(b'[');
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                match part {
                    Json::String(_) => write_normalised(buf, part),
                    Json::Object(object) => write_object(buf, object, |buf, key, member| {
                        if key == "text" {
                            write_normalised(buf, member);
                        } else {
                            write_without_keys(buf, member, VOLATILE);
                        }
                    }),
                    other => write_without_keys(buf, other, VOLATILE),
                }
            }
            buf.push(b']');
        }
        other => write_without_keys(buf, other, VOLATILE),
    }
}

/// A string as its normalised text (as sent when nothing in it is noise); anything else as
/// sent.
fn write_normalised(buf: &mut Vec<u8>, value: &Json) {
    let Json::String(s) = value else {
        return write_without_keys(buf, value, VOLATILE);
    };
    let text = s.to_cow();
    match normalise(&text) {
        Cow::Borrowed(_) => write_compact(buf, value),
        // Writing into a Vec cannot fail.
        Cow::Owned(normalised) => {
            let _ = serde_json::to_writer(&mut *buf, normalised.as_str());
        }
    }
}

/// An object without its [`VOLATILE`] members, each other member written by `member`.
fn write_object(
    buf: &mut Vec<u8>,
    object: &Object,
    member: impl Fn(&mut Vec<u8>, &str, &Json),
) {
    buf.push(b'{');
    let kept = object
        .members()
        .iter()
        .filter(|(key, _)| !VOLATILE.contains(&key.as_ref()));
    for (i, (key, value)) in kept.enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write_key(buf, key);
        buf.push(b':');
        member(buf, key, value);
    }
    buf.push(b'}');
}

/// `[name, arguments]` of a call, each as sent.
fn write_call_pair(buf: &mut Vec<u8>, name: Option<&Json>, arguments: Option<&Json>) {
    buf.push(b'[');
    write_compact(buf, name.unwrap_or(&Json::Null));
    buf.push(b',');
    write_compact(buf, arguments.unwrap_or(&Json::Null));
    buf.push(b']');
}

fn role_is(item: &Json, wanted: &[&str]) -> bool {
    item.get("role")
        .and_then(Json::as_string)
        .is_some_and(|role| wanted.iter().any(|w| role.is(w)))
}

fn is_system(item: &Json) -> bool {
    role_is(item, &["system", "developer"])
}

fn chat(buf: &mut Vec<u8>, body: &Object) -> bool {
    let messages = items(body, "messages");
    let Some(last) = messages.iter().rposition(|m| role_is(m, &["assistant"])) else {
        return false;
    };
    buf.push(b'[');
    let system = messages.iter().filter(|m| is_system(m));
    for (i, message) in system.enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write_without_keys(buf, message.get("content").unwrap_or(&Json::Null), VOLATILE);
    }
    buf.extend_from_slice(b"],");
    let assistant = &messages[last];
    let calls = match assistant.get("tool_calls") {
        Some(Json::Array(calls)) => calls.as_slice(),
        _ => &[],
    };
    let legacy = assistant.get("function_call").into_iter();
    tools_calls_after(
        buf,
        body,
        calls.iter().chain(legacy),
        |buf, call| {
            // `{function: {name, arguments}}`, `{custom: {name, input}}`, or a legacy
            // `function_call` that is itself `{name, arguments}`.
            let inner = call
                .get("function")
                .or_else(|| call.get("custom"))
                .unwrap_or(call);
            write_call_pair(
                buf,
                inner.get("name"),
                inner.get("arguments").or_else(|| inner.get("input")),
            )
        },
        messages[last + 1..].iter().filter(|m| !is_system(m)),
    );
    true
}

fn anthropic(buf: &mut Vec<u8>, body: &Object) -> bool {
    let messages = items(body, "messages");
    let Some(last) = messages.iter().rposition(|m| role_is(m, &["assistant"])) else {
        return false;
    };
    write_without_keys(buf, body.get("system").unwrap_or(&Json::Null), VOLATILE);
    buf.push(b',');
    let blocks = match messages[last].get("content") {
        Some(Json::Array(blocks)) => blocks.as_slice(),
        _ => &[],
    };
    let calls = blocks.iter().filter(|b| {
        matches!(
            string_field(b, "type").as_deref(),
            Some("tool_use" | "server_tool_use")
        )
    });
    tools_calls_after(
        buf,
        body,
        calls,
        |buf, call| write_call_pair(buf, call.get("name"), call.get("input")),
        messages[last + 1..].iter(),
    );
    true
}

/// Whether a Responses input item was produced by the model (a message from the assistant,
/// reasoning, a tool call) rather than sent to it (user and system messages, tool outputs).
fn model_item(item: &Json) -> bool {
    if role_is(item, &["system", "developer", "user"]) {
        return false;
    }
    match string_field(item, "type").as_deref() {
        // An item without a type is a message.
        Some("message") | None => role_is(item, &["assistant"]),
        Some(kind) => {
            !(kind.ends_with("_output") || kind.ends_with("_response") || kind == "item_reference")
        }
    }
}

fn responses(buf: &mut Vec<u8>, body: &Object) -> bool {
    let input = items(body, "input");
    let Some(last) = input.iter().rposition(model_item) else {
        return false;
    };
    // One answer may be several items (reasoning, calls, a message): the turn is the run of
    // model items that ends at the newest one.
    let first = input[..last]
        .iter()
        .rposition(|item| !model_item(item))
        .map_or(0, |i| i + 1);
    buf.push(b'[');
    write_compact(buf, body.get("instructions").unwrap_or(&Json::Null));
    // System and developer items whole (a message's content, Codex's `additional_tools`).
    for item in input.iter().filter(|item| is_system(item)) {
        buf.push(b',');
        write_without_keys(buf, item, VOLATILE);
    }
    buf.extend_from_slice(b"],");
    let calls = input[first..=last].iter().filter(|item| {
        string_field(item, "type")
            .as_deref()
            .is_some_and(|kind| kind.ends_with("_call"))
    });
    tools_calls_after(
        buf,
        body,
        calls,
        |buf, call| write_without_keys(buf, call, VOLATILE),
        input[last + 1..].iter().filter(|item| !is_system(item)),
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    const KEY: [u8; 32] = [7; 32];

    fn shape(route: Route, body: &str) -> crate::request::RequestShape {
        parse(route, body.as_bytes(), &KEY).unwrap().shape
    }

    /// A chat history of `steps` identical tool steps (fresh call ids each time, as a real
    /// provider gives), then `result` as the newest tool result.
    fn chat_loop(steps: usize, result: &str) -> String {
        let mut messages = vec![
            r#"{"role":"system","content":"be terse"}"#.to_string(),
            r#"{"role":"user","content":"check the build"}"#.to_string(),
        ];
        for i in 0..steps {
            let out = if i + 1 == steps { result } else { "same" };
            messages.push(format!(
                r#"{{"role":"assistant","content":"thinking {i}","tool_calls":[{{"id":"call_{i}","type":"function","function":{{"name":"sh","arguments":"{{\"cmd\":\"make\"}}"}}}}]}}"#
            ));
            messages.push(format!(
                r#"{{"role":"tool","tool_call_id":"call_{i}","content":"{out}"}}"#
            ));
        }
        format!(
            r#"{{"model":"m","tools":[{{"type":"function","function":{{"name":"sh"}}}}],"messages":[{}]}}"#,
            messages.join(",")
        )
    }

    #[test]
    fn a_stuck_chat_agent_repeats_its_step_not_its_fingerprint() {
        let a = shape(Route::OpenAiChat, &chat_loop(3, "same"));
        let b = shape(Route::OpenAiChat, &chat_loop(4, "same"));
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_eq!(a.step_fingerprint, b.step_fingerprint);
        // Progress: a different tool result is a different step.
        let c = shape(Route::OpenAiChat, &chat_loop(5, "other"));
        assert_ne!(b.step_fingerprint, c.step_fingerprint);
    }

    #[test]
    fn without_an_assistant_turn_the_step_is_the_fingerprint() {
        let s = shape(
            Route::OpenAiChat,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        );
        assert_eq!(s.step_fingerprint, s.fingerprint);
        let r = shape(Route::OpenAiResponses, r#"{"model":"m","input":"hi"}"#);
        assert_eq!(r.step_fingerprint, r.fingerprint);
    }

    fn anthropic_loop(steps: usize, result: &str, marker_on_last: bool) -> String {
        let mut messages = vec![r#"{"role":"user","content":"go"}"#.to_string()];
        for i in 0..steps {
            let out = if i + 1 == steps { result } else { "same" };
            let cache = if marker_on_last && i + 1 == steps {
                r#","cache_control":{"type":"ephemeral"}"#
            } else {
                ""
            };
            messages.push(format!(
                r#"{{"role":"assistant","content":[{{"type":"thinking","thinking":"t{i}","signature":"s{i}"}},{{"type":"tool_use","id":"toolu_{i}","name":"Bash","input":{{"command":"ls"}}}}]}}"#
            ));
            messages.push(format!(
                r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"toolu_{i}","content":"{out}"{cache}}}]}}"#
            ));
        }
        format!(
            r#"{{"model":"c","max_tokens":10,"system":[{{"type":"text","text":"sys","cache_control":{{"type":"ephemeral"}}}}],"tools":[{{"name":"Bash","input_schema":{{}}}}],"messages":[{}]}}"#,
            messages.join(",")
        )
    }

    #[test]
    fn a_stuck_anthropic_agent_repeats_its_step() {
        let a = shape(Route::AnthropicMessages, &anthropic_loop(2, "same", false));
        let b = shape(Route::AnthropicMessages, &anthropic_loop(6, "same", true));
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_eq!(a.step_fingerprint, b.step_fingerprint);
        let c = shape(Route::AnthropicMessages, &anthropic_loop(6, "new", true));
        assert_ne!(b.step_fingerprint, c.step_fingerprint);
    }

    fn responses_loop(steps: usize, result: &str) -> String {
        let mut input = vec![
            r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"go"}]}"#
                .to_string(),
        ];
        for i in 0..steps {
            let out = if i + 1 == steps { result } else { "same" };
            input.push(format!(
                r#"{{"type":"reasoning","id":"rs_{i}","summary":[],"encrypted_content":"e{i}"}}"#
            ));
            input.push(format!(
                r#"{{"type":"function_call","id":"fc_{i}","call_id":"call_{i}","name":"shell","arguments":"{{\"command\":[\"ls\"]}}","status":"completed"}}"#
            ));
            input.push(format!(
                r#"{{"type":"function_call_output","call_id":"call_{i}","output":"{out}"}}"#
            ));
        }
        format!(
            r#"{{"model":"g","instructions":"be useful","tools":[{{"type":"function","name":"shell","parameters":{{}}}}],"input":[{}]}}"#,
            input.join(",")
        )
    }

    #[test]
    fn a_stuck_responses_agent_repeats_its_step() {
        let a = shape(Route::OpenAiResponses, &responses_loop(2, "same"));
        let b = shape(Route::OpenAiResponses, &responses_loop(3, "same"));
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_eq!(a.step_fingerprint, b.step_fingerprint);
        let c = shape(Route::OpenAiResponses, &responses_loop(3, "new"));
        assert_ne!(b.step_fingerprint, c.step_fingerprint);
    }

    #[test]
    fn the_step_is_keyed_and_bound_to_route_and_model() {
        let body = chat_loop(2, "same");
        let a = parse(Route::OpenAiChat, body.as_bytes(), &[1; 32])
            .unwrap()
            .shape;
        let b = parse(Route::OpenAiChat, body.as_bytes(), &[2; 32])
            .unwrap()
            .shape;
        assert_ne!(a.step_fingerprint, b.step_fingerprint);
        let other_model = body.replacen(r#""model":"m""#, r#""model":"n""#, 1);
        let c = shape(Route::OpenAiChat, &other_model);
        assert_ne!(
            shape(Route::OpenAiChat, &body).step_fingerprint,
            c.step_fingerprint
        );
    }
}
