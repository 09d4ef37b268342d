//! The gatekeeper as one instance of a fleet: the same pure decision, with the windows, the
//! budget and the decision clock read from the fleet's PostgreSQL under the key's lock, and the
//! decision and its reservation written in that same transaction ([`Fleet::admit`]).
//!
//! Holds, attending leases, recorded usage and stored answers are in the database too, so a
//! hold raised through one instance is approved through another and released on a third, and
//! an answer stored through one is served by the others.

use std::collections::BTreeMap;
use std::sync::Arc;

pub mod spool;

use crate::config::{BudgetPeriod, Prices};
use crate::gatekeeper::backing::Backing;
use crate::gatekeeper::gate_core::{
    decide_seen, fingerprint_prefix, reopen, Attempt, GateCore, HeldFor, StateSeen,
};
use crate::gatekeeper::local::Local;
use crate::gatekeeper::{AdmitError, HoldList, SetBudgetError, Settled, Unavailable};
use crate::gatekeeper::{
    BudgetView, GateOutcome, GateRequest, HoldAction, HoldDecided, HoldError, HoldView, Holding,
    LeaseView, RecordError, RecordSource, UsageReport,
};
use crate::receipt::DecisionId;
use crate::store::answers::{AnswerKey, StoredAnswer};
use crate::store::booking::Booking;
use crate::store::postgres::{AdmitScope, Fleet, FleetError, HoldRefusal, Observed, SettleError};
use crate::store::{
    DecisionListing, DecisionPage, DecisionQuery, LedgerDay, LedgerTotals, ResponseBinding,
    StoreError, VerdictCount,
};
use crate::store::{HoldOpening, HoldState, UsageRow};
use spool::{Replayed, Spool};
use tokensaver_core::gate::{Decision, Usage, Verdict};

/// What an admission came to.
enum Admitted {
    /// A re-send of a pending hold: its original answer.
    Resent(Arc<GateOutcome>),
    /// A new decision, its receipt body and its id.
    Decided(Box<Decision>, Vec<u8>, DecisionId),
    /// A repeated step the schedule admits at `until_ms` (the database's clock, which read
    /// `now_ms`): nothing booked.
    Paced { until_ms: u64, now_ms: u64 },
}

/// A fleet's home for the gate's state: its PostgreSQL, and the local spool of the proxy's
/// usage reports that could not be written yet.
pub struct Shared {
    fleet: Fleet,
    spool: Spool,
    /// This node's own state: the budgets its config (or a `PUT` it saw) states, which an
    /// admission sends with its scope, its prices, and what `POST /forget` clears here too.
    mirror: Local,
}

impl Shared {
    pub(crate) fn new(fleet: Fleet, spool: Spool, mirror: Local) -> Shared {
        Shared {
            fleet,
            spool,
            mirror,
        }
    }

    pub(crate) fn mirror(&self) -> &Local {
        &self.mirror
    }

    async fn settle_in_fleet(
        &self,
        core: &GateCore,
        report: &UsageReport,
        source: RecordSource,
    ) -> Result<UsageRow, SettleError> {
        let prices = core.price_of(&report.served_model);
        self.fleet
            .settle(
                &report.decision_id,
                &report.key_id,
                report.wire,
                &report.served_model,
                source,
                |r, at_ms| {
                    let bound =
                        crate::gatekeeper::RecordBound::of(r.input_tokens, r.output_ceiling);
                    if source == RecordSource::Digest && !bound.admits_report(report) {
                        return Err(SettleError::ExceedsDecision);
                    }
                    let mut row =
                        report.usage_row(at_ms, prices.as_ref(), r.nano, r.output_ceiling);
                    crate::gatekeeper::settlement::cache_figures(
                        &row,
                        prices.as_ref(),
                        r.cache_edits,
                    )
                    .apply(&mut row, prices.as_ref(), r.cache_edits);
                    // Only a complete, reproducible answer's usage is what a SERVE does not buy.
                    let recorded = report
                        .reusable_usage(r.reusable)
                        .and_then(|u| serde_json::to_string(&u).ok());
                    Ok((row, recorded))
                },
            )
            .await
    }

    async fn fleet_budget(&self, _core: &GateCore, key_id: &str) -> Result<BudgetView, FleetError> {
        let limit = match self.fleet.shared_budget(key_id).await? {
            Some(shared) => shared,
            None => self.mirror.limit(key_id),
        };
        let now = self.fleet.db_now_ms().await?;
        let s = self
            .fleet
            .budget_sample(key_id, crate::store::period_start(limit.period, now))
            .await?;
        let left = limit
            .ceiling_nano
            .map(|c| i128::from(c) - i128::from(s.spend_nano) - i128::from(s.reserved_nano));
        Ok(BudgetView {
            key_id: key_id.to_string(),
            ceiling_nano: limit.ceiling_nano,
            period: limit.period.as_str(),
            spend_nano: s.spend_nano,
            reserved_nano: s.reserved_nano,
            left_nano: left,
        })
    }
}

impl Shared {
    /// One admission attempt in the fleet's database (`hold`: how long the request has been
    /// held, `None`: it cannot be).
    async fn admit_once(
        &self,
        core: &GateCore,
        req: &GateRequest<'_>,
        hold: HeldFor,
    ) -> Result<Attempt, Unavailable> {
        let started = std::time::Instant::now();
        let admitted = self
            .fleet
            .admit(self.admit_scope(req), |seen| {
                // As in `gate`: a re-send of a pending hold gets its original answer (the
                // same decision and receipt), uncounted, whichever instance it reaches.
                let reopened = seen.pending.as_ref().and_then(|p| {
                    Some(HoldOpening {
                        hold_id: p.hold_id.clone(),
                        decision: p.decision.clone()?,
                        receipt: p.receipt.clone()?,
                    })
                });
                if let Some(opened) = reopened.and_then(|o| reopen(&core.signer, &o)) {
                    return (Admitted::Resent(opened), None);
                }
                let decision = match decide_observed(core, req, &seen, hold.paced_ms) {
                    Ok(decision) => decision,
                    Err(until_ms) => {
                        let now_ms = seen.now_ms;
                        return (Admitted::Paced { until_ms, now_ms }, None);
                    }
                };
                let (body, decision_id) = decision.receipt();
                let booking = Booking::of(&decision, &body, decision_id, req);
                (
                    Admitted::Decided(Box::new(decision), body, decision_id),
                    Some(booking),
                )
            })
            .await
            .map_err(|_| Unavailable)?;
        let (decision, body, decision_id) = match admitted {
            Admitted::Resent(opened) => {
                core.metrics.hold_resends.inc();
                return Ok(Attempt::Decided(Box::new((*opened).clone())));
            }
            Admitted::Paced { until_ms, now_ms } => {
                return Ok(Attempt::Pace { until_ms, now_ms });
            }
            Admitted::Decided(decision, body, decision_id) => (*decision, body, decision_id),
        };
        core.count(&decision);
        let envelope = Arc::new(core.signer.sign(&body));
        core.note_committed(decision_id, &req.key.id, &envelope, started);
        Ok(Attempt::Decided(Box::new(GateOutcome {
            decision,
            envelope,
            decision_id,
        })))
    }
}

impl Backing for Shared {
    /// The fleet's decision: the windows, the runs, the budget and the decision clock read
    /// under the key's lock, the booking written in that same transaction. A repeated step is
    /// paced as on one node ([`GateCore::hold_until_decided`]): an attempt the schedule does
    /// not admit yet books nothing, and the request waits here for the time it names (the
    /// database's clock), so that instances sharing a key's session pace it as one would.
    async fn admit(
        &self,
        core: &GateCore,
        req: &GateRequest<'_>,
        holding: Holding<'_>,
    ) -> Result<GateOutcome, AdmitError> {
        core.hold_until_decided(req, holding, |hold| self.admit_once(core, req, hold))
            .await
    }

    /// From the fleet's windows, budget and holds; nothing is locked, counted or booked.
    async fn estimate(
        &self,
        core: &GateCore,
        req: &GateRequest<'_>,
    ) -> Result<GateOutcome, Unavailable> {
        let mut seen = self
            .fleet
            .peek(self.admit_scope(req))
            .await
            .map_err(|_| Unavailable)?;
        // A step the schedule holds is predicted as decided when it admits it (as one node
        // predicts it: `Local::estimate_paced`).
        let read_at = seen.now_ms;
        let decision = match decide_observed(core, req, &seen, Some(0)) {
            Ok(decision) => decision,
            Err(until_ms) => {
                seen.now_ms = until_ms;
                let paced = Some(until_ms.saturating_sub(read_at));
                match decide_observed(core, req, &seen, paced) {
                    Ok(decision) => decision,
                    Err(_) => decide_observed(core, req, &seen, None).map_err(|_| Unavailable)?,
                }
            }
        };
        let (body, decision_id) = decision.receipt();
        Ok(GateOutcome {
            envelope: Arc::new(core.signer.sign(&body)),
            decision_id,
            decision,
        })
    }

    /// Settled in the fleet's database ([`crate::gatekeeper::settlement`], as on a single
    /// node) before the answer is stored or finished, so a SERVE never precedes its usage. The
    /// proxy's own report that cannot be written is spooled and replayed later (and counts as
    /// recorded); a digest client's is refused (`Storage`), for the client to send again.
    async fn settle(
        &self,
        core: &GateCore,
        report: &UsageReport,
        source: RecordSource,
        _now_ms: u64,
    ) -> Result<Settled, RecordError> {
        match self.settle_in_fleet(core, report, source).await {
            Err(SettleError::Fleet(_)) if source == RecordSource::Proxy => {
                if self.spool.append(report).await.is_err() {
                    tracing::error!("fleet usage could neither be written nor spooled");
                }
                Err(RecordError::Storage)
            }
            Err(SettleError::Fleet(_)) => Err(RecordError::Storage),
            Err(SettleError::Unknown) => Err(RecordError::UnknownDecision),
            Err(SettleError::AlreadySettled) => Err(RecordError::AlreadyRecorded),
            Err(SettleError::ModelMismatch) => Err(RecordError::ModelMismatch),
            Err(SettleError::ExceedsDecision) => Err(RecordError::ExceedsDecision),
            Ok(row) => Ok(Settled::Here(Box::new(row))),
        }
    }

    /// In the fleet's database, by its clock.
    async fn renew(&self, _core: &GateCore, decision_id: &DecisionId, _now_ms: u64) {
        if self.fleet.renew(decision_id).await.is_err() {
            tracing::warn!("fleet reservation renewal failed; the next one retries");
        }
    }

    async fn renew_for_digest(
        &self,
        _core: &GateCore,
        key_id: &str,
        decision_id: &DecisionId,
        _now_ms: u64,
    ) -> Result<bool, Unavailable> {
        self.fleet
            .renew_for_digest(key_id, decision_id)
            .await
            .map_err(|_| Unavailable)
    }

    async fn answer(&self, _core: &GateCore, key: &AnswerKey) -> Option<Arc<StoredAnswer>> {
        let (content_type, body) = self
            .fleet
            .answer(&key.key_id, &key.fingerprint, key.wire)
            .await
            .ok()??;
        Some(Arc::new(StoredAnswer {
            content_type,
            body: bytes::Bytes::from(body),
            // Only the provider's bytes are kept: a replay cuts the usage on the way out.
            without_usage: None,
        }))
    }

    /// For the whole fleet: the provider's bytes only.
    async fn keep_answer(&self, _core: &GateCore, key: AnswerKey, answer: StoredAnswer) {
        let stored = self
            .fleet
            .put_answer(
                &key.key_id,
                &key.fingerprint,
                key.wire,
                &answer.content_type,
                &answer.body,
            )
            .await;
        if stored.is_err() {
            tracing::warn!("an answer could not be stored in the fleet database");
        }
    }

    /// The fleet's holds, and the database's time.
    async fn holds(
        &self,
        _core: &GateCore,
        key_id: Option<&str>,
        _now_ms: u64,
    ) -> Result<HoldList, HoldError> {
        let (now_ms, holds, leases) = self
            .fleet
            .open_holds(key_id)
            .await
            .map_err(|_| HoldError::Unavailable)?;
        let reason = |r: Option<String>| {
            // The closed set of reasons a CHALLENGE can carry, as static text.
            r.and_then(|r| {
                [
                    tokensaver_core::gate::Rule::ExceedsRemainingBudget.as_str(),
                    "score_challenge",
                ]
                .into_iter()
                .find(|known| *known == r)
            })
        };
        let holds = holds
            .into_iter()
            .map(|h| HoldView {
                fingerprint_prefix: fingerprint_prefix(h.fingerprint.as_ref()),
                hold_id: h.hold_id,
                key_id: h.key_id,
                state: if h.approved {
                    HoldState::Approved
                } else {
                    HoldState::Pending
                },
                reason: reason(h.reason),
                created_ms: h.created_ms,
                expires_ms: h.expires_ms,
                worst_case_tokens: h.worst_case_tokens,
            })
            .collect();
        let leases = leases
            .into_iter()
            .map(|l| LeaseView {
                key_id: l.key_id,
                hold_id: l.hold_id,
                granted_ms: l.granted_ms,
                until_ms: l.until_ms,
            })
            .collect();
        Ok(HoldList {
            now_ms,
            holds,
            leases,
        })
    }

    /// One conditional UPDATE decides (two concurrent approvals on two instances: one wins,
    /// the other finds it not pending).
    async fn decide_hold(
        &self,
        _core: &GateCore,
        hold_id: &str,
        key_id: Option<&str>,
        action: HoldAction,
        _now_ms: u64,
    ) -> Result<HoldDecided, HoldError> {
        let (approve, attend_minutes) = match action {
            HoldAction::Approve { attend_minutes } => (true, attend_minutes),
            HoldAction::Deny => (false, None),
        };
        if attend_minutes.is_some_and(|m| !(1..=crate::gatekeeper::MAX_ATTEND_MINUTES).contains(&m))
        {
            return Err(HoldError::AttendMinutes);
        }
        match self
            .fleet
            .decide_hold(hold_id, key_id, approve, attend_minutes)
            .await
        {
            Ok(Ok(d)) => Ok(HoldDecided {
                hold_id: hold_id.to_string(),
                key_id: d.key_id,
                state: if approve {
                    HoldState::Approved
                } else {
                    HoldState::Denied
                },
                expires_ms: d.expires_ms,
                attending_until_ms: d.attending_until_ms,
            }),
            Ok(Err(HoldRefusal::Unknown)) => Err(HoldError::Unknown),
            Ok(Err(HoldRefusal::Expired)) => Err(HoldError::Expired),
            Ok(Err(HoldRefusal::NotPending)) => Err(HoldError::NotPending),
            Err(_) => Err(HoldError::Unavailable),
        }
    }

    /// Spend in the key's period by the database's clock, and every instance's open
    /// reservations.
    async fn budget(
        &self,
        core: &GateCore,
        key_id: &str,
        _now_ms: u64,
    ) -> Result<BudgetView, Unavailable> {
        self.fleet_budget(core, key_id)
            .await
            .map_err(|_| Unavailable)
    }

    /// The fleet's budget first: it is what every instance's admissions read; then this
    /// node's, which its config-seeded view falls back on.
    async fn set_budget(
        &self,
        _core: &GateCore,
        key_id: &str,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
    ) -> Result<(), SetBudgetError> {
        self.fleet
            .set_budget(key_id, ceiling_nano, period)
            .await
            .map_err(|_| Unavailable)?;
        Ok(self.mirror.set_budget(key_id, ceiling_nano, period).await?)
    }

    /// The database's ledger: every instance's decisions and usage.
    async fn ledger(
        &self,
        _core: &GateCore,
        key_id: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), StoreError> {
        let bound = |d: Option<&str>| d.map(crate::store::day_start_ms);
        let from_ms = match bound(from) {
            Some(Some(ms)) => ms,
            Some(None) => return Err(StoreError::Unavailable),
            None => i64::MIN,
        };
        let to_ms = match bound(to) {
            Some(Some(ms)) => ms.saturating_add(crate::gatekeeper::DAY_MS as i64),
            Some(None) => return Err(StoreError::Unavailable),
            None => i64::MAX,
        };
        self.fleet
            .ledger(key_id, from_ms, to_ms)
            .await
            .map_err(|_| StoreError::Unavailable)
    }

    /// Every instance's decisions.
    async fn decisions(
        &self,
        _core: &GateCore,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        self.fleet.decisions(query).await
    }

    async fn latest_decisions(
        &self,
        _core: &GateCore,
        key_id: Option<&str>,
        verdict: Option<Verdict>,
        limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError> {
        self.fleet.latest_decisions(key_id, verdict, limit).await
    }

    async fn verdicts_over_time(
        &self,
        _core: &GateCore,
        key_id: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError> {
        self.fleet
            .verdicts_over_time(key_id, since_ms, bucket_ms)
            .await
    }

    async fn bind_response(
        &self,
        _core: &GateCore,
        binding: ResponseBinding,
    ) -> Result<(), Unavailable> {
        self.fleet
            .bind_response(&binding)
            .await
            .map_err(|_| Unavailable)
    }

    async fn response_binding(
        &self,
        _core: &GateCore,
        id: &str,
    ) -> Result<Option<ResponseBinding>, Unavailable> {
        self.fleet
            .response_binding(id)
            .await
            .map_err(|_| Unavailable)
    }

    /// The fleet's records first (every instance serves from them), then this node's.
    async fn forget(&self, _core: &GateCore, key_id: &str) -> Result<(), StoreError> {
        self.fleet
            .forget(key_id)
            .await
            .map_err(|_| StoreError::Unavailable)?;
        self.mirror.forget(key_id).await
    }

    /// This node's: prices are set per node.
    async fn keep_prices(&self, prices: &BTreeMap<String, Prices>) -> Result<(), StoreError> {
        self.mirror.keep_prices(prices).await
    }

    fn shared(&self) -> bool {
        true
    }

    /// This node's expiry, then the fleet's: charge expired reservations (any instance may,
    /// at once) and replay spooled usage once the database answers again.
    async fn tick(&self, core: &GateCore, now_ms: u64) {
        self.mirror.tick(now_ms);
        if self.fleet.expire().await.is_err() {
            tracing::warn!("fleet expiry sweep failed; the next tick retries");
        }
        if !self.spool.pending() {
            return;
        }
        let replayed = self
            .spool
            .replay(|report| async move {
                match self
                    .settle_in_fleet(core, &report, RecordSource::Proxy)
                    .await
                {
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

impl Shared {
    /// What an admission or an estimate asks the fleet about: the request and the key's
    /// budget as this instance's config (or a `PUT /budget` it has seen) states it.
    fn admit_scope<'r>(&self, req: &'r GateRequest<'r>) -> AdmitScope<'r> {
        let shape = req.shape;
        let limit = self.mirror.limit(&req.key.id);
        AdmitScope {
            key_id: &req.key.id,
            fingerprint: &shape.fingerprint,
            step: &shape.step_fingerprint,
            action: shape.step_action.as_ref(),
            model: &shape.model,
            limit,
            wire: shape.wire_form(),
            named_hold: req.hold_id,
            cache_points: req.placeable_cache_points(),
            session: &shape.session,
            route_prefix: shape.route_prefix.as_ref(),
        }
    }
}

/// The pure decision over what the fleet's database holds for the request (as `gate` over
/// what this instance's memory holds).
fn decide_observed(
    core: &GateCore,
    req: &GateRequest<'_>,
    seen: &Observed,
    paced_ms: Option<u64>,
) -> Result<Decision, u64> {
    let held_usage: Option<Usage> = seen
        .recorded
        .as_deref()
        .and_then(|u| serde_json::from_str(u).ok());
    let state = StateSeen {
        counts: seen.counts,
        budget: seen.budget,
        held_usage,
        approved_hold: seen.approved.as_deref(),
        lease: seen.lease.as_deref(),
        // The scope carries cache points only where the key's policy lets the gate place.
        cache_memory: (!seen.cache_memory.is_empty()).then_some(&seen.cache_memory[..]),
        session_cache: seen.session_cache,
        prefix_rate: seen.prefix_rate,
        prefix_shared: seen.prefix_shared,
    };
    let policy = core.policy.load();
    let mut decision = decide_seen(&policy, req, &state, paced_ms, seen.now_ms)?;
    decision.seq = seen.seq;
    Ok(decision)
}
