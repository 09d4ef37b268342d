//! What deciding a request writes — its ledger row, its reservation, the hold it uses up or
//! opens, the cache breakpoints it placed — as either home's store applies it: this process's
//! SQLite (through the gatekeeper's commit) or the fleet's admission transaction
//! ([`super::postgres::Fleet::admit`]). Built from a decision by `gatekeeper::booking`.

use super::{DecisionRow, RecordSource};
use tokensaver_core::gate::cache::CacheEdits;
use tokensaver_core::request::{Hash, WireForm};

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
