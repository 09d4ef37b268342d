//! Anthropic `messages` bodies → the shape's parts.

use super::json::{write_without_keys, Json, Object, Str};
use super::{CachePoint, CacheUnit};

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

/// Characters of one message's content (a string, or its blocks).
fn content_chars(message: &Object) -> u64 {
    match message.get("content") {
        Some(Json::String(s)) => s.chars(),
        Some(Json::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| match b {
                Json::Object(b) => Some(block_chars(b)),
                _ => None,
            })
            .sum(),
        _ => 0,
    }
}

/// Messages at the end of a request that carry a cache point: a breakpoint is placed where a
/// prefix came back, which in an agent's history is the previous call's end; older ones are
/// read through the provider's own look-back.
pub const CACHE_POINT_MESSAGES: usize = 32;

/// The request's cache points in the provider's cache order — after the tools, after the
/// system prompt, after each of the last [`CACHE_POINT_MESSAGES`] messages — each the keyed
/// hash of the prefix up to there (its compact JSON without any `cache_control`, so a caller's
/// own markers do not change it) and the characters it holds. Hashes only: no content.
pub(super) fn cache_points(body: &Object, key: &[u8; 32], tools_chars: u64) -> Vec<CachePoint> {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(b"tokensaver cache prefix v1\0");
    let mut buf = Vec::new();
    let mut unit = |hasher: &mut blake3::Hasher, value: &Json| {
        buf.clear();
        write_without_keys(&mut buf, value, &["cache_control"]);
        hasher.update(&(buf.len() as u64).to_le_bytes());
        hasher.update(&buf);
    };
    let mut points = Vec::new();
    let mut chars = 0u64;
    if let Some(Json::Array(tools)) = body.get("tools") {
        for tool in tools {
            unit(&mut hasher, tool);
        }
        if matches!(tools.last(), Some(Json::Object(_))) {
            chars = tools_chars;
            points.push(CachePoint::new(&hasher, chars, CacheUnit::Tools));
        }
    }
    hasher.update(b"\0system\0");
    if let Some(system) = body.get("system").filter(|s| !matches!(s, Json::Null)) {
        unit(&mut hasher, system);
        chars = chars.saturating_add(match system {
            Json::String(s) => s.chars(),
            Json::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Json::as_string))
                .map(Str::chars)
                .sum(),
            _ => 0,
        });
        if site_of(system).is_some() {
            points.push(CachePoint::new(&hasher, chars, CacheUnit::System));
        }
    }
    hasher.update(b"\0messages\0");
    let messages: &[Json] = match body.get("messages") {
        Some(Json::Array(items)) => items,
        _ => &[],
    };
    let first_pointed = messages.len().saturating_sub(CACHE_POINT_MESSAGES);
    for (index, message) in messages.iter().enumerate() {
        unit(&mut hasher, message);
        let Json::Object(m) = message else { continue };
        chars = chars.saturating_add(content_chars(m));
        if index >= first_pointed && m.get("content").and_then(site_of).is_some() {
            points.push(CachePoint::new(&hasher, chars, CacheUnit::Message(index)));
        }
    }
    points
}

/// Where a breakpoint goes in a unit: after the last block of an array (an object that has
/// members), or a string turned into one text block.
fn site_of<'b>(value: &'b Json<'b>) -> Option<Site<'b>> {
    match value {
        Json::String(s) => Some(Site::Text(s)),
        Json::Array(items) => match items.last() {
            Some(Json::Object(block)) if block.iter().next().is_some() => {
                Some(Site::Block(block.close()))
            }
            _ => None,
        },
        _ => None,
    }
}

enum Site<'b> {
    /// Insert before this closing brace.
    Block(usize),
    /// Wrap this string into a text block that carries the breakpoint.
    Text(&'b Str<'b>),
}

/// The edits that put a breakpoint at each of `units`: byte ranges of `bytes` to replace
/// (ascending, disjoint), and what replaces them. Every other byte stays as sent.
pub fn breakpoint_edits(
    body: &Object,
    bytes: &[u8],
    units: &[CacheUnit],
) -> Option<Vec<(std::ops::Range<usize>, Vec<u8>)>> {
    const MARK: &[u8] = br#""cache_control":{"type":"ephemeral"}"#;
    let mut edits = Vec::with_capacity(units.len());
    for unit in units {
        let value = match unit {
            CacheUnit::Tools => body.get("tools"),
            CacheUnit::System => body.get("system"),
            CacheUnit::Message(i) => match body.get("messages") {
                Some(Json::Array(items)) => items.get(*i).and_then(|m| m.get("content")),
                _ => None,
            },
        }?;
        match site_of(value)? {
            Site::Block(close) => {
                let mut insert = Vec::with_capacity(MARK.len() + 1);
                insert.push(b',');
                insert.extend_from_slice(MARK);
                edits.push((close..close, insert));
            }
            Site::Text(s) => {
                let raw = s.raw();
                let start = (raw.as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)?;
                let quoted = start.checked_sub(1)?..start + raw.len() + 1;
                let mut block = Vec::with_capacity(raw.len() + 64);
                block.extend_from_slice(br#"[{"type":"text","text":""#);
                block.extend_from_slice(raw.as_bytes());
                block.extend_from_slice(br#"","#);
                block.extend_from_slice(MARK);
                block.extend_from_slice(b"}]");
                edits.push((quoted, block));
            }
        }
    }
    edits.sort_by_key(|(range, _)| range.start);
    Some(edits)
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
