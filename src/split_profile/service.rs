//! The split-profile routes as pure handlers (the admin listener's shell calls [`SplitProfileService::handle`]).
//!
//! | route | answers |
//! |---|---|
//! | `GET /split-profile/criteria` | 200, the criteria as this build applies them |
//! | `POST /split-profile/precheck` | 200, signed assessability (or `in_contract: false` with the refusal); 402 outside the free allowance; 413 over the body cap |
//! | `POST /split-profile/check` | admin key: 200 signed report (house flag true) or the closed-form refusal; otherwise 402 with the price terms; 413 over the body cap |
//! | `/split-profile/budget`, `/catalogue`, `/audit` | 404 NOT COVERED (any method) |
//! | a known route with another method | 405 with `allow` |
//! | any other path under `/split-profile/` | 404 |
//!
//! Custody: the body is parsed in memory for the request's lifetime and dropped; nothing about
//! it is logged, stored or hashed. The only state is the free pre-check allowance, keyed by a
//! BLAKE3 digest of the caller identity (the body's `caller` string or the peer address —
//! never catalogue content), dropped at the end of each UTC day.

use std::collections::HashMap;
use std::sync::Mutex;

use http::Method;
use serde_json::json;

use super::criteria::criteria_json;
use super::engine::{catalogue_from_value, profile_catalogue, Refusal, MAX_BODY_BYTES};
use super::json::{self, JsValue};
use super::report::{precheck_bytes, signed_document, signed_report, PrecheckOutcome};
use crate::api_http::{ApiRequest, ApiResponse};
use crate::error::ApiError;
use crate::receipt::ReceiptSigner;

/// Free pre-checks per caller per UTC day.
pub const FREE_PRECHECKS_PER_DAY: u32 = 100;
/// Minimum time between one caller's served free pre-checks.
pub const FREE_PRECHECK_MIN_INTERVAL_MS: u64 = 5_000;
/// Distinct callers tracked per day (bounded memory); past it, new callers are refused 402.
pub const MAX_TRACKED_CALLERS: usize = 100_000;

const DAY_MS: u64 = 86_400_000;
const PREFIX: &str = "/split-profile/";

#[derive(Debug, Clone, Copy)]
struct CallerState {
    served: u32,
    last_ms: u64,
}

#[derive(Debug, Default)]
struct Allowance {
    day: u64,
    callers: HashMap<[u8; 32], CallerState>,
}

/// Why a free pre-check was not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AllowanceRefusal {
    Exhausted { retry_after_s: u64 },
    Interval { retry_after_s: u64 },
}

/// The split-profile routes and the free pre-check allowance (in memory).
#[derive(Debug, Default)]
pub struct SplitProfileService {
    allowance: Mutex<Allowance>,
}

impl SplitProfileService {
    pub fn new() -> Self {
        Self::default()
    }

    /// Answer a request under `/split-profile/`; `None` for any other path.
    pub fn handle(
        &self,
        req: &ApiRequest,
        is_admin_key: bool,
        signer: &ReceiptSigner,
        now_unix_ms: u64,
    ) -> Option<ApiResponse> {
        let route = req.path.strip_prefix(PREFIX)?;
        Some(match route {
            "criteria" => {
                if req.method == Method::GET {
                    ApiResponse::json(200, &criteria_json())
                } else {
                    method_not_allowed("GET")
                }
            }
            "precheck" => {
                if req.method == Method::POST {
                    self.precheck(req, is_admin_key, signer, now_unix_ms)
                } else {
                    method_not_allowed("POST")
                }
            }
            "check" => {
                if req.method == Method::POST {
                    check(req, is_admin_key, signer, now_unix_ms)
                } else {
                    method_not_allowed("POST")
                }
            }
            "budget" => not_covered("NOT COVERED — op budget is not built or offered by this worker; this worker serves op split-profile only"),
            "catalogue" => not_covered("NOT COVERED — op catalogue is not built or offered by this worker; this worker serves op split-profile only"),
            "audit" => not_covered("NOT COVERED — op audit is not built or offered by this worker; this worker serves op split-profile only"),
            _ => ApiError::SplitProfileUnknownRoute.into(),
        })
    }

    fn precheck(
        &self,
        req: &ApiRequest,
        is_admin_key: bool,
        signer: &ReceiptSigner,
        now_unix_ms: u64,
    ) -> ApiResponse {
        if req.body.len() > MAX_BODY_BYTES {
            return refusal_response(Refusal::BodyOverCap);
        }
        let parsed = json::parse(&req.body);
        if !is_admin_key {
            let caller = caller_key(parsed.as_ref().ok(), req);
            if let Err(refused) = self.take_free_precheck(caller, now_unix_ms) {
                return allowance_response(refused);
            }
        }
        let outcome = match parsed {
            Err(_) => PrecheckOutcome::Refused(Refusal::NotJson),
            Ok(value) => match catalogue_from_value(&value) {
                Ok(c) => PrecheckOutcome::InContract {
                    r3_assessable: c.tools_with_schema() >= 2,
                },
                Err(r) => PrecheckOutcome::Refused(r),
            },
        };
        let body = signed_document(
            "precheck",
            &precheck_bytes(outcome, is_admin_key, now_unix_ms),
            signer,
        );
        ApiResponse::text(200, "application/json", body)
    }

    /// Count one free pre-check for `caller`, or say why it is outside the allowance.
    fn take_free_precheck(&self, caller: [u8; 32], now: u64) -> Result<(), AllowanceRefusal> {
        let mut state = self
            .allowance
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let day = now / DAY_MS;
        if state.day != day {
            state.callers.clear(); // past days are dropped whole
            state.callers.shrink_to(1024);
            state.day = day;
        }
        let to_next_day_s = ((day + 1) * DAY_MS - now).div_ceil(1000);
        let tracked = state.callers.len();
        match state.callers.get_mut(&caller) {
            Some(st) => {
                if st.served >= FREE_PRECHECKS_PER_DAY {
                    return Err(AllowanceRefusal::Exhausted {
                        retry_after_s: to_next_day_s,
                    });
                }
                let next_ok = st.last_ms.saturating_add(FREE_PRECHECK_MIN_INTERVAL_MS);
                if now < next_ok {
                    return Err(AllowanceRefusal::Interval {
                        retry_after_s: (next_ok - now).div_ceil(1000),
                    });
                }
                st.served += 1;
                st.last_ms = now;
                Ok(())
            }
            None => {
                if tracked >= MAX_TRACKED_CALLERS {
                    return Err(AllowanceRefusal::Exhausted {
                        retry_after_s: to_next_day_s,
                    });
                }
                state.callers.insert(
                    caller,
                    CallerState {
                        served: 1,
                        last_ms: now,
                    },
                );
                Ok(())
            }
        }
    }

    /// How many callers the allowance currently tracks (for tests and metrics; no identities).
    pub fn tracked_callers(&self) -> usize {
        self.allowance
            .lock()
            .map(|s| s.callers.len())
            .unwrap_or_else(|p| p.into_inner().callers.len())
    }
}

/// The allowance key: BLAKE3 of the caller identity (body `caller` string, else peer address).
fn caller_key(body: Option<&JsValue>, req: &ApiRequest) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_derive_key("tokensaver split-profile free allowance v1");
    if let Some(JsValue::Object(o)) = body {
        if let Some(JsValue::String(s)) = o.get("caller") {
            hasher.update(b"caller\0");
            hasher.update(s.to_json().as_bytes());
            return *hasher.finalize().as_bytes();
        }
    }
    hasher.update(b"peer\0");
    match req.peer {
        Some(ip) => hasher.update(ip.to_string().as_bytes()),
        None => hasher.update(b"unknown"),
    };
    *hasher.finalize().as_bytes()
}

fn check(
    req: &ApiRequest,
    is_admin_key: bool,
    signer: &ReceiptSigner,
    now_unix_ms: u64,
) -> ApiResponse {
    if req.body.len() > MAX_BODY_BYTES {
        return refusal_response(Refusal::BodyOverCap);
    }
    if !is_admin_key {
        return payment_required();
    }
    let result = json::parse(&req.body)
        .map_err(|_| Refusal::NotJson)
        .and_then(|value| catalogue_from_value(&value))
        .and_then(|catalogue| profile_catalogue(&catalogue, now_unix_ms, true));
    match result {
        Ok(report) => ApiResponse::text(200, "application/json", signed_report(&report, signer)),
        Err(refusal) => refusal_response(refusal),
    }
}

/// A closed-form refusal: `{"error": {"code": rule, "message": static, "cap"?: N}}`.
pub fn refusal_response(refusal: Refusal) -> ApiResponse {
    let mut error = json!({"code": refusal.rule(), "message": refusal.message()});
    if let Some(cap) = refusal.cap() {
        error["cap"] = json!(cap);
    }
    ApiResponse::json(refusal.status(), &json!({ "error": error }))
}

fn payment_required() -> ApiResponse {
    let seed: serde_json::Value =
        serde_json::from_str(super::criteria::SEED_CRITERIA).unwrap_or_else(|_| json!({}));
    let price = seed.get("price").cloned().unwrap_or_else(
        || json!({"usdc_units_per_call": 20000, "label": "$0.02", "basis": "per catalogue"}),
    );
    ApiResponse::json(
        402,
        &json!({"error": {
            "code": "payment_required",
            "message": "POST /split-profile/check is paid: $0.02 per catalogue, one signed report per catalogue. This build has no payment rail; it serves house checks to the admin key only. The free pre-check (POST /split-profile/precheck) returns assessability.",
            "price": price,
            "payment_rail": "none in this build"
        }}),
    )
    .with_header("x-should-retry", "false")
}

fn allowance_response(refused: AllowanceRefusal) -> ApiResponse {
    let (code, message, retry) = match refused {
        AllowanceRefusal::Exhausted { retry_after_s } => (
            "free_precheck_exhausted",
            "the free pre-check allowance (100 per caller per UTC day) is used up",
            retry_after_s,
        ),
        AllowanceRefusal::Interval { retry_after_s } => (
            "free_precheck_interval",
            "free pre-checks are at least 5,000 ms apart per caller",
            retry_after_s,
        ),
    };
    ApiResponse::json(
        402,
        &json!({"error": {
            "code": code,
            "message": message,
            "per_day": FREE_PRECHECKS_PER_DAY,
            "min_interval_ms": FREE_PRECHECK_MIN_INTERVAL_MS
        }}),
    )
    .with_header("retry-after", retry.to_string())
    .with_header("x-should-retry", "false")
}

fn not_covered(message: &'static str) -> ApiResponse {
    ApiError::NotCovered(message).into()
}

fn method_not_allowed(allow: &'static str) -> ApiResponse {
    ApiResponse::from(ApiError::MethodNotAllowed).with_header("allow", allow)
}
