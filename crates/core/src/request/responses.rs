//! OpenAI Responses bodies (`POST /v1/responses`) → the shape's parts.
//!
//! `input` is a string (one user turn) or a list of items; every item other than a system or
//! developer message is a turn: messages by their role, tool calls and reasoning as the
//! assistant's, tool outputs as the tool's. `instructions` and system/developer messages count
//! as system. Characters: text parts, reasoning summaries, tool-call arguments and tool
//! outputs; media parts and encrypted reasoning count none (SPEC §2.1).

use super::json::{Json, Object, Str};

use super::canonical::{compact_json_chars, tool_name_hash, Canonical, TurnBytes};
use super::openai::content_chars;
use super::{Hash, Parts, Role, ShapeError, ToolDef, Turn};

/// The answer depends on state kept by the provider, which the answer store cannot vouch
/// for: a continuation (`previous_response_id`, `conversation`) answers from the provider's
/// copy of the earlier turns, and a `background` request answers with a job to poll.
pub(super) fn provider_state(body: &Object) -> bool {
    let set = |field| !matches!(body.get(field), None | Some(Json::Null));
    set("previous_response_id")
        || set("conversation")
        || body.get("background") == Some(&Json::Bool(true))
}

pub(super) fn parts(body: &Object, canonical: &Canonical) -> Result<Parts, ShapeError> {
    let key = canonical.key;
    let mut system_chars = match body.get("instructions") {
        None | Some(Json::Null) => 0,
        Some(Json::String(s)) => s.chars(),
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "instructions",
                expected: "a string",
            })
        }
    };
    let mut turns = Vec::new();
    let mut turn_bytes = Vec::new();
    let mut calls_per_turn: Vec<Vec<Hash>> = Vec::new();
    let mut extra_tools = Vec::new();
    match body.get("input") {
        None | Some(Json::Null) => {}
        Some(Json::String(text)) => {
            // The same turn hash as the one-message list it stands for.
            let mut message = Vec::with_capacity(text.chars() as usize + 32);
            message.extend_from_slice(br#"{"content":"#);
            super::json::write_compact(&mut message, &Json::String(text.clone()));
            message.extend_from_slice(br#","role":"user"}"#);
            turns.push(Turn {
                role: Role::User,
                chars: text.chars(),
                hash: None,
            });
            turn_bytes.push(TurnBytes::Standalone(message));
            calls_per_turn.push(Vec::new());
        }
        Some(Json::Array(items)) => {
            for (index, item) in items.iter().enumerate() {
                let err = |problem| ShapeError::Item { index, problem };
                let Json::Object(item) = item else {
                    return Err(err("must be an object"));
                };
                let kind = match item.get("type") {
                    None => None,
                    Some(Json::String(kind)) => Some(kind.to_cow()),
                    Some(_) => return Err(err("type must be a string")),
                };
                let mut called = Vec::new();
                let developer_item = kind.as_deref().is_some_and(|k| k != "message")
                    && item
                        .get("role")
                        .and_then(Json::as_string)
                        .is_some_and(|r| r.is("system") || r.is("developer"));
                if developer_item {
                    // Not a message but the caller's own: Codex sends its tools this way
                    // (`additional_tools`). Its tools are tool definitions; anything else in
                    // it is system text.
                    match item.get("tools") {
                        Some(Json::Array(defs)) => {
                            for def in defs {
                                let name = def.get("name").or_else(|| def.get("type"));
                                let Some(Json::String(name)) = name else {
                                    return Err(ShapeError::Item {
                                        index,
                                        problem: "a tool definition needs a name",
                                    });
                                };
                                extra_tools.push(ToolDef {
                                    name_hash: tool_name_hash(key, &name.to_cow()),
                                    chars: compact_json_chars(def),
                                });
                            }
                        }
                        _ => system_chars += compact_json_chars(&Json::Object(item.clone())),
                    }
                    continue;
                }
                let (role, chars) = match kind.as_deref() {
                    None | Some("message") => {
                        let chars = content_chars(item.get("content"))
                            .ok_or(err("content must be a string or an array of content parts"))?;
                        match item.get("role").and_then(Json::as_string).map(Str::to_cow) {
                            Some(r) if r == "system" || r == "developer" => {
                                system_chars += chars;
                                continue;
                            }
                            Some(r) if r == "user" => (Role::User, chars),
                            Some(r) if r == "assistant" => (Role::Assistant, chars),
                            _ => {
                                return Err(err(
                                    "role is not one of system, developer, user, assistant",
                                ))
                            }
                        }
                    }
                    Some("reasoning") => {
                        let text = |field| match item.get(field) {
                            Some(Json::Array(parts)) => text_parts(parts),
                            _ => 0,
                        };
                        (Role::Assistant, text("summary") + text("content"))
                    }
                    Some(kind) if kind.ends_with("_output") => {
                        let chars = match item.get("output") {
                            Some(Json::String(s)) => s.chars(),
                            Some(Json::Array(parts)) => text_parts(parts),
                            Some(other) => compact_json_chars(other),
                            None => 0,
                        };
                        (Role::Tool, chars)
                    }
                    Some(kind) => {
                        // A call the model made: function, custom and built-in tools.
                        let name = match item.get("name") {
                            Some(Json::String(name)) => name.to_cow(),
                            _ => kind
                                .strip_suffix("_call")
                                .unwrap_or(kind)
                                .to_string()
                                .into(),
                        };
                        if kind.ends_with("_call") {
                            called.push(tool_name_hash(key, &name));
                        }
                        let chars = ["arguments", "input", "action"]
                            .iter()
                            .filter_map(|field| item.get(field))
                            .map(compact_json_chars)
                            .sum();
                        (Role::Assistant, chars)
                    }
                };
                turns.push(Turn {
                    role,
                    chars,
                    hash: None,
                });
                turn_bytes.push(TurnBytes::Message(index));
                calls_per_turn.push(called);
            }
        }
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "input",
                expected: "a string or an array of input items",
            })
        }
    }

    // Function and custom tools have a name; built-in tools (web search, file search, local
    // shell, …) are named by their type, MCP servers by their label.
    let mut tools = super::tool_defs(body, canonical, |tool| {
        tool.get("name")
            .or_else(|| tool.get("server_label"))
            .or_else(|| tool.get("type"))
    })?;
    tools.extend(extra_tools);

    Ok(Parts {
        system_chars,
        turns,
        turn_bytes,
        tools,
        called_tool_hashes: super::history_calls(calls_per_turn),
    })
}

/// The `text` (or `refusal`) of each part.
fn text_parts(parts: &[Json]) -> u64 {
    parts
        .iter()
        .flat_map(|p| ["text", "refusal"].map(|field| p.get(field)))
        .filter_map(|v| v.and_then(Json::as_string))
        .map(Str::chars)
        .sum()
}

#[cfg(test)]
mod tests {
    use crate::request::{parse, Role, Route};

    const KEY: [u8; 32] = [3; 32];

    #[test]
    fn a_codex_style_body_has_its_turns_tools_and_ceiling() {
        let body = r#"{"model":"gpt-5-codex","instructions":"You are Codex.","store":false,"stream":true,
            "prompt_cache_key":"session-1","include":["reasoning.encrypted_content"],
            "tools":[{"type":"function","name":"shell","parameters":{"type":"object"}},{"type":"web_search"},{"type":"custom","name":"apply_patch","format":{}}],
            "input":[
              {"type":"message","role":"developer","content":[{"type":"input_text","text":"rules"}]},
              {"type":"message","role":"user","content":[{"type":"input_text","text":"fix it"},{"type":"input_image","image_url":"data:"}]},
              {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"plan"}],"encrypted_content":"zzz"},
              {"type":"function_call","id":"fc_1","call_id":"c1","name":"shell","arguments":"{\"command\":[\"ls\"]}"},
              {"type":"function_call_output","call_id":"c1","output":"a.rs"},
              {"role":"user","content":"thanks"}
            ]}"#;
        let parsed = parse(Route::OpenAiResponses, body.as_bytes(), &KEY).unwrap();
        let s = parsed.shape;
        assert_eq!(s.route, Route::OpenAiResponses);
        assert_eq!(s.max_tokens, None);
        assert!(s.stream);
        assert_eq!(s.system_chars, "You are Codex.".len() as u64 + 5);
        let roles: Vec<Role> = s.turns.iter().map(|t| t.role).collect();
        assert_eq!(
            roles,
            [
                Role::User,
                Role::Assistant,
                Role::Assistant,
                Role::Tool,
                Role::User
            ]
        );
        let chars: Vec<u64> = s.turns.iter().map(|t| t.chars).collect();
        // "fix it"; "plan"; the arguments string; "a.rs"; "thanks".
        assert_eq!(chars, [6, 4, r#"{"command":["ls"]}"#.len() as u64, 4, 6]);
        assert_eq!(s.tools.len(), 3);
        assert_eq!(s.called_tool_hashes.len(), 1);
        assert!(!s.provider_state);
    }

    #[test]
    fn codex_additional_tools_are_tool_definitions_not_turns() {
        let body = br#"{"model":"gpt-6.2-sol","input":[
            {"type":"additional_tools","id":"at_1","role":"developer","tools":[
              {"type":"namespace","name":"functions","tools":[{"type":"custom","name":"exec"}]},
              {"type":"web_search"}]},
            {"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#;
        let s = parse(Route::OpenAiResponses, body, &KEY).unwrap().shape;
        assert_eq!(s.tools.len(), 2);
        assert_eq!(s.turns.len(), 1);
        assert_eq!(s.system_chars, 0);
        assert_eq!(s.step_fingerprint, s.fingerprint);
        let unnamed = br#"{"model":"m","input":[{"type":"additional_tools","role":"developer","tools":[{}]}]}"#;
        assert_eq!(
            parse(Route::OpenAiResponses, unnamed, &KEY)
                .unwrap_err()
                .code(),
            "invalid_input_item"
        );
    }

    #[test]
    fn a_string_input_is_the_user_message_it_stands_for() {
        let a = parse(
            Route::OpenAiResponses,
            br#"{"model":"m","input":"hello","max_output_tokens":50}"#,
            &KEY,
        )
        .unwrap()
        .shape;
        let b = parse(
            Route::OpenAiResponses,
            br#"{"model":"m","input":[{"role":"user","content":"hello"}]}"#,
            &KEY,
        )
        .unwrap()
        .shape;
        assert_eq!(a.turns, b.turns);
        assert_eq!(a.max_tokens, Some(50));
    }

    #[test]
    fn provider_side_state_is_never_reusable() {
        for extra in [
            r#""previous_response_id":"resp_1""#,
            r#""conversation":"conv_1""#,
            r#""background":true"#,
        ] {
            let body = format!(r#"{{"model":"m","input":"hi","temperature":0,{extra}}}"#);
            let s = parse(Route::OpenAiResponses, body.as_bytes(), &KEY)
                .unwrap()
                .shape;
            assert!(s.provider_state, "{extra}");
            assert!(!s.reproducible(), "{extra}");
        }
        let s = parse(
            Route::OpenAiResponses,
            br#"{"model":"m","input":"hi","temperature":0,"store":true}"#,
            &KEY,
        )
        .unwrap()
        .shape;
        assert!(s.reproducible());
    }

    #[test]
    fn session_fields_leave_the_fingerprint_but_state_fields_do_not() {
        let fp = |body: &str| {
            parse(Route::OpenAiResponses, body.as_bytes(), &KEY)
                .unwrap()
                .shape
                .fingerprint
        };
        let base = fp(r#"{"model":"m","input":"hi"}"#);
        assert_eq!(
            base,
            fp(
                r#"{"model":"m","input":"hi","prompt_cache_key":"s1","user":"u","safety_identifier":"x","metadata":{"a":"b"},"stream":true}"#
            )
        );
        assert_ne!(
            base,
            fp(r#"{"model":"m","input":"hi","previous_response_id":"r"}"#)
        );
        assert_ne!(base, fp(r#"{"model":"m","input":"hi","store":false}"#));
    }

    #[test]
    fn malformed_items_are_refused_by_index() {
        let err = |body: &str| parse(Route::OpenAiResponses, body.as_bytes(), &KEY).unwrap_err();
        assert_eq!(
            err(r#"{"model":"m","input":[1]}"#).to_string(),
            "input[0]: must be an object"
        );
        assert_eq!(
            err(r#"{"model":"m","input":[{"role":"robot","content":"x"}]}"#).code(),
            "invalid_input_item"
        );
        assert_eq!(err(r#"{"model":"m","input":7}"#).code(), "wrong_type");
        assert_eq!(
            err(r#"{"model":"m","instructions":[],"input":"x"}"#).code(),
            "wrong_type"
        );
    }
}
