//! The digest: a request's shape as counts and keyed hashes, versioned, with no text in it.
//! A caller in digest mode sends this to `POST /gate` instead of its prompt.

use serde::{Deserialize, Serialize};

use super::RequestShape;

pub const DIGEST_VERSION: u32 = 1;

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
    #[error("digest version is missing or not supported (this build reads v1)")]
    UnknownVersion,
    #[error("digest does not match the v1 schema")]
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

    pub fn parse(bytes: &[u8]) -> Result<Self, DigestError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|_| DigestError::NotJson)?;
        Self::from_value(value)
    }

    /// A digest from JSON already parsed; an unknown version is refused.
    pub fn from_value(value: serde_json::Value) -> Result<Self, DigestError> {
        if value.get("v").and_then(serde_json::Value::as_u64) != Some(u64::from(DIGEST_VERSION)) {
            return Err(DigestError::UnknownVersion);
        }
        serde_json::from_value(value).map_err(|_| DigestError::Schema)
    }

    pub fn holds(&self, form: WireForm) -> bool {
        self.held.contains(&form)
    }
}
