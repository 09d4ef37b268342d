//! The gatekeeper as one instance of a fleet: the same pure decision, with the windows, the
//! budget and the decision clock read from the fleet's PostgreSQL under the key's lock, and the
//! decision and its reservation written in that same transaction ([`Fleet::admit`]).
//!
//! Holds, attending leases, stored answers and recorded usage stay in this instance's memory
//! (and its SQLite) for now: none of them can raise spend past a ceiling or let a runaway
//! through, since the budget and the windows are read from the database on every admission.

use std::sync::Arc;

use super::{
    decision_row, lock, settlement, GateOutcome, GateRequest, Gatekeeper, RecordError,
    RecordSource, UsageReport,
};
use crate::fleet::spool::Replayed;
use crate::fleet::{Booking, FleetError, KeyLimit, NewReservation, SettleError};
use crate::gate::{decide_with, Approvals, Billed, GateInput, KeyState};
use crate::store::{Ending, Event, HoldOpening, HoldRow, HoldState, UsageRow};

impl Gatekeeper {
    /// Decide and book a request (`Mode::Commit`) on a fleet instance; without a fleet, the
    /// single-node [`Gatekeeper::gate`]. An error means the database did not decide: the
    /// caller answers 503 and forwards nothing.
    pub async fn gate_fleet(&self, req: &GateRequest<'_>) -> Result<GateOutcome, FleetError> {
        let Some(fleet) = self.fleet.as_ref() else {
            return Ok(self.gate(req, super::Mode::Commit));
        };
        let started = std::time::Instant::now();
        let shape = req.shape;
        let key_id = req.key.id.as_str();
        let wire = shape.wire_form();
        let (resent, held_usage, approval, lease, limit) = {
            let mut st = lock(&self.state);
            self.expire(&mut st, req.now_ms);
            // As in `gate`: a re-send of a pending hold gets its original answer, uncounted.
            let resent = st
                .hold_for(key_id, &shape.fingerprint, req.now_ms)
                .filter(|h| h.row.state == HoldState::Pending)
                .and_then(|h| h.opened.clone());
            let held_usage = st
                .recorded
                .get(key_id)
                .and_then(|by_request| by_request.get(&(shape.fingerprint, wire)))
                .copied();
            let approval = st.approval_for(req.hold_id, key_id, &shape.fingerprint, req.now_ms);
            let lease = match req.human {
                None if !req.key.human_default => {
                    st.lease_for(key_id, req.now_ms).map(|l| l.hold_id.clone())
                }
                _ => None,
            };
            let limit = st.budgets.get(key_id).map_or(
                KeyLimit {
                    ceiling_nano: None,
                    period: Default::default(),
                },
                |b| KeyLimit {
                    ceiling_nano: b.ceiling_nano,
                    period: b.period,
                },
            );
            (resent, held_usage, approval, lease, limit)
        };
        if let Some(opened) = resent {
            self.metrics.hold_resends.inc();
            return Ok((*opened).clone());
        }

        let (decision, body, decision_id) = fleet
            .admit(
                key_id,
                &shape.fingerprint,
                &shape.step_fingerprint,
                &shape.model,
                limit,
                |seen| {
                    let input = GateInput {
                        key_id,
                        shape,
                        human: req.human.unwrap_or(req.key.human_default),
                        held: req.held,
                        held_usage,
                        approved_hold: false,
                    };
                    let approvals = Approvals {
                        hold: approval.as_deref(),
                        lease: lease.as_deref(),
                    };
                    let state = KeyState {
                        counts: seen.counts,
                        budget: seen.budget,
                    };
                    let decision = {
                        let policy = self.policy.read().unwrap_or_else(|p| p.into_inner());
                        decide_with(&policy, &input, approvals, &state, seen.now_ms)
                    };
                    let body = decision.receipt_body();
                    let decision_id = crate::receipt::decision_id(&body);
                    let reservation = decision.verdict.forwards().then(|| NewReservation {
                        nano: decision.worst_case.cost_nano.unwrap_or(0),
                        served_model: decision
                            .model_served
                            .clone()
                            .unwrap_or_else(|| shape.model.clone()),
                        wire,
                        output_ceiling: decision.worst_case.output_tokens,
                        fingerprint: shape.fingerprint,
                        reusable: shape.reproducible(),
                        approved_past_budget: decision.approved_hold.is_some(),
                    });
                    let reserved = reservation.as_ref().map_or(0, |r| r.nano);
                    let mut row = decision_row(&decision, &decision_id, wire, reserved);
                    row.step_fingerprint = Some(shape.step_fingerprint.to_hex());
                    ((decision, body, decision_id), Booking { row, reservation })
                },
            )
            .await?;

        // The decision is committed in the fleet; what stays local follows, as in `gate`.
        let now_ms = decision.decided_at_ms;
        let mut events = Vec::new();
        let mut signed = None;
        {
            let mut st = lock(&self.state);
            if let Some(id) = &decision.approved_hold {
                if let Some(mut h) = st.close_hold(id) {
                    h.row.state = HoldState::Used;
                    events.push(Event::Hold(h.row));
                }
            }
            if let Some(hold_id) = &decision.hold_id {
                let hold = HoldRow {
                    hold_id: hold_id.clone(),
                    key_id: key_id.to_string(),
                    fingerprint: shape.fingerprint.to_hex(),
                    created_ms: now_ms,
                    expires_ms: now_ms + self.config.hold_ttl_ms,
                    state: HoldState::Pending,
                    worst_case_tokens: decision.worst_case.tokens().unwrap_or(0),
                };
                let outcome = GateOutcome {
                    decision: decision.clone(),
                    envelope: self.signer.sign(&body),
                    decision_id: decision_id.clone(),
                };
                let opening = HoldOpening {
                    hold_id: hold_id.clone(),
                    decision: serde_json::to_string(&decision).unwrap_or_default(),
                    receipt: body.clone(),
                };
                signed = Some(outcome.envelope.clone());
                st.open_hold(hold.clone(), Some(Arc::new(outcome)));
                events.push(Event::HoldOpened { hold, opening });
            }
        }
        for e in events {
            self.store.submit(e);
        }
        self.count(&decision);
        let envelope = signed.unwrap_or_else(|| self.signer.sign(&body));
        lock(&self.recent).push(&decision_id, key_id, &envelope);
        self.metrics
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(GateOutcome {
            decision,
            envelope,
            decision_id,
        })
    }

    /// Settle a forwarded decision in the fleet ([`settlement`], as on a single node). The
    /// proxy's own report that cannot be written is spooled and replayed later (and counts as
    /// recorded); a digest client's is refused (`Storage`), for the client to send again.
    pub async fn record_usage_fleet(
        &self,
        report: &UsageReport,
        source: RecordSource,
    ) -> Result<UsageRow, RecordError> {
        match self.settle_in_fleet(report, source).await {
            Err(SettleError::Fleet(_)) if source == RecordSource::Proxy => {
                let spooled = match &self.spool {
                    Some(spool) => spool.append(report).await.is_ok(),
                    None => false,
                };
                if !spooled {
                    tracing::error!("fleet usage could neither be written nor spooled");
                }
                Err(RecordError::Storage)
            }
            Err(SettleError::Fleet(_)) => Err(RecordError::Storage),
            Err(SettleError::Unknown) => Err(RecordError::UnknownDecision),
            Err(SettleError::AlreadySettled) => Err(RecordError::AlreadyRecorded),
            Err(SettleError::ModelMismatch) => Err(RecordError::ModelMismatch),
            Ok(row) => Ok(row),
        }
    }

    async fn settle_in_fleet(
        &self,
        report: &UsageReport,
        source: RecordSource,
    ) -> Result<UsageRow, SettleError> {
        let Some(fleet) = self.fleet.as_ref() else {
            return Err(SettleError::Fleet(FleetError::Unavailable));
        };
        let ending = match (report.ending, report.usage) {
            (Ending::Complete, None) => Ending::NoUsage,
            (e, _) => e,
        };
        let complete = ending == Ending::Complete;
        let usage: Option<Billed> = report.usage;
        let prices = self
            .policy
            .read()
            .ok()
            .and_then(|p| p.prices.get(&report.served_model).copied());
        let (row, reservation) = fleet
            .settle(
                &report.decision_id,
                &report.key_id,
                report.wire,
                &report.served_model,
                |r, at_ms| {
                    let (spend, basis) = settlement(
                        ending,
                        usage.as_ref(),
                        prices.as_ref(),
                        r.nano,
                        r.output_ceiling,
                    );
                    UsageRow {
                        decision_id: report.decision_id.clone(),
                        key_id: report.key_id.clone(),
                        at_ms,
                        served_model: report.served_model.clone(),
                        wire: report.wire,
                        complete,
                        usage: usage.map(|b| b.usage).unwrap_or_default(),
                        cache_write_1h: usage.map(|b| b.cache_write_1h).unwrap_or(0),
                        web_search_requests: usage.map(|b| b.web_search_requests).unwrap_or(0),
                        ending: Some(ending),
                        basis,
                        spend_nano: spend,
                    }
                },
            )
            .await?;
        // What makes a stored answer servable stays with the answer, in this instance.
        if let (Some(b), true, true, Some(fp), RecordSource::Proxy) = (
            usage,
            complete,
            reservation.reusable,
            reservation.fingerprint,
            source,
        ) {
            lock(&self.state)
                .recorded
                .entry(report.key_id.clone())
                .or_default()
                .insert((fp, report.wire), b.usage);
        }
        Ok(row)
    }

    /// The fleet's periodic work: charge expired reservations (any instance may, at once) and
    /// replay spooled usage once the database answers again.
    pub async fn fleet_tick(&self) {
        let Some(fleet) = self.fleet.as_ref() else {
            return;
        };
        if fleet.expire().await.is_err() {
            return;
        }
        let Some(spool) = self.spool.as_ref().filter(|s| s.pending()) else {
            return;
        };
        let replayed = spool
            .replay(|report| async move {
                match self.settle_in_fleet(&report, RecordSource::Proxy).await {
                    Err(SettleError::Fleet(_)) => Replayed::Later,
                    _ => Replayed::Done,
                }
            })
            .await;
        match replayed {
            Ok(n) if n > 0 => tracing::info!(reports = n, "spooled fleet usage replayed"),
            Ok(_) => {}
            Err(_) => tracing::error!("the fleet usage spool could not be replayed"),
        }
    }
}
