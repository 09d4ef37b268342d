//! The booking of a decision — its ledger row, its reservation, the hold it uses up or opens,
//! the cache breakpoints it placed — built once from the decision, whichever home applies it:
//! this process's memory and SQLite ([`super::Gatekeeper`]'s commit), or the fleet's admission
//! transaction ([`super::fleet::Fleet::admit`]).

use super::GateRequest;
use crate::receipt::DecisionId;
use crate::store::{DecisionRow, RecordSource};
use tokensaver_core::gate::cache::CacheEdits;
use tokensaver_core::gate::{Decision, Verdict};
use tokensaver_core::request::{Hash, RequestShape, WireForm};

/// What one admission writes: the decision row (the attempt the windows count) and, for a
/// forwarded decision, its reservation.
pub struct Booking {
    pub row: DecisionRow,
    pub reservation: Option<NewReservation>,
    /// The approved hold this decision released: used up now.
    pub used_hold: Option<String>,
    /// The hold a CHALLENGE opens.
    pub new_hold: Option<NewHold>,
    /// The scope's cache points that got a breakpoint (indices): every point of the scope is
    /// remembered as sent now, these as placed now.
    pub cache_breakpoints: Vec<u16>,
    /// The call went to the provider (ALLOW, DOWNGRADE): only then were its prefixes sent, and
    /// only then are they remembered (SPEC §2.11b: a refused or served request is not "seen").
    pub sent_prefixes: bool,
}

pub struct NewReservation {
    pub nano: u64,
    pub served_model: String,
    pub wire: WireForm,
    pub output_ceiling: Option<u64>,
    pub fingerprint: Hash,
    pub reusable: bool,
    /// A person's approval forwards past `exceeds_remaining_budget` (SPEC §2.7): the
    /// conditional reservation does not apply to it.
    pub approved_past_budget: bool,
    /// The decision's input worst case (tokens).
    pub input_tokens: u64,
    /// The one party that may settle it.
    pub recorded_by: RecordSource,
    /// What the gate did to the call's caching (settlement attributes its savings by it).
    pub cache_edits: CacheEdits,
    /// The call's agent session (its settled usage feeds the session's cache figures).
    pub session: Hash,
}

/// A CHALLENGE's hold, written with its decision.
pub struct NewHold {
    pub hold_id: String,
    pub fingerprint: Hash,
    pub worst_case_tokens: u64,
    pub reason: &'static str,
    pub opening_decision: String,
    pub opening_receipt: Vec<u8>,
}

impl Booking {
    /// What deciding `decision` (its receipt `body`, its id) for `req` writes.
    pub fn of(
        decision: &Decision,
        body: &[u8],
        decision_id: DecisionId,
        req: &GateRequest<'_>,
    ) -> Booking {
        let shape = req.shape;
        let reservation = decision.verdict.forwards().then(|| NewReservation {
            nano: decision.worst_case.cost_nano.unwrap_or(0),
            served_model: decision
                .model_served
                .clone()
                .unwrap_or_else(|| shape.model.clone()),
            wire: shape.wire_form(),
            output_ceiling: decision.worst_case.output_tokens,
            fingerprint: shape.fingerprint,
            reusable: shape.reproducible(),
            approved_past_budget: decision.approved_hold.is_some(),
            input_tokens: decision.worst_case.input_tokens_estimated,
            recorded_by: req.recorded_by,
            cache_edits: decision.cache_edits(),
            session: req.shape.session,
        });
        let new_hold = decision.hold_id.as_ref().map(|hold_id| NewHold {
            hold_id: hold_id.clone(),
            fingerprint: shape.fingerprint,
            worst_case_tokens: decision.worst_case.tokens().unwrap_or(0),
            reason: decision.reason(),
            opening_decision: serde_json::to_string(decision).unwrap_or_default(),
            opening_receipt: body.to_vec(),
        });
        let reserved = reservation.as_ref().map_or(0, |r| r.nano);
        Booking {
            row: decision_row(decision, decision_id, shape, reserved, req.recorded_by),
            reservation,
            used_hold: decision.approved_hold.clone(),
            new_hold,
            cache_breakpoints: decision.cache_breakpoints.clone(),
            sent_prefixes: decision.verdict.forwards(),
        }
    }
}

/// The ledger row of a decision: what the windows are rebuilt from and what settles.
fn decision_row(
    d: &Decision,
    decision_id: DecisionId,
    shape: &RequestShape,
    reserved_nano: u64,
    recorded_by: RecordSource,
) -> DecisionRow {
    let wire = shape.wire_form();
    DecisionRow {
        decision_id,
        key_id: d.key_id.clone(),
        fingerprint: Some(d.fingerprint),
        verdict: d.verdict,
        reason: d.reason().to_string(),
        score: d.score,
        model_requested: d.model_requested.clone(),
        model_served: d.model_served.clone(),
        wire,
        decided_at_ms: d.decided_at_ms,
        reserved_nano,
        worst_case_tokens: d.worst_case.tokens(),
        tokens_not_bought: d.tokens_not_bought.map(|u| u.total()).unwrap_or(0),
        worst_case_tokens_avoided: if d.verdict == Verdict::Block {
            d.worst_case_tokens_avoided.unwrap_or(0)
        } else {
            0
        },
        findings_tokens: d.findings.iter().filter_map(|f| f.tokens).sum(),
        hold_id: d.hold_id.clone(),
        step_fingerprint: Some(shape.step_fingerprint),
        recorded_by,
        session: Some(shape.session).filter(|s| *s != Hash::default()),
        paced_ms: d.paced_ms.unwrap_or(0),
        cache_edits: d.cache_edits(),
    }
}
