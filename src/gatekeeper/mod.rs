//! The gatekeeper: the gate's parts ([`gate_core`]: policy, signer, metrics, the requests held
//! now) over the home of its state ([`backing`]): this process's memory and SQLite
//! ([`local`]) or a fleet's PostgreSQL ([`fleet`]). Both homes decide with the same pure
//! function ([`gate_core::decide_seen`]), so the proxy (request mode) and `POST /gate` (digest
//! mode) cannot drift apart, whichever home they are served from.

mod backing;
mod booking;
pub mod fleet;
pub mod gate_core;
mod homes;
pub mod local;
pub mod recent;
mod relays;
pub mod remote;
mod reservations;
pub mod settlement;
mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::config::{BudgetPeriod, CachePolicy, Config, KeyConfig};
use crate::gatekeeper::fleet::spool::Spool;
use crate::receipt::{DecisionId, Envelope, ReceiptSigner};
use crate::store::postgres::Fleet;
use crate::store::{period_start, HoldRow, HoldState, LeaseRow, Store, StoreError, UsageRow};
pub use gate_core::GateCore;
pub use local::Local;
pub use relays::Relaying;
use reservations::Reservations;
use tokensaver_core::gate::cache::{PointMemory, SessionCache};
use tokensaver_core::gate::{BudgetState, Decision, GateInput, Policy, Usage, Windows};
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

/// The gate's state could not be read or written (a fleet's database did not answer): the
/// caller fails closed — a 503 with `Retry-After`, nothing forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the gate's shared store is unreachable")]
pub struct Unavailable;

/// Why a request that could be held got no decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The gate's state could not be read or written: fail closed, nothing forwarded.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The caller left while its request was held: nothing was decided, reserved or charged.
    #[error("the caller left while its request was held")]
    CallerGone,
    /// Digest mode: the central gate did not decide (unreachable, or its answer was not one).
    #[error("the central gate could not be reached")]
    GateUnreachable,
}

/// Where a settled report went.
#[derive(Debug)]
pub enum Settled {
    /// This gate's ledger keeps it: its row.
    Here(Box<UsageRow>),
    /// Digest mode: the central gate settles it; the report is on its way there.
    Sent,
}

/// Why a budget could not be set: the shared store did not answer, or this node's did not.
#[derive(Debug, thiserror::Error)]
pub enum SetBudgetError {
    #[error(transparent)]
    Shared(#[from] Unavailable),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Open holds and running attending leases, as of the home's clock.
pub struct HoldList {
    pub now_ms: u64,
    pub holds: Vec<HoldView>,
    pub leases: Vec<LeaseView>,
}

/// The home a gatekeeper was built with ([`backing`]).
enum Home {
    Local(Box<Local>),
    Fleet(Box<fleet::Shared>),
    Remote(Box<remote::Remote>),
}

/// The gate: its own parts ([`GateCore`]: policy, signer, metrics, recent receipts, the
/// requests held now), the answers being relayed, and the home of its state. Every call on
/// the state is one [`backing::Backing`] call on that home, given the core.
pub struct Gatekeeper {
    pub core: GateCore,
    /// The answers being relayed now: the tick keeps their reservations live ([`relays`]).
    relays: relays::Relays,
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
        let core = GateCore::new(config, policy, signer);
        let local = Local::rebuild(&core, store, &snapshot);
        Ok(Self {
            core,
            relays: relays::Relays::default(),
            home: Home::Local(Box::new(local)),
        })
    }

    /// Make this gatekeeper an instance of a fleet: admissions, settles and expiry go to the
    /// fleet's database; usage it cannot write is spooled in the data dir. This process's own
    /// state stays as the fleet's local mirror (the config's budgets and a `PUT` this node saw).
    pub fn with_fleet(self, fleet: Fleet) -> Self {
        let Home::Local(mirror) = self.home else {
            return self;
        };
        let spool = Spool::new(&self.core.config.data_dir);
        Self {
            home: Home::Fleet(Box::new(fleet::Shared::new(fleet, spool, *mirror))),
            ..self
        }
    }

    /// Make this instance a digest-mode client of a central gate (SPEC §1.2): decisions are
    /// asked of it with the digest; answers stay in this process's own store. `Err`: the key
    /// it was given is not a tokensaver key.
    pub fn with_remote(self, gate: remote::client::RemoteGate) -> anyhow::Result<Self> {
        let Home::Local(mirror) = self.home else {
            anyhow::bail!("a digest client keeps its state in its own local store");
        };
        let remote = remote::Remote::new(gate, *mirror).ok_or_else(|| {
            anyhow::anyhow!("the gate key is not a tokensaver key (tsk_<id>_<secret>)")
        })?;
        Ok(Self {
            home: Home::Remote(Box::new(remote)),
            ..self
        })
    }

    /// This process's own state: the embedded home, a fleet instance's local mirror, or a
    /// digest client's own store.
    pub fn local(&self) -> &Local {
        match &self.home {
            Home::Local(local) => local,
            Home::Fleet(shared) => shared.mirror(),
            Home::Remote(remote) => remote.mirror(),
        }
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.core.policy()
    }
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
