//! A fleet of gate instances on one PostgreSQL (`[store] kind = "postgres"`): the database is
//! the one source of truth for budgets, reservations and the runaway windows, so two instances
//! behind a load balancer decide exactly as one would.
//!
//! - *admit* ([`Fleet::admit`]): one READ COMMITTED transaction — lock the key's row, count the
//!   windows from the shared decisions, read spend and reservations, decide (the pure
//!   [`tokensaver_core::gate::decide_with`], called by the caller's closure), record the decision, and
//!   reserve the worst case with a conditional insert (`spent + reserved + worst <= ceiling`).
//! - *settle* ([`Fleet::settle`]): delete the reservation and insert the usage in one
//!   transaction, idempotent by decision (reservation) id.
//! - *expiry* ([`Fleet::expire`]): one statement any instance may run at any time, with the
//!   database's clock; an expired reservation is charged its worst case.
//!
//! When the database cannot be reached every call fails with [`FleetError::Unavailable`] and
//! the callers fail closed (503); usage that could not be written goes to the fleet home's
//! spool (`gatekeeper::fleet::spool`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, NoTls};

use crate::config::{BudgetPeriod, FleetConfig};
use crate::receipt::DecisionId;
use crate::store::booking::Booking;
use crate::store::ledger::{DecisionSums, LedgerFold, Settlement, UsageSums};
use crate::store::{
    period_start, DecisionLine, DecisionListing, DecisionPage, DecisionQuery, DecisionRow,
    LedgerDay, LedgerTotals, RecordSource, ResponseBinding, StoreError, UsageRow, VerdictCount,
};
use tokensaver_core::gate::cache::{CacheEdits, PointMemory, SessionCache, CACHE_TTL_MS};
use tokensaver_core::gate::windows::Run;
use tokensaver_core::gate::windows::{SessionSteps, NOVELTY_WINDOW_MS, REPEAT_WINDOW_MS};
use tokensaver_core::gate::{BudgetState, StepLimits, Verdict, WindowCounts, WindowLengths};
use tokensaver_core::request::{CachePoint, Hash, WireForm};

/// The schema, in order; each applied once, recorded in `schema_migrations`.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../../../migrations/pg/0001_fleet.sql")),
    (
        2,
        include_str!("../../../migrations/pg/0002_holds_answers.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/pg/0003_fleet_budgets.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/pg/0004_recorded_by.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/pg/0005_fleet_responses.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/pg/0006_fleet_cache.sql"),
    ),
    (7, include_str!("../../../migrations/pg/0007_hostile2.sql")),
    (8, include_str!("../../../migrations/pg/0008_step_runs.sql")),
    (
        9,
        include_str!("../../../migrations/pg/0009_cache_terms.sql"),
    ),
    (
        10,
        include_str!("../../../migrations/pg/0010_route_sessions.sql"),
    ),
    (
        11,
        include_str!("../../../migrations/pg/0011_step_actions.sql"),
    ),
    (
        12,
        include_str!("../../../migrations/pg/0012_recorded_age.sql"),
    ),
];

/// Taken while migrating, so instances starting together apply each migration once.
const MIGRATION_LOCK: i64 = 0x746f_6b65_6e73_6176;

/// How long one admission, settle or sweep may take before it counts as the database being
/// unreachable (the caller answers 503 rather than hold the client).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait for a connection (a stopped server refuses at once; a partitioned one
/// does not).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a stored answer stays servable in the fleet (the in-memory store has no age
/// bound; a shared table needs one): the repeat window, one day.
const ANSWER_TTL_MS: u64 = 86_400_000;
/// How long a recorded usage makes an answer servable: as long as answers are kept (the
/// in-memory home's `RecordedUsage::TTL_MS`).
const RECORDED_TTL_MS: u64 = ANSWER_TTL_MS;
/// An answer lookup that takes longer counts as a miss: the request is decided without it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// `work` within `limit`; past it the database counts as unreachable.
async fn within<T, E: From<FleetError>>(
    limit: Duration,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or(Err(E::from(FleetError::Unavailable)))
}

/// The database's clock in unix milliseconds.
const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    #[error("the fleet database is unreachable")]
    Unavailable,
    /// The conditional reservation found less budget left than the decision read under the
    /// key's lock: never expected; the admission is rolled back rather than overshoot.
    #[error("the reservation would exceed the budget")]
    Overshoot,
}

impl From<tokio_postgres::Error> for FleetError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The SQLSTATE only: a database message may quote values.
        tracing::warn!(
            code = ?e.code().map(|c| c.code()),
            closed = e.is_closed(),
            "fleet database error"
        );
        FleetError::Unavailable
    }
}

impl From<deadpool_postgres::PoolError> for FleetError {
    fn from(_: deadpool_postgres::PoolError) -> Self {
        tracing::warn!("fleet database: no connection");
        FleetError::Unavailable
    }
}

/// Why a settle did not book usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleError {
    /// No open reservation with this id for this key and wire form, and no usage either.
    Unknown,
    /// The decision is already settled (or expired and charged).
    AlreadySettled,
    /// The reservation names another served model.
    ModelMismatch,
    /// A digest client's usage exceeds what the decision could have been billed.
    ExceedsDecision,
    Fleet(FleetError),
}

impl From<FleetError> for SettleError {
    fn from(e: FleetError) -> Self {
        SettleError::Fleet(e)
    }
}

impl From<tokio_postgres::Error> for SettleError {
    fn from(e: tokio_postgres::Error) -> Self {
        SettleError::Fleet(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for SettleError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        SettleError::Fleet(e.into())
    }
}

/// What an admission reads under the key's lock, for the decision.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The decision time: the database's clock, never behind the key's latest decision.
    pub now_ms: u64,
    /// The decision's place among the key's decisions in that millisecond (`Decision::seq`).
    pub seq: u32,
    pub counts: WindowCounts,
    /// `None` when the key has no ceiling.
    pub budget: Option<BudgetState>,
    /// The key's pending hold for this request, if one is open: a re-send gets its opening.
    pub pending: Option<PendingHold>,
    /// The approved, unexpired hold that releases this request (the named one first).
    pub approved: Option<String>,
    /// The key's attending lease that runs now (its hold id).
    pub lease: Option<String>,
    /// The recorded usage (JSON) of the answer to this request, if one was recorded.
    pub recorded: Option<String>,
    /// What the fleet remembers of each of the scope's cache points, in their order (empty
    /// when the scope names none).
    pub cache_memory: Vec<PointMemory>,
    /// What the fleet keeps of the request's session, its route prefix's rate, and whether
    /// another session made any of those calls.
    pub session_cache: SessionCache,
    pub prefix_rate: u64,
    pub prefix_shared: bool,
}

/// A pending hold's opening, as the admission that opened it stored it.
#[derive(Debug, Clone)]
pub struct PendingHold {
    pub hold_id: String,
    /// The CHALLENGE decision as JSON; `None` if it was not kept.
    pub decision: Option<String>,
    pub receipt: Option<Vec<u8>>,
}

/// A key's budget as admission reads it.
#[derive(Debug, Clone, Copy)]
pub struct KeyLimit {
    pub ceiling_nano: Option<u64>,
    pub period: BudgetPeriod,
}

/// The request an admission decides: whose, which, and the key's budget.
#[derive(Debug, Clone, Copy)]
pub struct AdmitScope<'a> {
    pub key_id: &'a str,
    pub fingerprint: &'a Hash,
    pub step: &'a Hash,
    /// The step's action (its calls without their results), if it has tool calls.
    pub action: Option<&'a Hash>,
    pub model: &'a str,
    pub limit: KeyLimit,
    pub wire: WireForm,
    /// The hold the request names (`x-tokensaver-hold`, the digest's `hold_id`).
    pub named_hold: Option<&'a str>,
    /// The request's cache points when the gate may place breakpoints for it (else empty).
    pub cache_points: &'a [CachePoint],
    /// The agent session it belongs to (its progress ends a run of repeated steps; its
    /// pauses decide cache lifetimes).
    pub session: &'a Hash,
    /// OpenAI: its route prefix (its rate picks a routing key).
    pub route_prefix: Option<&'a Hash>,
}

/// An open reservation, as settling reads it back.
#[derive(Debug, Clone)]
pub struct OpenReservation {
    pub nano: u64,
    pub output_ceiling: Option<u64>,
    pub fingerprint: Option<Hash>,
    pub reusable: bool,
    pub input_tokens: u64,
    /// What the gate did to the call's caching: its usage carries those mechanisms' savings.
    pub cache_edits: CacheEdits,
    /// The call's agent session (its usage feeds the session's cache figures).
    pub session: Option<Hash>,
}

/// A hold decision that did not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldRefusal {
    Unknown,
    Expired,
    NotPending,
}

/// A hold approved or denied in the fleet.
#[derive(Debug, Clone)]
pub struct DecidedHold {
    pub key_id: String,
    pub expires_ms: u64,
    pub attending_until_ms: Option<u64>,
}

/// A pending or approved hold as the fleet lists it.
#[derive(Debug, Clone)]
pub struct ListedHold {
    pub hold_id: String,
    pub key_id: String,
    pub approved: bool,
    pub reason: Option<String>,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub worst_case_tokens: u64,
    /// `None`: blanked, or not readable as a fingerprint.
    pub fingerprint: Option<Hash>,
}

/// A key's budget figures at one instant (one statement, one snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetSample {
    pub spend_nano: u64,
    pub reserved_nano: u64,
}

/// The TTLs and bounds a fleet instance applies (from `[limits]`; every instance of a fleet
/// should share them).
#[derive(Debug, Clone, Copy)]
pub struct FleetLimits {
    pub reservation_ttl_ms: u64,
    pub hold_ttl_ms: u64,
    pub answer_store_bytes: u64,
    /// `[gate.windows]`: the lengths the fleet's SQL counts in, as the in-memory windows.
    pub windows: WindowLengths,
    /// `[gate.steps]`: the schedule of repeated steps, as on one node.
    pub steps: StepLimits,
}

impl FleetLimits {
    pub fn from_config(config: &crate::config::Config) -> FleetLimits {
        FleetLimits {
            reservation_ttl_ms: config.reservation_ttl_ms,
            hold_ttl_ms: config.hold_ttl_ms,
            answer_store_bytes: config.answer_store_bytes as u64,
            windows: config.policy().gate.windows,
            steps: config.policy().gate.steps,
        }
    }
}

pub struct Fleet {
    pool: Pool,
    statements: Statements,
    /// The schedule of repeated steps (a run's continuation is judged here, as on one node).
    steps: StepLimits,
    /// The loop window's length: a forget keeps the fingerprints the loop rules still count.
    loop_ms: u64,
    reservation_ttl_ms: u64,
    hold_ttl_ms: u64,
    answer_store_bytes: u64,
    queues: KeyQueues,
}

/// How long an admission may wait for its key's earlier admissions in this process.
const KEY_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// Admissions of one key wait their turn here, in this process, before they take a pool
/// connection and the key's row lock. A burst on one key then holds one connection per
/// instance instead of the whole pool (other keys keep being admitted), and the database's
/// timeout measures the database rather than the queue in front of it. FIFO: tokio's mutex
/// is fair.
#[derive(Default)]
struct KeyQueues(std::sync::Mutex<HashMap<String, Queue>>);

type Queue = Arc<tokio::sync::Mutex<()>>;

/// One admission's turn on its key; the key's queue is dropped with its last waiter.
struct KeyTurn<'a> {
    queues: &'a KeyQueues,
    key_id: &'a str,
    queue: Queue,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl KeyQueues {
    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<String, Queue>> {
        // Nothing panics while holding it; a poisoned map is still a valid map.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn turn<'a>(&'a self, key_id: &'a str) -> Result<KeyTurn<'a>, FleetError> {
        let queue = self.queues().entry(key_id.to_string()).or_default().clone();
        let mut turn = KeyTurn {
            queues: self,
            key_id,
            queue: queue.clone(),
            guard: None,
        };
        // A turn not granted in time is dropped (and leaves the queue) like a granted one.
        let guard = tokio::time::timeout(KEY_QUEUE_TIMEOUT, queue.lock_owned())
            .await
            .map_err(|_| FleetError::Unavailable)?;
        turn.guard = Some(guard);
        Ok(turn)
    }
}

impl Drop for KeyTurn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut queues = self.queues.queues();
        // The map's handle and this one: nobody else waits (clones are made under the map's
        // lock, which is held here).
        if Arc::strong_count(&self.queue) == 2 {
            queues.remove(self.key_id);
        }
    }
}

fn db(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A read the ledger could not make: logged by its SQLSTATE (as [`FleetError`] does).
fn read_failed(e: tokio_postgres::Error) -> StoreError {
    let _logged = FleetError::from(e);
    StoreError::Unavailable
}

fn un(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Fleet {
    /// Apply the migrations (one connection, under an advisory lock) and build the pool. The
    /// pool connects lazily, on the runtime of whichever task asks first.
    pub async fn connect(config: &FleetConfig, limits: FleetLimits) -> anyhow::Result<Fleet> {
        let mut pg: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(|_| anyhow::anyhow!("store.url: not a PostgreSQL connection URL"))?;
        pg.connect_timeout(CONNECT_TIMEOUT);
        pg.application_name("tokensaver");
        migrate(&pg).await?;
        let manager = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                // A connection the server closed reports itself closed; that check is enough.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.max_connections)
            .wait_timeout(Some(CALL_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|_| anyhow::anyhow!("fleet database: cannot build the connection pool"))?;
        Ok(Fleet {
            pool,
            statements: Statements::new(&limits.windows, &limits.steps),
            steps: limits.steps,
            loop_ms: limits.windows.loop_secs * 1_000,
            reservation_ttl_ms: limits.reservation_ttl_ms,
            hold_ttl_ms: limits.hold_ttl_ms,
            answer_store_bytes: limits.answer_store_bytes,
            queues: KeyQueues::default(),
        })
    }

    /// Admit one request: everything under the key's row lock, in one transaction.
    ///
    /// READ COMMITTED is enough because every write that can *raise* a key's
    /// `spent + reserved` — an admission's reservation — happens while holding that key's row
    /// lock, taken first. Each later statement of the transaction takes a fresh snapshot, so
    /// it sees every admission committed before the lock was granted; an admission still in
    /// flight elsewhere is waiting on the lock and has written nothing. Settles and expiry run
    /// without the lock, and they only move money from `reserved` to `spent` (at most the
    /// reservation, except when a provider reports more than the worst case) in one
    /// transaction: a statement sees either both halves or neither, so the sum it reads is
    /// never below the truth by more than what a settle released. The conditional insert
    /// re-checks the sum in the same statement that reserves, so even a bug upstream cannot
    /// overshoot; it rolls the admission back instead. SERIALIZABLE would add retries and
    /// abort storms under exactly the contention the lock already orders.
    pub async fn admit<T>(
        &self,
        request: AdmitScope<'_>,
        decide: impl FnOnce(Observed) -> (T, Option<Booking>),
    ) -> Result<T, FleetError> {
        let _turn = self.queues.turn(request.key_id).await?;
        within(CALL_TIMEOUT, self.admit_inner(request, decide)).await
    }

    async fn admit_inner<T>(
        &self,
        request: AdmitScope<'_>,
        decide: impl FnOnce(Observed) -> (T, Option<Booking>),
    ) -> Result<T, FleetError> {
        let AdmitScope {
            key_id,
            step,
            action,
            limit,
            ..
        } = request;
        let mut client = self.pool.get().await?;
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await?;
        // The upsert locks the key's row (an ON CONFLICT update locks like FOR UPDATE) and
        // moves its decision clock, read after the lock is granted.
        let lock = tx
            .prepare_cached(&format!(
                "INSERT INTO fleet_keys AS k (key_id, last_decided_ms, last_seq) \
                 VALUES ($1, {DB_NOW_MS}, 0) \
                 ON CONFLICT (key_id) DO UPDATE \
                 SET last_seq = CASE WHEN excluded.last_decided_ms > k.last_decided_ms THEN 0 \
                                     ELSE k.last_seq + 1 END, \
                     last_decided_ms = GREATEST(excluded.last_decided_ms, k.last_decided_ms) \
                 RETURNING last_decided_ms, budget_set, ceiling_nano, period, last_seq"
            ))
            .await?;
        let locked = tx.query_one(&lock, &[&key_id]).await?;
        let now: i64 = locked.get("last_decided_ms");
        let now_ms = un(now);
        let seq = u32::try_from(locked.get::<_, i32>("last_seq")).unwrap_or(u32::MAX);
        let limit = shared_limit(&locked).unwrap_or(limit);
        let since = db(period_start(limit.period, now_ms));
        let wire = request.wire.as_str();
        let read = &self.statements.admit_read;
        let values = read.values(&request.read_binds(&now, &since, &wire));
        let found = tx
            .query_one(&tx.prepare_cached(&read.sql).await?, &values)
            .await?;
        let counts = paced_counts(&found, step, action);
        let spend = un(found.get::<_, i64>("spend_nano"));
        let reserved = un(found.get::<_, i64>("reserved_nano"));
        let budget = limit.ceiling_nano.map(|ceiling| BudgetState {
            ceiling_nano: ceiling,
            spend_nano: spend,
            reserved_nano: reserved,
        });
        let pending = match found.get::<_, Option<String>>("pending_hold") {
            Some(hold_id) => {
                let opening = tx
                    .query_one(
                        "SELECT opening_decision, opening_receipt FROM fleet_holds \
                         WHERE hold_id = $1",
                        &[&hold_id],
                    )
                    .await?;
                Some(PendingHold {
                    hold_id,
                    decision: opening.get("opening_decision"),
                    receipt: opening.get("opening_receipt"),
                })
            }
            None => None,
        };
        let cache_memory = cache_memory(&tx, key_id, request.cache_points).await?;
        let (session_cache, prefix_rate, prefix_shared) = cache_terms_from(&found);
        let (out, booking) = decide(Observed {
            now_ms,
            seq,
            counts,
            budget,
            pending,
            approved: found.get("approved_hold"),
            lease: found.get("lease_hold"),
            recorded: found.get("recorded_usage"),
            cache_memory,
            session_cache,
            prefix_rate,
            prefix_shared,
        });
        let Some(booking) = booking else {
            // A re-send of a pending hold: nothing is booked (the clock's move is harmless).
            tx.commit().await?;
            return Ok(out);
        };

        if let Some(id) = &booking.used_hold {
            // Under the key's lock nobody else can use it; only expiry could have closed it.
            let used = tx
                .execute(
                    "UPDATE fleet_holds SET state = 'used' WHERE hold_id = $1 AND state = 'approved'",
                    &[id],
                )
                .await?;
            if used != 1 {
                tx.rollback().await?;
                return Err(FleetError::Unavailable);
            }
        }
        if let Some(h) = &booking.new_hold {
            tx.execute(
                "INSERT INTO fleet_holds (hold_id, key_id, fingerprint, created_ms, expires_ms, \
                 state, worst_case_tokens, reason, opening_decision, opening_receipt) \
                 VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7, $8, $9) \
                 ON CONFLICT (hold_id) DO NOTHING",
                &[
                    &h.hold_id,
                    &key_id,
                    &h.fingerprint,
                    &now,
                    &db(now_ms.saturating_add(self.hold_ttl_ms)),
                    &db(h.worst_case_tokens),
                    &h.reason,
                    &h.opening_decision,
                    &h.opening_receipt,
                ],
            )
            .await?;
        }
        // The writes below are independent of each other. Sent together they pipeline on
        // the connection: one round trip while the key's lock is held instead of one each,
        // which is what a burst on one key queues behind.
        let paced = booking.row.verdict != tokensaver_core::gate::Verdict::Serve;
        let step_writes = async {
            if !paced {
                return Ok::<_, FleetError>(());
            }
            // The step's run and the session's latest step, as the in-memory windows keep
            // them (`Windows::record_session`): judged from the request's arrival.
            let arrival = now_ms.saturating_sub(booking.row.paced_ms);
            let continued = Run::continued(counts.run(), counts.run_broken, arrival, &self.steps);
            let run = Run::after(continued, now_ms);
            let (steps, first, last) = (db(run.steps), db(run.first_ms), db(run.last_ms));
            let (run_stmt, session_stmt) = tokio::try_join!(
                tx.prepare_cached(UPSERT_STEP_RUN),
                tx.prepare_cached(UPSERT_SESSION_STEP)
            )?;
            let run_params: [&(dyn ToSql + Sync); 5] = [&key_id, step, &steps, &first, &last];
            let session_params: [&(dyn ToSql + Sync); 5] =
                [&key_id, request.session, step, &action, &now];
            tokio::try_join!(
                tx.execute(&run_stmt, &run_params),
                tx.execute(&session_stmt, &session_params),
            )?;
            Ok(())
        };
        let cache_writes = async {
            if !booking.sent_prefixes {
                return Ok::<_, FleetError>(());
            }
            // The session's figures and the prefix's rate, as one node keeps them
            // (`SessionCache::forwarded`).
            let next = session_cache
                .forwarded(now_ms, booking.row.cache_edits.has(CacheEdits::AFTER_PAUSE));
            let figures = [
                next.last_ms.map(db),
                Some(db(next.calls)),
                Some(db(next.pauses)),
                Some(db(next.prompt_tokens)),
                Some(db(next.grown_tokens)),
            ];
            let session_stmt = tx.prepare_cached(UPSERT_SESSION_CACHE).await?;
            let session_params: [&(dyn ToSql + Sync); 7] = [
                &key_id,
                request.session,
                &figures[0],
                &figures[1],
                &figures[2],
                &figures[3],
                &figures[4],
            ];
            let session_write = tx.execute(&session_stmt, &session_params);
            let route_write = async {
                if let Some(prefix) = request.route_prefix {
                    let stmt = tx.prepare_cached(INSERT_ROUTE_TIME).await?;
                    tx.execute(&stmt, &[&key_id, prefix, &now, request.session])
                        .await?;
                }
                Ok::<_, FleetError>(())
            };
            let points_write = async {
                if !request.cache_points.is_empty() {
                    remember_cache_points(&tx, key_id, request.cache_points, &booking, now).await?;
                }
                Ok::<_, FleetError>(())
            };
            tokio::try_join!(
                async { session_write.await.map_err(FleetError::from) },
                route_write,
                points_write
            )?;
            Ok(())
        };
        let row = &booking.row;
        let columns = DecisionColumns::of(row)?;
        let decision = columns.binds(row, &key_id);
        // Whether the decision (and its reservation, if any) was written.
        let decision_write = async {
            match &booking.reservation {
                None => {
                    let insert = &self.statements.insert_decision;
                    let values = insert.values(&decision);
                    tx.execute(&tx.prepare_cached(&insert.sql).await?, &values)
                        .await?;
                    Ok::<_, FleetError>(true)
                }
                Some(r) => {
                    let ceiling = limit
                        .ceiling_nano
                        .filter(|_| !r.approved_past_budget)
                        .map(db);
                    let expires = db(now_ms.saturating_add(self.reservation_ttl_ms));
                    let (nano, wire) = (db(r.nano), r.wire.as_str());
                    let output_ceiling = r.output_ceiling.map(db);
                    let (input_tokens, recorded_by) = (db(r.input_tokens), r.recorded_by.as_str());
                    let cache_edits = i16::from(r.cache_edits.0);
                    let mut binds = decision.to_vec();
                    binds.extend_from_slice(&[
                        ("nano", &nano as &(dyn ToSql + Sync)),
                        ("expires_ms", &expires),
                        ("served_model", &r.served_model),
                        ("wire", &wire),
                        ("output_ceiling", &output_ceiling),
                        ("reservation_fingerprint", &r.fingerprint),
                        ("reusable", &r.reusable),
                        ("ceiling", &ceiling),
                        ("since", &since),
                        ("recorded_by", &recorded_by),
                        ("input_tokens", &input_tokens),
                        ("cache_edits", &cache_edits),
                        ("session", &r.session),
                    ]);
                    let reserve = &self.statements.decide_and_reserve;
                    let values = reserve.values(&binds);
                    let stmt = tx.prepare_cached(&reserve.sql).await?;
                    Ok(tx.execute(&stmt, &values).await? == 1)
                }
            }
        };
        let ((), (), written) = tokio::try_join!(step_writes, cache_writes, decision_write)?;
        if !written {
            tx.rollback().await?;
            return Err(FleetError::Overshoot);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Settle a forwarded decision: take its reservation and book what `charge` makes of it,
    /// in one transaction; idempotent by decision id (a second settle, or one after expiry,
    /// finds no reservation and a usage row).
    pub async fn settle(
        &self,
        decision_id: &DecisionId,
        key_id: &str,
        wire: WireForm,
        served_model: &str,
        recorded_by: RecordSource,
        charge: impl FnOnce(&OpenReservation, u64) -> Result<(UsageRow, Option<String>), SettleError>,
    ) -> Result<UsageRow, SettleError> {
        within(
            CALL_TIMEOUT,
            self.settle_inner(decision_id, key_id, wire, served_model, recorded_by, charge),
        )
        .await
    }

    async fn settle_inner(
        &self,
        decision_id: &DecisionId,
        key_id: &str,
        wire: WireForm,
        served_model: &str,
        recorded_by: RecordSource,
        charge: impl FnOnce(&OpenReservation, u64) -> Result<(UsageRow, Option<String>), SettleError>,
    ) -> Result<UsageRow, SettleError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let take = tx
            .prepare_cached(&format!(
                "DELETE FROM fleet_reservations \
                 WHERE decision_id = $1 AND key_id = $2 AND wire = $3 AND served_model = $4 \
                   AND recorded_by = $5 \
                 RETURNING nano, output_ceiling, fingerprint, reusable, {DB_NOW_MS} AS now_ms, \
                           input_tokens, cache_edits, session"
            ))
            .await?;
        let taken = tx
            .query_opt(
                &take,
                &[
                    decision_id,
                    &key_id,
                    &wire.as_str(),
                    &served_model,
                    &recorded_by.as_str(),
                ],
            )
            .await?;
        let Some(taken) = taken else {
            let why = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM fleet_reservations \
                                    WHERE decision_id = $1 AND key_id = $2 AND wire = $3 \
                                      AND recorded_by = $4) AS model_differs, \
                            EXISTS (SELECT 1 FROM fleet_usage WHERE decision_id = $1) AS settled",
                    &[decision_id, &key_id, &wire.as_str(), &recorded_by.as_str()],
                )
                .await?;
            return Err(if why.get::<_, bool>("model_differs") {
                SettleError::ModelMismatch
            } else if why.get::<_, bool>("settled") {
                SettleError::AlreadySettled
            } else {
                SettleError::Unknown
            });
        };
        let reservation = OpenReservation {
            nano: un(taken.get::<_, i64>("nano")),
            output_ceiling: taken.get::<_, Option<i64>>("output_ceiling").map(un),
            // A stored fingerprint that does not read as one is no fingerprint.
            fingerprint: taken
                .try_get::<_, Option<Hash>>("fingerprint")
                .ok()
                .flatten(),
            reusable: taken.get("reusable"),
            input_tokens: un(taken.get::<_, i64>("input_tokens")),
            cache_edits: CacheEdits(u8::try_from(taken.get::<_, i16>("cache_edits")).unwrap_or(0)),
            session: taken.try_get::<_, Option<Hash>>("session").ok().flatten(),
        };
        let at_ms = un(taken.get::<_, i64>("now_ms"));
        // An error leaves with the transaction unfinished: the reservation stays.
        let (row, recorded) = charge(&reservation, at_ms)?;
        if let Some(usage) = recorded {
            let fingerprint: &str = taken.get("fingerprint");
            tx.execute(
                "INSERT INTO fleet_recorded (key_id, fingerprint, wire, usage, at_ms) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (key_id, fingerprint, wire) \
                 DO UPDATE SET usage = EXCLUDED.usage, at_ms = EXCLUDED.at_ms",
                &[&key_id, &fingerprint, &wire.as_str(), &usage, &db(at_ms)],
            )
            .await?;
        }
        if let (Some(session), true) = (&reservation.session, row.complete) {
            // The session's figures, as one node keeps them (`SessionCache::settled`).
            let u = &row.usage;
            let prompt = u
                .input
                .saturating_add(u.cache_write)
                .saturating_add(u.cache_read);
            tx.execute(
                "UPDATE fleet_session_cache SET prompt_tokens = $3, grown_tokens = grown_tokens \
                 + CASE WHEN prompt_tokens > 0 THEN GREATEST($3 - prompt_tokens, 0) ELSE 0 END \
                 WHERE key_id = $1 AND session = $2",
                &[&key_id, session, &db(prompt)],
            )
            .await?;
        }
        let row_json = serde_json::to_string(&row).map_err(|_| FleetError::Unavailable)?;
        let book = tx
            .prepare_cached(
                "INSERT INTO fleet_usage (decision_id, key_id, at_ms, spend_nano, kind, row_json) \
                 VALUES ($1, $2, $3, $4, 'usage', $5)",
            )
            .await?;
        tx.execute(
            &book,
            &[
                decision_id,
                &key_id,
                &db(at_ms),
                &db(row.spend_nano),
                &row_json,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Extend an open reservation to a TTL from now (the database's clock, as expiry reads
    /// it): its answer is still being relayed. A settled or expired one is left as it is.
    pub async fn renew(&self, decision_id: &DecisionId) -> Result<(), FleetError> {
        let ttl_ms = db(self.reservation_ttl_ms);
        let renew = async {
            let client = self.pool.get().await?;
            let stmt = client
                .prepare_cached(&format!(
                    "UPDATE fleet_reservations \
                     SET expires_ms = GREATEST(expires_ms, {DB_NOW_MS} + $2::bigint) \
                     WHERE decision_id = $1"
                ))
                .await?;
            client.execute(&stmt, &[decision_id, &ttl_ms]).await?;
            Ok(())
        };
        within(CALL_TIMEOUT, renew).await
    }

    /// Renew a digest client's own open reservation (`POST /renew`): whether there was one.
    pub async fn renew_for_digest(
        &self,
        key_id: &str,
        decision_id: &DecisionId,
    ) -> Result<bool, FleetError> {
        let ttl_ms = db(self.reservation_ttl_ms);
        let renew = async {
            let client = self.pool.get().await?;
            let stmt = client
                .prepare_cached(&format!(
                    "UPDATE fleet_reservations \
                     SET expires_ms = GREATEST(expires_ms, {DB_NOW_MS} + $2::bigint) \
                     WHERE decision_id = $1 AND key_id = $3 AND recorded_by = 'digest'"
                ))
                .await?;
            let n = client
                .execute(&stmt, &[decision_id, &ttl_ms, &key_id])
                .await?;
            Ok(n == 1)
        };
        within(CALL_TIMEOUT, renew).await
    }

    /// Charge every reservation past its TTL (the database's clock) at its worst case. Safe to
    /// run from every instance at once: the DELETE takes each row once, and the charge is
    /// written by the same statement. Returns how many were charged.
    pub async fn expire(&self) -> Result<u64, FleetError> {
        let sweep = async {
            let client = self.pool.get().await?;
            let stmt = client
                .prepare_cached(&format!(
                    "WITH now AS (SELECT {DB_NOW_MS} AS ms), \
                     gone AS (DELETE FROM fleet_reservations \
                              WHERE expires_ms <= (SELECT ms FROM now) \
                              RETURNING decision_id, key_id, nano) \
                     INSERT INTO fleet_usage (decision_id, key_id, at_ms, spend_nano, kind) \
                     SELECT decision_id, key_id, (SELECT ms FROM now), nano, 'expired' FROM gone \
                     ON CONFLICT (decision_id) DO NOTHING"
                ))
                .await?;
            let charged = client.execute(&stmt, &[]).await?;
            client
                .execute(
                    &format!(
                        "UPDATE fleet_holds SET state = 'expired' \
                         WHERE state IN ('pending', 'approved') AND expires_ms <= {DB_NOW_MS}"
                    ),
                    &[],
                )
                .await?;
            // Cache points past the cache's lifetime place nothing any more.
            client
                .execute(
                    &format!(
                        "DELETE FROM fleet_cache_points WHERE seen_ms <= {DB_NOW_MS} - $1::bigint"
                    ),
                    &[&db(CACHE_TTL_MS)],
                )
                .await?;
            // A run silent for the longest hold has ended; a session's latest step is kept a
            // day (the in-memory windows keep the newest 4,096 per key).
            client
                .execute(
                    &format!(
                        "DELETE FROM fleet_step_runs WHERE last_ms <= {DB_NOW_MS} - $1::bigint"
                    ),
                    &[&db(self.steps.max_hold_ms())],
                )
                .await?;
            client
                .execute(
                    &format!(
                        "DELETE FROM fleet_session_steps WHERE at_ms <= {DB_NOW_MS} - $1::bigint"
                    ),
                    &[&db(86_400_000)],
                )
                .await?;
            // A route prefix's rate is counted over a minute; a session's cache figures are
            // kept a day.
            client
                .execute(
                    &format!("DELETE FROM fleet_route_times WHERE at_ms <= {DB_NOW_MS} - 60000"),
                    &[],
                )
                .await?;
            client
                .execute(
                    &format!(
                        "DELETE FROM fleet_session_cache WHERE last_ms <= {DB_NOW_MS} - $1::bigint"
                    ),
                    &[&db(86_400_000)],
                )
                .await?;
            // Recorded usage is read for as long as an answer may be held.
            client
                .execute(
                    &format!("DELETE FROM fleet_recorded WHERE at_ms <= {DB_NOW_MS} - $1::bigint"),
                    &[&db(RECORDED_TTL_MS)],
                )
                .await?;
            // Answers: past their age, then the oldest beyond the byte bound.
            client
                .execute(
                    &format!(
                        "DELETE FROM fleet_answers WHERE expires_ms <= {DB_NOW_MS} \
                         OR (key_id, fingerprint, wire) IN (\
                           SELECT key_id, fingerprint, wire FROM (\
                             SELECT key_id, fingerprint, wire, \
                                    (sum(bytes) OVER (ORDER BY stored_ms DESC, key_id, fingerprint, wire))::bigint AS running \
                             FROM fleet_answers) newest_first \
                           WHERE running > $1::bigint)"
                    ),
                    &[&db(self.answer_store_bytes)],
                )
                .await?;
            Ok::<_, FleetError>(charged)
        };
        within(CALL_TIMEOUT, sweep).await
    }

    /// Approve or deny a pending hold: one conditional UPDATE, so of two concurrent approvals
    /// on two instances exactly one wins. `owner`: the deciding owner's key (`None`: admin).
    pub async fn decide_hold(
        &self,
        hold_id: &str,
        owner: Option<&str>,
        approve: bool,
        attend_minutes: Option<u64>,
    ) -> Result<Result<DecidedHold, HoldRefusal>, FleetError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let state = if approve { "approved" } else { "denied" };
        let row = tx
            .query_opt(
                &format!(
                    "UPDATE fleet_holds SET state = $3 \
                     WHERE hold_id = $1 AND ($2::text IS NULL OR key_id = $2::text) \
                       AND state = 'pending' AND expires_ms > {DB_NOW_MS} \
                     RETURNING key_id, expires_ms, {DB_NOW_MS} AS now_ms"
                ),
                &[&hold_id, &owner, &state],
            )
            .await?;
        let Some(row) = row else {
            let found = tx
                .query_opt(
                    &format!(
                        "SELECT key_id, expires_ms <= {DB_NOW_MS} AS expired FROM fleet_holds \
                         WHERE hold_id = $1"
                    ),
                    &[&hold_id],
                )
                .await?;
            return Ok(Err(match found {
                Some(f) if owner.is_none_or(|o| o == f.get::<_, &str>("key_id")) => {
                    if f.get::<_, bool>("expired") {
                        HoldRefusal::Expired
                    } else {
                        HoldRefusal::NotPending
                    }
                }
                _ => HoldRefusal::Unknown,
            }));
        };
        let key_id: String = row.get("key_id");
        let now = un(row.get::<_, i64>("now_ms"));
        let mut attending_until_ms = None;
        if let (true, Some(m)) = (approve, attend_minutes) {
            let until = now.saturating_add(m.saturating_mul(60_000));
            tx.execute(
                "INSERT INTO fleet_leases (hold_id, key_id, granted_ms, until_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (hold_id) DO NOTHING",
                &[&hold_id, &key_id, &db(now), &db(until)],
            )
            .await?;
            attending_until_ms = Some(until);
        }
        tx.commit().await?;
        Ok(Ok(DecidedHold {
            key_id,
            expires_ms: un(row.get::<_, i64>("expires_ms")),
            attending_until_ms,
        }))
    }

    /// Pending and approved holds, oldest first, and the leases that run now: every key's
    /// (`None`) or one key's.
    pub async fn open_holds(
        &self,
        key_id: Option<&str>,
    ) -> Result<(u64, Vec<ListedHold>, Vec<crate::store::LeaseRow>), FleetError> {
        let client = self.pool.get().await?;
        let now: i64 = client
            .query_one(&format!("SELECT {DB_NOW_MS}"), &[])
            .await?
            .get(0);
        let holds = client
            .query(
                "SELECT hold_id, key_id, state, reason, created_ms, expires_ms, \
                        worst_case_tokens, fingerprint \
                 FROM fleet_holds WHERE state IN ('pending', 'approved') AND expires_ms > $1 \
                   AND ($2::text IS NULL OR key_id = $2::text) \
                 ORDER BY created_ms, hold_id",
                &[&now, &key_id],
            )
            .await?
            .iter()
            .map(|r| ListedHold {
                hold_id: r.get("hold_id"),
                key_id: r.get("key_id"),
                approved: r.get::<_, &str>("state") == "approved",
                reason: r.get("reason"),
                created_ms: un(r.get("created_ms")),
                expires_ms: un(r.get("expires_ms")),
                worst_case_tokens: un(r.get("worst_case_tokens")),
                fingerprint: r.try_get::<_, Option<Hash>>("fingerprint").ok().flatten(),
            })
            .collect();
        let leases = client
            .query(
                "SELECT DISTINCT ON (key_id) hold_id, key_id, granted_ms, until_ms \
                 FROM fleet_leases WHERE until_ms > $1 AND ($2::text IS NULL OR key_id = $2::text) \
                 ORDER BY key_id, until_ms DESC",
                &[&now, &key_id],
            )
            .await?
            .iter()
            .map(|r| crate::store::LeaseRow {
                hold_id: r.get("hold_id"),
                key_id: r.get("key_id"),
                granted_ms: un(r.get("granted_ms")),
                until_ms: un(r.get("until_ms")),
            })
            .collect();
        Ok((un(now), holds, leases))
    }

    /// The stored answer for (key, fingerprint, wire form), if one is fresh.
    pub async fn answer(
        &self,
        key_id: &str,
        fingerprint: &Hash,
        wire: WireForm,
    ) -> Result<Option<(String, Vec<u8>)>, FleetError> {
        let read = async {
            let client = self.pool.get().await?;
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT content_type, body FROM fleet_answers \
                     WHERE key_id = $1 AND fingerprint = $2 AND wire = $3 \
                       AND expires_ms > {DB_NOW_MS}"
                ))
                .await?;
            let row = client
                .query_opt(&stmt, &[&key_id, fingerprint, &wire.as_str()])
                .await?;
            Ok::<_, FleetError>(row.map(|r| (r.get("content_type"), r.get("body"))))
        };
        within(ANSWER_TIMEOUT, read).await
    }

    /// Bind a stored Responses object to the key that created it, for every instance: the
    /// first key keeps the id; the same key may fill in the context figure.
    pub async fn bind_response(&self, b: &ResponseBinding) -> Result<(), FleetError> {
        let write = async {
            let client = self.pool.get().await?;
            let stmt = client
                .prepare_cached(
                    "INSERT INTO fleet_responses (response_id, key_id, created_ms, \
                     context_tokens, upstream, answer) VALUES ($1, $2, $3, $4, $5, $6) \
                     ON CONFLICT (response_id) DO UPDATE SET context_tokens = \
                     coalesce(EXCLUDED.context_tokens, fleet_responses.context_tokens), \
                     upstream = coalesce(fleet_responses.upstream, EXCLUDED.upstream), \
                     answer = coalesce(EXCLUDED.answer, fleet_responses.answer) \
                     WHERE fleet_responses.key_id = EXCLUDED.key_id",
                )
                .await?;
            client
                .execute(
                    &stmt,
                    &[
                        &b.response_id,
                        &b.key_id,
                        &db(b.created_ms),
                        &b.context_tokens.map(db),
                        &b.upstream,
                        &b.answer,
                    ],
                )
                .await?;
            Ok::<_, FleetError>(())
        };
        within(CALL_TIMEOUT, write).await
    }

    /// The binding of a stored Responses object, if an instance saw it created.
    pub async fn response_binding(
        &self,
        response_id: &str,
    ) -> Result<Option<ResponseBinding>, FleetError> {
        let read = async {
            let client = self.pool.get().await?;
            let stmt = client
                .prepare_cached(
                    "SELECT key_id, created_ms, context_tokens, upstream, answer \
                     FROM fleet_responses WHERE response_id = $1",
                )
                .await?;
            let row = client.query_opt(&stmt, &[&response_id]).await?;
            Ok::<_, FleetError>(row.map(|r| ResponseBinding {
                response_id: response_id.to_string(),
                key_id: r.get("key_id"),
                created_ms: un(r.get("created_ms")),
                context_tokens: r.get::<_, Option<i64>>("context_tokens").map(un),
                upstream: r.get("upstream"),
                answer: r.get("answer"),
            }))
        };
        within(CALL_TIMEOUT, read).await
    }

    /// Store an answer for the fleet (replacing an older one for the same request).
    pub async fn put_answer(
        &self,
        key_id: &str,
        fingerprint: &Hash,
        wire: WireForm,
        content_type: &str,
        body: &[u8],
    ) -> Result<(), FleetError> {
        let write = async {
            let client = self.pool.get().await?;
            client
                .execute(
                    &format!(
                        "INSERT INTO fleet_answers (key_id, fingerprint, wire, content_type, body, \
                         bytes, stored_ms, expires_ms) \
                         VALUES ($1, $2, $3, $4, $5, $6, {DB_NOW_MS}, {DB_NOW_MS} + $7) \
                         ON CONFLICT (key_id, fingerprint, wire) DO UPDATE SET \
                         content_type = EXCLUDED.content_type, body = EXCLUDED.body, \
                         bytes = EXCLUDED.bytes, stored_ms = EXCLUDED.stored_ms, \
                         expires_ms = EXCLUDED.expires_ms"
                    ),
                    &[
                        &key_id,
                        fingerprint,
                        &wire.as_str(),
                        &content_type,
                        &body,
                        &db(body.len() as u64),
                        &db(ANSWER_TTL_MS),
                    ],
                )
                .await?;
            Ok::<_, FleetError>(())
        };
        within(CALL_TIMEOUT, write).await
    }

    /// Per-day and total ledger figures of a key (`None`: every key) over `[from_ms, to_ms)`,
    /// aggregated by the database, tier by tier as the SQLite ledger keeps them.
    pub async fn ledger(
        &self,
        key_id: Option<&str>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), FleetError> {
        let client = self.pool.get().await?;
        let mut fold = LedgerFold::default();
        let field =
            |f: &str| format!("COALESCE(sum((row_json::jsonb ->> '{f}')::bigint), 0)::bigint");
        let decisions = client
            .query(
                &format!(
                    "SELECT decided_at_ms / 86400000 AS day, verdict, count(*) AS n, \
                     {} AS not_bought, \
                     COALESCE(sum(CASE WHEN verdict = 'BLOCK' \
                         THEN (row_json::jsonb ->> 'worst_case_tokens_avoided')::bigint ELSE 0 END), 0)::bigint \
                         AS avoided, \
                     {} AS findings \
                     FROM fleet_decisions \
                     WHERE ($1::text IS NULL OR key_id = $1::text) \
                       AND decided_at_ms >= $2 AND decided_at_ms < $3 \
                     GROUP BY day, verdict",
                    field("tokens_not_bought"),
                    field("findings_tokens"),
                ),
                &[&key_id, &from_ms, &to_ms],
            )
            .await?;
        for r in &decisions {
            let Some(verdict) = Verdict::parse(r.get("verdict")) else {
                continue;
            };
            let sums = DecisionSums {
                count: un(r.get("n")),
                tokens_not_bought: un(r.get("not_bought")),
                worst_case_tokens_avoided: un(r.get("avoided")),
                findings_tokens: un(r.get("findings")),
            };
            fold.decisions(un(r.get("day")), verdict, sums);
        }
        let part = |p: &str| {
            format!("COALESCE(sum((row_json::jsonb -> 'usage' ->> '{p}')::bigint), 0)::bigint")
        };
        // Usage rows and expiry charges (no usage figures) alike carry their spend; the derived
        // cache figures are the row's own fields (a usage row's JSON, `UsageRow`).
        let usage = client
            .query(
                &format!(
                    "SELECT at_ms / 86400000 AS day, COALESCE(sum(spend_nano), 0)::bigint AS spend, \
                     {} AS input, {} AS cache_write, {} AS cache_read, {} AS output, \
                     count(*) FILTER (WHERE row_json::jsonb ->> 'basis' = 'unpriced') AS unpriced, \
                     {} AS saving, {} AS lifetimes, {} AS routing, \
                     count(row_json::jsonb -> 'cache_rebuild_nano') AS rebuilds, \
                     {} AS rebuild, {} AS premium \
                     FROM fleet_usage WHERE ($1::text IS NULL OR key_id = $1::text) \
                       AND at_ms >= $2 AND at_ms < $3 GROUP BY day",
                    part("input"),
                    part("cache_write"),
                    part("cache_read"),
                    part("output"),
                    field("cache_saving_nano"),
                    field("cache_saving_lifetimes_nano"),
                    field("cache_saving_routing_nano"),
                    field("cache_rebuild_nano"),
                    field("cache_premium_1h_nano"),
                ),
                &[&key_id, &from_ms, &to_ms],
            )
            .await?;
        for r in &usage {
            let sums = UsageSums {
                spend_nano: un(r.get("spend")),
                usage: tokensaver_core::gate::Usage {
                    input: un(r.get("input")),
                    cache_write: un(r.get("cache_write")),
                    cache_read: un(r.get("cache_read")),
                    output: un(r.get("output")),
                },
                unpriced_calls: un(r.get("unpriced")),
                cache_saving_nano: r.get("saving"),
                cache_saving_lifetimes_nano: r.get("lifetimes"),
                cache_saving_routing_nano: r.get("routing"),
                cache_rebuilds: un(r.get("rebuilds")),
                cache_rebuild_nano: un(r.get("rebuild")),
                cache_premium_1h_nano: un(r.get("premium")),
            };
            fold.usage(un(r.get("day")), sums);
        }
        // A hold never used (expired, or denied) counts on the day of the request it held.
        let holds = client
            .query(
                "SELECT created_ms / 86400000 AS day, \
                        COALESCE(sum(worst_case_tokens), 0)::bigint AS worst_case \
                 FROM fleet_holds WHERE ($1::text IS NULL OR key_id = $1::text) \
                   AND state IN ('expired', 'denied') AND created_ms >= $2 AND created_ms < $3 \
                 GROUP BY day",
                &[&key_id, &from_ms, &to_ms],
            )
            .await?;
        for r in &holds {
            fold.unused_holds(un(r.get("day")), un(r.get("worst_case")));
        }
        Ok(fold.finish())
    }

    /// Decisions with their settlements, oldest first (`GET /ledger/decisions`), as the SQLite
    /// store lists them.
    pub async fn decisions(&self, q: &DecisionQuery) -> Result<DecisionPage, StoreError> {
        let unavailable = |_| StoreError::Unavailable;
        let limit = q.limit.clamp(1, crate::store::ledger::MAX_DECISIONS_PAGE);
        let client = self.pool.get().await.map_err(|_| StoreError::Unavailable)?;
        let key_id = q.key_id.as_deref();
        // The cursor's id is compared as the text the column holds (see `tokensaver_core::sql_types`).
        let (after_ms, after_id) = match &q.after {
            None => (i64::MIN, String::new()),
            Some(id) => {
                let found = client
                    .query_opt(
                        "SELECT decided_at_ms FROM fleet_decisions \
                         WHERE decision_id = $1 AND ($2::text IS NULL OR key_id = $2::text)",
                        &[id, &key_id],
                    )
                    .await
                    .map_err(|e| unavailable(FleetError::from(e)))?
                    .ok_or(StoreError::UnknownCursor)?;
                (found.get("decided_at_ms"), id.to_string())
            }
        };
        let from = q.from_ms.map(db).unwrap_or(i64::MIN);
        let to = q.to_ms.map(db).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT d.row_json AS decision_json, u.kind, u.row_json AS usage_json, u.at_ms, \
                        u.spend_nano \
                 FROM fleet_decisions d LEFT JOIN fleet_usage u ON u.decision_id = d.decision_id \
                 WHERE ($1::text IS NULL OR d.key_id = $1::text) \
                   AND d.decided_at_ms >= $2 AND d.decided_at_ms < $3 \
                   AND (d.decided_at_ms, d.decision_id) > ($4::bigint, $5::text) \
                   AND ($7::text IS NULL OR d.row_json::jsonb ->> 'session' = $7::text) \
                 ORDER BY d.decided_at_ms, d.decision_id LIMIT $6",
                &[
                    &key_id,
                    &from,
                    &to,
                    &after_ms,
                    &after_id,
                    &db(limit as u64 + 1),
                    &q.session.map(|s| s.to_hex()),
                ],
            )
            .await
            .map_err(|e| unavailable(FleetError::from(e)))?;
        let mut lines = Vec::with_capacity(rows.len());
        for r in &rows {
            let d: DecisionRow = serde_json::from_str(r.get::<_, &str>("decision_json"))
                .map_err(|_| StoreError::Unavailable)?;
            let kind: Option<&str> = r.get("kind");
            let usage: Option<UsageRow> = r
                .get::<_, Option<&str>>("usage_json")
                .and_then(|u| serde_json::from_str(u).ok());
            let settled_at: Option<i64> = r.get("at_ms");
            let spend: Option<i64> = r.get("spend_nano");
            lines.push(decision_line(d, kind, usage, settled_at, spend));
        }
        Ok(DecisionPage::of(lines, limit))
    }

    /// The newest decisions of the fleet (newest first), with what each settled or was
    /// charged at expiry: the ledger page's list.
    pub async fn latest_decisions(
        &self,
        key_id: Option<&str>,
        verdict: Option<Verdict>,
        limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError> {
        let client = self.pool.get().await.map_err(|_| StoreError::Unavailable)?;
        let rows = client
            .query(
                "SELECT d.row_json, u.spend_nano \
                 FROM fleet_decisions d LEFT JOIN fleet_usage u ON u.decision_id = d.decision_id \
                 WHERE ($1::text IS NULL OR d.key_id = $1::text) \
                   AND ($2::text IS NULL OR d.verdict = $2::text) \
                 ORDER BY d.decided_at_ms DESC, d.decision_id DESC LIMIT $3",
                &[&key_id, &verdict.map(Verdict::as_str), &db(limit as u64)],
            )
            .await
            .map_err(read_failed)?;
        rows.iter()
            .map(|r| {
                Ok(DecisionListing {
                    row: serde_json::from_str(r.get::<_, &str>("row_json"))
                        .map_err(|_| StoreError::Unavailable)?,
                    spend_nano: r.get::<_, Option<i64>>("spend_nano").map(un),
                })
            })
            .collect()
    }

    /// The fleet's decisions since `since_ms` per bucket, verdict and rule: the ledger page's
    /// plot.
    pub async fn verdicts_over_time(
        &self,
        key_id: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError> {
        let client = self.pool.get().await.map_err(|_| StoreError::Unavailable)?;
        let rows = client
            .query(
                "SELECT (decided_at_ms / $3) * $3 AS bucket, verdict, reason, count(*) AS n \
                 FROM fleet_decisions \
                 WHERE ($1::text IS NULL OR key_id = $1::text) AND decided_at_ms >= $2 \
                 GROUP BY bucket, verdict, reason ORDER BY bucket, verdict, reason",
                &[&key_id, &db(since_ms), &db(bucket_ms.max(1))],
            )
            .await
            .map_err(read_failed)?;
        rows.iter()
            .map(|r| {
                let verdict: &str = r.get("verdict");
                Ok(VerdictCount {
                    bucket_start_ms: un(r.get("bucket")),
                    verdict: Verdict::ALL
                        .into_iter()
                        .find(|v| v.as_str() == verdict)
                        .ok_or(StoreError::Unavailable)?,
                    reason: r.get("reason"),
                    count: un(r.get("n")),
                })
            })
            .collect()
    }

    /// What an admission of this request would read now, without locking or writing
    /// (`POST /estimate`). A pending hold's opening is not read.
    pub async fn peek(&self, request: AdmitScope<'_>) -> Result<Observed, FleetError> {
        let client = self.pool.get().await?;
        let key = client
            .query_opt(
                &format!(
                    "SELECT {DB_NOW_MS} AS now_ms, budget_set, ceiling_nano, period \
                     FROM (SELECT 1) one LEFT JOIN fleet_keys ON key_id = $1"
                ),
                &[&request.key_id],
            )
            .await?
            .ok_or(FleetError::Unavailable)?;
        let now: i64 = key.get("now_ms");
        let limit = match shared_limit(&key) {
            Some(shared) => shared,
            None => request.limit,
        };
        let since = db(period_start(limit.period, un(now)));
        let wire = request.wire.as_str();
        let read = &self.statements.admit_read;
        let values = read.values(&request.read_binds(&now, &since, &wire));
        let found = client
            .query_one(&client.prepare_cached(&read.sql).await?, &values)
            .await?;
        Ok(Observed {
            now_ms: un(now),
            seq: 0,
            counts: paced_counts(&found, request.step, request.action),
            budget: limit.ceiling_nano.map(|ceiling| BudgetState {
                ceiling_nano: ceiling,
                spend_nano: un(found.get::<_, i64>("spend_nano")),
                reserved_nano: un(found.get::<_, i64>("reserved_nano")),
            }),
            pending: found
                .get::<_, Option<String>>("pending_hold")
                .map(|hold_id| PendingHold {
                    hold_id,
                    decision: None,
                    receipt: None,
                }),
            approved: found.get("approved_hold"),
            lease: found.get("lease_hold"),
            recorded: found.get("recorded_usage"),
            cache_memory: cache_memory(&client, request.key_id, request.cache_points).await?,
            session_cache: cache_terms_from(&found).0,
            prefix_rate: cache_terms_from(&found).1,
            prefix_shared: cache_terms_from(&found).2,
        })
    }

    /// `POST /forget` for the whole fleet, in one transaction: the key's stored answers, its
    /// recorded usage and its cache points are deleted, closed holds lose their opening, and
    /// its decision rows their fingerprints — except the rows of the last loop window, which
    /// are the fleet's windows (forgetting is no way around the runaway rules, as on one node,
    /// where the windows stay in memory). Totals stay.
    pub async fn forget(&self, key_id: &str) -> Result<(), FleetError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        for table in ["fleet_answers", "fleet_recorded", "fleet_cache_points"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE key_id = $1"),
                &[&key_id],
            )
            .await?;
        }
        tx.execute(
            "UPDATE fleet_holds SET opening_decision = NULL, opening_receipt = NULL \
             WHERE key_id = $1 AND state NOT IN ('pending', 'approved')",
            &[&key_id],
        )
        .await?;
        tx.execute(
            &format!(
                "UPDATE fleet_decisions SET fingerprint = NULL, step_fingerprint = NULL, \
                 row_json = jsonb_set(jsonb_set(row_json::jsonb, '{{fingerprint}}', 'null'), \
                 '{{step_fingerprint}}', 'null')::text \
                 WHERE key_id = $1 AND fingerprint IS NOT NULL \
                 AND decided_at_ms <= {DB_NOW_MS} - {}",
                self.loop_ms
            ),
            &[&key_id],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Set a key's budget for the whole fleet (`PUT /budget` through any instance). It takes
    /// the key's row lock, so it lands between two admissions, never inside one.
    pub async fn set_budget(
        &self,
        key_id: &str,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
    ) -> Result<(), FleetError> {
        let client = self.pool.get().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO fleet_keys (key_id, last_decided_ms, budget_set, ceiling_nano, period) \
                     VALUES ($1, {DB_NOW_MS}, true, $2, $3) \
                     ON CONFLICT (key_id) DO UPDATE SET budget_set = true, \
                     ceiling_nano = EXCLUDED.ceiling_nano, period = EXCLUDED.period"
                ),
                &[&key_id, &ceiling_nano.map(db), &period.as_str()],
            )
            .await?;
        Ok(())
    }

    /// The budget set for the fleet through `PUT /budget`, if any (else the config's holds).
    pub async fn shared_budget(&self, key_id: &str) -> Result<Option<KeyLimit>, FleetError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT budget_set, ceiling_nano, period FROM fleet_keys WHERE key_id = $1",
                &[&key_id],
            )
            .await?;
        Ok(row.and_then(|r| shared_limit(&r)))
    }

    /// A key's spend since `since_ms` and its open reservations, read in one statement.
    pub async fn budget_sample(
        &self,
        key_id: &str,
        since_ms: u64,
    ) -> Result<BudgetSample, FleetError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "SELECT COALESCE((SELECT sum(spend_nano) FROM fleet_usage \
                                  WHERE key_id = $1 AND at_ms >= $2), 0)::bigint AS spend_nano, \
                        COALESCE((SELECT sum(nano) FROM fleet_reservations \
                                  WHERE key_id = $1), 0)::bigint AS reserved_nano",
                &[&key_id, &db(since_ms)],
            )
            .await?;
        Ok(BudgetSample {
            spend_nano: un(row.get("spend_nano")),
            reserved_nano: un(row.get("reserved_nano")),
        })
    }

    /// The database's clock (unix ms).
    pub async fn db_now_ms(&self) -> Result<u64, FleetError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(&format!("SELECT {DB_NOW_MS}"), &[])
            .await?;
        Ok(un(row.get(0)))
    }

    /// The window counts a decision at `now_ms` would read (no lock, no write): the same query
    /// admission runs, for the equivalence test with the in-memory windows.
    pub async fn observe(
        &self,
        key_id: &str,
        fingerprint: &Hash,
        step: &Hash,
        model: &str,
        now_ms: u64,
    ) -> Result<WindowCounts, FleetError> {
        let client = self.pool.get().await?;
        let (now, since) = (db(now_ms), 0_i64);
        let observe = &self.statements.observe;
        let values = observe.values(&[
            ("key_id", &key_id),
            ("fingerprint", fingerprint),
            ("step", step),
            ("model", &model),
            ("now", &now),
            ("since", &since),
        ]);
        let stmt = client.prepare_cached(&observe.sql).await?;
        let row = client.query_one(&stmt, &values).await?;
        Ok(counts_from(&row))
    }

    /// Record a decision row without a decision (the windows' equivalence test).
    pub async fn record_attempt(&self, row: &DecisionRow) -> Result<(), FleetError> {
        let client = self.pool.get().await?;
        let columns = DecisionColumns::of(row)?;
        let insert = &self.statements.insert_decision;
        let values = insert.values(&columns.binds(row, &row.key_id));
        let stmt = client.prepare_cached(&insert.sql).await?;
        client.execute(&stmt, &values).await?;
        Ok(())
    }
}

/// The windows, spend and reservations of a key at `:now` (the decision time), for `:key_id`,
/// `:fingerprint`, `:step`, `:model` and `:since` (the budget period's start). Each window
/// is the in-memory [`tokensaver_core::gate::Windows`]'s, down to its caps (a SERVE is no step:
/// `Windows::record_serve`): the identical-request lists
/// keep 64 entries, the key's request list 1024 (`LIMIT` bounds each count the same way, and
/// bounds the scan). An entry exactly the window's length old is outside (`> now - len`). The
/// lengths are the configured `[gate.windows]`, as the in-memory windows'.
fn window_columns(w: &WindowLengths) -> String {
    let (loop_ms, burst_ms, grind_ms) = (
        w.loop_secs * 1_000,
        w.burst_secs * 1_000,
        w.grind_secs * 1_000,
    );
    let (novelty_ms, repeat_ms) = (NOVELTY_WINDOW_MS, REPEAT_WINDOW_MS);
    format!(
        "(SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id \
            AND fingerprint = :fingerprint AND decided_at_ms > :now::bigint - {loop_ms} LIMIT 64) s)::bigint \
            AS same_fingerprint, \
        (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id \
            AND step_fingerprint = :step AND verdict <> 'SERVE' \
            AND decided_at_ms > :now::bigint - {loop_ms} LIMIT 64) s)::bigint AS same_step, \
        (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id \
            AND fingerprint = :fingerprint AND step_fingerprint = :step AND verdict <> 'SERVE' \
            AND decided_at_ms > :now::bigint - {loop_ms} LIMIT 64) s)::bigint AS same_both, \
        (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id \
            AND decided_at_ms > :now::bigint - {burst_ms} LIMIT 1024) s)::bigint AS key_burst, \
        (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id \
            AND decided_at_ms > :now::bigint - {grind_ms} LIMIT 1024) s)::bigint AS key_grind, \
        EXISTS (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id AND model = :model \
            AND decided_at_ms > :now::bigint - {novelty_ms}) AS model_seen, \
        EXISTS (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id AND fingerprint = :fingerprint \
            AND decided_at_ms > :now::bigint - {repeat_ms}) AS fingerprint_seen, \
        COALESCE((SELECT sum(spend_nano) FROM fleet_usage \
            WHERE key_id = :key_id AND at_ms >= :since::bigint), 0)::bigint AS spend_nano, \
        COALESCE((SELECT sum(nano) FROM fleet_reservations WHERE key_id = :key_id), 0)::bigint \
            AS reserved_nano, \
        EXISTS (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id AND step_fingerprint = :step \
            AND decided_at_ms > :now::bigint - {repeat_ms}) AS step_seen"
    )
}

/// The statements bound by name ([`Named`]), built once when the fleet connects; the reads'
/// text carries the configured window lengths (integers from the validated config, never
/// request content).
struct Statements {
    insert_decision: Named,
    decide_and_reserve: Named,
    /// The windows alone ([`Fleet::observe`], the equivalence test): the same columns
    /// admission reads.
    observe: Named,
    /// Everything an admission reads under the key's lock, in one statement: the windows,
    /// spend and reservations ([`window_columns`]), the schedule's ([`pacing_columns`]), then
    /// the key's pending hold for this
    /// request, the approved hold that releases it (`:named_hold`, the named one, first), its
    /// attending lease, and the recorded usage of the answer in its wire form (`:wire`).
    admit_read: Named,
}

/// The columns of the schedule of repeated steps ([`tokensaver_core::gate::schedule`]): the
/// identical steps in the pace window (SERVEs excepted, capped at 64 as the in-memory lists)
/// and the newest seven of their times, the key's run of this step (`:step`), and the step the
/// request's session (`:session`) made last.
fn pacing_columns(steps: &StepLimits, w: &WindowLengths) -> String {
    let pace_ms = steps.pace_window_ms();
    let route_ms = w.route_secs.saturating_mul(1_000);
    format!(
        "(SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = :key_id \
            AND step_fingerprint = :step AND verdict <> 'SERVE' \
            AND decided_at_ms > :now::bigint - {pace_ms} LIMIT 64) s)::bigint AS step_paced, \
        ARRAY(SELECT decided_at_ms FROM fleet_decisions WHERE key_id = :key_id \
            AND step_fingerprint = :step AND verdict <> 'SERVE' \
            AND decided_at_ms > :now::bigint - {pace_ms} \
            ORDER BY decided_at_ms DESC LIMIT 7) AS step_newest, \
        (SELECT steps FROM fleet_step_runs WHERE key_id = :key_id AND step = :step) AS run_steps, \
        (SELECT first_ms FROM fleet_step_runs WHERE key_id = :key_id AND step = :step) AS run_first, \
        (SELECT last_ms FROM fleet_step_runs WHERE key_id = :key_id AND step = :step) AS run_last, \
        (SELECT step FROM fleet_session_steps WHERE key_id = :key_id AND session = :session::text) \
            AS session_step, \
        (SELECT action FROM fleet_session_steps WHERE key_id = :key_id AND session = :session::text) \
            AS session_action, \
        (SELECT before_step FROM fleet_session_steps WHERE key_id = :key_id AND session = :session::text) \
            AS session_before, \
        (SELECT at_ms FROM fleet_session_steps WHERE key_id = :key_id AND session = :session::text) \
            AS session_at, \
        (SELECT last_ms FROM fleet_session_cache WHERE key_id = :key_id AND session = :session::text) \
            AS sc_last, \
        (SELECT calls FROM fleet_session_cache WHERE key_id = :key_id AND session = :session::text) \
            AS sc_calls, \
        (SELECT pauses FROM fleet_session_cache WHERE key_id = :key_id AND session = :session::text) \
            AS sc_pauses, \
        (SELECT prompt_tokens FROM fleet_session_cache WHERE key_id = :key_id AND session = :session::text) \
            AS sc_prompt, \
        (SELECT grown_tokens FROM fleet_session_cache WHERE key_id = :key_id AND session = :session::text) \
            AS sc_written, \
        (SELECT count(*) FROM (SELECT 1 FROM fleet_route_times WHERE key_id = :key_id \
            AND prefix = :route_prefix::text AND at_ms > :now::bigint - {route_ms} LIMIT 1024) s)::bigint \
            AS prefix_rate, \
        EXISTS (SELECT 1 FROM fleet_route_times WHERE key_id = :key_id AND prefix = :route_prefix::text \
            AND at_ms > :now::bigint - {route_ms} AND session <> :session::text) AS prefix_shared"
    )
}

impl Statements {
    fn new(w: &WindowLengths, steps: &StepLimits) -> Statements {
        let columns = window_columns(w);
        let pacing = pacing_columns(steps, w);
        Statements {
            insert_decision: Named::new(INSERT_DECISION),
            decide_and_reserve: Named::new(DECIDE_AND_RESERVE),
            observe: Named::new(&format!("SELECT {columns}")),
            admit_read: Named::new(&format!(
                "SELECT {columns}, {pacing}, \
                (SELECT hold_id FROM fleet_holds WHERE key_id = :key_id AND fingerprint = :fingerprint \
                    AND state = 'pending' AND expires_ms > :now::bigint \
                    ORDER BY created_ms DESC LIMIT 1) AS pending_hold, \
                (SELECT hold_id FROM fleet_holds WHERE key_id = :key_id AND fingerprint = :fingerprint \
                    AND state = 'approved' AND expires_ms > :now::bigint \
                    ORDER BY (hold_id = :named_hold::text) IS TRUE DESC, created_ms DESC LIMIT 1) \
                    AS approved_hold, \
                (SELECT hold_id FROM fleet_leases WHERE key_id = :key_id AND until_ms > :now::bigint \
                    ORDER BY until_ms DESC LIMIT 1) AS lease_hold, \
                (SELECT usage FROM fleet_recorded WHERE key_id = :key_id AND fingerprint = :fingerprint \
                    AND wire = :wire::text AND at_ms > :now::bigint - {RECORDED_TTL_MS}) \
                    AS recorded_usage"
            )),
        }
    }
}

const UPSERT_STEP_RUN: &str = "INSERT INTO fleet_step_runs (key_id, step, steps, first_ms, \
    last_ms) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key_id, step) DO UPDATE SET \
    steps = EXCLUDED.steps, first_ms = EXCLUDED.first_ms, last_ms = EXCLUDED.last_ms";

/// The session's latest step and action, and the one before it (`SessionSteps::after`).
const UPSERT_SESSION_STEP: &str = "INSERT INTO fleet_session_steps AS s (key_id, session, step, \
    action, at_ms) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key_id, session) DO UPDATE SET \
    before_step = s.step, step = EXCLUDED.step, action = EXCLUDED.action, at_ms = EXCLUDED.at_ms";

const UPSERT_SESSION_CACHE: &str = "INSERT INTO fleet_session_cache (key_id, session, last_ms, \
    calls, pauses, prompt_tokens, grown_tokens) VALUES ($1, $2, $3, $4, $5, $6, $7) \
    ON CONFLICT (key_id, session) DO UPDATE SET last_ms = EXCLUDED.last_ms, \
    calls = EXCLUDED.calls, pauses = EXCLUDED.pauses";

const INSERT_ROUTE_TIME: &str =
    "INSERT INTO fleet_route_times (key_id, prefix, at_ms, session) VALUES ($1, $2, $3, $4)";

const INSERT_DECISION: &str = "INSERT INTO fleet_decisions (decision_id, key_id, decided_at_ms, \
    fingerprint, step_fingerprint, model, verdict, reason, reserved_nano, row_json) \
    VALUES (:decision_id, :key_id, :decided_at_ms, :fingerprint, :step_fingerprint, :model, \
    :verdict, :reason, :reserved_nano, :row_json)";

/// A forwarded decision's row and its conditional reservation, in one statement: the
/// decision (as [`INSERT_DECISION`]) is written by the CTE, the reservation only if the key's
/// spend since `:since` (its period's start), its open reservations and this worst case
/// (`:nano`) fit under `:ceiling` (NULL: no ceiling), all read by this statement. No
/// reservation (0 rows) rolls the whole admission back.
const DECIDE_AND_RESERVE: &str = "WITH decision AS (\
    INSERT INTO fleet_decisions (decision_id, key_id, decided_at_ms, fingerprint, \
    step_fingerprint, model, verdict, reason, reserved_nano, row_json) \
    VALUES (:decision_id, :key_id, :decided_at_ms, :fingerprint, :step_fingerprint, :model, \
    :verdict, :reason, :reserved_nano, :row_json)) \
    INSERT INTO fleet_reservations (decision_id, key_id, nano, expires_ms, \
    served_model, wire, output_ceiling, fingerprint, reusable, recorded_by, input_tokens, \
    cache_edits, session) \
    SELECT :decision_id::text, :key_id::text, :nano::bigint, :expires_ms::bigint, \
           :served_model::text, :wire::text, :output_ceiling::bigint, \
           :reservation_fingerprint::text, :reusable::boolean, :recorded_by::text, \
           :input_tokens::bigint, :cache_edits::smallint, :session::text \
    WHERE :ceiling::bigint IS NULL \
       OR COALESCE((SELECT sum(spend_nano) FROM fleet_usage \
                    WHERE key_id = :key_id::text AND at_ms >= :since::bigint), 0) \
        + COALESCE((SELECT sum(nano) FROM fleet_reservations WHERE key_id = :key_id::text), 0) \
        + :nano::bigint <= :ceiling::bigint";

/// A value bound by name (see [`Named`]).
type Bind<'a> = (&'static str, &'a (dyn ToSql + Sync));

/// A statement written with `:name` placeholders, made `$N` once, when the fleet connects
/// (numbered in the order the names first appear; `::type` casts are left alone). At each call
/// [`Named::values`] puts the values given by name in that order: a value cannot take
/// another's place, and one used twice is bound once.
struct Named {
    sql: String,
    /// `names[n]` is `$n+1`.
    names: Vec<String>,
}

impl Named {
    fn new(template: &str) -> Named {
        let mut sql = String::with_capacity(template.len());
        let mut names: Vec<String> = Vec::new();
        let mut rest = template;
        while let Some(at) = rest.find(':') {
            sql.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let len = after
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(after.len());
            if len == 0 || sql.ends_with(':') {
                // A cast's `::`, or a colon that names nothing.
                sql.push(':');
                rest = after;
                continue;
            }
            let name = &after[..len];
            let n = match names.iter().position(|known| known == name) {
                Some(n) => n,
                None => {
                    names.push(name.to_owned());
                    names.len() - 1
                }
            };
            sql.push('$');
            sql.push_str(&(n + 1).to_string());
            rest = &after[len..];
        }
        sql.push_str(rest);
        Named { sql, names }
    }

    /// The values of `binds` in the statement's order (a bound name it does not use is left
    /// out). A name of the statement left unbound leaves it short of a value, which the
    /// database refuses; the debug builds' tests stop here first.
    fn values<'a>(&self, binds: &[Bind<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
        self.names
            .iter()
            .filter_map(|name| {
                let value = binds.iter().find(|(bound, _)| bound == name);
                debug_assert!(value.is_some(), "no value bound to :{name}");
                value.map(|&(_, value)| value)
            })
            .collect()
    }
}

/// A decision row's values that are not its fields as they are: [`INSERT_DECISION`]'s columns.
struct DecisionColumns {
    decided_at: i64,
    verdict: &'static str,
    reserved_nano: i64,
    row_json: String,
}

impl DecisionColumns {
    fn of(row: &DecisionRow) -> Result<DecisionColumns, FleetError> {
        Ok(DecisionColumns {
            decided_at: db(row.decided_at_ms),
            verdict: row.verdict.as_str(),
            reserved_nano: db(row.reserved_nano),
            row_json: serde_json::to_string(row).map_err(|_| FleetError::Unavailable)?,
        })
    }

    fn binds<'a>(&'a self, row: &'a DecisionRow, key_id: &'a (dyn ToSql + Sync)) -> [Bind<'a>; 10] {
        [
            ("decision_id", &row.decision_id),
            ("key_id", key_id),
            ("decided_at_ms", &self.decided_at),
            ("fingerprint", &row.fingerprint),
            ("step_fingerprint", &row.step_fingerprint),
            ("model", &row.model_requested),
            ("verdict", &self.verdict),
            ("reason", &row.reason),
            ("reserved_nano", &self.reserved_nano),
            ("row_json", &self.row_json),
        ]
    }
}

impl<'r> AdmitScope<'r> {
    /// The admission read's values ([`Statements::admit_read`]), at `now` for a budget period
    /// from `since`.
    fn read_binds<'a>(&'a self, now: &'a i64, since: &'a i64, wire: &'a &str) -> [Bind<'a>; 10] {
        [
            ("key_id", &self.key_id),
            ("fingerprint", self.fingerprint),
            ("step", self.step),
            ("model", &self.model),
            ("now", now),
            ("since", since),
            ("named_hold", &self.named_hold),
            ("wire", wire),
            ("session", self.session),
            ("route_prefix", &self.route_prefix),
        ]
    }
}

/// One decision and its settlement as `GET /ledger/decisions` lists it (the SQLite store's
/// statuses: `complete`, `incomplete`, `not_billed`, `expired`, `open`, `not_forwarded`).
fn decision_line(
    d: DecisionRow,
    kind: Option<&str>,
    usage: Option<UsageRow>,
    settled_at: Option<i64>,
    spend: Option<i64>,
) -> DecisionLine {
    let settlement = match (kind, &usage) {
        (Some("usage"), Some(u)) => Settlement::Usage {
            ending: u.ending,
            complete: u.complete,
            basis: Some(u.basis),
            at_ms: u.at_ms,
            spend_nano: u.spend_nano,
        },
        (Some(_), _) => Settlement::Expired {
            at_ms: settled_at.map(un).unwrap_or(0),
            charged_nano: spend.map(un).unwrap_or(0),
        },
        (None, _) => Settlement::None,
    };
    let (status, basis, settled_at_ms, spend_nano) = settlement.line_terms(d.verdict);
    let u = usage.as_ref();
    DecisionLine {
        decision_id: d.decision_id,
        key_id: d.key_id,
        decided_at_ms: d.decided_at_ms,
        verdict: d.verdict,
        reason: d.reason,
        model_requested: d.model_requested,
        model_served: d.model_served,
        wire: d.wire,
        hold_id: d.hold_id,
        reserved_nano: d.reserved_nano,
        status,
        ending: u.and_then(|u| u.ending),
        basis,
        settled_at_ms,
        input: u.map_or(0, |u| u.usage.input),
        cache_write: u.map_or(0, |u| u.usage.cache_write),
        cache_write_1h: u.map_or(0, |u| u.cache_write_1h),
        cache_read: u.map_or(0, |u| u.usage.cache_read),
        output: u.map_or(0, |u| u.usage.output),
        web_search_requests: u.map_or(0, |u| u.web_search_requests),
        spend_nano,
        tokens_not_bought: d.tokens_not_bought,
        worst_case_tokens_avoided: if d.verdict == tokensaver_core::gate::Verdict::Block {
            d.worst_case_tokens_avoided
        } else {
            0
        },
        cache_saving_nano: u.and_then(|u| u.cache_saving_nano),
        cache: u.map(|u| u.cache).unwrap_or_default(),
        cache_edits: d.cache_edits,
        session: d.session,
        paced_ms: d.paced_ms,
        step: d.step_fingerprint,
    }
}

/// The budget set through `PUT /budget` on the key's row (columns `at..at+3`: set, ceiling,
/// period), if one was.
/// The columns `budget_set`, `ceiling_nano` and `period` of `fleet_keys`.
fn shared_limit(row: &tokio_postgres::Row) -> Option<KeyLimit> {
    if !row.get::<_, Option<bool>>("budget_set").unwrap_or(false) {
        return None;
    }
    let period = match row.get::<_, Option<&str>>("period") {
        Some("day") => BudgetPeriod::Day,
        Some("month") => BudgetPeriod::Month,
        _ => BudgetPeriod::Lifetime,
    };
    Some(KeyLimit {
        ceiling_nano: row.get::<_, Option<i64>>("ceiling_nano").map(un),
        period,
    })
}

/// The session's cache figures, the prefix's rate and whether another session shares it
/// ([`pacing_columns`]).
fn cache_terms_from(row: &tokio_postgres::Row) -> (SessionCache, u64, bool) {
    let n = |name: &str| row.get::<_, Option<i64>>(name).map_or(0, un);
    let session = SessionCache {
        last_ms: row.get::<_, Option<i64>>("sc_last").map(un),
        calls: n("sc_calls"),
        pauses: n("sc_pauses"),
        prompt_tokens: n("sc_prompt"),
        grown_tokens: n("sc_written"),
    };
    (session, n("prefix_rate"), row.get("prefix_shared"))
}

/// [`counts_from`] with the schedule's columns ([`pacing_columns`]).
fn paced_counts(row: &tokio_postgres::Row, step: &Hash, action: Option<&Hash>) -> WindowCounts {
    let newest: Vec<i64> = row.get("step_newest");
    let mut step_newest_ms = [0; tokensaver_core::gate::windows::STEP_NEWEST];
    for (slot, t) in step_newest_ms.iter_mut().zip(newest) {
        *slot = un(t);
    }
    let kept = match (
        row.get::<_, Option<i64>>("run_steps"),
        row.get::<_, Option<i64>>("run_first"),
        row.get::<_, Option<i64>>("run_last"),
    ) {
        (Some(steps), Some(first), Some(last)) => Some(Run {
            steps: un(steps),
            first_ms: un(first),
            last_ms: un(last),
        }),
        _ => None,
    };
    let session = row
        .get::<_, Option<Hash>>("session_step")
        .map(|last| SessionSteps {
            last,
            last_action: row.get("session_action"),
            last_ms: row.get::<_, Option<i64>>("session_at").map_or(0, un),
            before: row.get("session_before"),
        });
    let (run, broken) = SessionSteps::run_of(session.as_ref(), step, action, kept);
    WindowCounts {
        step_paced: un(row.get::<_, i64>("step_paced")),
        step_newest_ms,
        ..counts_from(row)
    }
    .with_run(run, broken)
}

fn counts_from(row: &tokio_postgres::Row) -> WindowCounts {
    let count = |name: &str| un(row.get::<_, i64>(name));
    let (same_fingerprint, same_step, same_both) = (
        count("same_fingerprint"),
        count("same_step"),
        count("same_both"),
    );
    WindowCounts {
        earlier_identical: same_fingerprint + same_step.saturating_sub(same_both),
        earlier_step_only: same_step.saturating_sub(same_both),
        earlier_key_minute: count("key_burst"),
        earlier_key_hour: count("key_grind"),
        model_seen: row.get("model_seen"),
        fingerprint_seen: row.get("fingerprint_seen"),
        step_seen: row.get("step_seen"),
        // The schedule's columns are admission's ([`paced_counts`]).
        ..WindowCounts::default()
    }
}

/// Apply the migrations not yet recorded, in order, each in its own transaction, under a
/// session advisory lock (instances starting together wait for the first).
async fn migrate(pg: &tokio_postgres::Config) -> anyhow::Result<()> {
    let unreachable = |_| anyhow::anyhow!("fleet database: cannot connect");
    let (mut client, connection) = pg.connect(NoTls).await.map_err(unreachable)?;
    let driver = tokio::spawn(connection);
    let result = async {
        let failed = |_| anyhow::anyhow!("fleet database: migration failed");
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(failed)?;
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (\
                 version integer PRIMARY KEY, \
                 applied_at timestamptz NOT NULL DEFAULT now())",
            )
            .await
            .map_err(failed)?;
        for (version, sql) in MIGRATIONS {
            let tx = client.transaction().await.map_err(failed)?;
            let applied = tx
                .query_opt(
                    "SELECT 1 FROM schema_migrations WHERE version = $1",
                    &[version],
                )
                .await
                .map_err(failed)?
                .is_some();
            if !applied {
                tx.batch_execute(sql).await.map_err(failed)?;
                tx.execute(
                    "INSERT INTO schema_migrations (version) VALUES ($1)",
                    &[version],
                )
                .await
                .map_err(failed)?;
            }
            tx.commit().await.map_err(failed)?;
        }
        client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(failed)?;
        Ok(())
    }
    .await;
    drop(client);
    let _ = driver.await;
    result
}

/// What the fleet remembers of each cache point of a request (in their order), for the key.
async fn cache_memory(
    client: &impl deadpool_postgres::GenericClient,
    key_id: &str,
    points: &[CachePoint],
) -> Result<Vec<PointMemory>, FleetError> {
    if points.is_empty() {
        return Ok(Vec::new());
    }
    let prefixes: Vec<String> = points.iter().map(|p| p.prefix.to_hex()).collect();
    let read = client
        .prepare_cached(
            "SELECT prefix, seen_ms, placed_ms FROM fleet_cache_points \
             WHERE key_id = $1::text AND prefix = ANY($2::text[])",
        )
        .await?;
    let rows = client.query(&read, &[&key_id, &prefixes]).await?;
    let mut by_prefix = HashMap::with_capacity(rows.len());
    for row in &rows {
        let memory = PointMemory {
            seen_ms: Some(un(row.get::<_, i64>("seen_ms"))),
            placed_ms: row.get::<_, Option<i64>>("placed_ms").map(un),
        };
        by_prefix.insert(row.get::<_, String>("prefix"), memory);
    }
    Ok(prefixes
        .iter()
        .map(|p| by_prefix.get(p).copied().unwrap_or_default())
        .collect())
}

/// Every cache point of an admitted request was sent now; the booked breakpoints were placed
/// now (a read through a breakpoint refreshes its entry, as the provider's does).
async fn remember_cache_points(
    tx: &deadpool_postgres::Transaction<'_>,
    key_id: &str,
    points: &[CachePoint],
    booking: &Booking,
    now: i64,
) -> Result<(), FleetError> {
    let prefixes: Vec<String> = points.iter().map(|p| p.prefix.to_hex()).collect();
    let placed: Vec<bool> = (0..points.len())
        .map(|i| u16::try_from(i).is_ok_and(|i| booking.cache_breakpoints.contains(&i)))
        .collect();
    let upsert = tx
        .prepare_cached(
            "INSERT INTO fleet_cache_points AS c (key_id, prefix, seen_ms, placed_ms) \
             SELECT $1::text, p, $2::bigint, CASE WHEN placed THEN $2::bigint END \
             FROM unnest($3::text[], $4::boolean[]) AS t(p, placed) \
             ON CONFLICT (key_id, prefix) DO UPDATE \
             SET seen_ms = EXCLUDED.seen_ms, \
                 placed_ms = COALESCE(EXCLUDED.placed_ms, c.placed_ms)",
        )
        .await?;
    tx.execute(&upsert, &[&key_id, &now, &prefixes, &placed])
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_bound_by_name_once_each_and_casts_are_kept() {
        let (a, b, c) = (1_i64, "k", true);
        let named = Named::new("SELECT :b::text, :a, :b, x::int, :c::boolean, ':'");
        let values = named.values(&[("a", &a), ("b", &b), ("c", &c), ("unused", &a)]);
        assert_eq!(
            named.sql,
            "SELECT $1::text, $2, $1, x::int, $3::boolean, ':'"
        );
        assert_eq!(values.len(), 3);
    }

    #[test]
    fn the_admission_statements_bind_every_name() {
        let v = 0_i64;
        let names = [
            "decision_id",
            "key_id",
            "decided_at_ms",
            "fingerprint",
            "step_fingerprint",
            "model",
            "verdict",
            "reason",
            "reserved_nano",
            "row_json",
            "nano",
            "expires_ms",
            "served_model",
            "wire",
            "output_ceiling",
            "reservation_fingerprint",
            "reusable",
            "ceiling",
            "since",
            "recorded_by",
            "input_tokens",
            "cache_edits",
            "session",
        ];
        let binds: Vec<Bind<'_>> = names.iter().map(|&n| (n, &v as _)).collect();
        for (template, bound) in [(INSERT_DECISION, 10), (DECIDE_AND_RESERVE, 23)] {
            let named = Named::new(template);
            let (sql, values) = (&named.sql, named.values(&binds));
            // Only casts keep a colon.
            assert_eq!(
                sql.matches(':').count(),
                2 * sql.matches("::").count(),
                "{sql}"
            );
            assert_eq!(values.len(), bound, "{sql}");
        }
    }

    #[tokio::test]
    async fn a_key_admits_one_at_a_time_and_its_queue_goes_with_its_last_turn() {
        let queues = Arc::new(KeyQueues::default());
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let first = queues.turn("k").await.unwrap();
        let waiters: Vec<_> = (0..3)
            .map(|i| {
                let (queues, order) = (queues.clone(), order.clone());
                tokio::spawn(async move {
                    let _turn = queues.turn("k").await.unwrap();
                    order.lock().unwrap().push(i);
                    tokio::task::yield_now().await;
                    order.lock().unwrap().push(i);
                })
            })
            .collect();
        // Another key is not held up by this one's queue.
        drop(queues.turn("other").await.unwrap());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            order.lock().unwrap().is_empty(),
            "nobody runs before the first turn ends"
        );
        drop(first);
        for w in waiters {
            w.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        // Each turn's two marks are adjacent: the turns never overlapped.
        assert_eq!(order.len(), 6);
        assert!(order.chunks(2).all(|pair| pair[0] == pair[1]), "{order:?}");
        assert!(queues.queues().is_empty(), "queues outlived their turns");
    }
}
