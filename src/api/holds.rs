//! The hold routes (SPEC §2.7): list, approve (optionally with an attending lease) and deny
//! CHALLENGE holds. Who may act is decided by the caller ([`super::routes`]): the admin
//! listener with the admin key (every key's holds), the API listener with the key's owner
//! secret (its own holds; listing also with the key itself).

use serde::Deserialize;
use serde_json::json;

use super::http::{ApiRequest, ApiResponse};
use crate::error::ApiError;
use crate::gatekeeper::{
    Gatekeeper, HoldAction, HoldDecided, HoldError, HoldList, MAX_ATTEND_MINUTES,
};

/// What a `/holds/...` path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldRoute<'a> {
    /// `GET /holds`
    List,
    /// `POST /holds/{id}/approve`
    Approve(&'a str),
    /// `POST /holds/{id}/deny`
    Deny(&'a str),
}

/// `GET /holds`: pending and approved-unused holds (no content: ids, reason, times, worst
/// case, a truncated keyed fingerprint) and the attending leases that run now.
pub async fn list(gatekeeper: &Gatekeeper, key_id: Option<&str>, now_ms: u64) -> ApiResponse {
    let HoldList {
        now_ms,
        holds,
        leases,
    } = match gatekeeper.open_holds(key_id, now_ms).await {
        Ok(found) => found,
        Err(e) => return hold_error(e),
    };
    ApiResponse::json(
        200,
        &json!({"now_ms": now_ms, "holds": holds, "leases": leases}),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    attend_minutes: Option<u64>,
}

/// The approval's body: empty, or `{"attend_minutes": N}` (1..=1440).
fn approve_action(req: &ApiRequest) -> Result<HoldAction, ApiResponse> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(HoldAction::Approve {
            attend_minutes: None,
        });
    }
    let body: ApproveBody = serde_json::from_slice(&req.body)
        .map_err(|_| ApiResponse::from(ApiError::InvalidHoldBody))?;
    match body.attend_minutes {
        Some(m) if !(1..=MAX_ATTEND_MINUTES).contains(&m) => Err(attend_error()),
        attend_minutes => Ok(HoldAction::Approve { attend_minutes }),
    }
}

fn attend_error() -> ApiResponse {
    ApiError::InvalidAttendMinutes.into()
}

/// Approve or deny `hold_id`. `owner`: the deciding owner's key id (`None`: the admin).
pub async fn decide(
    gatekeeper: &Gatekeeper,
    req: &ApiRequest,
    route: HoldRoute<'_>,
    owner: Option<&str>,
    now_ms: u64,
) -> ApiResponse {
    let (hold_id, action) = match route {
        HoldRoute::List => return list(gatekeeper, owner, now_ms).await,
        HoldRoute::Approve(id) => match approve_action(req) {
            Ok(action) => (id, action),
            Err(resp) => return resp,
        },
        HoldRoute::Deny(id) => (id, HoldAction::Deny),
    };
    match gatekeeper.decide(hold_id, owner, action, now_ms).await {
        Ok(decided) => decided_answer(&decided, action),
        Err(e) => hold_error(e),
    }
}

fn decided_answer(d: &HoldDecided, action: HoldAction) -> ApiResponse {
    let mut body = serde_json::to_value(d).unwrap_or_else(|_| json!({}));
    match action {
        HoldAction::Approve { .. } => {
            body["approved"] = json!(true);
            body["releases"] = json!(
                "the key's next request with the same fingerprint before expires_ms passes once \
                 (no header needed; x-tokensaver-hold or the digest's hold_id also work)"
            );
            if d.attending_until_ms.is_some() {
                body["attending"] = json!(
                    "until attending_until_ms the key's requests that declare no \
                     x-tokensaver-human are scored as attended; hard rules still apply"
                );
            }
        }
        HoldAction::Deny => {
            body["denied"] = json!(true);
        }
    }
    ApiResponse::json(200, &body)
}

pub fn hold_error(e: HoldError) -> ApiResponse {
    match e {
        HoldError::Unknown => ApiError::UnknownHold.into(),
        HoldError::Expired => ApiError::HoldExpired.into(),
        HoldError::NotPending => ApiError::HoldNotPending.into(),
        HoldError::AttendMinutes => attend_error(),
        HoldError::Unavailable => crate::error::GateError::fleet_unavailable().into(),
        HoldError::Unpriced => ApiError::UnpricedHold.into(),
    }
}
