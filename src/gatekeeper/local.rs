//! The embedded home of the gate's state: this process's memory (windows, budgets,
//! reservations, holds, answers), rebuilt from SQLite at start and written to it by group
//! commit. Decided by this process's clock.

use std::sync::Arc;

use super::backing::{AdmitError, Backing, HoldList, SetBudgetError, Unavailable};
use super::{
    BudgetView, GateOutcome, GateRequest, Gatekeeper, HoldAction, HoldDecided, HoldError, Holding,
    RecordError, RecordSource, UsageReport,
};
use crate::config::BudgetPeriod;
use crate::receipt::DecisionId;
use crate::store::answers::{AnswerKey, StoredAnswer};
use crate::store::{
    DecisionListing, DecisionPage, DecisionQuery, Event, LedgerDay, LedgerTotals, ResponseBinding,
    StoreError, UsageRow, VerdictCount,
};
use tokensaver_core::gate::Verdict;

pub(super) struct Local;

impl Backing for Local {
    async fn admit(
        &self,
        gk: &Gatekeeper,
        req: &GateRequest<'_>,
        holding: Holding<'_>,
    ) -> Result<GateOutcome, AdmitError> {
        gk.gate_paced(req, holding).await
    }

    async fn estimate(
        &self,
        gk: &Gatekeeper,
        req: &GateRequest<'_>,
    ) -> Result<GateOutcome, Unavailable> {
        Ok(gk.estimate_paced(req))
    }

    async fn settle(
        &self,
        gk: &Gatekeeper,
        report: &UsageReport,
        source: RecordSource,
        now_ms: u64,
    ) -> Result<UsageRow, RecordError> {
        // A digest client is told it may forget its report, so its row is committed before
        // this returns; the proxy's own is queued (`settle_usage` says which).
        gk.record_usage(report, now_ms, source).await
    }

    async fn renew(&self, gk: &Gatekeeper, decision_id: &DecisionId, now_ms: u64) {
        gk.renew_reservation(decision_id, now_ms)
    }

    async fn renew_for_digest(
        &self,
        gk: &Gatekeeper,
        key_id: &str,
        decision_id: &DecisionId,
        now_ms: u64,
    ) -> Result<bool, Unavailable> {
        Ok(gk.renew_digest_reservation(key_id, decision_id, now_ms))
    }

    async fn answer(&self, gk: &Gatekeeper, key: &AnswerKey) -> Option<Arc<StoredAnswer>> {
        gk.answer(key)
    }

    async fn keep_answer(&self, gk: &Gatekeeper, key: AnswerKey, answer: StoredAnswer) {
        gk.store_answer(key, answer)
    }

    async fn holds(
        &self,
        gk: &Gatekeeper,
        key_id: Option<&str>,
        now_ms: u64,
    ) -> Result<HoldList, HoldError> {
        let (holds, leases) = gk.holds(key_id, now_ms);
        Ok(HoldList {
            now_ms,
            holds,
            leases,
        })
    }

    async fn decide_hold(
        &self,
        gk: &Gatekeeper,
        hold_id: &str,
        owner: Option<&str>,
        action: HoldAction,
        now_ms: u64,
    ) -> Result<HoldDecided, HoldError> {
        gk.decide_hold(hold_id, owner, action, now_ms)
    }

    async fn budget(
        &self,
        gk: &Gatekeeper,
        key_id: &str,
        now_ms: u64,
    ) -> Result<BudgetView, Unavailable> {
        Ok(gk.budget_view(key_id, now_ms))
    }

    async fn set_budget(
        &self,
        gk: &Gatekeeper,
        key_id: &str,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
    ) -> Result<(), SetBudgetError> {
        Ok(gk.set_budget(key_id, ceiling_nano, period).await?)
    }

    async fn ledger(
        &self,
        gk: &Gatekeeper,
        key_id: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), StoreError> {
        let (key_id, from, to) = (
            key_id.map(str::to_string),
            from.map(str::to_string),
            to.map(str::to_string),
        );
        gk.read_committed(move |store| {
            store.ledger(key_id.as_deref(), from.as_deref(), to.as_deref())
        })
        .await
    }

    async fn decisions(
        &self,
        gk: &Gatekeeper,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        let query = query.clone();
        gk.read_committed(move |store| store.decisions(&query))
            .await
    }

    async fn latest_decisions(
        &self,
        gk: &Gatekeeper,
        key_id: Option<&str>,
        verdict: Option<Verdict>,
        limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError> {
        let key_id = key_id.map(str::to_string);
        gk.read_committed(move |store| store.latest_decisions(key_id.as_deref(), verdict, limit))
            .await
    }

    async fn verdicts_over_time(
        &self,
        gk: &Gatekeeper,
        key_id: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError> {
        let key_id = key_id.map(str::to_string);
        gk.read_committed(move |store| {
            store.verdicts_over_time(key_id.as_deref(), since_ms, bucket_ms)
        })
        .await
    }

    async fn bind_response(
        &self,
        gk: &Gatekeeper,
        binding: ResponseBinding,
    ) -> Result<(), Unavailable> {
        gk.store()
            .submit_acked(Event::ResponseBound(binding))
            .await
            .map_err(|_| Unavailable)
    }

    async fn response_binding(
        &self,
        gk: &Gatekeeper,
        id: &str,
    ) -> Result<Option<ResponseBinding>, Unavailable> {
        // SQLite is synchronous: the blocking pool's read, not a worker's.
        let store = gk.store().clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || store.response_binding(&id))
            .await
            .map_err(|_| Unavailable)?
            .map_err(|_| Unavailable)
    }

    async fn forget(&self, gk: &Gatekeeper, key_id: &str) -> Result<(), StoreError> {
        gk.forget(key_id).await
    }

    fn shared(&self) -> bool {
        false
    }

    async fn tick(&self, gk: &Gatekeeper, now_ms: u64) {
        gk.tick(now_ms)
    }
}
