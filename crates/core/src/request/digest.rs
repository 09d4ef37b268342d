//! The digest: a request's shape as counts and keyed hashes, versioned, with no text in it.
//! A caller in digest mode sends this to `POST /gate` instead of its prompt.

use serde::{Deserialize, Serialize};

use super::RequestShape;

/// v6: a step's action (`step_action`: its tool calls without their results), so that a run of
/// a step survives one other result of the same call (SPEC §2.3). v5: a system turn after a Messages call's newest assistant turn is left out of its step
/// (step domain v5). v4: the step fingerprint of a turn without a tool call names the assistant text it answers,
/// a chained Responses call's step names the calls of the response it continues, and ANSI
/// escapes are removed before the rest of the normalisation (step domain v4, normalisation 2;
/// SPEC §2.1). v3 normalised tool results; v2 added the step fingerprint (and the Responses
/// route).
pub const DIGEST_VERSION: u32 = 6;
/// Versions this build knows and no longer reads: their step identity is weaker (before v5 its
/// fingerprint was computed without today's normalisation, so a stuck agent whose tool prints a
/// clock would not repeat its step; v5 has no action, so one stray result would start a stuck
/// agent's schedule over), and the gate would decide otherwise than on the request itself. A digest is the
/// local instance's own computation, so the fix is to update it; a refusal says so, rather
/// than a gate quietly deciding on a weaker identity.
const OUTDATED_VERSIONS: [u32; 5] = [1, 2, 3, 4, 5];

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
    #[error("digest version is missing or not supported (this build reads v{current})", current = DIGEST_VERSION)]
    UnknownVersion,
    #[error(
        "digest v{version} is no longer read: its step fingerprint was computed by earlier rules \
         (SPEC 2.1). This build reads v{current}: update the tokensaver that computed it \
         (`tokensaver digest`, or the local instance in digest mode)",
        current = DIGEST_VERSION
    )]
    Outdated { version: u32 },
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

    /// Parse a digest; an unknown or outdated version is refused. One typed read on the way
    /// to `Ok`; only a refusal reads the bytes again, to say which kind it is.
    pub fn parse(bytes: &[u8]) -> Result<Self, DigestError> {
        match serde_json::from_slice::<Digest>(bytes) {
            // The step fingerprint is required (absent reads as the zero hash).
            Ok(digest) if digest.v == DIGEST_VERSION => {
                // The model is kept in windows, receipts and ledger rows: bounded as in a body.
                if digest.request.step_fingerprint == super::Hash::default()
                    || digest.request.model.is_empty()
                    || digest.request.model.len() > super::MAX_MODEL_BYTES
                    || digest.hold_id.as_ref().is_some_and(|h| h.len() > 64)
                {
                    Err(DigestError::Schema)
                } else {
                    Ok(digest)
                }
            }
            Ok(digest) => Err(Self::version_refusal(u64::from(digest.v))),
            Err(_) => Err(Self::refusal(bytes)),
        }
    }

    fn refusal(bytes: &[u8]) -> DigestError {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return DigestError::NotJson;
        };
        match value.get("v").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(DIGEST_VERSION) => DigestError::Schema,
            Some(v) => Self::version_refusal(v),
            None => DigestError::UnknownVersion,
        }
    }

    fn version_refusal(v: u64) -> DigestError {
        match OUTDATED_VERSIONS.iter().find(|o| u64::from(**o) == v) {
            Some(&version) => DigestError::Outdated { version },
            None => DigestError::UnknownVersion,
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

    /// The chained context (`RequestShape::chained_input_tokens`) travels in the digest's
    /// request, reads as 0 when absent (every digest before it), and enters the worst case's
    /// input as it does in request mode.
    #[test]
    fn the_chained_context_travels_in_the_digest_and_bounds_the_input() {
        let body = br#"{"model":"m","input":"go on","previous_response_id":"resp_1"}"#;
        let parsed = parse(Route::OpenAiResponses, body, &[3; 32]).unwrap();
        assert_eq!(parsed.previous_response_id.as_deref(), Some("resp_1"));
        let mut shape = parsed.shape;
        assert_eq!(shape.chained_input_tokens, 0, "never read from the body");
        let unchained = crate::gate::worst_case(&shape, None).input_tokens_estimated;
        let plain = serde_json::to_value(Digest::new(shape.clone())).unwrap();
        assert!(plain["request"].get("chained_input_tokens").is_none());
        assert_eq!(
            Digest::parse(plain.to_string().as_bytes())
                .unwrap()
                .request
                .chained_input_tokens,
            0
        );

        shape.chained_input_tokens = 13_000;
        let bytes = serde_json::to_vec(&Digest::new(shape.clone())).unwrap();
        let read = Digest::parse(&bytes).unwrap();
        assert_eq!(read.request.chained_input_tokens, 13_000);
        assert_eq!(
            crate::gate::worst_case(&read.request, None).input_tokens_estimated,
            unchained + 13_000
        );
        shape.chained_input_tokens = u64::MAX;
        assert_eq!(
            crate::gate::worst_case(&shape, None).input_tokens_estimated,
            u64::MAX,
            "saturates"
        );
    }

    /// The fuzz smoke's find: a temperature whose shortest decimal form serde_json's fast
    /// float reader read back one ulp off, so the digest a local instance wrote was not the
    /// request the central gate decided (`float_roundtrip`).
    #[test]
    fn a_digest_keeps_every_float_exactly() {
        let body = br#"{"model":"m","temperature":6.666666666666667e40,"top_p":0.1,"messages":[{"role":"user","content":"hi"}]}"#;
        let shape = parse(Route::AnthropicMessages, body, &[3; 32])
            .unwrap()
            .shape;
        let digest = Digest::new(shape);
        let back = Digest::parse(&serde_json::to_vec(&digest).unwrap()).unwrap();
        assert_eq!(back, digest);
        for x in [
            6.666666666666667e40_f64,
            0.1,
            1e-300,
            2.2250738585072014e-308,
        ] {
            let text = serde_json::to_string(&x).unwrap();
            assert_eq!(
                serde_json::from_str::<f64>(&text).unwrap().to_bits(),
                x.to_bits(),
                "{text}"
            );
        }
    }

    #[test]
    fn a_digest_round_trips_and_each_refusal_says_why() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let shape = parse(Route::OpenAiChat, body, &[3; 32]).unwrap().shape;
        let mut digest = Digest::new(shape);
        digest.held.push(WireForm::Json);
        let bytes = serde_json::to_vec(&digest).unwrap();
        assert_eq!(Digest::parse(&bytes), Ok(digest.clone()));

        let mut next: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        next["v"] = (DIGEST_VERSION + 1).into();
        assert_eq!(
            Digest::parse(&serde_json::to_vec(&next).unwrap()),
            Err(DigestError::UnknownVersion)
        );
        // The step fingerprint is required.
        let mut no_step: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        no_step["request"]
            .as_object_mut()
            .unwrap()
            .remove("step_fingerprint");
        assert_eq!(
            Digest::parse(&serde_json::to_vec(&no_step).unwrap()),
            Err(DigestError::Schema)
        );
        // v1 to v3 (a step fingerprint by earlier rules, or none) are refused by name, whole
        // or not, with the version this build reads.
        for version in [1u32, 2, 3] {
            for mut old in [no_step.clone(), serde_json::from_slice(&bytes).unwrap()] {
                old["v"] = version.into();
                let refused = Digest::parse(&serde_json::to_vec(&old).unwrap());
                assert_eq!(refused, Err(DigestError::Outdated { version }));
                let message = refused.unwrap_err().to_string();
                assert!(
                    message.contains(&format!("v{version} is no longer read"))
                        && message.contains(&format!("reads v{DIGEST_VERSION}")),
                    "{message}"
                );
            }
        }
        for (text, expected) in [
            (&b"nope"[..], DigestError::NotJson),
            (b"[1]", DigestError::UnknownVersion),
            (br#"{"v":"3","request":{}}"#, DigestError::UnknownVersion),
            (br#"{"v":7,"other":true}"#, DigestError::UnknownVersion),
            (br#"{"v":6,"request":{}}"#, DigestError::Schema),
            (br#"{"v":6,"request":{},"extra":1}"#, DigestError::Schema),
            (
                br#"{"v":5,"request":{}}"#,
                DigestError::Outdated { version: 5 },
            ),
            (
                br#"{"v":4,"request":{}}"#,
                DigestError::Outdated { version: 4 },
            ),
            (
                br#"{"v":3,"request":{}}"#,
                DigestError::Outdated { version: 3 },
            ),
            (
                br#"{"v":2,"request":{}}"#,
                DigestError::Outdated { version: 2 },
            ),
            (
                br#"{"v":1,"other":true}"#,
                DigestError::Outdated { version: 1 },
            ),
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
