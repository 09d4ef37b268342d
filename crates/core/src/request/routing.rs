//! The route prefix of an OpenAI request (SPEC §2.11b, routing): the provider routes a request
//! to a cache machine by a hash of the prompt's first ~256 tokens combined with
//! `prompt_cache_key`. The gate keeps the same identity — a keyed hash of the request's first
//! [`ROUTE_PREFIX_BYTES`] of tools, instructions and messages as sent, without per-item ids — to
//! count a prefix's rate and pick its routing key. No content: a keyed hash.

use super::canonical::keyed_in_place;
use super::json::{write_without_keys, Json, Object};
use super::{Hash, Route};

/// About 256 tokens of the prompt's beginning.
pub const ROUTE_PREFIX_BYTES: usize = 1024;

const ROUTE_DOMAIN: &[u8] = b"tokensaver route prefix v1\0";

/// The route prefix of an OpenAI request that names no `prompt_cache_key` (`None` otherwise,
/// and for Anthropic requests).
pub(super) fn route_prefix(route: Route, body: &Object, key: &[u8; 32]) -> Option<Hash> {
    if route == Route::AnthropicMessages
        || !matches!(body.get("prompt_cache_key"), None | Some(Json::Null))
    {
        return None;
    }
    let mut buf = Vec::with_capacity(2 * ROUTE_PREFIX_BYTES);
    let full = |buf: &Vec<u8>| buf.len() >= ROUTE_PREFIX_BYTES;
    if let Some(Json::Array(tools)) = body.get("tools") {
        for tool in tools {
            write_without_keys(&mut buf, tool, &[]);
        }
    }
    let items: &[Json] = match (route, body.get("messages"), body.get("input")) {
        (Route::OpenAiChat, Some(Json::Array(messages)), _) => messages,
        (Route::OpenAiResponses, _, Some(Json::Array(items))) => items,
        _ => &[],
    };
    if route == Route::OpenAiResponses {
        if let Some(instructions) = body.get("instructions") {
            write_without_keys(&mut buf, instructions, &[]);
        }
        if let Some(input @ Json::String(_)) = body.get("input") {
            write_without_keys(&mut buf, input, &[]);
        }
    }
    for item in items {
        if full(&buf) {
            break;
        }
        write_without_keys(&mut buf, item, &["id"]);
    }
    buf.truncate(ROUTE_PREFIX_BYTES);
    let mut input = Vec::with_capacity(ROUTE_DOMAIN.len() + buf.len());
    input.extend_from_slice(ROUTE_DOMAIN);
    input.extend_from_slice(&buf);
    Some(keyed_in_place(key, &mut input))
}

/// Whether the caller chose the retention itself (`prompt_cache_retention`, or GPT-5.6's
/// `prompt_cache_options`).
pub(super) fn retention_set(body: &Object) -> bool {
    ["prompt_cache_retention", "prompt_cache_options"]
        .iter()
        .any(|f| !matches!(body.get(f), None | Some(Json::Null)))
}

#[cfg(test)]
mod tests {
    use crate::request::{parse, Route};

    const KEY: [u8; 32] = [9; 32];

    fn prefix(route: Route, body: &str) -> Option<crate::request::Hash> {
        parse(route, body.as_bytes(), &KEY)
            .unwrap()
            .shape
            .route_prefix
    }

    #[test]
    fn sessions_sharing_a_system_prompt_share_a_route_prefix() {
        let system = "You are the support agent of a large shop. ".repeat(40);
        let chat = |user: &str| {
            format!(
                r#"{{"model":"gpt-5.5","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{user}"}}]}}"#
            )
        };
        let a = prefix(Route::OpenAiChat, &chat("where is my parcel?"));
        assert!(a.is_some());
        assert_eq!(a, prefix(Route::OpenAiChat, &chat("I want a refund")));
        // A short prompt is its own prefix.
        let short = |user: &str| {
            format!(r#"{{"model":"gpt-5.5","messages":[{{"role":"user","content":"{user}"}}]}}"#)
        };
        assert_ne!(
            prefix(Route::OpenAiChat, &short("a")),
            prefix(Route::OpenAiChat, &short("b"))
        );
        // A caller's own key: the gate places none, so keeps no prefix.
        let keyed = r#"{"model":"gpt-5.5","prompt_cache_key":"mine","messages":[{"role":"user","content":"x"}]}"#.to_string();
        assert_eq!(prefix(Route::OpenAiChat, &keyed), None);
        assert_eq!(
            prefix(
                Route::AnthropicMessages,
                r#"{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"x"}]}"#
            ),
            None
        );
        // Responses: item ids (a client's per-session uuids) are not the prefix.
        let items = |id: &str| {
            format!(
                r#"{{"model":"gpt-5.5","instructions":"{system}","input":[{{"id":"{id}","role":"user","content":"hi"}}]}}"#
            )
        };
        assert_eq!(
            prefix(Route::OpenAiResponses, &items("a")),
            prefix(Route::OpenAiResponses, &items("b"))
        );
    }
}
