//! The gate's own parts, which no home of its state owns: the configuration and the policy in
//! force, the receipt signer, the metrics, the latest receipts, and the requests held now.
//! Every home ([`super::local`], [`super::fleet`]) decides through [`decide_seen`] and holds
//! a request through [`GateCore::hold_until_decided`], given this core; none of them reaches
//! back into the [`super::Gatekeeper`] that owns it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::{lock, recent, GateOutcome, GateRequest, Holding};
use super::{AdmitError, Unavailable};
use crate::config::{CachePolicy, Config, Prices};
use crate::metrics::Metrics;
use crate::receipt::{DecisionId, Envelope, ReceiptSigner};
use crate::store::HoldOpening;
use tokensaver_core::gate::cache::{LifetimePolicy, PointMemory, SessionCache};
use tokensaver_core::gate::{
    decide_paced, decide_with, Approvals, BudgetState, CacheTerms, Decision, KeyState, Mechanism,
    Outcome, Policy, Usage, WindowCounts,
};
use tokensaver_core::request::Hash;

pub struct GateCore {
    pub config: Arc<Config>,
    /// Read by every decision, replaced whole by `PUT /prices`: readers never wait, and no
    /// lock order ties it to a home's state lock.
    pub(super) policy: ArcSwap<Policy>,
    pub signer: ReceiptSigner,
    pub metrics: Metrics,
    /// The latest committed decisions' receipts, for the ledger page.
    pub(super) recent: Mutex<recent::RecentReceipts>,
    /// The repeated steps held now ([`GateCore::hold_until_decided`]).
    paced: Mutex<PacedLoad>,
}

impl GateCore {
    pub(super) fn new(config: Config, policy: Policy, signer: ReceiptSigner) -> GateCore {
        GateCore {
            config: Arc::new(config),
            policy: ArcSwap::from_pointee(policy),
            signer,
            metrics: Metrics::new(),
            recent: Mutex::new(recent::RecentReceipts::default()),
            paced: Mutex::new(PacedLoad::default()),
        }
    }

    /// `PUT /prices` in the policy every later decision reads (the home keeps them).
    pub(super) fn set_prices(&self, prices: &BTreeMap<String, Prices>) {
        self.policy.rcu(|current| {
            let mut next = Policy::clone(current);
            for (model, price) in prices {
                next.prices.insert(model.clone(), *price);
            }
            next
        });
    }

    /// A committed decision's receipt joins the recent ones, and its time the metric.
    pub(super) fn note_committed(
        &self,
        decision_id: DecisionId,
        key_id: &Arc<str>,
        envelope: &Arc<Envelope>,
        started: std::time::Instant,
    ) {
        lock(&self.recent).push(decision_id, Arc::clone(key_id), Arc::clone(envelope));
        self.metrics
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
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

    pub(super) fn count(&self, d: &Decision) {
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

    /// The price of `model` under the policy in force (`None`: it has none).
    pub(super) fn price_of(&self, model: &str) -> Option<crate::config::Prices> {
        self.policy.load().prices.get(model).copied()
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }
}

/// What a decision reads of a key's state, wherever that state lives.
pub(super) struct StateSeen<'s> {
    pub counts: WindowCounts,
    pub budget: Option<BudgetState>,
    /// The usage recorded for the answer held in the request's wire form.
    pub held_usage: Option<Usage>,
    /// An approved hold that releases this request.
    pub approved_hold: Option<&'s str>,
    /// The hold whose approval granted the key an attending lease running now.
    pub lease: Option<&'s str>,
    /// The key's memory of the request's prompt prefixes, when the gate may place cache
    /// breakpoints for it (`None`: it may not).
    pub cache_memory: Option<&'s [PointMemory]>,
    /// What the gate keeps of the request's session, its route prefix's rate, and whether
    /// another session made any of those calls.
    pub session_cache: SessionCache,
    pub prefix_rate: u64,
    pub prefix_shared: bool,
}

/// The pure decision over what a home's state says of the request: one reading for the
/// embedded home and the fleet. `paced_ms`: the caller can hold the request and has held it
/// this long (`Err(until)`: hold it until then).
pub(super) fn decide_seen(
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
    let without = req.key.without;
    if let Some(memory) = seen
        .cache_memory
        .filter(|_| !without.has(Mechanism::Breakpoints))
    {
        decision.place_cache(req.shape, memory, now_ms);
    }
    let on = req.key.cache == CachePolicy::Auto;
    let served = decision.model_served.as_deref().unwrap_or(&req.shape.model);
    let terms = CacheTerms {
        lifetime: if on && !without.has(Mechanism::Lifetimes) {
            req.key.cache_ttl
        } else {
            LifetimePolicy::FiveMinutes
        },
        routing: on && !without.has(Mechanism::Routing),
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
pub(super) fn reopen(signer: &ReceiptSigner, opening: &HoldOpening) -> Option<Arc<GateOutcome>> {
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
pub(super) fn fingerprint_prefix(fingerprint: Option<&Hash>) -> String {
    fingerprint.map(|f| f.hex_prefix(16)).unwrap_or_default()
}

/// One attempt at deciding a request that may be held ([`GateCore::hold_until_decided`]).
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

/// The requests held now: per key, and their bytes in all (`[limits] max_paced_*`).
#[derive(Default)]
struct PacedLoad {
    per_key: HashMap<Arc<str>, usize>,
    bytes: usize,
}

/// A request held in the gate: counted in `tokensaver_paced_waiting` and in the caps until it
/// is decided or its caller goes.
struct PacedGuard<'g> {
    core: &'g GateCore,
    key_id: Arc<str>,
    bytes: usize,
}

impl<'g> PacedGuard<'g> {
    /// Hold one more request of `key_id`, unless a cap is reached.
    fn take(core: &'g GateCore, key_id: &Arc<str>, bytes: usize) -> Option<Self> {
        let mut load = lock(&core.paced);
        let of_key = load.per_key.get(key_id).copied().unwrap_or(0);
        if of_key >= core.config.max_paced_per_key
            || load.bytes.saturating_add(bytes) > core.config.max_paced_bytes
        {
            return None;
        }
        load.per_key.insert(Arc::clone(key_id), of_key + 1);
        load.bytes = load.bytes.saturating_add(bytes);
        drop(load);
        core.metrics.paced_waiting.inc();
        Some(Self {
            core,
            key_id: Arc::clone(key_id),
            bytes,
        })
    }
}

impl Drop for PacedGuard<'_> {
    fn drop(&mut self) {
        let mut load = lock(&self.core.paced);
        load.bytes = load.bytes.saturating_sub(self.bytes);
        if let Some(n) = load.per_key.get_mut(&self.key_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                load.per_key.remove(&self.key_id);
            }
        }
        drop(load);
        self.core.metrics.paced_waiting.dec();
    }
}
