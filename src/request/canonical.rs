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

const FINGERPRINT_DOMAIN: &[u8] = b"tokensaver fingerprint v1\0";
const TURN_DOMAIN: &[u8] = b"tokensaver turn v1\0";
const TOOL_NAME_DOMAIN: &[u8] = b"tokensaver tool name v1\0";

/// A 32-byte BLAKE3 output, shown and serialised as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    pub fn to_hex(&self) -> String {
        crate::receipt::hex_encode(&self.0)
    }

    pub fn from_hex(text: &str) -> Option<Hash> {
        crate::receipt::parse_hex32(text).map(Hash)
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.to_hex())
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Hash::from_hex(&text).ok_or_else(|| serde::de::Error::custom("expected 64 hex digits"))
    }
}

fn keyed(key: &[u8; 32], domain: &[u8], parts: &[&[u8]]) -> Hash {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(domain);
    for part in parts {
        hasher.update(part);
    }
    Hash(*hasher.finalize().as_bytes())
}

/// Keyed hash of a tool name, as defined and as called.
pub fn tool_name_hash(key: &[u8; 32], name: &str) -> Hash {
    keyed(key, TOOL_NAME_DOMAIN, &[name.as_bytes()])
}

/// The fingerprint, each tool definition's size, and the turn hashes on demand.
pub struct Canonical<'k> {
    pub key: &'k [u8; 32],
    pub fingerprint: Hash,
    pub tool_chars: Vec<u64>,
    /// The fingerprint's input: domain, route, then the canonical body.
    buf: Vec<u8>,
    message_ranges: Vec<Range<usize>>,
}

impl<'k> Canonical<'k> {
    pub fn of(route: Route, body: &Object, key: &'k [u8; 32], size_hint: usize) -> Self {
        let mut buf = Vec::with_capacity(size_hint + 64);
        // The prefix goes in the same buffer so that BLAKE3 gets the whole input in one
        // update: after a separate small update its chunk counter would be unaligned and it
        // could not hash the following chunks in parallel.
        buf.extend_from_slice(FINGERPRINT_DOMAIN);
        buf.extend_from_slice(route.as_str().as_bytes());
        buf.push(0);
        let mut message_ranges = Vec::new();
        let mut tool_ranges = Vec::new();
        buf.push(b'{');
        let mut first = true;
        for (member, value) in body.members() {
            let name = member.as_ref();
            if name == "stream" || name == "stream_options" {
                continue;
            }
            if !first {
                buf.push(b',');
            }
            first = false;
            json::write_key(&mut buf, member);
            buf.push(b':');
            match (name, value) {
                ("messages", Json::Array(items)) => {
                    write_elements(&mut buf, items, &mut message_ranges)
                }
                ("tools", Json::Array(items)) => write_elements(&mut buf, items, &mut tool_ranges),
                _ => json::write_compact(&mut buf, value),
            }
        }
        buf.push(b'}');

        let mut hasher = blake3::Hasher::new_keyed(key);
        hasher.update(&buf);
        let fingerprint = Hash(*hasher.finalize().as_bytes());
        let tool_chars = tool_ranges
            .iter()
            .map(|r| utf8_chars(&buf[r.clone()]))
            .collect();
        Canonical {
            key,
            fingerprint,
            tool_chars,
            buf,
            message_ranges,
        }
    }

    /// The turn hash of `messages[index]`: computed only for messages that are turns (a
    /// system prompt is not).
    pub fn message_hash(&self, index: usize) -> Hash {
        let range = self.message_ranges.get(index).cloned().unwrap_or_default();
        keyed(self.key, TURN_DOMAIN, &[&self.buf[range]])
    }
}

fn write_elements(buf: &mut Vec<u8>, items: &[Json], ranges: &mut Vec<Range<usize>>) {
    buf.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        let start = buf.len();
        json::write_compact(buf, item);
        ranges.push(start..buf.len());
    }
    buf.push(b']');
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

/// Whether an object key occurs anywhere in the body (iterative: no recursion on depth).
pub fn contains_key(body: &Object, wanted: &str) -> bool {
    let mut stack: Vec<&Json> = Vec::new();
    for (k, v) in body.iter() {
        if k == wanted {
            return true;
        }
        stack.push(v);
    }
    while let Some(value) = stack.pop() {
        match value {
            Json::Object(map) => {
                for (k, v) in map.iter() {
                    if k == wanted {
                        return true;
                    }
                    stack.push(v);
                }
            }
            Json::Array(items) => stack.extend(items.iter()),
            _ => {}
        }
    }
    false
}
