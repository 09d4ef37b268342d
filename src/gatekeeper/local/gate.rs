//! The embedded home's work on its own state: decide and book a request under the state
//! lock, settle usage, open and decide holds, expire, forget. Every function takes the
//! gate's [`GateCore`] (policy, signer, metrics) as an argument: the home owns its state and
//! nothing else.

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};

use super::Local;
use crate::config::{BudgetPeriod, Prices};
use crate::gatekeeper::booking::Booking;
use crate::gatekeeper::gate_core::{decide_seen, fingerprint_prefix, Attempt, GateCore, StateSeen};
use crate::gatekeeper::reservations::Reservation;
use crate::gatekeeper::state::State;
use crate::gatekeeper::AdmitError;
use crate::gatekeeper::{
    lock, settlement, BudgetView, GateOutcome, GateRequest, HoldAction, HoldDecided, HoldError,
    HoldView, Holding, LeaseView, Mode, RecordBound, RecordError, RecordSource, UsageReport,
    MAX_ATTEND_MINUTES,
};
use crate::receipt::{DecisionId, Envelope};
use crate::store::answers::{AnswerKey, StoredAnswer};
use crate::store::{Event, HoldOpening, HoldRow, HoldState, LeaseRow, Store, StoreError, UsageRow};
use tokensaver_core::gate::cache::CacheEdits;
use tokensaver_core::gate::{Decision, Verdict};

impl Local {
    /// Decide a request, and in `Commit` mode count it, reserve, open holds, and book it.
    /// The caller cannot hold the request: a repeated step past the loop thresholds is
    /// BLOCKed as a loop ([`Local::gate_paced`] paces it instead).
    pub fn gate(&self, core: &GateCore, req: &GateRequest, mode: Mode) -> GateOutcome {
        match self.gate_step(core, req, mode, None) {
            Ok(outcome) => outcome,
            Err(_) => unreachable!("without `paced_ms` the pure gate never paces"),
        }
    }

    /// `POST /estimate` on this process's state: the decision the proxy would reach for the
    /// request now — a repeated step its pace window does not admit yet is decided as of the
    /// time the window admits it, with the wait in `paced_ms` (SPEC §2.3), as the proxy would
    /// hold and then decide it. Nothing is counted or booked.
    pub fn estimate_paced(&self, core: &GateCore, req: &GateRequest) -> GateOutcome {
        let mut at = GateRequest { ..*req };
        // Nothing moves between the two readings, so the second is a decision (a third is a
        // guard against a window that never admits it: then the unpaced decision).
        for _ in 0..2 {
            let paced_ms = at.now_ms.saturating_sub(req.now_ms);
            match self.gate_step(core, &at, Mode::Estimate, Some(paced_ms)) {
                Ok(outcome) => return outcome,
                Err(until_ms) => at.now_ms = until_ms.max(at.now_ms + 1),
            }
        }
        self.gate(core, req, Mode::Estimate)
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
        core: &GateCore,
        req: &GateRequest<'_>,
        holding: Holding<'_>,
    ) -> Result<GateOutcome, AdmitError> {
        core.hold_until_decided(req, holding, |hold| {
            let at = GateRequest {
                now_ms: hold.now_ms,
                ..*req
            };
            let attempt = match self.gate_step(core, &at, Mode::Commit, hold.paced_ms) {
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
    pub fn decide_recorded(&self, core: &GateCore, req: &GateRequest<'_>) -> GateOutcome {
        let held = lock(&self.state).recorded_usage(req).is_some();
        let mut at = GateRequest { held, ..*req };
        loop {
            let paced_ms = at.now_ms.saturating_sub(req.now_ms);
            match self.gate_step(core, &at, Mode::Commit, Some(paced_ms)) {
                Ok(outcome) => return outcome,
                Err(until_ms) => at.now_ms = until_ms.max(at.now_ms + 1),
            }
        }
    }

    /// Settle a replayed decision with the usage the recording saw bought (a complete answer):
    /// what the next decisions read of it — the session's cache, a reusable answer — is then
    /// as it was when the call was recorded.
    pub fn settle_recorded(&self, core: &GateCore, report: &UsageReport, now_ms: u64) {
        let _ = self.settle_usage(core, report, now_ms, RecordSource::Proxy);
    }

    /// One decision; `paced_ms`: the caller can hold the request and has held it this long
    /// (`Err(until)`: hold it until then, nothing was counted or booked). In order: the state
    /// under its lock, a pending re-send's original answer, the decision clock, what the key's
    /// state says of the request, the pure decision, and in `Commit` mode its booking; the
    /// signature last, outside the lock.
    fn gate_step(
        &self,
        core: &GateCore,
        req: &GateRequest,
        mode: Mode,
        paced_ms: Option<u64>,
    ) -> Result<GateOutcome, u64> {
        let started = std::time::Instant::now();
        let policy = core.policy.load();
        let mut st = lock(&self.state);
        if let Some(opened) = st.pending_resend(req) {
            drop(st);
            if mode == Mode::Commit {
                core.metrics.hold_resends.inc();
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
            Mode::Commit => self.book(core, st, req, &decision, &body, decision_id),
            Mode::Estimate => {
                drop(st);
                None
            }
        };
        // Signing is the slowest step of a decision and needs no shared state: it runs after
        // the state lock is released, so concurrent requests do not queue behind it.
        let envelope = signed.unwrap_or_else(|| Arc::new(core.signer.sign(&body)));
        if mode == Mode::Commit {
            core.note_committed(decision_id, &req.key.id, &envelope, started);
        } else {
            core.metrics
                .decision_seconds
                .observe(started.elapsed().as_secs_f64());
        }
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
        core: &GateCore,
        mut st: MutexGuard<'_, State>,
        req: &GateRequest,
        decision: &Decision,
        body: &[u8],
        decision_id: DecisionId,
    ) -> Option<Arc<Envelope>> {
        // Booked on the decision's own clock.
        let now_ms = decision.decided_at_ms;
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
                expires_ms: now_ms + core.config.hold_ttl_ms,
                state: HoldState::Pending,
                worst_case_tokens: new_hold.worst_case_tokens,
            };
            let outcome = GateOutcome {
                decision: decision.clone(),
                envelope: Arc::new(core.signer.sign(body)),
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
                    expires_ms: now_ms + core.config.reservation_ttl_ms,
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
        core.count(decision);
        signed
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
    pub fn renew_reservation(&self, core: &GateCore, decision_id: &DecisionId, now_ms: u64) {
        let ttl_ms = core.config.reservation_ttl_ms;
        lock(&self.state)
            .reservations
            .renew(decision_id, now_ms.saturating_add(ttl_ms));
    }

    /// [`Self::renew_reservation`] for a digest client: only its own key's open reservation
    /// of a decision made through `POST /gate`.
    pub fn renew_digest_reservation(
        &self,
        core: &GateCore,
        key_id: &str,
        decision_id: &DecisionId,
        now_ms: u64,
    ) -> bool {
        let ttl_ms = core.config.reservation_ttl_ms;
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
        core: &GateCore,
        report: &UsageReport,
        now_ms: u64,
        source: RecordSource,
    ) -> Result<UsageRow, RecordError> {
        let (row, commit) = match self.settle_usage(core, report, now_ms, source) {
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
        core: &GateCore,
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
        let prices = core.price_of(served_model);
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
    fn hold_is_unpriced(&self, core: &GateCore, hold_id: &str) -> bool {
        let model = lock(&self.state)
            .holds
            .get(hold_id)
            .and_then(|h| h.opened.as_ref())
            .filter(|o| o.decision.worst_case.cost_nano.is_none())
            .map(|o| o.decision.model_requested.clone());
        model.is_some_and(|m| core.price_of(&m).is_none())
    }

    /// The answer held for this key, fingerprint and wire form, if any.
    pub fn answer(&self, key: &AnswerKey) -> Option<Arc<StoredAnswer>> {
        lock(&self.answers).get(key)
    }

    pub fn store_answer(&self, core: &GateCore, key: AnswerKey, answer: StoredAnswer) {
        let mut answers = lock(&self.answers);
        answers.put(key, answer);
        core.metrics.answer_store_bytes.set(answers.bytes() as i64);
    }

    /// A person approves or denies a pending hold. `key_id`: the deciding owner's key (None =
    /// the admin); another key's hold is unknown to an owner. An approval's lease runs from
    /// now for `attend_minutes` (1..=1440); the hold itself keeps its own TTL.
    pub fn decide_hold(
        &self,
        core: &GateCore,
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
        if matches!(action, HoldAction::Approve { .. }) && self.hold_is_unpriced(core, hold_id) {
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
        st.recorded.forget(key_id);
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

    /// Keep prices set by `PUT /prices` (the store wins after a PUT), acknowledged over a
    /// channel.
    pub async fn keep_prices(&self, prices: &BTreeMap<String, Prices>) -> Result<(), StoreError> {
        for (model, price) in prices {
            self.store.submit(Event::PricesSet {
                model: model.clone(),
                prices: *price,
            });
        }
        self.store.flush_acked().await
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

    /// The durable store (the proxy's response registry writes through it).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
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
