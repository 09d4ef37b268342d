//! Provider-shaped error bodies. Closed-form: static messages, rule ids, numbers — never any
//! content of the request.

use bytes::Bytes;
use serde_json::json;

use crate::request::Route;

/// An error the gate itself answers with.
#[derive(Debug, Clone)]
pub struct GateError {
    pub status: u16,
    /// OpenAI `type` / Anthropic `error.type`.
    pub kind: &'static str,
    /// A rule or error id.
    pub code: &'static str,
    pub message: String,
    pub hold_id: Option<String>,
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
        }
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
        let looks_like_id = !model.is_empty()
            && model.len() <= 128
            && model
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:/@".contains(&b));
        let message = if looks_like_id {
            format!(
                "refused by a budget rule: model {model} has no price in this gate's price table, so its worst case is unbounded on a budgeted key; add [prices.\"{model}\"] to the config or PUT /prices on the admin listener"
            )
        } else {
            "refused by a budget rule: the requested model has no price in this gate's price table, so its worst case is unbounded on a budgeted key; add it under [prices] in the config or PUT /prices on the admin listener".to_string()
        };
        Self::new(status, verdict_kind, "unpriced_model", message)
    }

    /// Whether the SDKs must be told not to retry (they retry 409 and 429 on their own, and each
    /// retry would count in the windows).
    pub fn no_retry(&self) -> bool {
        matches!(self.status, 402 | 403 | 409 | 429)
    }
}
