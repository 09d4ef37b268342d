//! The gatekeeper's calls on its home. Everything the proxy, the API and the page ask of the
//! gate's state goes through [`Gatekeeper`]'s methods here; each is one [`Backing`] call on
//! the home the gatekeeper was built with, given its core. So no caller asks which home it
//! is, and adding a capability means adding it to every home, which the compiler checks.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::backing::Backing;
use super::{
    AdmitError, BudgetView, GateOutcome, GateRequest, Gatekeeper, HoldAction, HoldDecided,
    HoldError, HoldList, Holding, Home, RecordError, RecordSource, SetBudgetError, Settled,
    Unavailable, UsageReport,
};
use crate::auth::{AuthError, Caller};
use crate::config::{BudgetPeriod, KeyConfig, Prices};
use crate::receipt::DecisionId;
use crate::store::answers::{AnswerKey, StoredAnswer};
use crate::store::{
    DecisionListing, DecisionPage, DecisionQuery, LedgerDay, LedgerTotals, ResponseBinding,
    StoreError, VerdictCount,
};
use tokensaver_core::gate::Verdict;

/// One call on the gatekeeper's home: the only place that names every home.
macro_rules! on_home {
    ($gk:expr, $home:ident => $call:expr) => {
        match &$gk.home {
            Home::Local(local) => {
                let $home: &super::Local = local;
                $call
            }
            Home::Fleet(shared) => {
                let $home: &super::fleet::Shared = shared;
                $call
            }
            Home::Remote(remote) => {
                let $home: &super::remote::Remote = remote;
                $call
            }
        }
    };
}

impl Gatekeeper {
    /// Decide and book a request whose caller can hold it: a repeated step its pace window
    /// does not admit yet waits (SPEC §2.3), unless its caller leaves. `Err`: nothing was
    /// decided; the caller forwards nothing.
    pub async fn admit(
        &self,
        req: &GateRequest<'_>,
        holding: Holding<'_>,
    ) -> Result<GateOutcome, AdmitError> {
        on_home!(self, home => Backing::admit(home, &self.core, req, holding).await)
    }

    /// `POST /estimate`: the decision the request would get now; nothing moves.
    pub async fn estimate(&self, req: &GateRequest<'_>) -> Result<GateOutcome, Unavailable> {
        on_home!(self, home => Backing::estimate(home, &self.core, req).await)
    }

    /// Settle a forwarded decision with the provider's usage ([`super::settlement`]).
    pub async fn settle(
        &self,
        report: &UsageReport,
        source: RecordSource,
        now_ms: u64,
    ) -> Result<Settled, RecordError> {
        let settled = on_home!(self, home => Backing::settle(home, &self.core, report, source, now_ms).await)?;
        if let Settled::Here(row) = &settled {
            self.core.metrics.count_cache(row);
        }
        Ok(settled)
    }

    pub async fn renew(&self, decision_id: &DecisionId, now_ms: u64) {
        on_home!(self, home => Backing::renew(home, &self.core, decision_id, now_ms).await)
    }

    /// `POST /renew` ([`Backing::renew_for_digest`]).
    pub async fn renew_for_digest(
        &self,
        key_id: &str,
        decision_id: &DecisionId,
        now_ms: u64,
    ) -> Result<bool, Unavailable> {
        on_home!(self, home => Backing::renew_for_digest(home, &self.core, key_id, decision_id, now_ms).await)
    }

    pub async fn stored_answer(&self, key: &AnswerKey) -> Option<Arc<StoredAnswer>> {
        on_home!(self, home => Backing::answer(home, &self.core, key).await)
    }

    pub async fn keep_answer(&self, key: AnswerKey, answer: StoredAnswer) {
        on_home!(self, home => Backing::keep_answer(home, &self.core, key, answer).await)
    }

    pub async fn open_holds(
        &self,
        key_id: Option<&str>,
        now_ms: u64,
    ) -> Result<HoldList, HoldError> {
        on_home!(self, home => Backing::holds(home, &self.core, key_id, now_ms).await)
    }

    /// Approve or deny a hold; `owner`: the deciding owner's key id (`None`: the admin).
    pub async fn decide(
        &self,
        hold_id: &str,
        owner: Option<&str>,
        action: HoldAction,
        now_ms: u64,
    ) -> Result<HoldDecided, HoldError> {
        on_home!(self, home => Backing::decide_hold(home, &self.core, hold_id, owner, action, now_ms).await)
    }

    pub async fn budget(&self, key_id: &str, now_ms: u64) -> Result<BudgetView, Unavailable> {
        on_home!(self, home => Backing::budget(home, &self.core, key_id, now_ms).await)
    }

    /// `PUT /budget/{key_id}`; the view after it.
    pub async fn put_budget(
        &self,
        key_id: &str,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
        now_ms: u64,
    ) -> Result<BudgetView, SetBudgetError> {
        on_home!(self, home => Backing::set_budget(home, &self.core, key_id, ceiling_nano, period).await)?;
        Ok(self.budget(key_id, now_ms).await?)
    }

    pub async fn ledger_report(
        &self,
        key_id: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), StoreError> {
        on_home!(self, home => Backing::ledger(home, &self.core, key_id, from, to).await)
    }

    pub async fn decision_page(&self, query: &DecisionQuery) -> Result<DecisionPage, StoreError> {
        on_home!(self, home => Backing::decisions(home, &self.core, query).await)
    }

    /// The ledger page's latest decisions (newest first).
    pub async fn latest_decisions(
        &self,
        key_id: Option<&str>,
        verdict: Option<Verdict>,
        limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError> {
        on_home!(self, home => Backing::latest_decisions(home, &self.core, key_id, verdict, limit).await)
    }

    /// The ledger page's plot: decisions since `since_ms` per bucket, verdict and rule.
    pub async fn verdicts_over_time(
        &self,
        key_id: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError> {
        on_home!(self, home => Backing::verdicts_over_time(home, &self.core, key_id, since_ms, bucket_ms).await)
    }

    pub async fn bind_response(&self, binding: ResponseBinding) -> Result<(), Unavailable> {
        on_home!(self, home => Backing::bind_response(home, &self.core, binding).await)
    }

    pub async fn response_binding(&self, id: &str) -> Result<Option<ResponseBinding>, Unavailable> {
        on_home!(self, home => Backing::response_binding(home, &self.core, id).await)
    }

    pub async fn forget_key(&self, key_id: &str) -> Result<(), StoreError> {
        on_home!(self, home => Backing::forget(home, &self.core, key_id).await)
    }

    /// `PUT /prices`: every later decision reads them; the home keeps them.
    pub async fn set_prices(&self, prices: &BTreeMap<String, Prices>) -> Result<(), StoreError> {
        self.core.set_prices(prices);
        on_home!(self, home => Backing::keep_prices(home, prices).await)
    }

    /// The signed receipt of a recent decision (kept in memory for the last
    /// [`super::recent::RECENT_RECEIPTS`] decisions since start), if it belongs to `key_id`
    /// (`None`: any key).
    pub fn recent_receipt(
        &self,
        decision_id: &DecisionId,
        key_id: Option<&str>,
    ) -> Option<crate::receipt::Envelope> {
        self.core.recent_receipt(decision_id, key_id)
    }

    /// Commit what this process has queued, acknowledged over a channel.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.local().flush().await
    }

    /// Shut this process's store down: commit everything queued and stop its writer. Later
    /// submits are dropped; called once the server has stopped serving.
    pub fn close_store(&self) -> Result<(), StoreError> {
        self.local().close_store()
    }

    /// Who may call: one of this gate's keys, or in digest mode the one key this instance
    /// was given (which the central gate holds).
    pub fn authenticate(&self, presented: Option<&str>) -> Result<(&KeyConfig, Caller), AuthError> {
        match &self.home {
            Home::Remote(remote) => remote.authenticate(presented),
            Home::Local(_) | Home::Fleet(_) => {
                crate::auth::authenticate(&self.core.config, presented)
            }
        }
    }

    /// Whether decisions are asked of a central gate, which reads the request's digest (every
    /// turn hash), rather than made here (which reads only what the decision needs).
    pub fn sends_digest(&self) -> bool {
        matches!(self.home, Home::Remote(_))
    }

    /// How long a hold lives, as the gate that opened it states it (a central gate: once it
    /// has said).
    pub fn hold_ttl_ms(&self) -> Option<u64> {
        match &self.home {
            Home::Remote(remote) => remote.hold_ttl_ms(),
            Home::Local(_) | Home::Fleet(_) => Some(self.core.config.hold_ttl_ms),
        }
    }

    /// How long a forwarded decision's reservation lives unrenewed, in the home that holds it.
    pub(super) fn reservation_ttl_ms(&self) -> u64 {
        let own = self.core.config.reservation_ttl_ms;
        match &self.home {
            Home::Remote(remote) => remote.reservation_ttl_ms().unwrap_or(own),
            Home::Local(_) | Home::Fleet(_) => own,
        }
    }

    /// Whether other processes write this gate's state too.
    pub fn shared(&self) -> bool {
        on_home!(self, home => Backing::shared(home, ))
    }

    /// The periodic work without a request (a background tick).
    pub async fn tick_all(&self, now_ms: u64) {
        // Renewals first: an answer still being relayed is never charged at its worst case.
        self.renew_relays(now_ms).await;
        on_home!(self, home => Backing::tick(home, &self.core, now_ms).await)
    }
}
