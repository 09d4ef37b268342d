//! Ed25519 receipts: every decision is signed, and anyone holding the public key can check it.
//!
//! The envelope is `{"body": base64 of the exact signed bytes, "sig": base64 signature,
//! "kid": key id}`. Earlier public keys stay verifiable so old receipts keep their worth after
//! a rotation. The key files (in the data dir) are read by the server, not here.
//!
//! One key signs several kinds of document (decision receipts, split-profile reports, …), so
//! each kind is signed under its own domain: the signed message is the kind's domain string,
//! then the body, and the envelope names the kind (`"kind"`). A document of one kind can never
//! pass as another (a free split-profile pre-check is no receipt). Envelopes signed before the
//! domains existed have no `kind`: they verify as *unscoped*, which proves the key signed the
//! body but not which kind of document it is.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("envelope is not valid JSON of the form {{body, sig, kid}}")]
    Malformed,
    #[error("envelope body or signature is not valid base64")]
    Encoding,
    #[error("no known receipt key has this kid")]
    UnknownKid,
    #[error("signature does not match the body")]
    BadSignature,
    #[error("the envelope is a signed document of another kind")]
    WrongKind,
}

/// The kinds of document the gate's key signs, each under its own domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocumentKind {
    /// A decision's receipt (SPEC §2.10).
    Receipt,
    /// A split-profile pre-check or house-check report.
    SplitProfileReport,
    /// An economics evidence file.
    Evidence,
    /// A readiness self-test (`/readyz`): never handed out.
    Probe,
}

impl DocumentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DocumentKind::Receipt => "receipt",
            DocumentKind::SplitProfileReport => "split_profile_report",
            DocumentKind::Evidence => "evidence",
            DocumentKind::Probe => "probe",
        }
    }

    /// What precedes the body in the signed message (NUL-terminated: no kind's domain is a
    /// prefix of another's).
    fn domain(self) -> &'static [u8] {
        match self {
            DocumentKind::Receipt => b"tokensaver receipt v1\0",
            DocumentKind::SplitProfileReport => b"tokensaver split-profile report v1\0",
            DocumentKind::Evidence => b"tokensaver economics evidence v1\0",
            DocumentKind::Probe => b"tokensaver readiness probe v1\0",
        }
    }

    fn message(self, body: &[u8]) -> Vec<u8> {
        let domain = self.domain();
        let mut message = Vec::with_capacity(domain.len() + body.len());
        message.extend_from_slice(domain);
        message.extend_from_slice(body);
        message
    }
}

/// A signed receipt as it travels: the exact body bytes, the signature, the key id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub body: String,
    pub sig: String,
    pub kid: String,
    /// The kind of document, whose domain the signature covers; absent in envelopes signed
    /// before domains existed (unscoped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<DocumentKind>,
}

impl Envelope {
    /// The signed bytes, decoded (no signature check).
    pub fn body_bytes(&self) -> Result<Vec<u8>, VerifyError> {
        B64.decode(&self.body).map_err(|_| VerifyError::Encoding)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The envelope as base64 JSON, the form carried in the `x-tokensaver-receipt` header.
    pub fn to_header_value(&self) -> String {
        B64.encode(self.to_json())
    }

    pub fn from_header_value(value: &str) -> Result<Self, VerifyError> {
        let json = B64
            .decode(value.trim())
            .map_err(|_| VerifyError::Encoding)?;
        serde_json::from_slice(&json).map_err(|_| VerifyError::Malformed)
    }
}

/// The receipt body version from which a decision's id is time-ordered ([`DecisionId::of`]);
/// bodies of version 1 are named by their hash alone ([`DecisionId::of_v1`]).
pub const TIME_ORDERED_RECEIPT_V: u32 = 2;

/// The id a receipt body names, by the body's version (`"v"`): from version 2 the time it was
/// decided, then its hash ([`DecisionId::of`]); before, or for bytes that are no receipt
/// body, the BLAKE3 hash of the bytes ([`DecisionId::of_v1`]). So an id read back from any
/// receipt, old or new, is the id its decision was booked under.
pub fn decision_id(body: &[u8]) -> DecisionId {
    /// The two members that say how a body is named (serde skips the rest).
    #[derive(Deserialize)]
    struct Named {
        v: u32,
        decided_at_ms: u64,
    }
    match serde_json::from_slice::<Named>(body) {
        Ok(n) if n.v >= TIME_ORDERED_RECEIPT_V => DecisionId::of(n.decided_at_ms, body),
        _ => DecisionId::of_v1(body),
    }
}

/// A decision's id: 32 bytes, shown, serialised and parsed as 64 lowercase hex digits, the one
/// spelling the gate has ever made, so that an id has one text form and a string key is never
/// compared against a differently spelt twin. Which bytes: [`decision_id`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DecisionId(pub [u8; 32]);

/// How many leading bytes of a time-ordered id hold the decision time.
const ID_TIME_BYTES: usize = 6;

impl DecisionId {
    /// A decision's id (receipt v2): the decision time in milliseconds since the epoch, 6 bytes
    /// big-endian (enough until the year 10889; a later clock wraps, the hash still tells ids
    /// apart), then the first 26 bytes of BLAKE3 of its receipt body. Ids sort by time, so the
    /// ledger's unique index on them grows at its end instead of at a random page for every
    /// row; 208 bits of hash keep distinct receipts apart.
    pub fn of(decided_at_ms: u64, body: &[u8]) -> DecisionId {
        let hash = blake3::hash(body);
        let mut id = [0u8; 32];
        id[..ID_TIME_BYTES].copy_from_slice(&decided_at_ms.to_be_bytes()[8 - ID_TIME_BYTES..]);
        id[ID_TIME_BYTES..].copy_from_slice(&hash.as_bytes()[..32 - ID_TIME_BYTES]);
        DecisionId(id)
    }

    /// The id of a receipt body of version 1: the BLAKE3 hash of the body.
    pub fn of_v1(body: &[u8]) -> DecisionId {
        DecisionId(*blake3::hash(body).as_bytes())
    }
}

/// A decision id that is not 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a decision id is 64 lowercase hex digits")]
pub struct MalformedDecisionId;

impl fmt::Display for DecisionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex32(&self.0, f)
    }
}

impl fmt::Debug for DecisionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for DecisionId {
    type Err = MalformedDecisionId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let lowercase = text.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        match parse_hex32(text) {
            Some(bytes) if lowercase => Ok(DecisionId(bytes)),
            _ => Err(MalformedDecisionId),
        }
    }
}

impl Serialize for DecisionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DecisionId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PublicKeyInfo {
    pub kid: String,
    pub alg: &'static str,
    pub public_key: String,
    pub current: bool,
}

pub struct ReceiptSigner {
    signing: SigningKey,
    kid: String,
    earlier: Vec<(String, VerifyingKey)>,
}

/// A key id names a public key: the first 16 hex digits of its BLAKE3 hash.
fn kid_of(key: &VerifyingKey) -> String {
    let hex = blake3::hash(key.as_bytes()).to_hex();
    format!("ed25519-{}", &hex.as_str()[..16])
}

impl ReceiptSigner {
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let signing = SigningKey::from_bytes(&seed);
        let kid = kid_of(&signing.verifying_key());
        Self {
            signing,
            kid,
            earlier: Vec::new(),
        }
    }

    /// The signer with the earlier public keys it still verifies: one base64 public key per
    /// line (unreadable lines are skipped); their kids are derived, not trusted.
    pub fn with_earlier_keys(mut self, lines: &str) -> Self {
        self.earlier = lines
            .lines()
            .filter_map(|line| {
                let bytes = B64.decode(line.trim()).ok()?;
                let arr: [u8; 32] = bytes.try_into().ok()?;
                let key = VerifyingKey::from_bytes(&arr).ok()?;
                Some((kid_of(&key), key))
            })
            .collect();
        self
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// Sign a decision's receipt body.
    pub fn sign(&self, body: &[u8]) -> Envelope {
        self.sign_as(DocumentKind::Receipt, body)
    }

    /// Sign `body` as a document of `kind`, under that kind's domain.
    pub fn sign_as(&self, kind: DocumentKind, body: &[u8]) -> Envelope {
        let sig = self.signing.sign(&kind.message(body));
        Envelope {
            body: B64.encode(body),
            sig: B64.encode(sig.to_bytes()),
            kid: self.kid.clone(),
            kind: Some(kind),
        }
    }

    /// Check a receipt: an envelope of kind `receipt` (or an unscoped one, from before the
    /// domains) against the current and earlier keys; returns the signed bytes.
    pub fn verify(&self, envelope: &Envelope) -> Result<Vec<u8>, VerifyError> {
        match self.verify_document(envelope)? {
            (None | Some(DocumentKind::Receipt), body) => Ok(body),
            (Some(_), _) => Err(VerifyError::WrongKind),
        }
    }

    /// Check a document of `kind` (an unscoped envelope never passes as one).
    pub fn verify_as(
        &self,
        kind: DocumentKind,
        envelope: &Envelope,
    ) -> Result<Vec<u8>, VerifyError> {
        match self.verify_document(envelope)? {
            (Some(k), body) if k == kind => Ok(body),
            _ => Err(VerifyError::WrongKind),
        }
    }

    /// Check an envelope of any kind; returns its kind (`None`: unscoped, signed before the
    /// domains existed) and the signed bytes.
    pub fn verify_document(
        &self,
        envelope: &Envelope,
    ) -> Result<(Option<DocumentKind>, Vec<u8>), VerifyError> {
        let current = self.signing.verifying_key();
        let key = if envelope.kid == self.kid {
            current
        } else {
            self.earlier
                .iter()
                .find(|(kid, _)| *kid == envelope.kid)
                .map(|(_, key)| *key)
                .ok_or(VerifyError::UnknownKid)?
        };
        let body = envelope.body_bytes()?;
        let sig_bytes = B64
            .decode(&envelope.sig)
            .map_err(|_| VerifyError::Encoding)?;
        let sig = Signature::from_slice(&sig_bytes).map_err(|_| VerifyError::Encoding)?;
        let verified = match envelope.kind {
            Some(kind) => key.verify(&kind.message(&body), &sig),
            None => key.verify(&body, &sig),
        };
        verified.map_err(|_| VerifyError::BadSignature)?;
        Ok((envelope.kind, body))
    }

    pub fn verify_json(&self, json: &[u8]) -> Result<Vec<u8>, VerifyError> {
        let envelope: Envelope =
            serde_json::from_slice(json).map_err(|_| VerifyError::Malformed)?;
        self.verify(&envelope)
    }

    pub fn public_keys(&self) -> Vec<PublicKeyInfo> {
        let mut keys = vec![PublicKeyInfo {
            kid: self.kid.clone(),
            alg: "Ed25519",
            public_key: B64.encode(self.signing.verifying_key().as_bytes()),
            current: true,
        }];
        keys.extend(self.earlier.iter().map(|(kid, key)| PublicKeyInfo {
            kid: kid.clone(),
            alg: "Ed25519",
            public_key: B64.encode(key.as_bytes()),
            current: false,
        }));
        keys
    }
}

/// 32 bytes as 64 lowercase hex digits, written from the stack (no allocation: receipts and
/// digests write ids and fingerprints on every request).
pub fn write_hex32(bytes: &[u8; 32], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut digits = [0u8; 64];
    // 32 bytes always fit 64 digits: encode_to_slice fails only on a length mismatch.
    hex::encode_to_slice(bytes, &mut digits).map_err(|_| fmt::Error)?;
    f.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)
}

/// Exactly 64 hex digits → 32 bytes.
pub fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex::encode([0x00, 0x0f, 0xa0, 0xff, 0x5c]), "000fa0ff5c");
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 37) as u8);
        let hex = hex::encode(bytes);
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expected);
        assert_eq!(parse_hex32(&hex), Some(bytes));
    }

    #[test]
    fn a_v2_receipt_names_its_decision_by_time_then_hash() {
        let at = 1_790_000_123_456u64;
        let body = format!(r#"{{"v":2,"verdict":"ALLOW","decided_at_ms":{at}}}"#);
        let id = decision_id(body.as_bytes());
        assert_eq!(id, DecisionId::of(at, body.as_bytes()));
        assert_eq!(&id.0[..6], &at.to_be_bytes()[2..]);
        assert_eq!(&id.0[6..], &blake3::hash(body.as_bytes()).as_bytes()[..26]);
        // Later decisions sort after earlier ones, whatever their bodies.
        let later = format!(r#"{{"v":2,"verdict":"BLOCK","decided_at_ms":{}}}"#, at + 1);
        assert!(decision_id(later.as_bytes()) > id);
        // A body of version 1 keeps the id it was booked under: its hash.
        let v1 = format!(r#"{{"v":1,"verdict":"ALLOW","decided_at_ms":{at}}}"#);
        assert_eq!(
            decision_id(v1.as_bytes()).0,
            *blake3::hash(v1.as_bytes()).as_bytes()
        );
    }

    #[test]
    fn decision_id_is_64_lowercase_hex_everywhere() {
        let id = decision_id(b"body");
        let text = blake3::hash(b"body").to_hex().to_string();
        assert_eq!(id.to_string(), text);
        assert_eq!(format!("{id:?}"), text);
        assert_eq!(text.parse::<DecisionId>(), Ok(id));
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<DecisionId>(&json).unwrap(), id);
        for bad in [
            text.to_uppercase(),
            text[1..].to_owned(),
            format!("{text}0"),
            format!("{}g", &text[1..]),
            "d1".into(),
            String::new(),
        ] {
            assert_eq!(bad.parse::<DecisionId>(), Err(MalformedDecisionId), "{bad}");
            let err = serde_json::from_value::<DecisionId>(serde_json::Value::String(bad.clone()))
                .unwrap_err()
                .to_string();
            assert!(
                !err.contains(&bad) || bad.is_empty(),
                "the error echoes the input"
            );
        }
    }

    #[test]
    fn sign_then_verify_round_trips_and_tampering_fails() {
        let signer = ReceiptSigner::from_seed([7; 32]);
        let env = signer.sign(br#"{"verdict":"ALLOW"}"#);
        assert_eq!(signer.verify(&env).unwrap(), br#"{"verdict":"ALLOW"}"#);
        let mut forged = env.clone();
        forged.body = B64.encode(br#"{"verdict":"SERVE"}"#);
        assert_eq!(signer.verify(&forged), Err(VerifyError::BadSignature));
        let mut unknown = env.clone();
        unknown.kid = "ed25519-0000000000000000".into();
        assert_eq!(signer.verify(&unknown), Err(VerifyError::UnknownKid));
        let header = env.to_header_value();
        assert_eq!(Envelope::from_header_value(&header).unwrap(), env);
    }
}
