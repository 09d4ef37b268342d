//! The one error type at the edges: every error the gate itself answers with, on the proxy
//! (in the error shape of the provider the caller speaks to) and on the API and admin
//! listeners (`{"error": {"code", "message"}}`). The leaf errors convert into it with `From`.
//! Closed-form: static messages, rule ids, numbers — never any content of the request.

use bytes::Bytes;
use serde_json::json;

use crate::api_http::ApiResponse;
use crate::store::StoreError;
use tokensaver_core::request::Route;

/// Seconds a caller is told to wait when the fleet's database is unreachable.
pub const FLEET_RETRY_AFTER_SECS: u64 = 2;

/// An error the gate itself answers with.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct GateError {
    pub status: u16,
    /// OpenAI `type` / Anthropic `error.type`.
    pub kind: &'static str,
    /// A rule or error id.
    pub code: &'static str,
    pub message: String,
    pub hold_id: Option<String>,
    /// Sent as `Retry-After` (seconds) wherever the error is answered.
    pub retry_after_secs: Option<u64>,
}

impl GateError {
    pub fn new(
        status: u16,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
            hold_id: None,
            retry_after_secs: None,
        }
    }

    /// The 409 of a CHALLENGE: names the hold and every way to release it (SPEC §2.7). Off-
    /// the-shelf agent clients cannot add a header, so the message leads with the approval
    /// and the plain re-send. Closed-form: only the hold id (which the gate generated) and
    /// numbers. `ttl_ms`: the hold's time to live, when known.
    pub fn held(code: &'static str, hold_id: Option<String>, ttl_ms: Option<u64>) -> Self {
        let message = hold_message(hold_id.as_deref(), ttl_ms);
        let mut err = Self::new(409, "tokensaver_hold", code, message);
        err.hold_id = hold_id;
        err
    }

    /// The fleet's database cannot be reached: no budget, window or hold to decide by, so
    /// nothing is decided or forwarded; retry after [`FLEET_RETRY_AFTER_SECS`].
    pub fn fleet_unavailable() -> Self {
        let mut err = Self::new(
            503,
            "api_error",
            "fleet_store_unavailable",
            "the gate's shared store is unreachable; retry shortly",
        );
        err.retry_after_secs = Some(FLEET_RETRY_AFTER_SECS);
        err
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    /// The rule or error id.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// An error of the API and admin listeners (their body names no provider `type`).
    pub fn api(status: u16, code: &'static str, message: &'static str) -> Self {
        Self::new(status, "tokensaver_error", code, message)
    }

    /// The API and admin listeners' body: `{"error": {"code", "message"}}`.
    pub fn api_body(&self) -> serde_json::Value {
        crate::api_http::error_body(self.code, &self.message)
    }

    /// The body in the error format of the provider the caller speaks to.
    pub fn body(&self, route: Option<Route>) -> Bytes {
        let value = match route {
            Some(Route::AnthropicMessages) => {
                let mut error =
                    json!({"type": self.kind, "message": self.message, "code": self.code});
                if let Some(id) = &self.hold_id {
                    error["hold_id"] = json!(id);
                }
                json!({"type": "error", "error": error})
            }
            _ => {
                let mut error = json!({
                    "message": self.message,
                    "type": self.kind,
                    "param": null,
                    "code": self.code,
                });
                if let Some(id) = &self.hold_id {
                    error["hold_id"] = json!(id);
                }
                json!({"error": error})
            }
        };
        Bytes::from(serde_json::to_vec(&value).unwrap_or_default())
    }

    /// A budget refusal for a model the price table does not know: its worst case is
    /// unbounded, so a budgeted key refuses it. Names the model (a request parameter, never
    /// content; shown only when it looks like a model id) and the fix.
    pub fn unpriced_model(status: u16, verdict_kind: &'static str, model: &str) -> Self {
        let message = if looks_like_model_id(model) {
            format!(
                "refused by a budget rule: model {model} has no price in this gate's price table, so its worst case is unbounded on a budgeted key; add [prices.\"{model}\"] to the config or PUT /prices on the admin listener"
            )
        } else {
            "refused by a budget rule: the requested model has no price in this gate's price table, so its worst case is unbounded on a budgeted key; add it under [prices] in the config or PUT /prices on the admin listener".to_string()
        };
        Self::new(status, verdict_kind, "unpriced_model", message)
    }

    /// A model no configured upstream takes: a 404 that names it (when it reads as a model
    /// id), never a silent default that bills another provider.
    pub fn unknown_model(model: &str) -> Self {
        let message = if looks_like_model_id(model) {
            format!("no upstream of this gate takes model {model} (see [upstreams.NAME] models)")
        } else {
            "no upstream of this gate takes the requested model (see [upstreams.NAME] models)"
                .to_string()
        };
        Self::new(404, "not_found_error", "unknown_model", message)
    }

    /// Whether the SDKs must be told not to retry (they retry 409 and 429 on their own, and each
    /// retry would count in the windows).
    pub fn no_retry(&self) -> bool {
        matches!(self.status, 402 | 403 | 409 | 429)
    }
}

impl From<StoreError> for GateError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::UnknownCursor => GateError::api(
                400,
                "unknown_cursor",
                "after must be the decision id a previous page ended with",
            ),
            StoreError::Unavailable | StoreError::Sqlite(_) => {
                GateError::api(503, "storage_unavailable", "the ledger is unavailable")
            }
        }
    }
}

/// A keyed route of the API listener without a valid key. (The proxy answers the same
/// failure in the provider's own shape, code `invalid_api_key`, which the SDKs recognise.)
impl From<crate::auth::AuthError> for GateError {
    fn from(e: crate::auth::AuthError) -> Self {
        match e {
            crate::auth::AuthError::Missing => {
                GateError::api(401, "missing_key", "a tokensaver key is required")
            }
            crate::auth::AuthError::Invalid => {
                GateError::api(401, "invalid_key", "invalid tokensaver key")
            }
        }
    }
}

/// The CHALLENGE message (see [`GateError::held`]); also the `message` of a `POST /gate`
/// answer that holds the request, so both modes tell the caller the same thing.
pub fn hold_message(hold_id: Option<&str>, ttl_ms: Option<u64>) -> String {
    let Some(id) = hold_id.filter(|id| is_hold_id(id)) else {
        return "held for a person: a person must approve the hold before this request can \
                pass"
            .to_string();
    };
    let within = match ttl_ms {
        Some(ms) => format!("until the hold expires, {} after it was made", duration(ms)),
        None => "until the hold expires".to_string(),
    };
    format!(
        "held for a person: approve with 'tokensaver holds approve {id}' (or POST \
         /holds/{id}/approve on the admin listener; add --attend-minutes N, or \
         {{\"attend_minutes\": N}}, to attend the key for N minutes); the same request then \
         passes once, with no header needed, {within}. Do not retry before that: a re-send \
         gets this same answer."
    )
}

/// Only an id of the form the gate generates (`hold_` and hex digits) is ever echoed.
fn is_hold_id(id: &str) -> bool {
    id.strip_prefix("hold_").is_some_and(|hex| {
        !hex.is_empty() && hex.len() <= 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

fn duration(ms: u64) -> String {
    let plural = |n: u64, unit: &str| format!("{n} {unit}{}", if n == 1 { "" } else { "s" });
    if ms >= 60_000 && ms.is_multiple_of(60_000) {
        plural(ms / 60_000, "minute")
    } else {
        plural(ms.div_ceil(1000), "second")
    }
}

/// Whether a caller's model string may be named in an answer: a short id of the characters
/// model names use, so an error never carries markup, whitespace or a prompt.
pub(crate) fn looks_like_model_id(model: &str) -> bool {
    !model.is_empty()
        && model.len() <= 128
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:/@".contains(&b))
}

/// The API and admin listeners' shape of an edge error.
impl From<GateError> for ApiResponse {
    fn from(e: GateError) -> Self {
        let resp = ApiResponse::json(e.status(), &e.api_body());
        match e.retry_after_secs {
            Some(secs) => resp.with_header("retry-after", secs.to_string()),
            None => resp,
        }
    }
}

impl From<StoreError> for ApiResponse {
    fn from(e: StoreError) -> Self {
        GateError::from(e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fleet's 503 says when to retry on the API listener as the proxy says it (the proxy's
    /// is `tests/fleet.rs`, against a paused PostgreSQL).
    #[test]
    fn the_fleet_outage_carries_its_retry_after() {
        let resp = ApiResponse::from(GateError::fleet_unavailable());
        assert_eq!(resp.status, 503);
        assert_eq!(resp.headers, [("retry-after", "2".to_string())]);
        let plain = ApiResponse::from(GateError::api(503, "x", "y"));
        assert!(plain.headers.is_empty());
    }

    #[test]
    fn the_hold_message_names_the_hold_and_how_to_release_it() {
        let id = "hold_0123456789abcdef0123456789abcdef";
        let err = GateError::held("score_challenge", Some(id.into()), Some(900_000));
        assert_eq!((err.status, err.kind), (409, "tokensaver_hold"));
        assert!(err.no_retry());
        assert!(err
            .message
            .contains(&format!("'tokensaver holds approve {id}'")));
        assert!(err.message.contains(&format!("POST /holds/{id}/approve")));
        assert!(err.message.contains("15 minutes after it was made"));
        let body: serde_json::Value = serde_json::from_slice(&err.body(None)).unwrap();
        assert_eq!(body["error"]["hold_id"], id);
        assert_eq!(body["error"]["code"], "score_challenge");
        // Only a gate-made id is echoed.
        let odd = GateError::held("score_challenge", Some("<script>".into()), Some(60_000));
        assert!(!odd.message.contains("<script>"));
        assert_eq!(duration(60_000), "1 minute");
        assert_eq!(duration(90_000), "90 seconds");
        assert!(hold_message(Some(id), None).contains("until the hold expires."));
    }
}
