//! Keys. A tokensaver key is `tsk_<id>_<secret>`: the id is looked up first, then the secret
//! is compared in constant time against its stored hash. Two different keyed derivations of
//! the secret exist: one stored by the gate (authentication), one used only to key the
//! request fingerprints — so the gate's store alone cannot test a fingerprint against a guess.

use std::sync::Arc;

use rand::RngCore;
use subtle::ConstantTimeEq;

pub use crate::config::valid_key_id;
use crate::config::{Config, KeyConfig};

const AUTH_CONTEXT: &str = "tokensaver auth v1";
const ADMIN_CONTEXT: &str = "tokensaver admin v1";
const OWNER_CONTEXT: &str = "tokensaver owner v1";
const FINGERPRINT_CONTEXT: &str = "tokensaver fingerprint v1";

/// A caller's key, split into its parts. The secret never leaves this struct except as hashes.
#[derive(Clone)]
pub struct ParsedKey<'a> {
    pub id: &'a str,
    pub secret: &'a str,
}

impl std::fmt::Debug for ParsedKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ParsedKey {{ id: {:?}, secret: <redacted> }}", self.id)
    }
}

pub fn parse_key(key: &str) -> Option<ParsedKey<'_>> {
    let rest = key.strip_prefix("tsk_")?;
    let (id, secret) = rest.split_once('_')?;
    (valid_key_id(id) && !secret.is_empty()).then_some(ParsedKey { id, secret })
}

pub fn secret_hash(secret: &str) -> [u8; 32] {
    blake3::derive_key(AUTH_CONTEXT, secret.as_bytes())
}

pub fn admin_hash(admin_key: &str) -> [u8; 32] {
    blake3::derive_key(ADMIN_CONTEXT, admin_key.as_bytes())
}

pub fn owner_hash(owner_secret: &str) -> [u8; 32] {
    blake3::derive_key(OWNER_CONTEXT, owner_secret.as_bytes())
}

/// The key for the keyed BLAKE3 hashes of fingerprints and turns.
pub fn fingerprint_key(secret: &str) -> [u8; 32] {
    blake3::derive_key(FINGERPRINT_CONTEXT, secret.as_bytes())
}

fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.ct_eq(b).into()
}

/// An authenticated caller: its key config and the fingerprint key derived from its secret.
#[derive(Debug, Clone)]
pub struct Caller {
    pub key_id: Arc<str>,
    pub fingerprint_key: [u8; 32],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing tokensaver key")]
    Missing,
    #[error("invalid tokensaver key")]
    Invalid,
}

/// Find the key, then compare the secret's hash in constant time.
pub fn authenticate<'c>(
    config: &'c Config,
    presented: Option<&str>,
) -> Result<(&'c KeyConfig, Caller), AuthError> {
    authenticate_among(presented, |id| config.key(id))
}

/// Digest mode: the one key this instance was given is the only one its callers may present.
pub fn authenticate_as<'k>(
    key: &'k KeyConfig,
    presented: Option<&str>,
) -> Result<(&'k KeyConfig, Caller), AuthError> {
    authenticate_among(presented, |id| (*key.id == *id).then_some(key))
}

/// The key the presented one names (`find`, by id), if its secret is that key's.
fn authenticate_among<'k>(
    presented: Option<&str>,
    find: impl FnOnce(&str) -> Option<&'k KeyConfig>,
) -> Result<(&'k KeyConfig, Caller), AuthError> {
    let presented = presented.ok_or(AuthError::Missing)?;
    let parsed = parse_key(presented).ok_or(AuthError::Invalid)?;
    let key = find(parsed.id).ok_or(AuthError::Invalid)?;
    if !ct_eq(&secret_hash(parsed.secret), &key.secret_hash) {
        return Err(AuthError::Invalid);
    }
    Ok((
        key,
        Caller {
            key_id: key.id.clone(),
            fingerprint_key: fingerprint_key(parsed.secret),
        },
    ))
}

pub fn is_admin(config: &Config, presented: Option<&str>) -> bool {
    match (config.admin_key_hash.as_ref(), presented) {
        (Some(stored), Some(key)) => ct_eq(&admin_hash(key), stored),
        _ => false,
    }
}

pub fn is_owner(key: &KeyConfig, presented: Option<&str>) -> bool {
    match (key.owner_secret_hash.as_ref(), presented) {
        (Some(stored), Some(secret)) => ct_eq(&owner_hash(secret), stored),
        _ => false,
    }
}

/// The key a request presents: `Authorization: Bearer` (OpenAI SDKs) or `x-api-key`
/// (Anthropic SDKs).
pub fn presented_key(headers: &http::HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim());
    }
    let auth = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = auth.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// A fresh key: `(full key, config lines holding its hash and, if given, its scoring
/// profile)`.
pub fn new_key(id: &str, profile: Option<&str>) -> Option<(String, String)> {
    if !valid_key_id(id) || profile.is_some_and(|p| !valid_key_id(p)) {
        return None;
    }
    let mut secret = [0u8; 24];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let secret = hex::encode(secret);
    let key = format!("tsk_{id}_{secret}");
    let mut line = format!(
        "[[keys]]\nid = \"{id}\"\nsecret_hash = \"{}\"\n",
        hex::encode(secret_hash(&secret))
    );
    if let Some(profile) = profile {
        line.push_str(&format!(
            "profile = \"{profile}\"   # needs [profiles.{profile}] in the config\n"
        ));
    }
    Some((key, line))
}

/// A fresh owner secret for a key (the person who approves its CHALLENGE holds) and the
/// config line holding its hash, to add to that key's `[[keys]]` table.
pub fn new_owner_secret() -> (String, String) {
    let mut secret = [0u8; 24];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let secret = hex::encode(secret);
    let line = format!(
        "owner_secret_hash = \"{}\"\n",
        hex::encode(owner_hash(&secret))
    );
    (secret, line)
}

pub fn new_admin_key() -> (String, String) {
    let mut secret = [0u8; 24];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let key = format!("tsa_{}", hex::encode(secret));
    let line = format!(
        "[admin]\nkey_hash = \"{}\"\n",
        hex::encode(admin_hash(&key))
    );
    (key, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_parsing() {
        let k = parse_key("tsk_team-a_abc123").unwrap();
        assert_eq!((k.id, k.secret), ("team-a", "abc123"));
        assert!(parse_key("sk-abc").is_none());
        assert!(parse_key("tsk__abc").is_none());
        assert!(parse_key("tsk_a_").is_none());
        assert!(!format!("{k:?}").contains("abc123"));
    }

    #[test]
    fn derivations_differ() {
        assert_ne!(secret_hash("s"), fingerprint_key("s"));
        assert_ne!(secret_hash("s"), secret_hash("t"));
    }
}
