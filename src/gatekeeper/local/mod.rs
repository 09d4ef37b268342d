//! The embedded home of the gate's state: this process's memory (windows, budgets,
//! reservations, holds, answers), rebuilt from SQLite at start and written to it by group
//! commit. Decided by this process's clock. It owns that state; what it does with it is in
//! [`gate`] (deciding and booking, settling, holds, expiry).

mod gate;
#[cfg(test)]
mod session_tests;
#[cfg(test)]
mod settle_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::backing::Backing;
use super::gate_core::{reopen, GateCore};
use super::lock;
use super::reservations::Reservation;
use super::state::{KeyBudget, State};
use super::{AdmitError, HoldList, SetBudgetError, Settled, Unavailable};
use super::{
    BudgetView, GateOutcome, GateRequest, HoldAction, HoldDecided, HoldError, Holding, RecordError,
    RecordSource, UsageReport,
};
use crate::config::{BudgetPeriod, Prices};
use crate::receipt::DecisionId;
use crate::store::answers::AnswerStore;
use crate::store::answers::{AnswerKey, StoredAnswer};
use crate::store::postgres::KeyLimit;
use crate::store::{
    DecisionListing, DecisionPage, DecisionQuery, Event, LedgerDay, LedgerTotals, ResponseBinding,
    StoreError, VerdictCount,
};
use crate::store::{HoldOpening, Snapshot, Store};
use tokensaver_core::gate::Verdict;

pub struct Local {
    state: Mutex<State>,
    answers: Mutex<AnswerStore>,
    store: Arc<dyn Store>,
}

impl Local {
    /// Rebuild the state from what the store kept: budgets (config, then a `PUT`), spend,
    /// the windows from the recent decisions, open reservations, holds and leases, and the
    /// usage recorded for stored answers.
    pub(super) fn rebuild(core: &GateCore, store: Arc<dyn Store>, snapshot: &Snapshot) -> Local {
        let mut state = State::new(&core.policy.load().gate, core.config.remembered_entries);
        for key in &core.config.keys {
            state.budgets.insert(
                key.id.to_string(),
                KeyBudget {
                    ceiling_nano: key.budget.map(|b| b.ceiling_nano),
                    period: key.budget.map(|b| b.period).unwrap_or_default(),
                    spend_by_day: BTreeMap::new(),
                },
            );
        }
        for (key_id, ceiling, period) in &snapshot.budgets {
            if let Some(b) = state.budgets.get_mut(key_id) {
                b.ceiling_nano = *ceiling;
                b.period = *period;
            }
        }
        for (key_id, at, nano) in &snapshot.spend {
            state.add_spend(key_id, *at, *nano);
        }
        for row in &snapshot.recent_decisions {
            if let Some(fp) = row.fingerprint {
                let step = row.step_fingerprint.unwrap_or(fp);
                // As `gate` counted it: a SERVE in every window but the step windows and runs.
                if row.verdict == Verdict::Serve {
                    state.windows.record_serve(
                        &row.key_id,
                        &fp,
                        &step,
                        &row.model_requested,
                        row.decided_at_ms,
                    );
                } else {
                    // The row keeps no action: a restart reads every other step as progress.
                    state.windows.record_session(
                        &row.key_id,
                        &fp,
                        &step,
                        None,
                        row.session.as_ref(),
                        &row.model_requested,
                        row.decided_at_ms,
                        row.decided_at_ms.saturating_sub(row.paced_ms),
                    );
                }
            }
        }
        for row in &snapshot.open_reservations {
            if let Some(fp) = row.fingerprint {
                state.reservations.open(
                    row.decision_id,
                    Reservation {
                        key_id: Arc::from(row.key_id.as_str()),
                        fingerprint: fp,
                        served_model: row
                            .model_served
                            .clone()
                            .unwrap_or_else(|| row.model_requested.clone()),
                        wire: row.wire,
                        nano: row.reserved_nano,
                        // The stored worst case adds the input estimate: a looser ceiling.
                        output_ceiling: row.worst_case_tokens,
                        input_tokens: row.worst_case_tokens.unwrap_or(0),
                        expires_ms: row.decided_at_ms + core.config.reservation_ttl_ms,
                        reusable: false,
                        recorded_by: row.recorded_by,
                        // As the decision row kept them.
                        cache_edits: row.cache_edits,
                        session: row.session.unwrap_or_default(),
                    },
                );
            }
        }
        let mut openings: HashMap<&str, &HoldOpening> = snapshot
            .hold_openings
            .iter()
            .map(|o| (o.hold_id.as_str(), o))
            .collect();
        for hold in &snapshot.holds {
            let opened = openings
                .remove(hold.hold_id.as_str())
                .and_then(|o| reopen(&core.signer, o));
            state.open_hold(hold.clone(), opened);
        }
        for lease in &snapshot.leases {
            state.add_lease(lease.clone());
        }
        for (key_id, fp, wire, usage, at_ms) in &snapshot.recorded {
            state.record_usage(key_id, *fp, *wire, *usage, *at_ms);
        }
        Local {
            state: Mutex::new(state),
            answers: Mutex::new(AnswerStore::new(core.config.answer_store_bytes)),
            store,
        }
    }

    /// The key's budget as this process's config (or a `PUT /budget` it has seen) states it;
    /// unlimited when it states none.
    pub(crate) fn limit(&self, key_id: &str) -> KeyLimit {
        lock(&self.state).budgets.get(key_id).map_or(
            KeyLimit {
                ceiling_nano: None,
                period: Default::default(),
            },
            |b| KeyLimit {
                ceiling_nano: b.ceiling_nano,
                period: b.period,
            },
        )
    }
}

impl Backing for Local {
    async fn admit(
        &self,
        core: &GateCore,
        req: &GateRequest<'_>,
        holding: Holding<'_>,
    ) -> Result<GateOutcome, AdmitError> {
        self.gate_paced(core, req, holding).await
    }

    async fn estimate(
        &self,
        core: &GateCore,
        req: &GateRequest<'_>,
    ) -> Result<GateOutcome, Unavailable> {
        Ok(self.estimate_paced(core, req))
    }

    async fn settle(
        &self,
        core: &GateCore,
        report: &UsageReport,
        source: RecordSource,
        now_ms: u64,
    ) -> Result<Settled, RecordError> {
        // A digest client is told it may forget its report, so its row is committed before
        // this returns; the proxy's own is queued (`settle_usage` says which).
        self.record_usage(core, report, now_ms, source)
            .await
            .map(|row| Settled::Here(Box::new(row)))
    }

    async fn renew(&self, core: &GateCore, decision_id: &DecisionId, now_ms: u64) {
        self.renew_reservation(core, decision_id, now_ms)
    }

    async fn renew_for_digest(
        &self,
        core: &GateCore,
        key_id: &str,
        decision_id: &DecisionId,
        now_ms: u64,
    ) -> Result<bool, Unavailable> {
        Ok(self.renew_digest_reservation(core, key_id, decision_id, now_ms))
    }

    async fn answer(&self, _core: &GateCore, key: &AnswerKey) -> Option<Arc<StoredAnswer>> {
        self.answer(key)
    }

    async fn keep_answer(&self, core: &GateCore, key: AnswerKey, answer: StoredAnswer) {
        self.store_answer(core, key, answer)
    }

    async fn holds(
        &self,
        _core: &GateCore,
        key_id: Option<&str>,
        now_ms: u64,
    ) -> Result<HoldList, HoldError> {
        let (holds, leases) = self.holds(key_id, now_ms);
        Ok(HoldList {
            now_ms,
            holds,
            leases,
        })
    }

    async fn decide_hold(
        &self,
        core: &GateCore,
        hold_id: &str,
        owner: Option<&str>,
        action: HoldAction,
        now_ms: u64,
    ) -> Result<HoldDecided, HoldError> {
        self.decide_hold(core, hold_id, owner, action, now_ms)
    }

    async fn budget(
        &self,
        _core: &GateCore,
        key_id: &str,
        now_ms: u64,
    ) -> Result<BudgetView, Unavailable> {
        Ok(self.budget_view(key_id, now_ms))
    }

    async fn set_budget(
        &self,
        _core: &GateCore,
        key_id: &str,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
    ) -> Result<(), SetBudgetError> {
        Ok(self.set_budget(key_id, ceiling_nano, period).await?)
    }

    async fn ledger(
        &self,
        _core: &GateCore,
        key_id: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), StoreError> {
        let (key_id, from, to) = (
            key_id.map(str::to_string),
            from.map(str::to_string),
            to.map(str::to_string),
        );
        self.read_committed(move |store| {
            store.ledger(key_id.as_deref(), from.as_deref(), to.as_deref())
        })
        .await
    }

    async fn decisions(
        &self,
        _core: &GateCore,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        let query = query.clone();
        self.read_committed(move |store| store.decisions(&query))
            .await
    }

    async fn latest_decisions(
        &self,
        _core: &GateCore,
        key_id: Option<&str>,
        verdict: Option<Verdict>,
        limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError> {
        let key_id = key_id.map(str::to_string);
        self.read_committed(move |store| store.latest_decisions(key_id.as_deref(), verdict, limit))
            .await
    }

    async fn verdicts_over_time(
        &self,
        _core: &GateCore,
        key_id: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError> {
        let key_id = key_id.map(str::to_string);
        self.read_committed(move |store| {
            store.verdicts_over_time(key_id.as_deref(), since_ms, bucket_ms)
        })
        .await
    }

    async fn bind_response(
        &self,
        _core: &GateCore,
        binding: ResponseBinding,
    ) -> Result<(), Unavailable> {
        self.store
            .submit_acked(Event::ResponseBound(binding))
            .await
            .map_err(|_| Unavailable)
    }

    async fn response_binding(
        &self,
        _core: &GateCore,
        id: &str,
    ) -> Result<Option<ResponseBinding>, Unavailable> {
        // SQLite is synchronous: the blocking pool's read, not a worker's.
        let store = self.store.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || store.response_binding(&id))
            .await
            .map_err(|_| Unavailable)?
            .map_err(|_| Unavailable)
    }

    async fn forget(&self, _core: &GateCore, key_id: &str) -> Result<(), StoreError> {
        self.forget(key_id).await
    }

    async fn keep_prices(&self, prices: &BTreeMap<String, Prices>) -> Result<(), StoreError> {
        Local::keep_prices(self, prices).await
    }

    fn shared(&self) -> bool {
        false
    }

    async fn tick(&self, _core: &GateCore, now_ms: u64) {
        self.tick(now_ms)
    }
}
