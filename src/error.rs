//! The one error type at the edges: every error the gate itself answers with, on the proxy
//! (in the error shape of the provider the caller speaks to) and on the API and admin
//! listeners (`{"error": {"code", "message"}}`). The leaf errors convert into it with `From`.
//! Closed-form: static messages, rule ids, numbers — never any content of the request.

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::json;

use crate::api_http::ApiResponse;
use crate::auth::AuthError;
use crate::store::StoreError;
use tokensaver_core::request::Route;

/// Seconds a caller is told to wait when the fleet's database is unreachable.
pub const FLEET_RETRY_AFTER_SECS: u64 = 2;

/// An error the gate itself answers with: every one it can answer, so that its status, its
/// provider `type`, its code and its message are each one exhaustive match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateError {
    /// The body is over the configured cap (413).
    BodyTooLarge,
    /// The body could not be read (400).
    BodyUnreadable,
    /// The body is not a request the gate can read: the reader's code and its closed-form
    /// message (400).
    BadRequest {
        code: &'static str,
        message: String,
    },
    /// No valid tokensaver key (401, `invalid_api_key`, which the SDKs recognise).
    InvalidKey(AuthError),
    /// A gated route called with another method (405).
    MethodNotAllowed,
    /// A billable provider path this build does not gate: never forwarded (404).
    NotGated,
    UnknownRoute,
    /// No configured upstream takes the model; `model` is named only when it reads as a
    /// model id (404).
    UnknownModel {
        model: Option<String>,
    },
    /// A stored response this key did not create (404).
    UnknownResponse,
    /// A chained Responses call whose previous response's usage the gate has not seen (409).
    ChainedContextUnknown,
    /// A Responses call that names a `conversation`: provider-side state the gate cannot bind
    /// to a key (400).
    ConversationNotGated,
    /// A request path with dot segments, encoded separators or a backslash: what the gate
    /// checks must be what a normalising server behind it would read (400).
    InvalidPath,
    /// An HTTP/1.1 request without `Host` (RFC 9112 §3.2: 400).
    MissingHost,
    /// A body labelled with a `Content-Encoding` the gate does not read: it would price other
    /// bytes than the provider reads (415).
    UnsupportedEncoding,
    /// A CHALLENGE (409): the hold, its reason, and how long it waits.
    Held {
        reason: &'static str,
        hold_id: Option<String>,
        ttl_ms: Option<u64>,
    },
    /// A BLOCK (429 runaway, 402 budget, 403 score) and the rule or band that refused it.
    Blocked {
        status: u16,
        reason: &'static str,
    },
    /// A budget refusal (BLOCK, or a CHALLENGE's hold) for a model without a price: its
    /// worst case is unbounded on a budgeted key.
    Unpriced {
        status: u16,
        model: Option<String>,
        hold_id: Option<String>,
        held: bool,
    },
    /// The fleet's database cannot be reached: nothing is decided or forwarded (503, with
    /// `Retry-After`).
    FleetUnavailable,
    /// The provider did not answer in time (504).
    UpstreamTimeout,
    /// The provider's answer could not be relayed (502).
    BadGateway {
        code: &'static str,
        message: &'static str,
    },
    /// Digest mode: the central gate did not decide (502).
    GateUnreachable,
    /// A central gate said SERVE for an answer this instance does not hold (502).
    AnswerMissing,
    /// An error of the API and admin listeners (their body names no provider `type`).
    Api(ApiError),
}

/// An error of the API and admin listeners: each one closed form, its status, code and
/// message in one table ([`ApiError::parts`]), so no route answers an error of its own making.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiError {
    NotFound,
    MethodNotAllowed,
    InvalidJson,
    MissingKey,
    InvalidKey,
    AdminKeyRequired,
    OwnerSecretRequired,
    InvalidOwnerSecret,
    /// Too many bodies are being read at once (503, retry after a second).
    Busy,
    BodyTimeout,
    /// `POST /gate` (estimate) with a route the digest cannot name.
    UnknownDigestRoute,
    /// The caller left while its request was held: nothing was bought or reserved.
    CallerGone,
    InconsistentEnding,
    AlreadyRecorded,
    ModelMismatch,
    UsageExceedsDecision,
    RecordNotCommitted,
    UnknownDecision,
    UnknownCursor,
    StorageUnavailable,
    InvalidDay,
    InvalidTime,
    InvalidLimit,
    InvalidSession,
    UnknownFilter,
    EconomicsUnavailable,
    UnknownKey,
    InvalidPrices,
    InvalidHoldBody,
    InvalidAttendMinutes,
    UnknownHold,
    HoldExpired,
    HoldNotPending,
    /// Approving a hold whose model has no price: its spend would have no bound.
    UnpricedHold,
    SplitProfileUnknownRoute,
    /// A split-profile route the seed names but this build does not cover (its reason).
    NotCovered(&'static str),
}

impl ApiError {
    /// Status, code and message: the one table of the API listeners' errors.
    pub fn parts(self) -> (u16, &'static str, &'static str) {
        match self {
            ApiError::NotFound => (404, "not_found", "unknown route"),
            ApiError::MethodNotAllowed => (
                405,
                "method_not_allowed",
                "method not allowed on this route",
            ),
            ApiError::InvalidJson => (
                400,
                "invalid_json",
                "request body is not valid JSON of the expected form",
            ),
            ApiError::MissingKey => (401, "missing_key", "a tokensaver key is required"),
            ApiError::InvalidKey => (401, "invalid_key", "invalid tokensaver key"),
            ApiError::AdminKeyRequired => {
                (401, "admin_key_required", "this route needs the admin key")
            }
            ApiError::OwnerSecretRequired => (
                401,
                "owner_secret_required",
                "deciding a hold needs the key owner's secret",
            ),
            ApiError::InvalidOwnerSecret => (401, "invalid_owner_secret", "invalid owner secret"),
            ApiError::Busy => (503, "busy", "too many requests are being read"),
            ApiError::BodyTimeout => (408, "body_timeout", "the request body took too long"),
            ApiError::UnknownDigestRoute => (
                400,
                "unknown_route",
                "route must be openai_chat or anthropic_messages",
            ),
            ApiError::CallerGone => (
                499,
                "caller_gone",
                "the caller left while its request was held",
            ),
            ApiError::InconsistentEnding => (
                400,
                "inconsistent_ending",
                "complete must be true exactly when ending is complete",
            ),
            ApiError::AlreadyRecorded => (
                409,
                "already_recorded",
                "usage for this decision was already recorded",
            ),
            ApiError::ModelMismatch => (
                409,
                "model_mismatch",
                "served_model differs from the model the gate decided",
            ),
            ApiError::UsageExceedsDecision => (
                422,
                "usage_exceeds_decision",
                "the usage exceeds what the decision could have been billed: input at most \
                 3 tokens per character of the request plus 4096, output at most its ceiling, \
                 each part at most 100000000",
            ),
            ApiError::RecordNotCommitted => (
                503,
                "storage_unavailable",
                "the ledger could not commit the record",
            ),
            ApiError::UnknownDecision => (
                404,
                "unknown_decision",
                "no forwarded decision with this id is awaiting usage for this key",
            ),
            ApiError::UnknownCursor => (
                400,
                "unknown_cursor",
                "after must be the decision id a previous page ended with",
            ),
            ApiError::StorageUnavailable => {
                (503, "storage_unavailable", "the ledger is unavailable")
            }
            ApiError::InvalidDay => (400, "invalid_day", "from and to must be days as YYYY-MM-DD"),
            ApiError::InvalidTime => (
                400,
                "invalid_time",
                "from and to must be days as YYYY-MM-DD or unix milliseconds",
            ),
            ApiError::InvalidLimit => (400, "invalid_limit", "limit must be 1 to 1000"),
            ApiError::InvalidSession => (
                400,
                "invalid_session",
                "session must be 64 lowercase hex digits",
            ),
            ApiError::UnknownFilter => (
                400,
                "unknown_filter",
                "filters are suite, category, model and task",
            ),
            ApiError::EconomicsUnavailable => (503, "economics_unavailable", "the report failed"),
            ApiError::UnknownKey => (404, "unknown_key", "no key with this id"),
            ApiError::InvalidPrices => (400, "invalid_prices", "max_output must be at least 1"),
            ApiError::InvalidHoldBody => (
                400,
                "invalid_json",
                "the body must be empty or {\"attend_minutes\": N}",
            ),
            ApiError::InvalidAttendMinutes => (
                400,
                "invalid_attend_minutes",
                "attend_minutes must be a whole number from 1 to 1440",
            ),
            ApiError::UnknownHold => (404, "unknown_hold", "no such hold"),
            ApiError::HoldExpired => (410, "hold_expired", "the hold has expired"),
            ApiError::HoldNotPending => (409, "hold_not_pending", "the hold is not pending"),
            ApiError::UnpricedHold => (
                409,
                "unpriced_model",
                "the held request's model has no price, so its spend has no bound: set its price \
                 (PUT /prices on the admin listener, or [prices] in the config), then approve",
            ),
            ApiError::SplitProfileUnknownRoute => {
                (404, "unknown_route", "no such split-profile route")
            }
            ApiError::NotCovered(reason) => (404, "not_covered", reason),
        }
    }
}

impl From<ApiError> for GateError {
    fn from(e: ApiError) -> Self {
        GateError::Api(e)
    }
}

impl From<ApiError> for ApiResponse {
    fn from(e: ApiError) -> Self {
        GateError::Api(e).into()
    }
}

/// A body the request reader refused: its code and closed-form message (a field name, an
/// index, a bound; never a value).
impl From<tokensaver_core::request::ShapeError> for GateError {
    fn from(e: tokensaver_core::request::ShapeError) -> Self {
        GateError::BadRequest {
            code: e.code(),
            message: e.to_string(),
        }
    }
}

/// A digest `POST /gate` or `/estimate` refused (closed-form, as the reader's).
impl From<&tokensaver_core::request::DigestError> for GateError {
    fn from(e: &tokensaver_core::request::DigestError) -> Self {
        GateError::BadRequest {
            code: "invalid_digest",
            message: e.to_string(),
        }
    }
}

impl From<crate::body::BodyError> for GateError {
    fn from(e: crate::body::BodyError) -> Self {
        match e {
            crate::body::BodyError::TooLarge => GateError::BodyTooLarge,
            crate::body::BodyError::Unreadable => GateError::BodyUnreadable,
        }
    }
}

impl std::fmt::Display for GateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for GateError {}

impl GateError {
    /// The 409 of a CHALLENGE: names the hold and every way to release it (SPEC §2.7). Off-
    /// the-shelf agent clients cannot add a header, so the message leads with the approval
    /// and the plain re-send. Closed-form: only the hold id (which the gate generated) and
    /// numbers. `ttl_ms`: the hold's time to live, when known.
    pub fn held(reason: &'static str, hold_id: Option<String>, ttl_ms: Option<u64>) -> Self {
        GateError::Held {
            reason,
            hold_id,
            ttl_ms,
        }
    }

    /// The fleet's database cannot be reached; retry after [`FLEET_RETRY_AFTER_SECS`].
    pub fn fleet_unavailable() -> Self {
        GateError::FleetUnavailable
    }

    /// A budget refusal for a model the price table does not know. Names the model (a request
    /// parameter, never content; only when it looks like a model id) and the fix; `hold_id`:
    /// the hold of a CHALLENGE (`None` for a BLOCK).
    pub fn unpriced_model(status: u16, model: &str, held: bool, hold_id: Option<String>) -> Self {
        GateError::Unpriced {
            status,
            model: named_model(model),
            hold_id,
            held,
        }
    }

    /// A model no configured upstream takes: a 404 that names it (when it reads as a model
    /// id), never a silent default that bills another provider.
    pub fn unknown_model(model: &str) -> Self {
        GateError::UnknownModel {
            model: named_model(model),
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            GateError::BodyTooLarge => 413,
            GateError::BodyUnreadable
            | GateError::BadRequest { .. }
            | GateError::ConversationNotGated
            | GateError::InvalidPath
            | GateError::MissingHost => 400,
            GateError::UnsupportedEncoding => 415,
            GateError::InvalidKey(_) => 401,
            GateError::MethodNotAllowed => 405,
            GateError::NotGated
            | GateError::UnknownRoute
            | GateError::UnknownModel { .. }
            | GateError::UnknownResponse => 404,
            GateError::ChainedContextUnknown | GateError::Held { .. } => 409,
            GateError::Blocked { status, .. } | GateError::Unpriced { status, .. } => *status,
            GateError::FleetUnavailable => 503,
            GateError::UpstreamTimeout => 504,
            GateError::BadGateway { .. }
            | GateError::GateUnreachable
            | GateError::AnswerMissing => 502,
            GateError::Api(e) => e.parts().0,
        }
    }

    /// The level the edge logs it at: a fault of the gate's own (an answer it served but does
    /// not hold) is an error, what the operator must act on (an unreachable store, provider or
    /// central gate) a warning; a refusal the gate decided and a caller's mistake are debug,
    /// because the access log's line (info) already names the status, verdict and rule.
    pub fn level(&self) -> tracing::Level {
        use tracing::Level;
        match self {
            GateError::AnswerMissing => Level::ERROR,
            GateError::FleetUnavailable
            | GateError::UpstreamTimeout
            | GateError::BadGateway { .. }
            | GateError::GateUnreachable => Level::WARN,
            GateError::Api(e) if e.parts().0 >= 500 => Level::WARN,
            GateError::BodyTooLarge
            | GateError::BodyUnreadable
            | GateError::BadRequest { .. }
            | GateError::InvalidKey(_)
            | GateError::MethodNotAllowed
            | GateError::NotGated
            | GateError::UnknownRoute
            | GateError::UnknownModel { .. }
            | GateError::UnknownResponse
            | GateError::ChainedContextUnknown
            | GateError::ConversationNotGated
            | GateError::InvalidPath
            | GateError::MissingHost
            | GateError::UnsupportedEncoding
            | GateError::Held { .. }
            | GateError::Blocked { .. }
            | GateError::Unpriced { .. }
            | GateError::Api(_) => Level::DEBUG,
        }
    }

    /// One log event for an answered error, at its [`level`](Self::level): its status and
    /// code, never anything of the request.
    pub fn log(&self) {
        let (status, code) = (self.status(), self.code());
        match self.level() {
            tracing::Level::ERROR => tracing::error!(status, code, "answered with an error"),
            tracing::Level::WARN => tracing::warn!(status, code, "answered with an error"),
            _ => tracing::debug!(status, code, "answered with an error"),
        }
    }

    /// OpenAI `type` / Anthropic `error.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            GateError::BodyTooLarge
            | GateError::BodyUnreadable
            | GateError::BadRequest { .. }
            | GateError::MethodNotAllowed
            | GateError::UnknownResponse
            | GateError::ChainedContextUnknown
            | GateError::ConversationNotGated
            | GateError::InvalidPath
            | GateError::MissingHost
            | GateError::UnsupportedEncoding => "invalid_request_error",
            GateError::InvalidKey(_) => "authentication_error",
            GateError::NotGated | GateError::UnknownRoute | GateError::UnknownModel { .. } => {
                "not_found_error"
            }
            GateError::Held { .. } | GateError::Unpriced { held: true, .. } => "tokensaver_hold",
            GateError::Blocked { .. } | GateError::Unpriced { held: false, .. } => {
                "tokensaver_block"
            }
            GateError::FleetUnavailable
            | GateError::UpstreamTimeout
            | GateError::BadGateway { .. }
            | GateError::GateUnreachable
            | GateError::AnswerMissing => "api_error",
            GateError::Api(_) => "tokensaver_error",
        }
    }

    /// The rule or error id.
    pub fn code(&self) -> &'static str {
        match self {
            GateError::BodyTooLarge => "body_too_large",
            GateError::BodyUnreadable => "body_unreadable",
            GateError::BadRequest { code, .. } => code,
            GateError::InvalidKey(_) => "invalid_api_key",
            GateError::MethodNotAllowed => "method_not_allowed",
            GateError::NotGated => "not_gated",
            GateError::UnknownRoute => "unknown_route",
            GateError::UnknownModel { .. } => "unknown_model",
            GateError::UnknownResponse => "unknown_response",
            GateError::ChainedContextUnknown => "chained_context_unknown",
            GateError::ConversationNotGated => "conversation_not_gated",
            GateError::InvalidPath => "invalid_path",
            GateError::MissingHost => "missing_host",
            GateError::UnsupportedEncoding => "unsupported_content_encoding",
            GateError::Held { reason, .. } | GateError::Blocked { reason, .. } => reason,
            GateError::Unpriced { .. } => "unpriced_model",
            GateError::FleetUnavailable => "fleet_store_unavailable",
            GateError::UpstreamTimeout => "upstream_timeout",
            GateError::BadGateway { code, .. } => code,
            GateError::Api(e) => e.parts().1,
            GateError::GateUnreachable => "gate_unreachable",
            GateError::AnswerMissing => "answer_missing",
        }
    }

    /// The closed-form message: static text, rule ids, numbers, and a model id only when it
    /// reads as one.
    pub fn message(&self) -> Cow<'static, str> {
        let text: &'static str = match self {
            GateError::BodyTooLarge => "request body exceeds the configured size cap",
            GateError::BodyUnreadable => "request body could not be read",
            GateError::BadRequest { message, .. } => return Cow::Owned(message.clone()),
            GateError::InvalidKey(AuthError::Missing) => "missing tokensaver key",
            GateError::InvalidKey(AuthError::Invalid) => "invalid tokensaver key",
            GateError::MethodNotAllowed => "this route takes POST",
            GateError::NotGated => {
                "this provider path is not gated by this build, so it is not forwarded"
            }
            GateError::UnknownRoute => "unknown route",
            GateError::UnknownModel { model: Some(model) } => {
                return Cow::Owned(format!(
                    "no upstream of this gate takes model {model} (see [upstreams.NAME] models)"
                ))
            }
            GateError::UnknownModel { model: None } => {
                "no upstream of this gate takes the requested model (see [upstreams.NAME] models)"
            }
            GateError::UnknownResponse => "no stored response with this id was created with this key",
            GateError::ChainedContextUnknown => {
                "previous_response_id names a response whose usage the gate has not seen: read it \
                 once it is complete (GET /v1/responses/{id}), then send the call again"
            }
            GateError::ConversationNotGated => {
                "conversation is provider-side state this gate cannot bind to a key, so a call \
                 that names one is not forwarded; send the history (input) or previous_response_id"
            }
            GateError::InvalidPath => {
                "the request path has dot segments, encoded separators or a backslash"
            }
            GateError::MissingHost => "an HTTP/1.1 request must carry a Host header",
            GateError::UnsupportedEncoding => {
                "the request body's Content-Encoding is not read by this gate: send it unencoded"
            }
            GateError::Held {
                hold_id, ttl_ms, ..
            } => return Cow::Owned(hold_message(hold_id.as_deref(), *ttl_ms)),
            GateError::Blocked { status: 429, .. } => {
                "refused by a runaway rule: the same or too many requests in a short window"
            }
            GateError::Blocked { status: 402, .. } => {
                "refused by a budget rule: the key's budget cannot cover this call"
            }
            GateError::Blocked { .. } => "refused: the request's score is in the BLOCK band",
            GateError::Unpriced {
                model: Some(model),
                ..
            } => {
                return Cow::Owned(format!(
                    "refused by a budget rule: model {model} has no price in this gate's price table, so its worst case is unbounded on a budgeted key; add [prices.\"{model}\"] to the config or PUT /prices on the admin listener"
                ))
            }
            GateError::Unpriced { model: None, .. } => {
                "refused by a budget rule: the requested model has no price in this gate's price table, so its worst case is unbounded on a budgeted key; add it under [prices] in the config or PUT /prices on the admin listener"
            }
            GateError::FleetUnavailable => "the gate's shared store is unreachable; retry shortly",
            GateError::UpstreamTimeout => "the provider did not answer in time",
            GateError::BadGateway { message, .. } => message,
            GateError::Api(e) => e.parts().2,
            GateError::GateUnreachable => "the central gate did not decide this request",
            GateError::AnswerMissing => "the gate served an answer this instance does not hold",
        };
        Cow::Borrowed(text)
    }

    /// The hold a CHALLENGE names (body `hold_id`, header `x-tokensaver-hold`).
    pub fn hold_id(&self) -> Option<&str> {
        match self {
            GateError::Held { hold_id, .. } | GateError::Unpriced { hold_id, .. } => {
                hold_id.as_deref()
            }
            _ => None,
        }
    }

    /// Sent as `Retry-After` (seconds) wherever the error is answered.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            GateError::FleetUnavailable => Some(FLEET_RETRY_AFTER_SECS),
            GateError::Api(ApiError::Busy) => Some(1),
            _ => None,
        }
    }

    /// The API and admin listeners' body: `{"error": {"code", "message"}}`.
    pub fn api_body(&self) -> serde_json::Value {
        crate::api_http::error_body(self.code(), &self.message())
    }

    /// The body in the error format of the provider the caller speaks to.
    pub fn body(&self, route: Option<Route>) -> Bytes {
        let (kind, code, message) = (self.kind(), self.code(), self.message());
        let value = match route {
            Some(Route::AnthropicMessages) => {
                let mut error = json!({"type": kind, "message": message, "code": code});
                if let Some(id) = self.hold_id() {
                    error["hold_id"] = json!(id);
                }
                json!({"type": "error", "error": error})
            }
            _ => {
                let mut error = json!({
                    "message": message,
                    "type": kind,
                    "param": null,
                    "code": code,
                });
                if let Some(id) = self.hold_id() {
                    error["hold_id"] = json!(id);
                }
                json!({"error": error})
            }
        };
        Bytes::from(serde_json::to_vec(&value).unwrap_or_default())
    }

    /// Whether the SDKs must be told not to retry (they retry 409 and 429 on their own, and each
    /// retry would count in the windows).
    pub fn no_retry(&self) -> bool {
        matches!(self.status(), 402 | 403 | 409 | 429)
    }
}

/// A caller's model, kept only when it reads as a model id (never markup or a prompt).
fn named_model(model: &str) -> Option<String> {
    looks_like_model_id(model).then(|| model.to_string())
}

impl From<StoreError> for GateError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::UnknownCursor => ApiError::UnknownCursor.into(),
            StoreError::Unavailable | StoreError::Sqlite(_) => ApiError::StorageUnavailable.into(),
        }
    }
}

/// A keyed route of the API listener without a valid key. (The proxy answers the same
/// failure in the provider's own shape, code `invalid_api_key`, which the SDKs recognise.)
impl From<AuthError> for GateError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Missing => ApiError::MissingKey.into(),
            AuthError::Invalid => ApiError::InvalidKey.into(),
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
        e.log();
        let resp = ApiResponse::json(e.status(), &e.api_body());
        match e.retry_after_secs() {
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
        let plain = ApiResponse::from(ApiError::StorageUnavailable);
        assert!(plain.headers.is_empty());
    }

    /// The API listeners' errors come from one table: the listener's 503 for too many bodies
    /// read at once says when to retry, and each error is logged at the level its cause needs.
    #[test]
    fn api_errors_answer_from_their_table_at_their_level() {
        let busy = ApiResponse::from(ApiError::Busy);
        assert_eq!(busy.status, 503);
        assert_eq!(busy.headers, [("retry-after", "1".to_string())]);
        let body: serde_json::Value = serde_json::from_slice(&busy.body).unwrap();
        assert_eq!(body["error"]["code"], "busy");
        let not_covered = GateError::from(ApiError::NotCovered("not covered here"));
        assert_eq!(
            (not_covered.status(), not_covered.code()),
            (404, "not_covered")
        );
        assert_eq!(not_covered.message(), "not covered here");
        use tracing::Level;
        assert_eq!(GateError::AnswerMissing.level(), Level::ERROR);
        assert_eq!(GateError::FleetUnavailable.level(), Level::WARN);
        assert_eq!(
            GateError::from(ApiError::StorageUnavailable).level(),
            Level::WARN
        );
        assert_eq!(
            GateError::from(ApiError::InvalidLimit).level(),
            Level::DEBUG
        );
        let blocked = GateError::Blocked {
            status: 429,
            reason: "runaway_loop",
        };
        assert_eq!(blocked.level(), Level::DEBUG);
    }

    #[test]
    fn the_hold_message_names_the_hold_and_how_to_release_it() {
        let id = "hold_0123456789abcdef0123456789abcdef";
        let err = GateError::held("score_challenge", Some(id.into()), Some(900_000));
        assert_eq!((err.status(), err.kind()), (409, "tokensaver_hold"));
        assert!(err.no_retry());
        assert!(err
            .message()
            .contains(&format!("'tokensaver holds approve {id}'")));
        assert!(err.message().contains(&format!("POST /holds/{id}/approve")));
        assert!(err.message().contains("15 minutes after it was made"));
        let body: serde_json::Value = serde_json::from_slice(&err.body(None)).unwrap();
        assert_eq!(body["error"]["hold_id"], id);
        assert_eq!(body["error"]["code"], "score_challenge");
        // Only a gate-made id is echoed.
        let odd = GateError::held("score_challenge", Some("<script>".into()), Some(60_000));
        assert!(!odd.message().contains("<script>"));
        assert_eq!(duration(60_000), "1 minute");
        assert_eq!(duration(90_000), "90 seconds");
        assert!(hold_message(Some(id), None).contains("until the hold expires."));
    }
}
