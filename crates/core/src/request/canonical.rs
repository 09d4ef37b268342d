//! The canonical form of a request and the keyed hashes over it.
//!
//! Canonical form: the body as JSON with object keys sorted (serde_json's default map is
//! ordered) and no whitespace, with `stream` and `stream_options` removed — they change the
//! answer's wire form, not its content. It is written once; the message and tool elements are
//! recorded as byte ranges of it, so turn hashes and tool sizes cost no second serialisation.

use std::fmt;
use std::ops::Range;

use super::json::{self, Json, Object};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Route;

// Domain separation under the one fingerprint key. The fingerprint and tool-name inputs start
// with their tag; a turn's input starts with its canonical message (`{`), so its tag goes at
// the end: no input of one kind can equal an input of another, and the message starts at
// BLAKE3 chunk 0, which lets a long message's chunks be hashed in parallel. v2: inputs longer
// than a chunk are padded ([`keyed`]).
const FINGERPRINT_DOMAIN: &[u8] = b"tokensaver fingerprint v2\0";
const TURN_DOMAIN_SUFFIX: &[u8] = b"\0tokensaver turn v2";
const TOOL_NAME_DOMAIN: &[u8] = b"tokensaver tool name v2\0";

/// BLAKE3 compresses whole 1 KiB chunks side by side only four or more at a time (its SIMD
/// kernels are 4, 8 and 16 lanes wide); a remainder of one to three chunks and a partial last
/// chunk go one 64-byte block after another. An 8,177-byte input took 5.5 µs here and an
/// 8,192-byte one 1.7 µs. So an input longer than one chunk is padded — one `0x01` byte, then
/// zeros — to a multiple of 4 KiB, and every chunk of it is compressed in parallel. The
/// padding is injective (the last non-zero byte ends the input), and an input of one chunk or
/// less is hashed as it is (padding it would only add work).
pub(super) const PAD_TO: usize = 4 * 1024;
const CHUNK_LEN: usize = 1024;

/// Top-level fields that never change the answer, left out of the canonical form (and so of
/// both fingerprints) so that a rerun in a new client session has the same identity. Each
/// names the caller, its session or a caching hint: `user`, `safety_identifier` and
/// `metadata` identify the end user or session (Claude Code's `metadata.user_id` carries its
/// session id); `prompt_cache_key` and `prompt_cache_retention` steer the provider's prompt
/// cache (Codex sets the key to its session id); Codex's `client_metadata` carries its session,
/// turn and installation ids and a timestamp; chat's `store` keeps a copy for the caller's
/// dashboard. Responses input items also lose their `id` (see [`Canonical::of`]). `stream` and `stream_options` change the wire form only.
/// Responses `store` is kept: it decides whether the answer can be chained later.
pub fn ignored_fields(route: Route) -> &'static [&'static str] {
    match route {
        Route::OpenAiChat => &[
            "metadata",
            "prompt_cache_key",
            "prompt_cache_retention",
            "safety_identifier",
            "store",
            "stream",
            "stream_options",
            "user",
        ],
        Route::OpenAiResponses => &[
            "client_metadata",
            "metadata",
            "prompt_cache_key",
            "prompt_cache_retention",
            "safety_identifier",
            "stream",
            "stream_options",
            "user",
        ],
        Route::AnthropicMessages => &["metadata", "stream", "stream_options"],
    }
}

/// A 32-byte BLAKE3 output, shown and serialised as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first `digits` hex digits (at most 64): a short name for display.
    pub fn hex_prefix(&self, digits: usize) -> String {
        let mut hex = self.to_hex();
        hex.truncate(digits);
        hex
    }

    pub fn from_hex(text: &str) -> Option<Hash> {
        crate::receipt::parse_hex32(text).map(Hash)
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hash(")?;
        crate::receipt::write_hex32(&self.0, f)?;
        f.write_str(")")
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::receipt::write_hex32(&self.0, f)
    }
}

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Hash::from_hex(&text).ok_or_else(|| serde::de::Error::custom("expected 64 hex digits"))
    }
}

/// Keyed BLAKE3 of the parts in order (the domain tag is one of them), padded as [`PAD_TO`]
/// says when longer than a chunk.
pub(super) fn keyed(key: &[u8; 32], parts: &[&[u8]]) -> Hash {
    let len: usize = parts.iter().map(|part| part.len()).sum();
    if len <= CHUNK_LEN {
        let mut hasher = blake3::Hasher::new_keyed(key);
        for part in parts {
            hasher.update(part);
        }
        return Hash(*hasher.finalize().as_bytes());
    }
    let mut input = Vec::with_capacity(padded_len(len));
    for part in parts {
        input.extend_from_slice(part);
    }
    keyed_in_place(key, &mut input)
}

/// [`keyed`] of one buffer the caller owns, padded in place instead of copied.
pub(super) fn keyed_in_place(key: &[u8; 32], buf: &mut Vec<u8>) -> Hash {
    if buf.len() > CHUNK_LEN {
        let len = padded_len(buf.len());
        buf.push(1);
        buf.resize(len, 0);
    }
    Hash(*blake3::keyed_hash(key, buf).as_bytes())
}

/// The padded length of an input of `len` bytes (more than a chunk): the `0x01` byte and the
/// zeros up to a multiple of [`PAD_TO`].
pub(super) fn padded_len(len: usize) -> usize {
    (len + 1).next_multiple_of(PAD_TO)
}

/// What a turn's hash is over: a message of the body's turn list (by index: a system prompt
/// is not a turn), or, for a Responses `input` string, the user message it stands for.
pub enum TurnBytes {
    Message(usize),
    Standalone(Vec<u8>),
}

/// Keyed hash of a tool name, as defined and as called.
pub fn tool_name_hash(key: &[u8; 32], name: &str) -> Hash {
    keyed(key, &[TOOL_NAME_DOMAIN, name.as_bytes()])
}

/// The fingerprint, each tool definition's size, and the turn hashes on demand.
pub struct Canonical<'k> {
    pub key: &'k [u8; 32],
    pub fingerprint: Hash,
    pub tool_chars: Vec<u64>,
    /// A `cache_control` key anywhere in the body (noted while writing the canonical form).
    pub cache_marked: bool,
    /// The fingerprint's input: domain, route, then the canonical body.
    buf: Vec<u8>,
    message_ranges: Vec<Range<usize>>,
}

impl<'k> Canonical<'k> {
    pub fn of(route: Route, body: &Object, key: &'k [u8; 32], size_hint: usize) -> Self {
        let mut buf = Vec::with_capacity(padded_len(size_hint + 64));
        // The prefix goes in the same buffer so that BLAKE3 gets the whole input in one
        // update: after a separate small update its chunk counter would be unaligned and it
        // could not hash the following chunks in parallel.
        buf.extend_from_slice(FINGERPRINT_DOMAIN);
        buf.extend_from_slice(route.as_str().as_bytes());
        buf.push(0);
        let mut message_ranges = Vec::new();
        let mut tool_ranges = Vec::new();
        let mut probe = json::KeyProbe {
            wanted: "cache_control",
            found: false,
        };
        buf.push(b'{');
        let mut first = true;
        let ignored = ignored_fields(route);
        // The turns: chat and messages bodies list them in `messages`, Responses in `input`.
        let turns_field = match route {
            Route::OpenAiResponses => "input",
            Route::OpenAiChat | Route::AnthropicMessages => "messages",
        };
        for (member, value) in body.members() {
            let name = member.as_ref();
            probe.found |= name == probe.wanted;
            if ignored.contains(&name) {
                json::write_value(&mut Vec::new(), value, &mut probe);
                continue;
            }
            if !first {
                buf.push(b',');
            }
            first = false;
            json::write_key(&mut buf, member);
            buf.push(b':');
            match (name, value) {
                (field, Json::Array(items)) if field == turns_field => {
                    // Responses input items carry ids the client makes up per session (Codex
                    // gives every item a fresh uuid); an item's content is its identity. An
                    // `item_reference` is nothing but its id, so it keeps it.
                    let drop_id = route == Route::OpenAiResponses;
                    write_elements(&mut buf, items, &mut message_ranges, &mut probe, drop_id)
                }
                ("tools", Json::Array(items)) => {
                    write_elements(&mut buf, items, &mut tool_ranges, &mut probe, false)
                }
                _ => json::write_value(&mut buf, value, &mut probe),
            }
        }
        buf.push(b'}');

        // The ranges below stay valid: the padding goes after the canonical form.
        let fingerprint = keyed_in_place(key, &mut buf);
        let tool_chars = tool_ranges
            .iter()
            .map(|r| utf8_chars(&buf[r.clone()]))
            .collect();
        Canonical {
            key,
            fingerprint,
            tool_chars,
            cache_marked: probe.found,
            buf,
            message_ranges,
        }
    }

    /// A turn's hash: over its message's canonical JSON, with the turn domain after it.
    pub fn turn_hash(&self, turn: &TurnBytes) -> Hash {
        let message = match turn {
            TurnBytes::Message(index) => {
                let range = self.message_ranges.get(*index).cloned().unwrap_or_default();
                &self.buf[range]
            }
            TurnBytes::Standalone(message) => message.as_slice(),
        };
        keyed(self.key, &[message, TURN_DOMAIN_SUFFIX])
    }
}

fn write_elements(
    buf: &mut Vec<u8>,
    items: &[Json],
    ranges: &mut Vec<Range<usize>>,
    probe: &mut json::KeyProbe,
    drop_id: bool,
) {
    buf.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        let start = buf.len();
        match item {
            Json::Object(object) if drop_id && !is_item_reference(object) => {
                buf.push(b'{');
                let kept = object.members().iter().filter(|(k, _)| k != "id");
                for (j, (key, value)) in kept.enumerate() {
                    if j > 0 {
                        buf.push(b',');
                    }
                    probe.found |= key == probe.wanted;
                    json::write_key(buf, key);
                    buf.push(b':');
                    json::write_value(buf, value, probe);
                }
                buf.push(b'}');
            }
            _ => json::write_value(buf, item, probe),
        }
        ranges.push(start..buf.len());
    }
    buf.push(b']');
}

fn is_item_reference(object: &json::Object) -> bool {
    object
        .get("type")
        .and_then(Json::as_string)
        .is_some_and(|t| t.is("item_reference"))
}

/// Unicode scalar values in valid UTF-8: every byte that is not a continuation byte.
pub fn utf8_chars(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| (b & 0xC0) != 0x80).count() as u64
}

/// Characters of a value's compact JSON, without keeping the text.
pub fn compact_json_chars(value: &Json) -> u64 {
    match value {
        Json::String(s) => s.chars(),
        _ => {
            let mut buf = Vec::new();
            json::write_compact(&mut buf, value);
            utf8_chars(&buf)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse_object;

    fn marked(body: &str) -> bool {
        let object = parse_object(body.as_bytes()).unwrap();
        Canonical::of(Route::AnthropicMessages, &object, &[1; 32], body.len()).cache_marked
    }

    #[test]
    fn cache_control_is_found_at_any_depth_and_only_as_a_key() {
        assert!(marked(r#"{"cache_control":{"type":"ephemeral"}}"#));
        assert!(marked(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{}}]}]}"#
        ));
        assert!(marked(r#"{"tools":[{"name":"t","cache_control":{}}]}"#));
        assert!(marked(r#"{"stream_options":{"cache_control":1}}"#));
        assert!(marked(r#"{"a":[[{"b":{"cache_control":null}}]]}"#));
        assert!(!marked(
            r#"{"messages":[{"role":"user","content":"cache_control"}]}"#
        ));
        assert!(!marked(r#"{"cache_control_x":1,"x":["cache_control"]}"#));
    }

    /// The padding of inputs longer than a chunk: what it is, that it keeps distinct inputs
    /// distinct (an input and the same input with zeros after it, either side of a chunk), and
    /// that the parts and the in-place forms agree.
    #[test]
    fn long_inputs_are_padded_injectively() {
        let key = [5u8; 32];
        let plain = |bytes: &[u8]| Hash(*blake3::keyed_hash(&key, bytes).as_bytes());
        let short = vec![b'x'; CHUNK_LEN];
        assert_eq!(keyed(&key, &[&short]), plain(&short));
        let long = vec![b'x'; CHUNK_LEN + 1];
        let mut padded = long.clone();
        padded.push(1);
        padded.resize(PAD_TO, 0);
        assert_eq!(keyed(&key, &[&long]), plain(&padded));
        assert_eq!(padded_len(PAD_TO - 1), PAD_TO);
        assert_eq!(padded_len(PAD_TO), 2 * PAD_TO);

        let mut seen = std::collections::HashSet::new();
        for len in [
            1,
            CHUNK_LEN - 1,
            CHUNK_LEN,
            CHUNK_LEN + 1,
            PAD_TO - 2,
            PAD_TO - 1,
            PAD_TO,
        ] {
            for tail in [&b""[..], b"\0", b"\0\0", b"\x01", b"\x01\0"] {
                let mut input = vec![b'y'; len];
                input.extend_from_slice(tail);
                let (head, rest) = input.split_at(len / 2);
                let by_parts = keyed(&key, &[head, rest]);
                assert_eq!(by_parts, keyed_in_place(&key, &mut input.clone()));
                assert!(seen.insert(by_parts), "{len} + {tail:?} collides");
            }
        }
    }

    #[test]
    fn escape_spellings_of_the_same_text_are_the_same_request() {
        let shape = |body: &str| {
            crate::request::parse(Route::OpenAiChat, body.as_bytes(), &[1; 32])
                .unwrap()
                .shape
        };
        let escaped = shape(
            r#"{"model":"m","messages":[{"role":"user","content":"caf\u00E9 \/ \"q\" \ud83d\ude00"}]}"#,
        );
        let plain =
            shape(r#"{"model":"m","messages":[{"role":"user","content":"café / \"q\" 😀"}]}"#);
        assert_eq!(escaped.fingerprint, plain.fingerprint);
        assert_eq!(escaped.turns, plain.turns);
        // c a f é ␠ / ␠ " q " ␠ 😀
        assert_eq!(plain.turns[0].chars, 12);
    }

    #[test]
    fn the_fingerprint_ignores_wire_form_fields_and_key_order() {
        let fp = |body: &str| {
            let object = parse_object(body.as_bytes()).unwrap();
            Canonical::of(Route::OpenAiChat, &object, &[1; 32], body.len()).fingerprint
        };
        let a = fp(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#);
        let b = fp(
            r#"{ "messages":[{"content":"hi","role":"user"}], "stream":true,
                       "stream_options":{"include_usage":true}, "model":"m" }"#,
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            fp(r#"{"model":"m","messages":[{"role":"user","content":"hi!"}]}"#)
        );
    }
}
