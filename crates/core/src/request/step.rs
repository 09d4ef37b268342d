//! The step fingerprint (SPEC §2.1): a request's identity without its growing middle.
//!
//! An agent that is stuck sends, step after step, a longer history that ends the same way:
//! the model asked for the same tool call and got the same result. Its fingerprints all
//! differ; its step fingerprints do not. The step input is the route, model, system and
//! tools, then the tail from the newest assistant turn on: that turn's tool calls (names and
//! arguments — not its text or thinking, which vary) and every turn after it (tool results,
//! user turns). A turn without a tool call is named by its text instead: a person who answers
//! two different assistant texts with the same word ("continue") takes two steps, not one.
//! A Responses call that continues a stored response (`previous_response_id`, no model item
//! in its input) has its newest assistant turn on the provider's side: its step names that
//! response's [answer identity](answer_identity), which the proxy reads off the answer it
//! relayed, and never the response id (a new one at every step). Ids that the provider or the client generate per call, and cache hints, are
//! left out of the tail: they differ between two identical steps. The tool results in the
//! tail are [normalised](super::normalise): a clock, a duration, an id or the client's own
//! envelope in a command's output reads as its kind, so a stuck agent whose tool prints one
//! still repeats its step. Only the step input is normalised: the fingerprint and the bytes
//! forwarded are the caller's.

use std::borrow::Cow;
use std::ops::Range;

use super::canonical::{keyed, keyed_in_place, PAD_TO};
use super::json::{write_compact, write_object_without, write_without_keys, Json, Object};
use super::normalise::{normalise, NORMALISATION_VERSION};
use super::{Hash, Route};

/// v5: a system turn after the newest assistant turn of a Messages call is not in the tail.
/// v4: a turn without a tool call named by its text, chained Responses calls by the answer they
/// continue, normalisation 2 (colour codes removed first). v3: tool results normalised
/// (normalisation 1). v2 hashed them as sent.
const STEP_DOMAIN: &[u8] = b"tokensaver step v5\0";
/// The normalisation the step domain stands for: a new normalisation is a new step identity.
const STEP_NORMALISATION: u32 = 2;
/// The domain of an answer's identity (a stored response's calls or text).
const ANSWER_DOMAIN: &[u8] = b"tokensaver answer v1\0";
/// The domain of a step's action: the tool calls of its newest assistant turn, without what
/// they returned.
const ACTION_DOMAIN: &[u8] = b"tokensaver action v1\0";
const _: () = assert!(
    NORMALISATION_VERSION == STEP_NORMALISATION,
    "the normalisation moved: move STEP_DOMAIN (and the digest version) with it"
);

/// Keys that vary between identical steps without changing what is asked: per-call ids,
/// item status and prompt-cache hints.
pub(super) const VOLATILE: &[&str] = &[
    "cache_control",
    "call_id",
    "id",
    "status",
    "tool_call_id",
    "tool_use_id",
];

/// A step's identity, and its action's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The step fingerprint.
    pub fingerprint: Hash,
    /// The keyed hash of the route and the newest assistant turn's tool calls (names and
    /// arguments), without their results: two steps with one action and two results are one
    /// call that answered twice. `None` for a turn without a tool call and for a chained
    /// Responses call (whose calls are the stored response's).
    pub action: Option<Hash>,
}

/// The step fingerprint and action, or `None` when the request has no assistant turn (its
/// step is then the fingerprint itself). A chained Responses call is read with its
/// predecessor's answer unknown ([`chained_step`] names it).
pub(super) fn step_fingerprint(route: Route, body: &Object, key: &[u8; 32]) -> Option<Step> {
    step_with(route, body, key, None)
}

/// The step of a Responses call that continues a stored response, given the identity of that
/// response's answer ([`answer_identity`]): `None` when the call is no such continuation.
pub fn chained_step(body: &Object, key: &[u8; 32], previous: &Hash) -> Option<Hash> {
    chained(body)?;
    step_with(Route::OpenAiResponses, body, key, Some(previous)).map(|step| step.fingerprint)
}

/// The identity of a model answer as the step of the call after it names it: the answer's
/// tool calls (each `*_call` item without per-call ids and status) or, with none, its message
/// text — keyed like every step. `output` is a Responses answer's `output` array.
pub fn answer_identity(output: &Json, key: &[u8; 32]) -> Hash {
    let items = match output {
        Json::Array(items) => items.as_slice(),
        _ => &[],
    };
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(ANSWER_DOMAIN);
    let calls: Vec<&Json> = items.iter().filter(|item| is_call(item)).collect();
    let text: Vec<&Json> = items
        .iter()
        .filter(|item| is_assistant_message(item))
        .filter_map(|item| item.get("content"))
        .collect();
    write_answer(
        &mut buf,
        &calls,
        |buf, call| write_without_keys(buf, call, VOLATILE),
        &text,
    );
    keyed_in_place(key, &mut buf)
}

/// Whether a Responses call continues a stored response with nothing of the model's in its
/// input: the assistant turn its step needs is the stored response's answer.
fn chained(body: &Object) -> Option<()> {
    let continues = matches!(body.get("previous_response_id"), Some(Json::String(_)));
    (continues && !items(body, "input").iter().any(model_item)).then_some(())
}

fn step_with(route: Route, body: &Object, key: &[u8; 32], previous: Option<&Hash>) -> Option<Step> {
    // A typical step (system, tools, the tail) fits the padded size of one block.
    let mut buf = Vec::with_capacity(PAD_TO);
    buf.extend_from_slice(STEP_DOMAIN);
    buf.extend_from_slice(route.as_str().as_bytes());
    buf.push(0);
    // One JSON array: [model, system, tools, calls, after].
    buf.push(b'[');
    write_compact(&mut buf, body.get("model").unwrap_or(&Json::Null));
    buf.push(b',');
    let answer = match route {
        Route::OpenAiChat => chat(&mut buf, body),
        Route::AnthropicMessages => anthropic(&mut buf, body),
        Route::OpenAiResponses => responses(&mut buf, body, previous),
    }?;
    // Calls are written as an array; a text answer and a chained call's as an object.
    let action = (buf.get(answer.start) == Some(&b'[')).then(|| {
        keyed(
            key,
            &[ACTION_DOMAIN, route.as_str().as_bytes(), &buf[answer]],
        )
    });
    buf.push(b']');
    Some(Step {
        fingerprint: keyed_in_place(key, &mut buf),
        action,
    })
}

pub(super) fn items<'b>(body: &'b Object, field: &str) -> &'b [Json<'b>] {
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

/// Writes `tools, answer, [after]` after the system part has been written: where the answer
/// is in `buf`.
fn tools_calls_after<'b>(
    buf: &mut Vec<u8>,
    body: &Object,
    answer: impl FnOnce(&mut Vec<u8>),
    after: impl Iterator<Item = &'b Json<'b>>,
) -> Range<usize> {
    write_without_keys(
        buf,
        body.get("tools").unwrap_or(&Json::Null),
        &["cache_control"],
    );
    buf.push(b',');
    let start = buf.len();
    answer(buf);
    let answer = start..buf.len();
    buf.extend_from_slice(b",[");
    for (i, turn) in after.enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write_tail(buf, turn);
    }
    buf.push(b']');
    answer
}

/// The newest assistant turn as a step names it: `[calls…]` when it called tools (names and
/// arguments, never its text or thinking, which vary while an agent is stuck), else
/// `{"text":[…]}`, its text parts as sent without per-call ids (SPEC §2.3: a turn without a
/// tool call is a step only together with the assistant text it answers).
fn write_answer(
    buf: &mut Vec<u8>,
    calls: &[&Json],
    write_call: impl Fn(&mut Vec<u8>, &Json),
    text: &[&Json],
) {
    if calls.is_empty() {
        buf.extend_from_slice(br#"{"text":["#);
        for (i, part) in text.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            write_without_keys(buf, part, VOLATILE);
        }
        buf.extend_from_slice(b"]}");
        return;
    }
    buf.push(b'[');
    for (i, call) in calls.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write_call(buf, call);
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
fn write_object(buf: &mut Vec<u8>, object: &Object, member: impl Fn(&mut Vec<u8>, &str, &Json)) {
    write_object_without(buf, object, VOLATILE, member);
}

/// `[name, arguments]` of a call, each as sent.
fn write_call_pair(buf: &mut Vec<u8>, name: Option<&Json>, arguments: Option<&Json>) {
    buf.push(b'[');
    write_compact(buf, name.unwrap_or(&Json::Null));
    buf.push(b',');
    write_compact(buf, arguments.unwrap_or(&Json::Null));
    buf.push(b']');
}

pub(super) fn role_is(item: &Json, wanted: &[&str]) -> bool {
    item.get("role")
        .and_then(Json::as_string)
        .is_some_and(|role| wanted.iter().any(|w| role.is(w)))
}

pub(super) fn is_system(item: &Json) -> bool {
    role_is(item, &["system", "developer"])
}

fn chat(buf: &mut Vec<u8>, body: &Object) -> Option<Range<usize>> {
    let messages = items(body, "messages");
    let last = messages.iter().rposition(|m| role_is(m, &["assistant"]))?;
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
    let calls: Vec<&Json> = calls.iter().chain(legacy).collect();
    let text: Vec<&Json> = assistant.get("content").into_iter().collect();
    let write_call = |buf: &mut Vec<u8>, call: &Json| {
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
    };
    let answer = tools_calls_after(
        buf,
        body,
        |buf| write_answer(buf, &calls, write_call, &text),
        messages[last + 1..].iter().filter(|m| !is_system(m)),
    );
    Some(answer)
}

fn anthropic(buf: &mut Vec<u8>, body: &Object) -> Option<Range<usize>> {
    let messages = items(body, "messages");
    let last = messages.iter().rposition(|m| role_is(m, &["assistant"]))?;
    write_without_keys(buf, body.get("system").unwrap_or(&Json::Null), VOLATILE);
    buf.push(b',');
    let blocks = match messages[last].get("content") {
        Some(Json::Array(blocks)) => blocks.as_slice(),
        _ => &[],
    };
    let calls: Vec<&Json> = blocks
        .iter()
        .filter(|b| {
            matches!(
                string_field(b, "type").as_deref(),
                Some("tool_use" | "server_tool_use")
            )
        })
        .collect();
    // A text answer is its `text` blocks (thinking is signed and varies); a plain string
    // content is the text itself.
    let text: Vec<&Json> = match messages[last].get("content") {
        Some(Json::Array(blocks)) => blocks
            .iter()
            .filter(|b| string_field(b, "type").as_deref() == Some("text"))
            .filter_map(|b| b.get("text"))
            .collect(),
        other => other.into_iter().collect(),
    };
    let answer = tools_calls_after(
        buf,
        body,
        |buf| {
            write_answer(
                buf,
                &calls,
                |buf, call| write_call_pair(buf, call.get("name"), call.get("input")),
                &text,
            )
        },
        // A system turn the client appends after a tool result (Claude Code's "The user hasn't
        // heard from you in a while" after a pause) is not the agent's progress: left out, as
        // chat's are, or every hold would start a stuck agent's schedule afresh.
        messages[last + 1..].iter().filter(|m| !is_system(m)),
    );
    Some(answer)
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

fn is_call(item: &Json) -> bool {
    string_field(item, "type")
        .as_deref()
        .is_some_and(|kind| kind.ends_with("_call"))
}

fn is_assistant_message(item: &Json) -> bool {
    matches!(
        string_field(item, "type").as_deref(),
        Some("message") | None
    ) && role_is(item, &["assistant"])
}

/// `[instructions, system items…]`: a Responses call's system part.
fn responses_system(buf: &mut Vec<u8>, body: &Object, input: &[Json]) {
    buf.push(b'[');
    write_compact(buf, body.get("instructions").unwrap_or(&Json::Null));
    // System and developer items whole (a message's content, Codex's `additional_tools`).
    for item in input.iter().filter(|item| is_system(item)) {
        buf.push(b',');
        write_without_keys(buf, item, VOLATILE);
    }
    buf.extend_from_slice(b"],");
}

fn responses(buf: &mut Vec<u8>, body: &Object, previous: Option<&Hash>) -> Option<Range<usize>> {
    let input = items(body, "input");
    let Some(last) = input.iter().rposition(model_item) else {
        chained(body)?;
        // The turn it answers is the stored response's: its identity when the proxy knows
        // it, else `null` (never the response id, which is new at every step).
        responses_system(buf, body, input);
        let answer = tools_calls_after(
            buf,
            body,
            |buf| match previous {
                Some(answer) => {
                    buf.extend_from_slice(br#"{"previous":""#);
                    buf.extend_from_slice(answer.to_hex().as_bytes());
                    buf.extend_from_slice(br#""}"#);
                }
                None => buf.extend_from_slice(br#"{"previous":null}"#),
            },
            // `input` as a string is the one user turn it stands for.
            match body.get("input") {
                Some(text @ Json::String(_)) => std::slice::from_ref(text),
                _ => input,
            }
            .iter()
            .filter(|item| !is_system(item)),
        );
        return Some(answer);
    };
    // One answer may be several items (reasoning, calls, a message): the turn is the run of
    // model items that ends at the newest one.
    let first = input[..last]
        .iter()
        .rposition(|item| !model_item(item))
        .map_or(0, |i| i + 1);
    responses_system(buf, body, input);
    let turn = &input[first..=last];
    let calls: Vec<&Json> = turn.iter().filter(|item| is_call(item)).collect();
    let text: Vec<&Json> = turn
        .iter()
        .filter(|item| is_assistant_message(item))
        .filter_map(|item| item.get("content"))
        .collect();
    let answer = tools_calls_after(
        buf,
        body,
        |buf| {
            write_answer(
                buf,
                &calls,
                |buf, call| write_without_keys(buf, call, VOLATILE),
                &text,
            )
        },
        input[last + 1..].iter().filter(|item| !is_system(item)),
    );
    Some(answer)
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

    /// The action is the step's calls without their results: one call that answered twice
    /// has one action and two steps; another call has another action; a text turn has none.
    #[test]
    fn a_steps_action_is_its_calls_without_their_results() {
        let step = |body: &str| {
            let s = shape(Route::OpenAiChat, body);
            (s.step_fingerprint, s.step_action)
        };
        let (same, same_action) = step(&chat_loop(3, "same"));
        let (other, other_action) = step(&chat_loop(3, "attempt 20261207"));
        assert_ne!(same, other);
        assert_eq!(same_action, other_action);
        assert!(same_action.is_some());
        let (_, call_action) =
            step(&chat_loop(3, "same").replace(r#"\"make\""#, r#"\"make test\""#));
        assert!(call_action.is_some());
        assert_ne!(call_action, same_action);
        let (_, text_action) = step(
            r#"{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":"done"},{"role":"user","content":"ok"}]}"#,
        );
        assert_eq!(text_action, None);
    }

    /// A turn without a tool call is named by its text (SPEC §2.3): the same word answering two
    /// different assistant texts is two steps; the same word answering the same text is one.
    #[test]
    fn a_turn_without_a_tool_call_is_a_step_with_the_text_it_answers() {
        let chat_turn = |text: &str| {
            shape(
                Route::OpenAiChat,
                &format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":"{text}"}},{{"role":"user","content":"continue"}}]}}"#
                ),
            )
            .step_fingerprint
        };
        assert_ne!(chat_turn("part one"), chat_turn("part two"));
        assert_eq!(chat_turn("part one"), chat_turn("part one"));
        let anthropic_turn = |text: &str, thinking: &str| {
            shape(
                Route::AnthropicMessages,
                &format!(
                    r#"{{"model":"c","max_tokens":5,"messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":[{{"type":"thinking","thinking":"{thinking}","signature":"s"}},{{"type":"text","text":"{text}"}}]}},{{"role":"user","content":"continue"}}]}}"#
                ),
            )
            .step_fingerprint
        };
        assert_ne!(anthropic_turn("a", "t"), anthropic_turn("b", "t"));
        // Thinking varies and is not the answer.
        assert_eq!(anthropic_turn("a", "t1"), anthropic_turn("a", "t2"));
        let responses_turn = |text: &str| {
            shape(
                Route::OpenAiResponses,
                &format!(
                    r#"{{"model":"m","input":[{{"role":"user","content":"go"}},{{"type":"message","role":"assistant","id":"msg_1","content":[{{"type":"output_text","text":"{text}"}}]}},{{"role":"user","content":"continue"}}]}}"#
                ),
            )
            .step_fingerprint
        };
        assert_ne!(responses_turn("a"), responses_turn("b"));
        // A tool call still names the step, whatever text came with it.
        let with_call = |text: &str| {
            shape(
                Route::OpenAiChat,
                &format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":"{text}","tool_calls":[{{"id":"c1","type":"function","function":{{"name":"sh","arguments":"{{}}"}}}}]}},{{"role":"tool","tool_call_id":"c1","content":"ok"}}]}}"#
                ),
            )
            .step_fingerprint
        };
        assert_eq!(with_call("thinking aloud 1"), with_call("thinking aloud 2"));
    }

    /// A chained Responses call's step names the answer it continues, never the response id;
    /// `input` as a string is its user turn.
    #[test]
    fn a_chained_call_is_a_step_of_the_answer_it_continues() {
        let chained = |previous: &str, output: &str| {
            format!(
                r#"{{"model":"m","previous_response_id":"{previous}","input":[{{"type":"function_call_output","call_id":"call_{previous}","output":"{output}"}}]}}"#
            )
        };
        let a = shape(Route::OpenAiResponses, &chained("resp_1", "same"));
        let b = shape(Route::OpenAiResponses, &chained("resp_2", "same"));
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_eq!(
            a.step_fingerprint, b.step_fingerprint,
            "the id is not the step"
        );
        let call = |args: &str| {
            crate::request::answer_identity_of(
                format!(
                    r#"[{{"type":"function_call","id":"fc_9","call_id":"call_9","name":"sh","arguments":"{args}","status":"completed"}}]"#
                )
                .as_bytes(),
                &KEY,
            )
            .unwrap()
        };
        let (ls, make) = (call("ls"), call("make"));
        assert_ne!(ls, make);
        let step = |body: &str, answer: &Hash| {
            crate::request::chained_step(body.as_bytes(), &KEY, answer).unwrap()
        };
        let body_a = chained("resp_1", "same");
        let body_b = chained("resp_2", "same");
        assert_eq!(step(&body_a, &ls), step(&body_b, &ls));
        assert_ne!(step(&body_a, &ls), step(&body_a, &make));
        assert_ne!(step(&body_a, &ls), step(&chained("resp_1", "other"), &ls));
        // Ids and status of the answer's items are not its identity.
        let renamed = crate::request::answer_identity_of(
            br#"[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"sh","arguments":"ls","status":"in_progress"}]"#,
            &KEY,
        )
        .unwrap();
        assert_eq!(renamed, ls);
        let text = |input: &str| {
            shape(
                Route::OpenAiResponses,
                &format!(r#"{{"model":"m","previous_response_id":"resp_1","input":"{input}"}}"#),
            )
            .step_fingerprint
        };
        assert_ne!(text("yes"), text("no"));
        // A body that is no continuation has no chained step.
        assert!(
            crate::request::chained_step(br#"{"model":"m","input":"hi"}"#, &KEY, &ls).is_none()
        );
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

    #[test]
    fn a_system_turn_the_client_appends_is_not_a_new_step() {
        // Claude Code 2.1.332 on the wire, after a paced step: a system turn after the tool
        // result, then, a step later, the same turn in the history.
        let plain = anthropic_loop(3, "same", true);
        let nudge = r#"{"role":"system","content":[{"type":"text","text":"The user hasn't heard from you in a while. As you continue, keep them updated when there's something to tell \u2014 a finding, a change of plan.","cache_control":{"type":"ephemeral"}}]}"#;
        let messages_end = plain.rfind("]}").unwrap();
        let nudged = format!("{},{nudge}]}}", &plain[..messages_end]);
        let a = shape(Route::AnthropicMessages, &plain);
        let b = shape(Route::AnthropicMessages, &nudged);
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_eq!(a.step_fingerprint, b.step_fingerprint);
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

/// The step fingerprint against the noise in tool results: a property test (re-noising a
/// result keeps its step), a negative set (progress stays distinct), and where the
/// normalisation applies (tool results only; never the fingerprint).
#[cfg(test)]
mod noise_tests {
    use super::*;
    use crate::request::parse;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const KEY: [u8; 32] = [9; 32];
    const ROUTES: [Route; 3] = [
        Route::OpenAiChat,
        Route::AnthropicMessages,
        Route::OpenAiResponses,
    ];

    /// A request of `route` whose newest assistant turn calls `sh` and whose tail is
    /// `result` (Anthropic: as a list of one text part, as Claude Code sends images and
    /// text; the others as a string), after `history` earlier identical steps.
    fn body(route: Route, history: usize, result: &str) -> Vec<u8> {
        let value = match route {
            Route::OpenAiChat => {
                let mut messages = vec![json!({"role": "user", "content": "go"})];
                for i in 0..=history {
                    let out = if i == history { result } else { "earlier" };
                    messages.push(json!({"role": "assistant", "content": format!("step {i}"), "tool_calls": [{"id": format!("call_{i}"), "type": "function", "function": {"name": "sh", "arguments": "{\"cmd\":\"make test\"}"}}]}));
                    messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": out}));
                }
                json!({"model": "m", "tools": [{"type": "function", "function": {"name": "sh"}}], "messages": messages})
            }
            Route::AnthropicMessages => {
                let mut messages = vec![json!({"role": "user", "content": "go"})];
                for i in 0..=history {
                    let out = if i == history { result } else { "earlier" };
                    messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": {"command": "make test"}}]}));
                    messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": [{"type": "text", "text": out}]}]}));
                }
                json!({"model": "c", "max_tokens": 10, "tools": [{"name": "Bash", "input_schema": {}}], "messages": messages})
            }
            Route::OpenAiResponses => {
                let mut input = vec![json!({"role": "user", "content": "go"})];
                for i in 0..=history {
                    let out = if i == history { result } else { "earlier" };
                    input.push(json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": format!("call_{i}"), "name": "exec_command", "arguments": "{\"cmd\":\"make test\"}"}));
                    input.push(json!({"type": "function_call_output", "id": format!("fco_{i}"), "call_id": format!("call_{i}"), "output": out}));
                }
                json!({"model": "g", "tools": [{"type": "function", "name": "exec_command"}], "input": input})
            }
        };
        serde_json::to_vec(&value).unwrap()
    }

    fn shape(route: Route, history: usize, result: &str) -> crate::request::RequestShape {
        parse(route, &body(route, history, result), &KEY)
            .unwrap()
            .shape
    }

    fn step(route: Route, result: &str) -> Hash {
        shape(route, 0, result).step_fingerprint
    }

    /// splitmix64: the noise of one rendering, from its seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn range(&mut self, low: u64, high: u64) -> u64 {
            low + self.below(high - low + 1)
        }
        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len() as u64) as usize]
        }
        fn chars(&mut self, alphabet: &[u8], n: usize) -> String {
            (0..n)
                .map(|_| alphabet[self.below(alphabet.len() as u64) as usize] as char)
                .collect()
        }
    }

    const HEX: &[u8] = b"0123456789abcdef";
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const DAYS: &[&str] = &["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: &[&str] = &[
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];

    /// The kinds of noise a rendering draws from.
    const KINDS: usize = 20;

    /// One noise value of `kind` in the form `form` (the same in every rendering of a
    /// template), its values drawn from `r`.
    fn noise(kind: usize, form: u64, r: &mut Rng) -> String {
        let choose = |items: &[&'static str], salt: u64| {
            items[((form >> salt) % items.len() as u64) as usize]
        };
        let (y, mo, d) = (r.range(2001, 2099), r.range(1, 12), r.range(1, 28));
        let (h, mi, s) = (r.range(0, 23), r.range(0, 59), r.range(0, 59));
        let n = r.range(1, 9) as usize;
        let frac = r.chars(b"0123456789", n);
        let zone = choose(&["Z", "+00:00", "-0700", "+05:30", ""], 0);
        let day = r.pick(DAYS);
        let month = MONTHS[mo as usize - 1];
        match kind {
            0 => format!("{y}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{frac}{zone}"),
            1 => format!("{y}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}{zone}"),
            2 => format!(
                "{day}, {d:02} {month} {y} {h:02}:{mi:02}:{s:02} {}",
                choose(&["+0000", "GMT", "-0500"], 4)
            ),
            3 => format!(
                "{day} {month} {d:>2} {h:02}:{mi:02}:{s:02} {} {y}",
                choose(&["UTC", "CET", "PDT"], 8)
            ),
            4 => format!("{month} {d:>2} {h:02}:{mi:02}"),
            5 => format!("{h:02}:{mi:02}:{s:02}.{frac}"),
            6 => {
                let secs = r.range(1_000_000_000, 4_102_444_800);
                match form % 5 {
                    0 => format!("{secs}"),
                    1 => format!("{secs}.{frac}"),
                    2 => format!("{secs}{:03}", r.below(1000)),
                    3 => format!("{secs}{:06}", r.below(1_000_000)),
                    _ => format!("{secs}{:09}", r.below(1_000_000_000)),
                }
            }
            7 => {
                let (a, b) = (r.below(100), r.below(1000));
                let unit = choose(&["s", "ms", " ms", " seconds", "µs", " sec", "ns"], 12);
                format!("{a}.{b:03}{unit}")
            }
            8 => format!(
                "{}{}",
                r.below(100_000),
                choose(&["ms", "s", " ms", " seconds"], 16)
            ),
            9 => format!("real\t{}m{}.{:03}s", r.below(3), r.below(60), r.below(1000)),
            10 => format!("{}h{}m{}s", r.range(1, 9), r.below(60), r.below(60)),
            11 => {
                let hex = |r: &mut Rng, n| r.chars(HEX, n);
                let u = format!(
                    "{}-{}-{}-{}-{}",
                    hex(r, 8),
                    hex(r, 4),
                    hex(r, 4),
                    hex(r, 4),
                    hex(r, 12)
                );
                if form.is_multiple_of(2) {
                    u
                } else {
                    u.to_uppercase()
                }
            }
            12 => {
                // A hex id: a digit and a letter among at least 8.
                let n = r.range(8, 40) as usize;
                let mut id = r.chars(HEX, n - 2);
                id.push((b'0' + r.below(10) as u8) as char);
                id.insert(
                    r.below(id.len() as u64) as usize,
                    (b'a' + r.below(6) as u8) as char,
                );
                id
            }
            13 => {
                // A random token the rule calls one (it measures how random; see
                // `random_tokens_are_ids_and_identifiers_are_not` for how often).
                loop {
                    let n = r.range(22, 48) as usize;
                    let t = r.chars(B64, n);
                    let core = t.trim_matches(|c| c == '-' || c == '_');
                    if core.len() == t.len() && super::super::normalise::looks_random(t.as_bytes())
                    {
                        break t;
                    }
                }
            }
            14 => match form % 4 {
                0 => format!("pid {}", r.range(1, 4_000_000)),
                1 => format!("PID: {}", r.range(1, 4_000_000)),
                2 => format!("(pid={})", r.range(1, 4_000_000)),
                _ => format!("worker[{}]: ready", r.range(1, 4_000_000)),
            },
            15 => format!(
                "/tmp/tmp.{}/report.txt",
                r.chars(
                    b"abcdefghijkmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
                    10
                )
            ),
            16 => format!(
                "/tmp/pytest-of-root/pytest-{}/test_case0/out.log:12",
                r.below(500)
            ),
            17 => format!(
                "/var/folders/{}/{}/T/tmp{}/f.py",
                r.chars(HEX, 2),
                r.chars(B64, 12),
                r.chars(HEX, 8)
            ),
            18 => format!("\u{1b}[{};{}m", r.below(2), r.range(30, 37)),
            _ => {
                let n = r.range(8, 16) as usize;
                format!("0x{}", r.chars(HEX, n))
            }
        }
    }

    /// Codex CLI's envelope around a command's output, with its own noise.
    fn codex_envelope(r: &mut Rng, code: u8, output: &str) -> String {
        format!(
            "Chunk ID: {}\nWall time: {}.{:04} seconds\nProcess exited with code {code}\nOriginal token count: {}\nOutput:\n{output}",
            r.chars(HEX, 6),
            r.below(10),
            r.below(10_000),
            r.below(5000)
        )
    }

    /// A tool result: literal lines (the same in every rendering) with noise between them.
    fn render(template: &[(String, usize, u64)], seed: u64, envelope: bool) -> String {
        let mut r = Rng(seed);
        let mut out = String::new();
        for (literal, kind, form) in template {
            out.push_str(literal);
            out.push(' ');
            out.push_str(&noise(*kind, *form, &mut r));
            out.push(if form.is_multiple_of(3) { '\n' } else { ' ' });
        }
        if envelope {
            codex_envelope(&mut r, 0, &out)
        } else {
            out
        }
    }

    fn literal() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("3 of 10 done".to_string()),
            Just("FAILED tests/test_api.py::test_login - AssertionError: 401 != 200".to_string()),
            Just("-rw-r--r-- 1 root root 45".to_string()),
            Just(
                "error: could not compile `app` (bin \"app\") due to 2 previous errors".to_string()
            ),
            Just("45% complete, 12 files".to_string()),
            Just("".to_string()),
            "[a-z]{1,10}( [a-z]{1,10}){0,4}[:.,]?",
            "[A-Za-z_./-]{1,24}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The same step twice, its tool result re-noised (clocks, durations, ids, pids,
        /// temporary paths, escapes, Codex's envelope): one step fingerprint, on every route;
        /// the fingerprints differ (the noise is really there).
        #[test]
        fn re_noising_a_tool_result_keeps_its_step(
            template in prop::collection::vec((literal(), 0..KINDS, any::<u64>()), 1..12),
            a in any::<u64>(),
            b in any::<u64>(),
            envelope in any::<bool>(),
            history in 0usize..3,
        ) {
            let (first, second) = (render(&template, a, envelope), render(&template, b, envelope));
            prop_assert_eq!(
                normalise(&first),
                normalise(&second),
                "\n{:?}\n{:?}", first, second
            );
            for route in ROUTES {
                let x = shape(route, 0, &first);
                let y = shape(route, history, &second);
                prop_assert_eq!(x.step_fingerprint, y.step_fingerprint, "{:?}", route);
                if first != second {
                    prop_assert_ne!(x.fingerprint, y.fingerprint);
                }
            }
        }
    }

    /// What changes when an agent makes progress is a new step, though the noise around it
    /// changed too.
    #[test]
    fn progress_is_a_new_step() {
        let pairs = [
            ("2026-12-02T10:06:28+00:00 3 of 10 done", "2026-12-02T10:06:31+00:00 4 of 10 done"),
            (
                "FAILED test_flaky.py::test_alpha - AssertionError: alpha broke\n1 failed, 2 passed in 0.05s",
                "FAILED test_flaky.py::test_beta - AssertionError: beta broke\n1 failed, 2 passed in 0.03s",
            ),
            (
                "total 8\n-rw-r--r-- 1 root root 0 Dec  2 10:06 a.txt\n-rw-r--r-- 1 root root 0 Dec  2 10:06 b.txt",
                "total 8\n-rw-r--r-- 1 root root 0 Dec  2 10:07 a.txt\n-rw-r--r-- 1 root root 0 Dec  2 10:07 c.txt",
            ),
            ("README.md\nmain.py\n", "README.md\nmain.py\nitem1.txt\n"),
            (
                "Chunk ID: 3ca58a\nWall time: 0.8635 seconds\nProcess exited with code 1\nOutput:\nfail\n",
                "Chunk ID: 5d024e\nWall time: 0.0120 seconds\nProcess exited with code 0\nOutput:\nfail\n",
            ),
            ("Exit code 1\n10:06:30 attempt 1", "10:06:31 attempt 1"),
            (
                "[12:00:01] error: connection refused (pid 12)",
                "[12:00:09] error: permission denied (pid 13)",
            ),
            ("12 files changed in 0.2s", "13 files changed in 0.4s"),
            ("downloaded 45% in 3.1s", "downloaded 46% in 3.3s"),
            ("job 1a87be98-e63d-4285-bf08-d9d5f29c7677 status: running", "job 44708ea6-6077-4a46-83cd-e746de9828ac status: done"),
            ("wrote /tmp/tmp.hboGCCWeBk/report.txt", "wrote /tmp/tmp.JKmxa5cGGX/summary.txt"),
        ];
        for (before, after) in pairs {
            for route in ROUTES {
                assert_ne!(
                    step(route, before),
                    step(route, after),
                    "{route:?}: {before:?} and {after:?} read as one step"
                );
            }
        }
    }

    /// Only tool results are normalised: a user turn in the tail is taken as written, and so
    /// is the call's arguments; and the fingerprint is the caller's bytes.
    #[test]
    fn only_tool_results_are_normalised_and_only_for_the_step() {
        let (a, b) = ("built at 10:06:28", "built at 10:06:31");
        for route in ROUTES {
            let (x, y) = (shape(route, 0, a), shape(route, 0, b));
            assert_eq!(x.step_fingerprint, y.step_fingerprint);
            assert_ne!(x.fingerprint, y.fingerprint);
        }
        let with_user_turn = |text: &str| {
            let mut v: Value = serde_json::from_slice(&body(Route::OpenAiChat, 0, "ok")).unwrap();
            v["messages"]
                .as_array_mut()
                .unwrap()
                .push(json!({"role": "user", "content": text}));
            parse(Route::OpenAiChat, &serde_json::to_vec(&v).unwrap(), &KEY)
                .unwrap()
                .shape
                .step_fingerprint
        };
        assert_ne!(with_user_turn(a), with_user_turn(b));
        let with_call = |cmd: &str| {
            let text = String::from_utf8(body(Route::OpenAiResponses, 0, "ok"))
                .unwrap()
                .replace("make test", cmd);
            parse(Route::OpenAiResponses, text.as_bytes(), &KEY)
                .unwrap()
                .shape
                .step_fingerprint
        };
        assert_ne!(with_call("sleep 0.1s"), with_call("sleep 0.2s"));
        // Responses `output` as a list of parts, chat `content` as one: the text parts are
        // normalised, the other parts are not.
        let parts = |stamp: &str, image: &str| {
            let v = json!({"model": "g", "input": [
                {"type": "function_call", "call_id": "c", "name": "shot", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": [
                    {"type": "input_text", "text": format!("taken {stamp}")},
                    {"type": "input_image", "image_url": image},
                ]},
            ]});
            parse(
                Route::OpenAiResponses,
                &serde_json::to_vec(&v).unwrap(),
                &KEY,
            )
            .unwrap()
            .shape
            .step_fingerprint
        };
        let img =
            "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk";
        let other =
            "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNX";
        assert_eq!(parts("10:06:28", img), parts("10:06:31", img));
        assert_ne!(parts("10:06:28", img), parts("10:06:28", other));
    }

    /// How often the id rule catches a random token, and that long words in identifiers are
    /// not ids (the rates quoted in `normalise.rs`).
    #[test]
    fn random_tokens_are_ids_and_identifiers_are_not() {
        let mut r = Rng(2024);
        for (len, at_least) in [(22usize, 0.96), (32, 0.985), (43, 0.99)] {
            let caught = (0..4000)
                .filter(|_| {
                    let t = r.chars(&B64[..62], len);
                    normalise(&format!("id {t} ok")) == "id <id> ok"
                })
                .count();
            let rate = caught as f64 / 4000.0;
            assert!(rate >= at_least, "{len} characters: {rate}");
        }
        for word in [
            "TestParseHttp2RequestHandler",
            "AbstractSingletonProxyFactoryBean",
            "getElementById2WithFallback",
            "XMLHttpRequestUpload2Test",
            "ERR_CONNECTION_REFUSED_BY_PEER2",
            "test_parse_http_request_handler_v2",
            "node_modules/@types/react-dom/index",
            "BetaResponseMcpCallArgumentsDelta",
        ] {
            assert_eq!(normalise(word), word);
        }
    }
}
