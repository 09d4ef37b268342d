//! OpenAI `chat/completions` bodies → the shape's parts.

use super::json::{Json, Object};

use super::canonical::{compact_json_chars, tool_name_hash, Canonical, TurnBytes};
use super::{Parts, Role, ShapeError, Turn};

pub(super) fn parts(body: &Object, canonical: &Canonical) -> Result<Parts, ShapeError> {
    let messages = match body.get("messages") {
        Some(Json::Array(items)) => items,
        None => return Err(ShapeError::Missing("messages")),
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "messages",
                expected: "an array",
            })
        }
    };
    let key = canonical.key;
    let mut system_chars = 0u64;
    let mut turns = Vec::with_capacity(messages.len());
    let mut turn_bytes = Vec::with_capacity(messages.len());
    let mut calls_per_turn: Vec<Vec<super::Hash>> = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let err = |problem| ShapeError::Message { index, problem };
        let Json::Object(message) = message else {
            return Err(err("must be an object"));
        };
        let role = match message.get("role") {
            Some(Json::String(role)) => role.to_cow(),
            _ => return Err(err("role must be a string")),
        };
        let content_chars = content_chars(message.get("content")).ok_or(err(
            "content must be a string, an array of content parts, or null",
        ))?;
        let role = match role.as_ref() {
            "system" | "developer" => {
                system_chars += content_chars;
                continue;
            }
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "function" => Role::Function,
            _ => {
                return Err(err(
                    "role is not one of system, developer, user, assistant, tool",
                ))
            }
        };
        let mut turn_chars = content_chars;
        let mut called = Vec::new();
        if let Some(calls) = message.get("tool_calls") {
            let Json::Array(calls) = calls else {
                return Err(err("tool_calls must be an array"));
            };
            for call in calls {
                let function = call.get("function").or_else(|| call.get("custom"));
                let (name, arguments) = function
                    .map(|f| (f.get("name"), f.get("arguments").or_else(|| f.get("input"))))
                    .unwrap_or((None, None));
                let Some(Json::String(name)) = name else {
                    return Err(err("tool_calls entries need a function name"));
                };
                called.push(tool_name_hash(key, &name.to_cow()));
                turn_chars += arguments.map(compact_json_chars).unwrap_or(0);
            }
        }
        if let Some(Json::Object(call)) = message.get("function_call") {
            if let Some(Json::String(name)) = call.get("name") {
                called.push(tool_name_hash(key, &name.to_cow()));
            }
            turn_chars += call.get("arguments").map(compact_json_chars).unwrap_or(0);
        }
        turns.push(Turn {
            role,
            chars: turn_chars,
            hash: None,
        });
        turn_bytes.push(TurnBytes::Message(index));
        calls_per_turn.push(called);
    }

    // OpenAI: `{type: function, function: {name}}`, `{type: custom, custom: {name}}`, or a
    // top-level name.
    let tools = super::tool_defs(body, canonical, |tool| {
        tool.get("function")
            .or_else(|| tool.get("custom"))
            .and_then(|f| f.get("name"))
            .or_else(|| tool.get("name"))
    })?;

    Ok(Parts {
        system_chars,
        turns,
        turn_bytes,
        tools,
        called_tool_hashes: super::history_calls(calls_per_turn),
    })
}

/// Characters of a message's content: text parts count, media parts count nothing. (Chat and
/// Responses messages share the form: a string, or parts with `text`/`refusal`.)
pub(super) fn content_chars(content: Option<&Json>) -> Option<u64> {
    match content {
        None | Some(Json::Null) => Some(0),
        Some(Json::String(s)) => Some(s.chars()),
        Some(Json::Array(parts)) => {
            let mut total = 0;
            for part in parts {
                match part {
                    Json::String(s) => total += s.chars(),
                    Json::Object(p) => {
                        for field in ["text", "refusal"] {
                            if let Some(Json::String(s)) = p.get(field) {
                                total += s.chars();
                            }
                        }
                    }
                    _ => return None,
                }
            }
            Some(total)
        }
        Some(_) => None,
    }
}
