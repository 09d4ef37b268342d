//! Anthropic `messages` bodies → the shape's parts.

use super::json::{Json, Object, Str};

use super::canonical::{compact_json_chars, tool_name_hash, Canonical, TurnBytes};
use super::{Parts, Role, ShapeError, Turn};

pub(super) fn parts(body: &Object, canonical: &Canonical) -> Result<Parts, ShapeError> {
    let key = canonical.key;
    let mut system_chars = match body.get("system") {
        None | Some(Json::Null) => 0,
        Some(Json::String(s)) => s.chars(),
        Some(Json::Array(blocks)) => {
            let mut total = 0;
            for block in blocks {
                match block.get("text") {
                    Some(Json::String(s)) => total += s.chars(),
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
        Some(Json::Array(items)) => items,
        None => return Err(ShapeError::Missing("messages")),
        Some(_) => {
            return Err(ShapeError::WrongType {
                field: "messages",
                expected: "an array",
            })
        }
    };
    let mut turns = Vec::with_capacity(messages.len());
    let mut turn_bytes = Vec::with_capacity(messages.len());
    let mut calls_per_turn = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let err = |problem| ShapeError::Message { index, problem };
        let Json::Object(message) = message else {
            return Err(err("must be an object"));
        };
        let role = match message.get("role") {
            Some(Json::String(r)) if r.is("user") => Role::User,
            Some(Json::String(r)) if r.is("assistant") => Role::Assistant,
            // A system turn inside `messages` (Claude Code with current models sends them):
            // it counts as system, not as a turn.
            Some(Json::String(r)) if r.is("system") => {
                system_chars += match message.get("content") {
                    Some(Json::String(s)) => s.chars(),
                    Some(Json::Array(blocks)) => blocks
                        .iter()
                        .filter_map(|b| match b {
                            Json::Object(b) => Some(block_chars(b)),
                            _ => None,
                        })
                        .sum(),
                    _ => {
                        return Err(err(
                            "content must be a string or an array of content blocks",
                        ))
                    }
                };
                continue;
            }
            _ => return Err(err("role must be \"user\", \"assistant\" or \"system\"")),
        };
        let mut called = Vec::new();
        let turn_chars = match message.get("content") {
            Some(Json::String(s)) => s.chars(),
            Some(Json::Array(blocks)) => {
                let mut total = 0;
                for block in blocks {
                    let Json::Object(block) = block else {
                        return Err(err("content blocks must be objects"));
                    };
                    total += block_chars(block);
                    if let (Some(Json::String(kind)), Some(Json::String(name))) =
                        (block.get("type"), block.get("name"))
                    {
                        if kind.is("tool_use") || kind.is("server_tool_use") {
                            called.push(tool_name_hash(key, &name.to_cow()));
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
            hash: None,
        });
        turn_bytes.push(TurnBytes::Message(index));
        calls_per_turn.push(called);
    }

    let tools = super::tool_defs(body, canonical, |tool| tool.get("name"))?;

    Ok(Parts {
        system_chars,
        turns,
        turn_bytes,
        tools,
        called_tool_hashes: super::history_calls(calls_per_turn),
    })
}

/// Characters of one content block: text, tool inputs and tool results count; media does not.
fn block_chars(block: &Object) -> u64 {
    let kind = block
        .get("type")
        .and_then(Json::as_string)
        .map(Str::to_cow)
        .unwrap_or_default();
    match kind.as_ref() {
        "tool_use" | "server_tool_use" => block.get("input").map(compact_json_chars).unwrap_or(0),
        "tool_result" => match block.get("content") {
            Some(Json::String(s)) => s.chars(),
            Some(Json::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Json::as_string))
                .map(Str::chars)
                .sum(),
            _ => 0,
        },
        "thinking" => block
            .get("thinking")
            .and_then(Json::as_string)
            .map(Str::chars)
            .unwrap_or(0),
        _ => block
            .get("text")
            .and_then(Json::as_string)
            .map(Str::chars)
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use crate::request::{parse, Role, Route};

    #[test]
    fn a_system_turn_inside_messages_counts_as_system() {
        let body = br#"{"model":"c","max_tokens":5,"system":"abc","messages":[
            {"role":"user","content":"hi"},
            {"role":"system","content":[{"type":"text","text":"12345"}]},
            {"role":"assistant","content":"yo"}]}"#;
        let s = parse(Route::AnthropicMessages, body, &[1; 32])
            .unwrap()
            .shape;
        assert_eq!(s.system_chars, 8);
        let roles: Vec<Role> = s.turns.iter().map(|t| t.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant]);
        let bad = br#"{"model":"c","max_tokens":5,"messages":[{"role":"robot","content":"x"}]}"#;
        assert!(parse(Route::AnthropicMessages, bad, &[1; 32]).is_err());
    }
}
