//! Anthropic `messages` bodies → the shape's parts.

use super::json::{write_without_keys, Json, Object, Str};
use super::{CachePoint, CacheSite, CacheUnit};

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

/// The caller's own `cache_control` markers (SPEC §2.11b, lifetimes): the closing-brace offset
/// of each marker object that names no `ttl` — where the gate may write `,"ttl":"1h"` — and
/// whether any marker names one (then the caller chose its lifetimes, and none is touched).
/// Markers are read where the provider reads them: top level, tools, system blocks, message
/// content blocks and a `tool_result`'s content parts.
pub(super) fn ttl_marks(body: &Object) -> (Vec<usize>, bool) {
    let mut sites = Vec::new();
    let mut ttl_set = false;
    let mut marker = |value: Option<&Json>| {
        if let Some(Json::Object(marker)) = value {
            if marker.get("ttl").is_some() {
                ttl_set = true;
            } else {
                sites.push(marker.close());
            }
        }
    };
    marker(body.get("cache_control"));
    let holders = |field: &str| match body.get(field) {
        Some(Json::Array(items)) => items.as_slice(),
        _ => &[],
    };
    for holder in holders("tools").iter().chain(holders("system")) {
        marker(holder.get("cache_control"));
    }
    for message in holders("messages") {
        if let Some(Json::Array(content)) = message.get("content") {
            for block in content {
                marker(block.get("cache_control"));
                if let Some(Json::Array(parts)) = block.get("content") {
                    for part in parts {
                        marker(part.get("cache_control"));
                    }
                }
            }
        }
    }
    sites.sort_unstable();
    (sites, ttl_set)
}

/// Where a breakpoint can go in a unit: after the last block of an array (an object that has
/// members, and a block that may carry one: not `thinking`/`redacted_thinking`, not an empty
/// text), or a non-empty string turned into one text block.
fn site_of<'b>(value: &'b Json<'b>) -> Option<Site<'b>> {
    match value {
        Json::String(s) if !s.raw().is_empty() => Some(Site::Text(s)),
        Json::Array(items) => match items.last() {
            Some(Json::Object(block)) if markable(block) => Some(Site::Block(block.close())),
            _ => None,
        },
        _ => None,
    }
}

/// Whether the provider takes a `cache_control` on this block (Anthropic refuses one on a
/// thinking block and on an empty text block).
fn markable(block: &Object) -> bool {
    if block.iter().next().is_none() {
        return false;
    }
    match block.get("type").and_then(Json::as_string).map(Str::raw) {
        Some("thinking" | "redacted_thinking") => false,
        Some("text") => block
            .get("text")
            .and_then(Json::as_string)
            .is_some_and(|t| !t.raw().is_empty()),
        _ => true,
    }
}

enum Site<'b> {
    /// Insert before this closing brace.
    Block(usize),
    /// Wrap this string into a text block that carries the breakpoint.
    Text(&'b Str<'b>),
}

/// The unit's value in the body (the tools array, the system prompt, a message's content).
fn unit_value<'b>(body: &'b Object<'b>, unit: CacheUnit) -> Option<&'b Json<'b>> {
    match unit {
        CacheUnit::Tools => body.get("tools"),
        CacheUnit::System => body.get("system"),
        CacheUnit::Message(i) => match body.get("messages") {
            Some(Json::Array(items)) => items.get(i).and_then(|m| m.get("content")),
            _ => None,
        },
    }
}

/// Where in `bytes` a breakpoint goes for each of `points` (index for index): recorded when
/// the body is read, so the proxy edits the bytes without reading them again. `None` when a
/// point's unit is not where its shape found it (never, for the body the points came from).
pub(super) fn cache_sites(
    body: &Object,
    bytes: &[u8],
    points: &[CachePoint],
) -> Option<Vec<CacheSite>> {
    points
        .iter()
        .map(|point| match site_of(unit_value(body, point.unit)?)? {
            Site::Block(close) => Some(CacheSite::Block(close)),
            Site::Text(s) => {
                // The tree borrows from `bytes`: the string's offset is its distance from them.
                let raw = s.raw();
                let start = (raw.as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)?;
                let quoted = start.checked_sub(1)?..start + raw.len() + 1;
                let read = bytes.get(quoted.clone())?;
                (read.first() == Some(&b'"') && read.last() == Some(&b'"'))
                    .then_some(CacheSite::Text(quoted))
            }
        })
        .collect()
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

    /// The sites the reading records, edited, give the body a person would write by hand:
    /// the string system prompt as one marked text block, a marker after the last tool and
    /// after a message's last block; every other byte (the odd spacing included) as sent.
    #[test]
    fn cache_sites_edit_only_where_the_breakpoint_goes() {
        use crate::request::edit::apply;
        use crate::request::CacheUnit;
        let body = br#"{"model":"c", "max_tokens":5,"tools":[{"name":"t","input_schema":{}}],"system":"s\"ys","messages":[
            {"role":"user","content":"hi"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"x"},{"type":"tool_use","id":"a","name":"t","input":{}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"ok"}]},
            {"role":"assistant","content":[{"type":"thinking","thinking":"y"}]},
            {"role":"user","content":""}]}"#;
        let parsed = parse(Route::AnthropicMessages, body, &[1; 32]).unwrap();
        let units: Vec<CacheUnit> = parsed.shape.cache_points.iter().map(|p| p.unit).collect();
        // The thinking-only message and the empty string take no breakpoint.
        assert_eq!(
            units,
            [
                CacheUnit::Tools,
                CacheUnit::System,
                CacheUnit::Message(0),
                CacheUnit::Message(1),
                CacheUnit::Message(2)
            ]
        );
        assert_eq!(parsed.cache_sites.len(), units.len());
        let edits = parsed
            .cache_sites
            .iter()
            .map(|s| s.edit(body).unwrap())
            .collect();
        let edited = String::from_utf8(apply(body, edits).unwrap()).unwrap();
        let m = r#""cache_control":{"type":"ephemeral"}"#;
        let expected = format!(
            r#"{{"model":"c", "max_tokens":5,"tools":[{{"name":"t","input_schema":{{}},{m}}}],"system":[{{"type":"text","text":"s\"ys",{m}}}],"messages":[
            {{"role":"user","content":[{{"type":"text","text":"hi",{m}}}]}},
            {{"role":"assistant","content":[{{"type":"thinking","thinking":"x"}},{{"type":"tool_use","id":"a","name":"t","input":{{}},{m}}}]}},
            {{"role":"user","content":[{{"type":"tool_result","tool_use_id":"a","content":"ok",{m}}}]}},
            {{"role":"assistant","content":[{{"type":"thinking","thinking":"y"}}]}},
            {{"role":"user","content":""}}]}}"#
        );
        assert_eq!(edited, expected);
        // The edited body is marked: the gate would place nothing on it.
        let again = parse(Route::AnthropicMessages, edited.as_bytes(), &[1; 32]).unwrap();
        assert!(again.shape.cache_marked && again.shape.cache_points.is_empty());
    }
}
