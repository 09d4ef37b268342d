//! Digest mode's home of the gate's state (SPEC §1.2): a central gate decides, from the digest
//! alone (counts and keyed hashes, never content), and keeps the windows, budgets, holds and
//! the ledger; this instance keeps what must not leave the building — its stored answers, and
//! the response ids it bound — in its own [`Local`] store. So a request is read, decided,
//! enforced and settled on the same path as on a gate of its own: only the home differs.
//!
//! A digest client serves no API or admin listener (the routes live at the central gate):
//! what only those routes ask of a home (holds, budgets, the ledger's reads) is not here.

pub mod client;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::backing::Backing;
use super::gate_core::GateCore;
use super::local::Local;
use super::{AdmitError, HoldList, SetBudgetError, Settled, Unavailable};
use super::{
    BudgetView, GateOutcome, GateRequest, HoldAction, HoldDecided, HoldError, Holding, RecordError,
    RecordSource, UsageReport,
};
use crate::auth::{AuthError, Caller};
use crate::config::{BudgetPeriod, CachePolicy, KeyConfig, Prices};
use crate::receipt::DecisionId;
use crate::store::answers::{AnswerKey, StoredAnswer};
use crate::store::{
    DecisionListing, DecisionPage, DecisionQuery, LedgerDay, LedgerTotals, ResponseBinding,
    StoreError, VerdictCount,
};
use client::RemoteGate;
use tokensaver_core::gate::cache::is_routing_key;
use tokensaver_core::gate::Verdict;
use tokensaver_core::request::Digest;

pub struct Remote {
    gate: RemoteGate,
    /// The one key this instance was given: the only one its callers may present.
    key: KeyConfig,
    /// This instance's own store: answers and response bindings.
    mirror: Local,
}

impl Remote {
    /// `key`: the tokensaver key this instance was given (`tsk_<id>_<secret>`); `None` when it
    /// is not one.
    pub(crate) fn new(gate: RemoteGate, mirror: Local) -> Option<Remote> {
        let parsed = crate::auth::parse_key(&gate.key)?;
        let key = KeyConfig {
            id: Arc::from(parsed.id),
            secret_hash: crate::auth::secret_hash(parsed.secret),
            // The central gate holds this key's budget, profile and default; what it sends
            // with a request is the request's own (`x-tokensaver-human`, the digest's points).
            budget: None,
            human_default: false,
            owner_secret_hash: None,
            profile: None,
            cache: CachePolicy::Auto,
            cache_ttl: Default::default(),
            // The central gate applies the key's `without` in what it decides.
            without: Default::default(),
            credential_env: BTreeMap::new(),
        };
        Some(Remote { gate, key, mirror })
    }

    pub(crate) fn mirror(&self) -> &Local {
        &self.mirror
    }

    /// The caller must present the key this instance was given.
    pub(super) fn authenticate(
        &self,
        presented: Option<&str>,
    ) -> Result<(&KeyConfig, Caller), AuthError> {
        crate::auth::authenticate_as(&self.key, presented)
    }

    /// The central gate's hold TTL, once it has stated one.
    pub(super) fn hold_ttl_ms(&self) -> Option<u64> {
        self.gate.hold_ttl_ms()
    }

    /// The central gate's reservation TTL, once it has stated one.
    pub(super) fn reservation_ttl_ms(&self) -> Option<u64> {
        self.gate.reservation_ttl_ms()
    }
}

impl Backing for Remote {
    /// `POST /gate` with the request's digest. The central gate may hold the request too: a
    /// caller that leaves meanwhile is not waited for (the exchange is dropped, and the
    /// central gate sees its caller gone in turn).
    async fn admit(
        &self,
        _core: &GateCore,
        req: &GateRequest<'_>,
        holding: Holding<'_>,
    ) -> Result<GateOutcome, AdmitError> {
        let mut digest = Digest::new(req.shape.clone());
        digest.human = req.human;
        digest.hold_id = req.hold_id.map(str::to_string);
        if req.held {
            digest.held.push(req.shape.wire_form());
        }
        let answered = tokio::select! {
            r = self.gate.gate(&digest) => r,
            () = holding.gone => return Err(AdmitError::CallerGone),
        };
        let r = answered.map_err(|_| AdmitError::GateUnreachable)?;
        let mut decision = r.decision;
        // Only a key a gate makes (`ts_` and hex) goes into the body.
        decision.cache_routing_key = decision.cache_routing_key.filter(|k| is_routing_key(k));
        Ok(GateOutcome {
            decision,
            envelope: Arc::new(r.receipt),
            decision_id: r.decision_id,
        })
    }

    /// The central gate estimates (`POST /estimate` there).
    async fn estimate(
        &self,
        _core: &GateCore,
        _req: &GateRequest<'_>,
    ) -> Result<GateOutcome, Unavailable> {
        Err(Unavailable)
    }

    /// `POST /record` to the central gate, in the background: the client has its answer, and
    /// a drain waits for the record.
    async fn settle(
        &self,
        _core: &GateCore,
        report: &UsageReport,
        _source: RecordSource,
        _now_ms: u64,
    ) -> Result<Settled, RecordError> {
        let (gate, report) = (self.gate.clone(), report.clone());
        let in_flight = crate::lifecycle::enter();
        tokio::spawn(async move {
            let _in_flight = in_flight;
            if gate.record(&report).await.is_err() {
                tracing::warn!("could not record usage with the central gate");
            }
        });
        Ok(Settled::Sent)
    }

    /// `POST /renew` at the central gate.
    async fn renew(&self, _core: &GateCore, decision_id: &DecisionId, _now_ms: u64) {
        if self.gate.renew(decision_id).await.is_err() {
            tracing::warn!(
                "the central gate did not renew a reservation; the next renewal retries"
            );
        }
    }

    async fn renew_for_digest(
        &self,
        _core: &GateCore,
        _key_id: &str,
        _decision_id: &DecisionId,
        _now_ms: u64,
    ) -> Result<bool, Unavailable> {
        Err(Unavailable)
    }

    /// Answers never leave the building: this instance's own store.
    async fn answer(&self, core: &GateCore, key: &AnswerKey) -> Option<Arc<StoredAnswer>> {
        Backing::answer(&self.mirror, core, key).await
    }

    async fn keep_answer(&self, core: &GateCore, key: AnswerKey, answer: StoredAnswer) {
        Backing::keep_answer(&self.mirror, core, key, answer).await
    }

    async fn holds(
        &self,
        _core: &GateCore,
        _key_id: Option<&str>,
        _now_ms: u64,
    ) -> Result<HoldList, HoldError> {
        Err(HoldError::Unavailable)
    }

    async fn decide_hold(
        &self,
        _core: &GateCore,
        _hold_id: &str,
        _owner: Option<&str>,
        _action: HoldAction,
        _now_ms: u64,
    ) -> Result<HoldDecided, HoldError> {
        Err(HoldError::Unavailable)
    }

    async fn budget(
        &self,
        _core: &GateCore,
        _key_id: &str,
        _now_ms: u64,
    ) -> Result<BudgetView, Unavailable> {
        Err(Unavailable)
    }

    async fn set_budget(
        &self,
        _core: &GateCore,
        _key_id: &str,
        _ceiling_nano: Option<u64>,
        _period: BudgetPeriod,
    ) -> Result<(), SetBudgetError> {
        Err(SetBudgetError::Shared(Unavailable))
    }

    async fn ledger(
        &self,
        _core: &GateCore,
        _key_id: Option<&str>,
        _from: Option<&str>,
        _to: Option<&str>,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), StoreError> {
        Err(StoreError::Unavailable)
    }

    async fn decisions(
        &self,
        _core: &GateCore,
        _query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        Err(StoreError::Unavailable)
    }

    async fn latest_decisions(
        &self,
        _core: &GateCore,
        _key_id: Option<&str>,
        _verdict: Option<Verdict>,
        _limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError> {
        Err(StoreError::Unavailable)
    }

    async fn verdicts_over_time(
        &self,
        _core: &GateCore,
        _key_id: Option<&str>,
        _since_ms: u64,
        _bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError> {
        Err(StoreError::Unavailable)
    }

    /// The response ids this instance created are bound in its own store.
    async fn bind_response(
        &self,
        core: &GateCore,
        binding: ResponseBinding,
    ) -> Result<(), Unavailable> {
        Backing::bind_response(&self.mirror, core, binding).await
    }

    async fn response_binding(
        &self,
        core: &GateCore,
        id: &str,
    ) -> Result<Option<ResponseBinding>, Unavailable> {
        Backing::response_binding(&self.mirror, core, id).await
    }

    /// This instance's stored answers (the central gate forgets its records on its own
    /// `POST /forget`).
    async fn forget(&self, core: &GateCore, key_id: &str) -> Result<(), StoreError> {
        Backing::forget(&self.mirror, core, key_id).await
    }

    async fn keep_prices(&self, _prices: &BTreeMap<String, Prices>) -> Result<(), StoreError> {
        Err(StoreError::Unavailable)
    }

    /// Its answers and bindings are this process's alone.
    fn shared(&self) -> bool {
        false
    }

    async fn tick(&self, core: &GateCore, now_ms: u64) {
        Backing::tick(&self.mirror, core, now_ms).await
    }
}
