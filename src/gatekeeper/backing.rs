//! What a home of the gate's state does: the one trait its three homes implement — this
//! process (memory rebuilt from SQLite: [`super::local::Local`]), a fleet's PostgreSQL
//! ([`super::fleet::Shared`]), a digest client's central gate ([`super::remote::Remote`]).
//! Each method is handed the gate's [`GateCore`] (policy, signer, metrics); a home owns its
//! state and never reaches back into the gatekeeper that owns it. The gatekeeper's calls on
//! its home are in [`super::homes`].
//!
//! The homes that decide here decide with the same pure function over the same inputs; they
//! differ in where the windows, budgets, holds and answers are read and written, and in whose
//! clock expires them (this process's, or the database's).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::gate_core::GateCore;
use super::{
    AdmitError, BudgetView, GateOutcome, GateRequest, HoldAction, HoldDecided, HoldError, HoldList,
    Holding, RecordError, RecordSource, SetBudgetError, Settled, Unavailable, UsageReport,
};
use crate::config::{BudgetPeriod, Prices};
use crate::receipt::DecisionId;
use crate::store::answers::{AnswerKey, StoredAnswer};
use crate::store::{
    DecisionListing, DecisionPage, DecisionQuery, LedgerDay, LedgerTotals, ResponseBinding,
    StoreError, VerdictCount,
};
use tokensaver_core::gate::Verdict;

/// What a home for the gate's state does. `now_ms` is this process's clock, which the
/// embedded home decides by; a fleet decides by its database's clock and ignores it.
pub(super) trait Backing {
    /// Decide and book a request whose caller can hold it (the proxy, `POST /gate`).
    async fn admit(
        &self,
        core: &GateCore,
        req: &GateRequest<'_>,
        holding: Holding<'_>,
    ) -> Result<GateOutcome, AdmitError>;
    /// The decision the request would get now; nothing is counted or booked.
    async fn estimate(
        &self,
        core: &GateCore,
        req: &GateRequest<'_>,
    ) -> Result<GateOutcome, Unavailable>;
    /// Settle a forwarded decision with the usage the provider reported. A digest client's
    /// report is committed before this returns; the proxy's own is queued (or spooled).
    async fn settle(
        &self,
        core: &GateCore,
        report: &UsageReport,
        source: RecordSource,
        now_ms: u64,
    ) -> Result<Settled, RecordError>;
    /// Keep the reservation of an answer still being relayed live for another TTL; a renewal
    /// that fails is retried at the next one.
    async fn renew(&self, core: &GateCore, decision_id: &DecisionId, now_ms: u64);
    /// `POST /renew`: a digest client keeps the reservation of a decision it was given live
    /// while it relays the answer. Only that key's open digest reservations: `Ok(false)` for
    /// any other id.
    async fn renew_for_digest(
        &self,
        core: &GateCore,
        key_id: &str,
        decision_id: &DecisionId,
        now_ms: u64,
    ) -> Result<bool, Unavailable>;
    /// The stored answer for this request, if one is held; a store that does not answer reads
    /// as a miss (the request is decided without it).
    async fn answer(&self, core: &GateCore, key: &AnswerKey) -> Option<Arc<StoredAnswer>>;
    /// Store a complete answer; one that cannot be written is simply not stored.
    async fn keep_answer(&self, core: &GateCore, key: AnswerKey, answer: StoredAnswer);
    async fn holds(
        &self,
        core: &GateCore,
        key_id: Option<&str>,
        now_ms: u64,
    ) -> Result<HoldList, HoldError>;
    async fn decide_hold(
        &self,
        core: &GateCore,
        hold_id: &str,
        owner: Option<&str>,
        action: HoldAction,
        now_ms: u64,
    ) -> Result<HoldDecided, HoldError>;
    async fn budget(
        &self,
        core: &GateCore,
        key_id: &str,
        now_ms: u64,
    ) -> Result<BudgetView, Unavailable>;
    async fn set_budget(
        &self,
        core: &GateCore,
        key_id: &str,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
    ) -> Result<(), SetBudgetError>;
    /// Spend and savings per day and in total, of a key or every key (`None`); `from` and
    /// `to` are UTC days, both inclusive.
    async fn ledger(
        &self,
        core: &GateCore,
        key_id: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), StoreError>;
    /// Decisions with their settlements, oldest first, a page at a time; what is queued is
    /// committed first, so a settled call is listed as settled.
    async fn decisions(
        &self,
        core: &GateCore,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError>;
    /// The newest decisions (newest first) with what each settled, of a key or every key
    /// (`None`), of one verdict or all.
    async fn latest_decisions(
        &self,
        core: &GateCore,
        key_id: Option<&str>,
        verdict: Option<Verdict>,
        limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError>;
    /// Decisions since `since_ms` per `bucket_ms`-wide bucket, verdict and rule.
    async fn verdicts_over_time(
        &self,
        core: &GateCore,
        key_id: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError>;
    /// Bind a created response id to its key (committed before the id reaches the client).
    async fn bind_response(
        &self,
        core: &GateCore,
        binding: ResponseBinding,
    ) -> Result<(), Unavailable>;
    async fn response_binding(
        &self,
        core: &GateCore,
        id: &str,
    ) -> Result<Option<ResponseBinding>, Unavailable>;
    /// `POST /forget`: the key's stored answers and fingerprint records; totals and the
    /// windows stay.
    async fn forget(&self, core: &GateCore, key_id: &str) -> Result<(), StoreError>;
    /// Keep prices set by `PUT /prices` (this node's store: prices are per node).
    async fn keep_prices(&self, prices: &BTreeMap<String, Prices>) -> Result<(), StoreError>;
    /// Whether other processes write this state too (so what this one remembers of it may be
    /// behind).
    fn shared(&self) -> bool;
    /// The periodic work without a request: expiry, and a fleet's spool replay.
    async fn tick(&self, core: &GateCore, now_ms: u64);
}
