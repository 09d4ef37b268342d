//! The session an agent's request belongs to, without keeping content (SPEC §2.11a).
//!
//! A client that names its session sends a header (Claude Code's `X-Claude-Code-Session-Id`,
//! Codex's `session-id`, or `x-tokensaver-session`): the session is a keyed hash of that value
//! ([`session_of_header`]). Otherwise it is a keyed hash of what stays the same for a whole
//! agent run: the route, the system prompt, the tools and the first user turn
//! ([`session_fingerprint`]). The model is left out: an agent that is DOWNGRADEd or switches
//! models mid-run stays one session. Two runs of the same task with the same first prompt are
//! one session by the prefix; a client that sends a session header tells them apart.

use super::canonical::{keyed_in_place, PAD_TO};
use super::json::{write_compact, write_without_keys, Json, Object};
use super::step::{is_system, items, role_is, VOLATILE};
use super::{Hash, Route};

const SESSION_DOMAIN: &[u8] = b"tokensaver session v1\0";
const SESSION_HEADER_DOMAIN: &[u8] = b"tokensaver session header v1\0";

/// The headers a client names its session in, the first present wins: tokensaver's own, then
/// Claude Code's and Codex's (both seen on the wire from the pinned clients).
pub const SESSION_HEADERS: [&str; 3] = [
    "x-tokensaver-session",
    "x-claude-code-session-id",
    "session-id",
];

/// The session of a request whose client named it: a keyed hash of the header's value.
pub fn session_of_header(value: &[u8], key: &[u8; 32]) -> Hash {
    let mut buf = Vec::with_capacity(SESSION_HEADER_DOMAIN.len() + value.len());
    buf.extend_from_slice(SESSION_HEADER_DOMAIN);
    buf.extend_from_slice(value);
    keyed_in_place(key, &mut buf)
}

/// The session of a request by its stable prefix: route, system, tools, first user turn.
pub(super) fn session_fingerprint(route: Route, body: &Object, key: &[u8; 32]) -> Hash {
    let mut buf = Vec::with_capacity(PAD_TO);
    buf.extend_from_slice(SESSION_DOMAIN);
    buf.extend_from_slice(route.as_str().as_bytes());
    buf.push(0);
    // One JSON array: [system, tools, first user turn].
    buf.push(b'[');
    match route {
        Route::OpenAiChat => {
            let messages = items(body, "messages");
            write_system_messages(&mut buf, messages);
            tools_and_first_user(&mut buf, body, messages);
        }
        Route::AnthropicMessages => {
            write_without_keys(
                &mut buf,
                body.get("system").unwrap_or(&Json::Null),
                VOLATILE,
            );
            buf.push(b',');
            tools_and_first_user(&mut buf, body, items(body, "messages"));
        }
        Route::OpenAiResponses => {
            buf.push(b'[');
            write_compact(&mut buf, body.get("instructions").unwrap_or(&Json::Null));
            for item in items(body, "input").iter().filter(|item| is_system(item)) {
                buf.push(b',');
                write_without_keys(&mut buf, item, VOLATILE);
            }
            buf.extend_from_slice(b"],");
            match body.get("input") {
                // A plain-string input is the first user turn itself.
                Some(text @ Json::String(_)) => {
                    write_tools(&mut buf, body);
                    write_compact(&mut buf, text);
                }
                _ => tools_and_first_user(&mut buf, body, items(body, "input")),
            }
        }
    }
    buf.push(b']');
    keyed_in_place(key, &mut buf)
}

fn write_system_messages(buf: &mut Vec<u8>, messages: &[Json]) {
    buf.push(b'[');
    for (i, message) in messages.iter().filter(|m| is_system(m)).enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write_without_keys(buf, message.get("content").unwrap_or(&Json::Null), VOLATILE);
    }
    buf.extend_from_slice(b"],");
}

fn write_tools(buf: &mut Vec<u8>, body: &Object) {
    write_without_keys(
        buf,
        body.get("tools").unwrap_or(&Json::Null),
        &["cache_control"],
    );
    buf.push(b',');
}

/// `tools, first user turn's content` (null when there is none).
fn tools_and_first_user(buf: &mut Vec<u8>, body: &Object, turns: &[Json]) {
    write_tools(buf, body);
    let first = turns.iter().find(|t| role_is(t, &["user"]));
    let content = first.and_then(|t| t.get("content")).unwrap_or(&Json::Null);
    write_without_keys(buf, content, VOLATILE);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    const KEY: [u8; 32] = [7; 32];

    fn session(route: Route, body: &str) -> Hash {
        parse(route, body.as_bytes(), &KEY).unwrap().shape.session
    }

    #[test]
    fn a_growing_conversation_stays_one_session() {
        let first = r#"{"model":"claude-x","max_tokens":10,"system":"You are an agent.",
            "tools":[{"name":"ls","input_schema":{}}],
            "messages":[{"role":"user","content":"Build it."}]}"#;
        let later = r#"{"model":"claude-y","max_tokens":10,"system":"You are an agent.",
            "tools":[{"name":"ls","input_schema":{},"cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"Build it."},
              {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"ls","input":{}}]},
              {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a b"}]}]}"#;
        assert_eq!(
            session(Route::AnthropicMessages, first),
            session(Route::AnthropicMessages, later)
        );
        let other_task = first.replace("Build it.", "Test it.");
        assert_ne!(
            session(Route::AnthropicMessages, first),
            session(Route::AnthropicMessages, &other_task)
        );
        let other_system = first.replace("You are an agent.", "You are a reviewer.");
        assert_ne!(
            session(Route::AnthropicMessages, first),
            session(Route::AnthropicMessages, &other_system)
        );
    }

    #[test]
    fn chat_and_responses_sessions_follow_their_first_user_turn() {
        let chat = r#"{"model":"m","messages":[{"role":"system","content":"S"},
            {"role":"user","content":"Go."}]}"#;
        let chat_later = r#"{"model":"m","messages":[{"role":"system","content":"S"},
            {"role":"user","content":"Go."},{"role":"assistant","content":"ok"},
            {"role":"user","content":"More."}]}"#;
        assert_eq!(
            session(Route::OpenAiChat, chat),
            session(Route::OpenAiChat, chat_later)
        );
        let string_input = r#"{"model":"m","instructions":"I","input":"Go."}"#;
        let item_input = r#"{"model":"m","instructions":"I",
            "input":[{"role":"user","content":"Go."}]}"#;
        assert_eq!(
            session(Route::OpenAiResponses, string_input),
            session(Route::OpenAiResponses, item_input),
            "a string input is the first user turn itself"
        );
        let item_later = r#"{"model":"m","instructions":"I",
            "input":[{"role":"user","content":"Go."},
              {"type":"function_call","call_id":"c","name":"ls","arguments":"{}"},
              {"type":"function_call_output","call_id":"c","output":"a"}]}"#;
        assert_eq!(
            session(Route::OpenAiResponses, item_input),
            session(Route::OpenAiResponses, item_later)
        );
        // The same words on two routes are two sessions.
        assert_ne!(
            session(
                Route::OpenAiChat,
                r#"{"model":"m","messages":[{"role":"user","content":"Go."}]}"#
            ),
            session(Route::OpenAiResponses, item_input)
        );
    }

    #[test]
    fn a_named_session_is_keyed_and_apart_from_a_prefix_session() {
        let a = session_of_header(b"01a2373d-7784", &KEY);
        assert_eq!(a, session_of_header(b"01a2373d-7784", &KEY));
        assert_ne!(a, session_of_header(b"01a2373d-7785", &KEY));
        assert_ne!(a, session_of_header(b"01a2373d-7784", &[8; 32]));
    }
}
