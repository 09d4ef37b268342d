//! The gatekeeper: the gate's live state around the pure decision — windows, budgets and
//! reservations, holds, recorded usage, stored answers — and the ledger events it emits.
//! Both the proxy (request mode) and `POST /gate` (digest mode) decide through [`Gatekeeper::gate`],
//! so the two modes cannot drift apart.

mod backing;
mod booking;
pub mod fleet;
mod local;
pub mod recent;
mod relays;
mod reservations;
#[cfg(test)]
mod session_tests;
#[cfg(test)]
mod settle_tests;
pub mod settlement;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;

use serde::Serialize;

use crate::config::{BudgetPeriod, CachePolicy, Config, KeyConfig, Prices};
use crate::gatekeeper::fleet::spool::Spool;
use crate::metrics::Metrics;
use crate::receipt::{DecisionId, Envelope, ReceiptSigner};
use crate::store::answers::{AnswerKey, AnswerStore, StoredAnswer};
use crate::store::postgres::Fleet;
use crate::store::{
    period_start, Event, HoldOpening, HoldRow, HoldState, LeaseRow, Store, StoreError, UsageRow,
};
pub use backing::{AdmitError, HoldList, SetBudgetError, Unavailable};
use booking::Booking;
pub use relays::{Relaying, RemoteRenewal};
use reservations::{Reservation, Reservations};
use state::{KeyBudget, State};
use tokensaver_core::gate::cache::LifetimePolicy;
use tokensaver_core::gate::cache::{CacheEdits, PointMemory, SessionCache};
use tokensaver_core::gate::{
    decide_paced, decide_with, Approvals, BudgetState, CacheTerms, Decision, GateInput, KeyState,
    Outcome, Policy, Usage, Verdict, WindowCounts, Windows,
};
use tokensaver_core::request::CachePoint;
use tokensaver_core::request::{Hash, RequestShape, WireForm};

pub(crate) const DAY_MS: u64 = 86_400_000;
/// The longest window a route prefix's rate is counted in (the provider's minute; a config
/// may shorten it): what the gate keeps of a prefix's calls.
const ROUTE_WINDOW_MS: u64 = tokensaver_core::gate::cache::ROUTE_WINDOW_MS;
/// Sessions, route prefixes and times kept per key for cache decisions: bounded, and far more
/// than one key runs at once.
const SESSIONS_KEPT: usize = 4_096;
const ROUTE_PREFIXES_KEPT: usize = 4_096;
const ROUTE_TIMES_KEPT: usize = 1_024;

/// Whether a gate call moves the windows and books the decision (`/gate`, proxy) or only
/// evaluates it (`/estimate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Commit,
    Estimate,
}

pub struct GateRequest<'a> {
    pub key: &'a KeyConfig,
    pub shape: &'a RequestShape,
    pub human: Option<bool>,
    /// An answer is held for this request's wire form (proxy: the answer store; digest: `held`).
    pub held: bool,
    pub hold_id: Option<&'a str>,
    pub now_ms: u64,
    /// Who will report this request's usage: the proxy (request mode) or the digest client
    /// (`POST /gate`). Only that party can settle its reservation.
    pub recorded_by: RecordSource,
}

impl<'a> GateRequest<'a> {
    /// The request's prompt prefixes where the gate may place cache breakpoints: all of them
    /// when the key's policy is `cache = "auto"`, none otherwise (SPEC §2.11b).
    fn placeable_cache_points(&self) -> &'a [CachePoint] {
        match self.key.cache {
            CachePolicy::Auto => &self.shape.cache_points,
            CachePolicy::Off => &[],
        }
    }

    /// The pure gate's input for this request (one place for the single node and the fleet).
    fn input(&self, held_usage: Option<Usage>) -> GateInput<'a> {
        GateInput {
            key_id: &self.key.id,
            shape: self.shape,
            human: self.human.unwrap_or(self.key.human_default),
            held: self.held,
            held_usage,
            approved_hold: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GateOutcome {
    pub decision: Decision,
    /// Shared with the ledger page's recent receipts: kept there without a copy.
    pub envelope: Arc<Envelope>,
    pub decision_id: DecisionId,
}

/// Who reports usage: which decides how durably it is kept, and who may settle a decision.
pub use crate::store::RecordSource;

pub use crate::gatekeeper::settlement::{
    cache_saving_nano, settlement, RecordBound, UsageReport, MAX_RECORDED_TOKENS,
    RECORD_INPUT_FRAMING_TOKENS,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("no forwarded decision with this id is awaiting usage for this key")]
    UnknownDecision,
    #[error("usage for this decision was already recorded")]
    AlreadyRecorded,
    #[error("the ledger could not commit the record")]
    Storage,
    #[error("the served model differs from the one the gate decided")]
    ModelMismatch,
    #[error("the usage exceeds what the decision could have been billed")]
    ExceedsDecision,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HoldError {
    #[error("no such hold")]
    Unknown,
    #[error("the hold has expired")]
    Expired,
    #[error("the hold is not pending")]
    NotPending,
    #[error("attend_minutes must be between 1 and 1440")]
    AttendMinutes,
    #[error("the fleet's shared store is unreachable")]
    Unavailable,
    #[error("the held request's model has no price: its spend has no bound to approve")]
    Unpriced,
}

/// The longest attending lease an approval may grant: one day.
pub const MAX_ATTEND_MINUTES: u64 = 1440;

/// What a person decided about a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldAction {
    /// Release the held request once (with its header, or the key's next identical request
    /// within the hold's TTL), and optionally attend the key for this many minutes.
    Approve { attend_minutes: Option<u64> },
    /// Refuse it: the hold closes, its worst case counts as avoided, the next identical
    /// request is decided afresh.
    Deny,
}

/// A hold as `GET /holds` lists it: never content; the fingerprint is truncated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HoldView {
    pub hold_id: String,
    pub key_id: String,
    pub state: HoldState,
    /// The verdict's reason (`score_challenge`, `exceeds_remaining_budget`); `None` for a
    /// hold opened by a build that did not keep it.
    pub reason: Option<&'static str>,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub worst_case_tokens: u64,
    /// The first 16 hex digits of the request's keyed fingerprint.
    pub fingerprint_prefix: String,
}

/// An attending lease as `GET /holds` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseView {
    pub key_id: String,
    pub hold_id: String,
    pub granted_ms: u64,
    pub until_ms: u64,
}

/// The outcome of an approval or a denial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HoldDecided {
    pub hold_id: String,
    pub key_id: String,
    pub state: HoldState,
    pub expires_ms: u64,
    /// Set when the approval granted an attending lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attending_until_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BudgetView {
    pub key_id: String,
    pub ceiling_nano: Option<u64>,
    pub period: &'static str,
    pub spend_nano: u64,
    pub reserved_nano: u64,
    pub left_nano: Option<i128>,
}

/// The home a gatekeeper was built with ([`backing`]).
enum Home {
    Local(local::Local),
    Fleet(Box<fleet::Shared>),
}

pub struct Gatekeeper {
    pub config: Arc<Config>,
    /// Read by every decision, replaced whole by `PUT /prices`: readers never wait, and no
    /// lock order ties it to the state lock.
    policy: ArcSwap<Policy>,
    pub signer: ReceiptSigner,
    state: Mutex<State>,
    answers: Mutex<AnswerStore>,
    store: Arc<dyn Store>,
    pub metrics: Metrics,
    /// The latest committed decisions' receipts, for the ledger page.
    recent: Mutex<recent::RecentReceipts>,
    /// The answers being relayed now: the tick keeps their reservations live ([`relays`]).
    relays: relays::Relays,
    /// The repeated steps held now ([`Gatekeeper::gate_paced`]).
    paced: Mutex<PacedLoad>,
    /// Where the windows, budgets, holds, answers and the ledger live: this process, or a
    /// fleet's PostgreSQL ([`backing`]).
    home: Home,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these maps half-updated in a way that matters
    // more than stopping the gate would; keep serving.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Gatekeeper {
    /// Build the gatekeeper from config, a signer and a store, rebuilding memory from the store.
    pub fn new(
        config: Config,
        signer: ReceiptSigner,
        store: Arc<dyn Store>,
        now_ms: u64,
    ) -> Result<Self, StoreError> {
        let snapshot = store.load(now_ms)?;
        let mut policy = config.policy();
        for (model, prices) in &snapshot.prices {
            policy.prices.insert(model.clone(), *prices);
        }
        let mut state = State {
            windows: Windows::configured(&policy.gate),
            ..State::default()
        };
        for key in &config.keys {
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
                        expires_ms: row.decided_at_ms + config.reservation_ttl_ms,
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
                .and_then(|o| reopen(&signer, o));
            state.open_hold(hold.clone(), opened);
        }
        for lease in &snapshot.leases {
            state.add_lease(lease.clone());
        }
        for (key_id, fp, wire, usage, at_ms) in &snapshot.recorded {
            state.record_usage(key_id, *fp, *wire, *usage, *at_ms);
        }
        Ok(Self {
            answers: Mutex::new(AnswerStore::new(config.answer_store_bytes)),
            config: Arc::new(config),
            policy: ArcSwap::from_pointee(policy),
            signer,
            state: Mutex::new(state),
            store,
            metrics: Metrics::new(),
            recent: Mutex::new(recent::RecentReceipts::default()),
            relays: relays::Relays::default(),
            paced: Mutex::new(PacedLoad::default()),
            home: Home::Local(local::Local),
        })
    }

    /// Make this gatekeeper an instance of a fleet: admissions, settles and expiry go to the
    /// fleet's database; usage it cannot write is spooled in the data dir.
    pub fn with_fleet(mut self, fleet: Fleet) -> Self {
        let spool = Spool::new(&self.config.data_dir);
        self.home = Home::Fleet(Box::new(fleet::Shared::new(fleet, spool)));
        self
    }

    /// The durable store (the proxy's response registry writes through it).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The price of `model` under the policy in force (`None`: it has none).
    fn price_of(&self, model: &str) -> Option<crate::config::Prices> {
        self.policy.load().prices.get(model).copied()
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Decide a request, and in `Commit` mode count it, reserve, open holds, and book it.
    /// The caller cannot hold the request: a repeated step past the loop thresholds is
    /// BLOCKed as a loop ([`Gatekeeper::gate_paced`] paces it instead).
    pub fn gate(&self, req: &GateRequest, mode: Mode) -> GateOutcome {
        match self.gate_step(req, mode, None) {
            Ok(outcome) => outcome,
            Err(_) => unreachable!("without `paced_ms` the pure gate never paces"),
        }
    }

    /// `POST /estimate` on this process's state: the decision the proxy would reach for the
    /// request now — a repeated step its pace window does not admit yet is decided as of the
    /// time the window admits it, with the wait in `paced_ms` (SPEC §2.3), as the proxy would
    /// hold and then decide it. Nothing is counted or booked.
    pub fn estimate_paced(&self, req: &GateRequest) -> GateOutcome {
        let mut at = GateRequest { ..*req };
        // Nothing moves between the two readings, so the second is a decision (a third is a
        // guard against a window that never admits it: then the unpaced decision).
        for _ in 0..2 {
            let paced_ms = at.now_ms.saturating_sub(req.now_ms);
            match self.gate_step(&at, Mode::Estimate, Some(paced_ms)) {
                Ok(outcome) => return outcome,
                Err(until_ms) => at.now_ms = until_ms.max(at.now_ms + 1),
            }
        }
        self.gate(req, Mode::Estimate)
    }

    /// Decide and book a request whose caller can hold it (the proxy, `POST /gate`): a
    /// repeated step its pace window does not admit yet waits here — an async sleep, no
    /// worker thread — and is decided afresh when the window admits it (SPEC §2.3; at most
    /// `[gate.steps]`'s cap in all). Nothing counts it while it waits, and a caller that leaves
    /// while it waits is never decided (`None`): nothing is bought, reserved or charged for it.
    /// Past `[limits] max_paced_per_key` held steps of its key, or `max_paced_bytes` held in
    /// all, a step is refused as a loop, as a gate that cannot hold it refuses it.
    pub async fn gate_paced(
        &self,
        req: &GateRequest<'_>,
        holding: Holding<'_>,
    ) -> Result<GateOutcome, AdmitError> {
        self.hold_until_decided(req, holding, |hold| {
            let at = GateRequest {
                now_ms: hold.now_ms,
                ..*req
            };
            let attempt = match self.gate_step(&at, Mode::Commit, hold.paced_ms) {
                Ok(outcome) => Attempt::Decided(Box::new(outcome)),
                Err(until_ms) => Attempt::Pace {
                    until_ms,
                    now_ms: hold.now_ms,
                },
            };
            std::future::ready(Ok(attempt))
        })
        .await
    }

    /// Decide a recorded request again as the proxy decided it, on the recording's clock: a
    /// repeated step its window does not admit yet is held until then — the clock jumps, nothing
    /// sleeps — and decided afresh. `held`: this key's store holds an answer for it (a reusable
    /// answer of the same request settled earlier in the replay). For the economics summary's
    /// replay of recorded evidence (`economics::replay`).
    pub fn decide_recorded(&self, req: &GateRequest<'_>) -> GateOutcome {
        let held = lock(&self.state).recorded_usage(req).is_some();
        let mut at = GateRequest { held, ..*req };
        loop {
            let paced_ms = at.now_ms.saturating_sub(req.now_ms);
            match self.gate_step(&at, Mode::Commit, Some(paced_ms)) {
                Ok(outcome) => return outcome,
                Err(until_ms) => at.now_ms = until_ms.max(at.now_ms + 1),
            }
        }
    }

    /// Settle a replayed decision with the usage the recording saw bought (a complete answer):
    /// what the next decisions read of it — the session's cache, a reusable answer — is then
    /// as it was when the call was recorded.
    pub fn settle_recorded(&self, report: &UsageReport, now_ms: u64) {
        let _ = self.settle_usage(report, now_ms, RecordSource::Proxy);
    }

    /// Decide a request that may be held, in either home: `attempt` decides it as of a time,
    /// or says until when to hold it (nothing counted or booked). Between attempts the
    /// request waits here — an async sleep, no worker thread — counted in the caps, while its
    /// caller's connection is watched: a caller that leaves is never decided. When the caps
    /// are reached, the attempt is told the caller cannot hold it (a repeated step is then
    /// refused as a loop).
    pub(super) async fn hold_until_decided<F, Fut>(
        &self,
        req: &GateRequest<'_>,
        mut holding: Holding<'_>,
        mut attempt: F,
    ) -> Result<GateOutcome, AdmitError>
    where
        F: FnMut(HeldFor) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt, Unavailable>>,
    {
        let started = std::time::Instant::now();
        let mut now_ms = req.now_ms;
        let mut paced_ms = Some(0);
        let mut held: Option<PacedGuard<'_>> = None;
        loop {
            match attempt(HeldFor { now_ms, paced_ms }).await? {
                Attempt::Decided(outcome) => {
                    let outcome = *outcome;
                    if let Some(paced) = paced_ms.filter(|&p| p > 0) {
                        self.metrics.paced.inc();
                        self.metrics.paced_seconds.inc_by(paced as f64 / 1_000.0);
                    }
                    return Ok(outcome);
                }
                Attempt::Pace {
                    until_ms,
                    now_ms: read_at,
                } => {
                    if held.is_none() {
                        match PacedGuard::take(self, &req.key.id, holding.bytes) {
                            Some(guard) => held = Some(guard),
                            None => {
                                self.metrics.paced_refused.inc();
                                paced_ms = None;
                                continue;
                            }
                        }
                    }
                    let wait = until_ms.saturating_sub(read_at).max(1);
                    tokio::select! {
                        () = tokio::time::sleep(std::time::Duration::from_millis(wait)) => {}
                        () = &mut holding.gone => {
                            self.metrics.paced_abandoned.inc();
                            return Err(AdmitError::CallerGone);
                        }
                    }
                    // The wall clock, as the proxy reads it; never behind the time waited for.
                    now_ms = crate::now_ms().max(now_ms.saturating_add(wait));
                    let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    paced_ms = Some(elapsed.max(now_ms.saturating_sub(req.now_ms)));
                }
            }
        }
    }

    /// One decision; `paced_ms`: the caller can hold the request and has held it this long
    /// (`Err(until)`: hold it until then, nothing was counted or booked). In order: the state
    /// under its lock, a pending re-send's original answer, the decision clock, what the key's
    /// state says of the request, the pure decision, and in `Commit` mode its booking; the
    /// signature last, outside the lock.
    fn gate_step(
        &self,
        req: &GateRequest,
        mode: Mode,
        paced_ms: Option<u64>,
    ) -> Result<GateOutcome, u64> {
        let started = std::time::Instant::now();
        let policy = self.policy.load();
        let mut st = lock(&self.state);
        if let Some(opened) = st.pending_resend(req) {
            drop(st);
            if mode == Mode::Commit {
                self.metrics.hold_resends.inc();
            }
            return Ok((*opened).clone());
        }
        let (now_ms, seq) = match mode {
            Mode::Commit => st.decision_clock(&req.key.id, req.now_ms),
            Mode::Estimate => (req.now_ms, 0),
        };
        let approval = st.approval_for(req.hold_id, &req.key.id, &req.shape.fingerprint, now_ms);
        let lease = st
            .lease_for(&req.key.id, now_ms)
            .map(|l| l.hold_id.as_str());
        let placeable = req.placeable_cache_points();
        let cache_memory = (!placeable.is_empty()).then(|| st.cache_recall(req.key, placeable));
        let session_cache = st.session_cache(&req.key.id, &req.shape.session);
        let (prefix_rate, prefix_shared) = st.route_rate(
            &req.key.id,
            req.shape.route_prefix.as_ref(),
            &req.shape.session,
            now_ms,
            policy.gate.windows.route_secs.saturating_mul(1_000),
        );
        let seen = StateSeen {
            counts: st.windows.observe_session(
                &req.key.id,
                &req.shape.fingerprint,
                &req.shape.step_fingerprint,
                req.shape.step_action.as_ref(),
                Some(&req.shape.session),
                &req.shape.model,
                now_ms,
            ),
            budget: st.budget_state(&req.key.id, now_ms),
            held_usage: st.recorded_usage(req),
            approved_hold: approval.as_deref(),
            lease,
            cache_memory: cache_memory.as_deref(),
            session_cache,
            prefix_rate,
            prefix_shared,
        };
        let mut decision = decide_seen(&policy, req, &seen, paced_ms, now_ms)?;
        decision.seq = seq;
        drop(policy);
        let (body, decision_id) = decision.receipt();
        let signed = match mode {
            Mode::Commit => self.book(st, req, &decision, &body, decision_id, now_ms),
            Mode::Estimate => {
                drop(st);
                None
            }
        };
        // Signing is the slowest step of a decision and needs no shared state: it runs after
        // the state lock is released, so concurrent requests do not queue behind it.
        let envelope = signed.unwrap_or_else(|| Arc::new(self.signer.sign(&body)));
        if mode == Mode::Commit {
            let key_id = Arc::clone(&req.key.id);
            lock(&self.recent).push(decision_id, key_id, Arc::clone(&envelope));
        }
        self.metrics
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(GateOutcome {
            decision,
            envelope,
            decision_id,
        })
    }

    /// Apply a decision's [`Booking`] to this process's memory — the windows, the cache
    /// memory, the hold it uses up or opens, its reservation — then release the state lock and
    /// queue the booking for the store. A CHALLENGE's receipt is signed under the lock (they
    /// are rare), and returned: a re-send racing this request must find the hold together with
    /// the answer it repeats.
    fn book(
        &self,
        mut st: MutexGuard<'_, State>,
        req: &GateRequest,
        decision: &Decision,
        body: &[u8],
        decision_id: DecisionId,
        now_ms: u64,
    ) -> Option<Arc<Envelope>> {
        let shape = req.shape;
        let key_id = &*req.key.id;
        let booking = Booking::of(decision, body, decision_id, req);
        let placeable = req.placeable_cache_points();
        // Only a forwarded call sent its prefixes to the provider (SPEC §2.11b: a refused or
        // served request is not "seen"); a prefix that was only ever refused earns no write.
        if booking.sent_prefixes {
            let after_pause = decision.cache_edits().has(CacheEdits::AFTER_PAUSE);
            st.note_forwarded(key_id, shape, now_ms, after_pause);
        }
        if !placeable.is_empty() && booking.sent_prefixes {
            st.cache_memory
                .entry(key_id.to_string())
                .or_default()
                .remember(placeable, &booking.cache_breakpoints, now_ms);
        }
        // A SERVE buys nothing: it counts by its fingerprint, not as a repeated step
        // (`Windows::record_serve`), so a rerun of a session is no loop.
        if decision.verdict == Verdict::Serve {
            st.windows.record_serve(
                key_id,
                &shape.fingerprint,
                &shape.step_fingerprint,
                &shape.model,
                now_ms,
            );
        } else {
            // The step's run is judged from when the request arrived, before any hold.
            let arrival = now_ms.saturating_sub(decision.paced_ms.unwrap_or(0));
            st.windows.record_session(
                key_id,
                &shape.fingerprint,
                &shape.step_fingerprint,
                shape.step_action.as_ref(),
                Some(&shape.session),
                &shape.model,
                now_ms,
                arrival,
            );
        }
        let mut events = Vec::new();
        // An approval is used up only by the request it released; one that a runaway rule or
        // `budget_exhausted` refused (or a SERVE answered) stays for the next identical
        // request within the hold's TTL.
        if let Some(mut h) = booking
            .used_hold
            .as_deref()
            .and_then(|id| st.close_hold(id))
        {
            h.row.state = HoldState::Used;
            events.push(Event::Hold(h.row));
        }
        let mut signed = None;
        if let Some(new_hold) = booking.new_hold {
            let hold = HoldRow {
                hold_id: new_hold.hold_id.clone(),
                key_id: key_id.to_string(),
                fingerprint: Some(new_hold.fingerprint),
                created_ms: now_ms,
                expires_ms: now_ms + self.config.hold_ttl_ms,
                state: HoldState::Pending,
                worst_case_tokens: new_hold.worst_case_tokens,
            };
            let outcome = GateOutcome {
                decision: decision.clone(),
                envelope: Arc::new(self.signer.sign(body)),
                decision_id,
            };
            signed = Some(outcome.envelope.clone());
            st.open_hold(hold.clone(), Some(Arc::new(outcome)));
            let opening = HoldOpening {
                hold_id: new_hold.hold_id,
                decision: new_hold.opening_decision,
                receipt: new_hold.opening_receipt,
            };
            events.push(Event::HoldOpened { hold, opening });
        }
        if let Some(r) = booking.reservation {
            st.reservations.open(
                decision_id,
                Reservation {
                    key_id: Arc::clone(&req.key.id),
                    fingerprint: r.fingerprint,
                    served_model: r.served_model,
                    wire: r.wire,
                    nano: r.nano,
                    output_ceiling: r.output_ceiling,
                    input_tokens: r.input_tokens,
                    expires_ms: now_ms + self.config.reservation_ttl_ms,
                    reusable: r.reusable,
                    recorded_by: r.recorded_by,
                    cache_edits: r.cache_edits,
                    session: r.session,
                },
            );
        }
        drop(st);
        self.store.submit(Event::Decision(booking.row));
        for e in events {
            self.store.submit(e);
        }
        self.count(decision);
        signed
    }

    fn count(&self, d: &Decision) {
        self.metrics
            .requests
            .with_label_values(&[d.verdict.as_str(), d.reason()])
            .inc();
        if let Some(u) = d.tokens_not_bought {
            self.metrics
                .tokens
                .with_label_values(&["tokens_not_bought"])
                .inc_by(u.total());
        }
        if let Some(t) = d.worst_case_tokens_avoided {
            self.metrics
                .tokens
                .with_label_values(&["worst_case_tokens_avoided"])
                .inc_by(t);
        }
        let findings: u64 = d.findings.iter().filter_map(|f| f.tokens).sum();
        if findings > 0 {
            self.metrics
                .tokens
                .with_label_values(&["findings_tokens"])
                .inc_by(findings);
        }
    }

    /// Charge reservations past their TTL at their worst case; expire holds (their worst case
    /// counts as avoided). Off the request path: the background tick runs it every second
    /// (`server.rs`), and the holds routes before they read. A decision does not wait for it:
    /// an expired hold or lease is read as absent by its time, and a reservation past its TTL
    /// and not yet charged (at most the tick's second, as when the request path swept once a
    /// second) leaves the budget the same "left": reserved, where the charge makes it spent.
    fn expire(&self, st: &mut State, now_ms: u64) {
        for id in st.reservations.expired(now_ms) {
            if let Some(r) = st.reservations.close(&id) {
                st.add_spend(&r.key_id, now_ms, r.nano);
                self.store.submit(Event::ReservationExpired {
                    decision_id: id,
                    key_id: r.key_id.to_string(),
                    at_ms: now_ms,
                    charged_nano: r.nano,
                });
            }
        }
        let expired: Vec<String> = st
            .holds
            .values()
            .filter(|h| h.row.expires_ms <= now_ms)
            .map(|h| h.row.hold_id.clone())
            .collect();
        for id in expired {
            if let Some(mut h) = st.close_hold(&id) {
                h.row.state = HoldState::Expired;
                self.store.submit(Event::Hold(h.row));
            }
        }
        // Ended leases leave memory; their rows stay (an approval's record).
        st.leases.retain(|_, l| now_ms < l.until_ms);
    }

    /// Keep a reservation live for another TTL from `now_ms`: its answer is still being
    /// relayed (SPEC §4), so the usage that ends it will settle it exactly. Memory only: a
    /// restarted gate has no relay for it (the relay ended with the old process), so the
    /// reservation it rebuilds from the decision row expires TTL after the decision.
    pub fn renew_reservation(&self, decision_id: &DecisionId, now_ms: u64) {
        let ttl_ms = self.config.reservation_ttl_ms;
        lock(&self.state)
            .reservations
            .renew(decision_id, now_ms.saturating_add(ttl_ms));
    }

    /// [`Self::renew_reservation`] for a digest client: only its own key's open reservation
    /// of a decision made through `POST /gate`.
    pub fn renew_digest_reservation(
        &self,
        key_id: &str,
        decision_id: &DecisionId,
        now_ms: u64,
    ) -> bool {
        let ttl_ms = self.config.reservation_ttl_ms;
        let mut st = lock(&self.state);
        let owned = st
            .reservations
            .get(decision_id)
            .is_some_and(|r| &*r.key_id == key_id && r.recorded_by == RecordSource::Digest);
        if owned {
            st.reservations
                .renew(decision_id, now_ms.saturating_add(ttl_ms));
        }
        owned
    }

    /// Settle a forwarded decision with what the provider reported and how its answer ended
    /// ([`settlement`]): nothing is invented, and an answer that may have been billed without
    /// its usage reported is charged its worst case. The commit a digest client's record
    /// waits for is acknowledged over a channel, and an unknown id is read on the blocking
    /// pool, so no worker blocks on the disk.
    pub async fn record_usage(
        &self,
        report: &UsageReport,
        now_ms: u64,
        source: RecordSource,
    ) -> Result<UsageRow, RecordError> {
        let (row, commit) = match self.settle_usage(report, now_ms, source) {
            Ok(settled) => settled,
            Err(Unsettled::Refused(e)) => return Err(e),
            // A caller's id that names no open reservation is read from SQLite on the
            // blocking pool: a key sending unknown ids never holds a worker on the disk.
            Err(Unsettled::NotReserved) => {
                let (store, id) = (Arc::clone(&self.store), report.decision_id);
                let recorded = tokio::task::spawn_blocking(move || store.usage_recorded(&id))
                    .await
                    .unwrap_or(Err(StoreError::Unavailable));
                return Err(not_reserved(recorded));
            }
        };
        if let Some(event) = commit {
            self.store
                .submit_acked(event)
                .await
                .map_err(|_| RecordError::Storage)?;
        }
        Ok(row)
    }

    /// The memory half of a record: settle the reservation and the spend, queue what needs no
    /// acknowledgement, and return the event the caller must see committed (a digest
    /// client's usage row), if any.
    fn settle_usage(
        &self,
        report: &UsageReport,
        now_ms: u64,
        source: RecordSource,
    ) -> Result<(UsageRow, Option<Event>), Unsettled> {
        let (key_id, decision_id, served_model) = (
            report.key_id.as_str(),
            &report.decision_id,
            report.served_model.as_str(),
        );
        let wire = report.wire;
        let prices = self.price_of(served_model);
        let mut st = lock(&self.state);
        // A decision is settled only by the party its reservation names: a key can never
        // record usage for a call the proxy forwarded for it (SPEC §3, `POST /record`).
        let reservation = match st.reservations.get(decision_id) {
            Some(r) if &*r.key_id == key_id && r.wire == wire && r.recorded_by == source => {
                if source == RecordSource::Digest
                    && !RecordBound::of(r.input_tokens, r.output_ceiling).admits_report(report)
                {
                    return Err(Unsettled::Refused(RecordError::ExceedsDecision));
                }
                st.reservations.close(decision_id)
            }
            _ => None,
        };
        let Some(reservation) = reservation else {
            return Err(Unsettled::NotReserved);
        };
        if reservation.served_model != served_model {
            // A record must name the model the gate sent the call to; put the reservation back.
            st.reservations.open(*decision_id, reservation);
            return Err(Unsettled::Refused(RecordError::ModelMismatch));
        }
        let mut row = report.usage_row(
            now_ms,
            prices.as_ref(),
            reservation.nano,
            reservation.output_ceiling,
        );
        settlement::cache_figures(&row, prices.as_ref(), reservation.cache_edits).apply(
            &mut row,
            prices.as_ref(),
            reservation.cache_edits,
        );
        if row.complete {
            st.note_settled(key_id, &reservation.session, &row.usage);
        }
        st.add_spend(key_id, now_ms, row.spend_nano);
        let mut recorded_event = None;
        // Only a complete answer's usage is what a SERVE of it would not buy.
        if let Some(u) = report.reusable_usage(reservation.reusable) {
            st.record_usage(key_id, reservation.fingerprint, wire, u, now_ms);
            recorded_event = Some(Event::Recorded {
                key_id: key_id.to_string(),
                fingerprint: reservation.fingerprint,
                wire,
                usage: u,
                at_ms: now_ms,
            });
        }
        drop(st);
        if let (Some(e), RecordSource::Digest) = (recorded_event, source) {
            self.store.submit(e);
        }
        if source == RecordSource::Digest {
            return Ok((row.clone(), Some(Event::Usage(row))));
        }
        self.store.submit(Event::Usage(row.clone()));
        Ok((row, None))
    }

    /// Whether the hold was opened for a call whose worst case had no bound (a model without a
    /// price) and the model still has none. Such a hold cannot be approved: the decision would
    /// hold it again (an approval never passes an unbounded worst case), and a person cannot
    /// approve a spend nobody can bound.
    fn hold_is_unpriced(&self, hold_id: &str) -> bool {
        let model = lock(&self.state)
            .holds
            .get(hold_id)
            .and_then(|h| h.opened.as_ref())
            .filter(|o| o.decision.worst_case.cost_nano.is_none())
            .map(|o| o.decision.model_requested.clone());
        model.is_some_and(|m| self.price_of(&m).is_none())
    }

    /// The answer held for this key, fingerprint and wire form, if any.
    pub fn answer(&self, key: &AnswerKey) -> Option<Arc<StoredAnswer>> {
        lock(&self.answers).get(key)
    }

    pub fn store_answer(&self, key: AnswerKey, answer: StoredAnswer) {
        let mut answers = lock(&self.answers);
        answers.put(key, answer);
        self.metrics.answer_store_bytes.set(answers.bytes() as i64);
    }

    /// A person approves a CHALLENGE hold. `key_id`: the approving owner's key (None = admin).
    pub fn approve_hold(
        &self,
        hold_id: &str,
        key_id: Option<&str>,
        now_ms: u64,
    ) -> Result<(), HoldError> {
        self.decide_hold(
            hold_id,
            key_id,
            HoldAction::Approve {
                attend_minutes: None,
            },
            now_ms,
        )
        .map(drop)
    }

    /// A person approves or denies a pending hold. `key_id`: the deciding owner's key (None =
    /// the admin); another key's hold is unknown to an owner. An approval's lease runs from
    /// now for `attend_minutes` (1..=1440); the hold itself keeps its own TTL.
    pub fn decide_hold(
        &self,
        hold_id: &str,
        key_id: Option<&str>,
        action: HoldAction,
        now_ms: u64,
    ) -> Result<HoldDecided, HoldError> {
        if let HoldAction::Approve {
            attend_minutes: Some(m),
        } = action
        {
            if !(1..=MAX_ATTEND_MINUTES).contains(&m) {
                return Err(HoldError::AttendMinutes);
            }
        }
        if matches!(action, HoldAction::Approve { .. }) && self.hold_is_unpriced(hold_id) {
            return Err(HoldError::Unpriced);
        }
        let mut st = lock(&self.state);
        self.expire(&mut st, now_ms);
        let hold = st.holds.get_mut(hold_id).ok_or(HoldError::Unknown)?;
        if key_id.is_some_and(|k| k != hold.row.key_id) {
            return Err(HoldError::Unknown);
        }
        if hold.row.expires_ms <= now_ms {
            return Err(HoldError::Expired);
        }
        if hold.row.state != HoldState::Pending {
            return Err(HoldError::NotPending);
        }
        let mut events = Vec::new();
        let mut attending_until_ms = None;
        let row = match action {
            HoldAction::Approve { attend_minutes } => {
                hold.row.state = HoldState::Approved;
                let row = hold.row.clone();
                if let Some(m) = attend_minutes {
                    let lease = LeaseRow {
                        hold_id: row.hold_id.clone(),
                        key_id: row.key_id.clone(),
                        granted_ms: now_ms,
                        until_ms: now_ms.saturating_add(m.saturating_mul(60_000)),
                    };
                    attending_until_ms = Some(lease.until_ms);
                    st.add_lease(lease.clone());
                    events.push(Event::Lease(lease));
                }
                row
            }
            HoldAction::Deny => {
                let mut closed = st.close_hold(hold_id).ok_or(HoldError::Unknown)?;
                closed.row.state = HoldState::Denied;
                closed.row
            }
        };
        drop(st);
        let decided = HoldDecided {
            hold_id: row.hold_id.clone(),
            key_id: row.key_id.clone(),
            state: row.state,
            expires_ms: row.expires_ms,
            attending_until_ms,
        };
        // The hold's new state first: a lease row never outlives an approval lost in between.
        events.insert(0, Event::Hold(row));
        for e in events {
            self.store.submit(e);
        }
        Ok(decided)
    }

    /// Pending and approved (not yet used) holds, oldest first, and the attending leases that
    /// run now: every key's (`None`, the admin) or one key's.
    pub fn holds(&self, key_id: Option<&str>, now_ms: u64) -> (Vec<HoldView>, Vec<LeaseView>) {
        let mut st = lock(&self.state);
        self.expire(&mut st, now_ms);
        let mine = |k: &str| key_id.is_none_or(|id| id == k);
        let mut holds: Vec<HoldView> = st
            .holds
            .values()
            .filter(|h| mine(&h.row.key_id) && now_ms < h.row.expires_ms)
            .map(|h| HoldView {
                hold_id: h.row.hold_id.clone(),
                key_id: h.row.key_id.clone(),
                state: h.row.state,
                reason: h.opened.as_ref().map(|o| o.decision.reason()),
                created_ms: h.row.created_ms,
                expires_ms: h.row.expires_ms,
                worst_case_tokens: h.row.worst_case_tokens,
                fingerprint_prefix: fingerprint_prefix(h.row.fingerprint.as_ref()),
            })
            .collect();
        holds.sort_by(|a, b| (a.created_ms, &a.hold_id).cmp(&(b.created_ms, &b.hold_id)));
        let mut leases: Vec<LeaseView> = st
            .leases
            .values()
            .filter(|l| mine(&l.key_id) && now_ms < l.until_ms)
            .map(|l| LeaseView {
                key_id: l.key_id.clone(),
                hold_id: l.hold_id.clone(),
                granted_ms: l.granted_ms,
                until_ms: l.until_ms,
            })
            .collect();
        leases.sort_by(|a, b| a.key_id.cmp(&b.key_id));
        (holds, leases)
    }

    /// Delete the key's stored answers and fingerprint records (windows stay), acknowledged
    /// over a channel.
    pub async fn forget(&self, key_id: &str) -> Result<(), StoreError> {
        self.store.submit_acked(self.forget_in_memory(key_id)).await
    }

    fn forget_in_memory(&self, key_id: &str) -> Event {
        lock(&self.answers).forget(key_id);
        let mut st = lock(&self.state);
        st.recorded.remove(key_id);
        st.windows.forget_fingerprints(key_id);
        drop(st);
        Event::Forget {
            key_id: key_id.to_string(),
        }
    }

    pub fn budget_view(&self, key_id: &str, now_ms: u64) -> BudgetView {
        let st = lock(&self.state);
        let b = st.budgets.get(key_id);
        let spend = b.map(|b| b.spend_in_period(now_ms)).unwrap_or(0);
        let reserved = st.reservations.reserved(key_id);
        let ceiling = b.and_then(|b| b.ceiling_nano);
        BudgetView {
            key_id: key_id.to_string(),
            ceiling_nano: ceiling,
            period: b.map(|b| b.period).unwrap_or_default().as_str(),
            spend_nano: spend,
            reserved_nano: reserved,
            left_nano: ceiling.map(|c| i128::from(c) - i128::from(spend) - i128::from(reserved)),
        }
    }

    /// Set a key's budget, acknowledged over a channel.
    pub async fn set_budget(
        &self,
        key_id: &str,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
    ) -> Result<(), StoreError> {
        let event = self.set_budget_in_memory(key_id, ceiling_nano, period)?;
        self.store.submit_acked(event).await
    }

    fn set_budget_in_memory(
        &self,
        key_id: &str,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
    ) -> Result<Event, StoreError> {
        let mut st = lock(&self.state);
        let b = st.budgets.get_mut(key_id).ok_or(StoreError::Unavailable)?;
        b.ceiling_nano = ceiling_nano;
        b.period = period;
        Ok(Event::BudgetSet {
            key_id: key_id.to_string(),
            ceiling_nano,
            period,
        })
    }

    /// Set prices (the store wins after a PUT), acknowledged over a channel.
    pub async fn set_prices(&self, prices: &BTreeMap<String, Prices>) -> Result<(), StoreError> {
        self.set_prices_in_memory(prices);
        self.store.flush_acked().await
    }

    fn set_prices_in_memory(&self, prices: &BTreeMap<String, Prices>) {
        self.policy.rcu(|current| {
            let mut next = Policy::clone(current);
            for (model, price) in prices {
                next.prices.insert(model.clone(), *price);
            }
            next
        });
        for (model, price) in prices {
            self.store.submit(Event::PricesSet {
                model: model.clone(),
                prices: *price,
            });
        }
    }

    /// A read of what is committed, queued events first: the flush is acknowledged over a
    /// channel and the read (SQLite, synchronous) runs on the blocking pool, never on a
    /// worker thread.
    pub(super) async fn read_committed<T: Send + 'static>(
        &self,
        read: impl FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.store.flush_acked().await?;
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || read(&*store))
            .await
            .map_err(|_| StoreError::Unavailable)?
    }

    /// The signed receipt of a recent decision (kept in memory for the last
    /// [`recent::RECENT_RECEIPTS`] decisions since start), if it belongs to `key_id`
    /// (`None`: any key).
    pub fn recent_receipt(
        &self,
        decision_id: &DecisionId,
        key_id: Option<&str>,
    ) -> Option<Envelope> {
        lock(&self.recent).get(decision_id, key_id)
    }

    /// Commit what is queued, acknowledged over a channel.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.store.flush_acked().await
    }

    /// Shut the store down: commit everything queued and stop its writer. Later submits are
    /// dropped; called once the server has stopped serving.
    pub fn close_store(&self) -> Result<(), StoreError> {
        self.store.close()
    }

    /// Run expiry without a request (a background tick).
    pub fn tick(&self, now_ms: u64) {
        let mut st = lock(&self.state);
        self.expire(&mut st, now_ms);
    }
}

/// Why a record settled nothing.
enum Unsettled {
    Refused(RecordError),
    /// No open reservation of this key, wire form and reporter has the id: the store says
    /// whether its usage was already recorded ([`not_reserved`]).
    NotReserved,
}

/// A record whose decision holds no open reservation: already recorded, or unknown.
fn not_reserved(recorded: Result<bool, StoreError>) -> RecordError {
    match recorded {
        Ok(true) => RecordError::AlreadyRecorded,
        _ => RecordError::UnknownDecision,
    }
}

/// What a decision reads of a key's state, wherever that state lives.
struct StateSeen<'s> {
    counts: WindowCounts,
    budget: Option<BudgetState>,
    /// The usage recorded for the answer held in the request's wire form.
    held_usage: Option<Usage>,
    /// An approved hold that releases this request.
    approved_hold: Option<&'s str>,
    /// The hold whose approval granted the key an attending lease running now.
    lease: Option<&'s str>,
    /// The key's memory of the request's prompt prefixes, when the gate may place cache
    /// breakpoints for it (`None`: it may not).
    cache_memory: Option<&'s [PointMemory]>,
    /// What the gate keeps of the request's session, its route prefix's rate, and whether
    /// another session made any of those calls.
    session_cache: SessionCache,
    prefix_rate: u64,
    prefix_shared: bool,
}

/// The pure decision over what a home's state says of the request: one reading for the
/// embedded home and the fleet. `paced_ms`: the caller can hold the request and has held it
/// this long (`Err(until)`: hold it until then).
fn decide_seen(
    policy: &Policy,
    req: &GateRequest,
    seen: &StateSeen,
    paced_ms: Option<u64>,
    now_ms: u64,
) -> Result<Decision, u64> {
    // A lease makes attended only the requests that declare nothing, on a key whose default
    // is unattended; a request that says `x-tokensaver-human: 0` stays unattended.
    let lease = match req.human {
        None if !req.key.human_default => seen.lease,
        _ => None,
    };
    let input = req.input(seen.held_usage);
    let approvals = Approvals {
        hold: seen.approved_hold,
        lease,
    };
    let state = KeyState {
        counts: seen.counts,
        budget: seen.budget,
    };
    let mut decision = match paced_ms {
        None => decide_with(policy, &input, approvals, &state, now_ms),
        Some(paced) => match decide_paced(policy, &input, approvals, &state, paced, now_ms) {
            Outcome::Decided(decision) => *decision,
            Outcome::Pace { until_ms } => return Err(until_ms),
        },
    };
    if let Some(memory) = seen.cache_memory {
        decision.place_cache(req.shape, memory, now_ms);
    }
    let on = req.key.cache == CachePolicy::Auto;
    let served = decision.model_served.as_deref().unwrap_or(&req.shape.model);
    let terms = CacheTerms {
        lifetime: if on {
            req.key.cache_ttl
        } else {
            LifetimePolicy::FiveMinutes
        },
        routing: on,
        session: seen.session_cache,
        lifetime_ms: policy.gate.windows.cache_secs.saturating_mul(1_000),
        prefix_rate: seen.prefix_rate,
        prefix_shared: seen.prefix_shared,
        prices: policy.prices.get(served),
    };
    decision.place_cache_terms(req.shape, &terms);
    Ok(decision)
}

/// A pending hold's opening, as the store kept it, back in memory: the decision, and the
/// receipt body signed again (Ed25519 is deterministic: the same key gives the same envelope).
fn reopen(signer: &ReceiptSigner, opening: &HoldOpening) -> Option<Arc<GateOutcome>> {
    let decision: Decision = serde_json::from_str(&opening.decision).ok()?;
    if decision.hold_id.as_deref() != Some(opening.hold_id.as_str()) {
        return None;
    }
    Some(Arc::new(GateOutcome {
        decision,
        envelope: Arc::new(signer.sign(&opening.receipt)),
        decision_id: crate::receipt::decision_id(&opening.receipt),
    }))
}

/// The first 16 hex digits of a fingerprint (`GET /holds`); empty once forgotten.
fn fingerprint_prefix(fingerprint: Option<&Hash>) -> String {
    fingerprint.map(|f| f.hex_prefix(16)).unwrap_or_default()
}

/// One attempt at deciding a request that may be held ([`Gatekeeper::hold_until_decided`]).
pub(super) enum Attempt {
    Decided(Box<GateOutcome>),
    /// Not yet: attempt again at `until_ms`; `now_ms` is the clock this attempt decided by.
    Pace {
        until_ms: u64,
        now_ms: u64,
    },
}

/// What an attempt decides with: the time (this process's clock; a fleet reads its
/// database's), and how long the request has been held (`None`: it cannot be held).
#[derive(Debug, Clone, Copy)]
pub(super) struct HeldFor {
    pub now_ms: u64,
    pub paced_ms: Option<u64>,
}

/// What a caller that can hold its request lends the gate while it is held: the bytes it keeps
/// (its body), and a future that ends when the caller has gone (its connection closed).
pub struct Holding<'g> {
    pub bytes: usize,
    pub gone: CallerGone<'g>,
}

/// Ends when a held request's caller has gone.
pub type CallerGone<'g> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'g>>;

impl Holding<'_> {
    /// A caller that never goes (tests, and callers with no connection to watch).
    pub fn staying(bytes: usize) -> Holding<'static> {
        Holding {
            bytes,
            gone: Box::pin(std::future::pending()),
        }
    }
}

/// The requests held now: per key, and their bytes in all (`[limits] max_paced_*`).
#[derive(Default)]
struct PacedLoad {
    per_key: HashMap<Arc<str>, usize>,
    bytes: usize,
}

/// A request held in the gate: counted in `tokensaver_paced_waiting` and in the caps until it
/// is decided or its caller goes.
struct PacedGuard<'g> {
    gk: &'g Gatekeeper,
    key_id: Arc<str>,
    bytes: usize,
}

impl<'g> PacedGuard<'g> {
    /// Hold one more request of `key_id`, unless a cap is reached.
    fn take(gk: &'g Gatekeeper, key_id: &Arc<str>, bytes: usize) -> Option<Self> {
        let mut load = lock(&gk.paced);
        let of_key = load.per_key.get(key_id).copied().unwrap_or(0);
        if of_key >= gk.config.max_paced_per_key
            || load.bytes.saturating_add(bytes) > gk.config.max_paced_bytes
        {
            return None;
        }
        load.per_key.insert(Arc::clone(key_id), of_key + 1);
        load.bytes = load.bytes.saturating_add(bytes);
        drop(load);
        gk.metrics.paced_waiting.inc();
        Some(Self {
            gk,
            key_id: Arc::clone(key_id),
            bytes,
        })
    }
}

impl Drop for PacedGuard<'_> {
    fn drop(&mut self) {
        let mut load = lock(&self.gk.paced);
        load.bytes = load.bytes.saturating_sub(self.bytes);
        if let Some(n) = load.per_key.get_mut(&self.key_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                load.per_key.remove(&self.key_id);
            }
        }
        drop(load);
        self.gk.metrics.paced_waiting.dec();
    }
}
