//! The booking of a decision ([`Booking`]), built once from the decision, whichever home
//! applies it: this process's memory and SQLite ([`super::Gatekeeper`]'s commit), or the
//! fleet's admission transaction ([`crate::store::postgres::Fleet::admit`]).

use super::GateRequest;
use crate::receipt::DecisionId;
pub use crate::store::booking::{Booking, NewHold, NewReservation};
use crate::store::{DecisionRow, RecordSource};
use tokensaver_core::gate::{Decision, Verdict};
use tokensaver_core::request::{Hash, RequestShape};

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
