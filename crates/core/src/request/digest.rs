//! The digest: a request's shape as counts and keyed hashes, versioned, with no text in it.
//! A caller in digest mode sends this to `POST /gate` instead of its prompt.

use serde::{Deserialize, Serialize};

use super::RequestShape;

/// v2 adds the step fingerprint (and the Responses route). A v1 digest is still read: its
/// step fingerprint is its fingerprint, as it was for the v1 gate.
pub const DIGEST_VERSION: u32 = 2;
const READABLE_VERSIONS: [u32; 2] = [1, 2];

/// The wire form of an answer: a JSON body or a server-sent-event stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireForm {
    Json,
    Sse,
}

impl WireForm {
    pub fn as_str(self) -> &'static str {
        match self {
            WireForm::Json => "json",
            WireForm::Sse => "sse",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Digest {
    pub v: u32,
    pub request: RequestShape,
    /// `x-tokensaver-human`: `Some(true)` a person attends, `Some(false)` none, `None` the
    /// key's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human: Option<bool>,
    /// The wire forms for which the client's local store holds an answer under this fingerprint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<WireForm>,
    /// Set when retrying an approved hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest is not valid JSON")]
    NotJson,
    #[error("digest version is missing or not supported (this build reads v1 and v2)")]
    UnknownVersion,
    #[error("digest does not match the schema of its version")]
    Schema,
}

impl Digest {
    pub fn new(request: RequestShape) -> Self {
        Digest {
            v: DIGEST_VERSION,
            request,
            human: None,
            held: Vec::new(),
            hold_id: None,
        }
    }

    /// Parse a digest; an unknown version is refused. One typed read on the way to `Ok`; only
    /// a refusal reads the bytes again, to say which kind it is.
    pub fn parse(bytes: &[u8]) -> Result<Self, DigestError> {
        match serde_json::from_slice::<Digest>(bytes) {
            Ok(mut digest) if digest.v == 1 => {
                digest.request.step_fingerprint = digest.request.fingerprint;
                Ok(digest)
            }
            // v2 requires the step fingerprint (absent reads as the zero hash).
            Ok(digest) if digest.v == 2 => {
                if digest.request.step_fingerprint == super::Hash::default() {
                    Err(DigestError::Schema)
                } else {
                    Ok(digest)
                }
            }
            Ok(_) => Err(DigestError::UnknownVersion),
            Err(_) => Err(Self::refusal(bytes)),
        }
    }

    fn refusal(bytes: &[u8]) -> DigestError {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return DigestError::NotJson;
        };
        let version = value.get("v").and_then(serde_json::Value::as_u64);
        if version.is_some_and(|v| READABLE_VERSIONS.iter().any(|r| u64::from(*r) == v)) {
            DigestError::Schema
        } else {
            DigestError::UnknownVersion
        }
    }

    pub fn holds(&self, form: WireForm) -> bool {
        self.held.contains(&form)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse, Route};

    #[test]
    fn a_digest_round_trips_and_each_refusal_says_why() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let shape = parse(Route::OpenAiChat, body, &[3; 32]).unwrap().shape;
        let mut digest = Digest::new(shape);
        digest.held.push(WireForm::Json);
        let bytes = serde_json::to_vec(&digest).unwrap();
        assert_eq!(Digest::parse(&bytes), Ok(digest.clone()));

        let mut v3: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v3["v"] = 3.into();
        assert_eq!(
            Digest::parse(&serde_json::to_vec(&v3).unwrap()),
            Err(DigestError::UnknownVersion)
        );
        // v2 needs the step fingerprint; v1 never had one and reads it as the fingerprint.
        let mut no_step: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        no_step["request"]
            .as_object_mut()
            .unwrap()
            .remove("step_fingerprint");
        assert_eq!(
            Digest::parse(&serde_json::to_vec(&no_step).unwrap()),
            Err(DigestError::Schema)
        );
        no_step["v"] = 1.into();
        let v1 = Digest::parse(&serde_json::to_vec(&no_step).unwrap()).unwrap();
        assert_eq!(v1.request.step_fingerprint, v1.request.fingerprint);
        for (text, expected) in [
            (&b"nope"[..], DigestError::NotJson),
            (b"[1]", DigestError::UnknownVersion),
            (br#"{"v":"1","request":{}}"#, DigestError::UnknownVersion),
            (br#"{"v":3,"other":true}"#, DigestError::UnknownVersion),
            (br#"{"v":1,"request":{}}"#, DigestError::Schema),
            (br#"{"v":1,"request":{},"extra":1}"#, DigestError::Schema),
        ] {
            assert_eq!(
                Digest::parse(text),
                Err(expected),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }
}
