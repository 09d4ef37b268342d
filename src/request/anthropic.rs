//! Anthropic `messages` bodies → the shape's parts.

use serde_json::{Map, Value};

use super::canonical::{compact_json_chars, tool_name_hash, Canonical};
use super::{chars, Parts, Role, ShapeError, Turn};

pub(super) fn parts(body: &Map<String, Value>, canonical: &Canonical) -> Result<Parts, ShapeError> {
    let key = canonical.key;
    let system_chars = match body.get("system") {
        None | Some(Value::Null) => 0,
        Some(Value::String(s)) => chars(s),
        Some(Value::Array(blocks)) => {
            let mut total = 0;
            for block in blocks {
                match block.get("text") {
                    Some(Value::String(s)) => total += chars(s),
                    _ => {
                        return Err(ShapeError::WrongType {
                            field: "system",
                            expected: "a string or an array of text blocks",
                        })
                    }
                }
            }
            total
        }
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "system",
                expected: "a string or an array of text blocks",
            })
        }
    };

    let messages = match body.get("messages") {
        Some(Value::Array(items)) => items,
        None => return Err(ShapeError::Missing("messages")),
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "messages",
                expected: "an array",
            })
        }
    };
    let mut turns = Vec::with_capacity(messages.len());
    let mut calls_per_turn = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let err = |problem| ShapeError::Message { index, problem };
        let Value::Object(message) = message else {
            return Err(err("must be an object"));
        };
        let role = match message.get("role") {
            Some(Value::String(r)) if r == "user" => Role::User,
            Some(Value::String(r)) if r == "assistant" => Role::Assistant,
            _ => return Err(err("role must be \"user\" or \"assistant\"")),
        };
        let mut called = Vec::new();
        let turn_chars = match message.get("content") {
            Some(Value::String(s)) => chars(s),
            Some(Value::Array(blocks)) => {
                let mut total = 0;
                for block in blocks {
                    let Value::Object(block) = block else {
                        return Err(err("content blocks must be objects"));
                    };
                    total += block_chars(block);
                    if let (Some(Value::String(kind)), Some(Value::String(name))) =
                        (block.get("type"), block.get("name"))
                    {
                        if kind == "tool_use" || kind == "server_tool_use" {
                            called.push(tool_name_hash(key, name));
                        }
                    }
                }
                total
            }
            _ => {
                return Err(err(
                    "content must be a string or an array of content blocks",
                ))
            }
        };
        turns.push(Turn {
            role,
            chars: turn_chars,
            hash: canonical.message_hashes[index],
        });
        calls_per_turn.push(called);
    }

    let tools = super::tool_defs(body, canonical, |tool| tool.get("name"))?;

    Ok(Parts {
        system_chars,
        turns,
        tools,
        called_tool_hashes: super::history_calls(calls_per_turn),
    })
}

/// Characters of one content block: text, tool inputs and tool results count; media does not.
fn block_chars(block: &Map<String, Value>) -> u64 {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "tool_use" | "server_tool_use" => block.get("input").map(compact_json_chars).unwrap_or(0),
        "tool_result" => match block.get("content") {
            Some(Value::String(s)) => chars(s),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .map(chars)
                .sum(),
            _ => 0,
        },
        "thinking" => block
            .get("thinking")
            .and_then(Value::as_str)
            .map(chars)
            .unwrap_or(0),
        _ => block
            .get("text")
            .and_then(Value::as_str)
            .map(chars)
            .unwrap_or(0),
    }
}
