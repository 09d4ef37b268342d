//! A fleet of gate instances on one PostgreSQL (`[store] kind = "postgres"`): the database is
//! the one source of truth for budgets, reservations and the runaway windows, so two instances
//! behind a load balancer decide exactly as one would.
//!
//! - *admit* ([`Fleet::admit`]): one READ COMMITTED transaction — lock the key's row, count the
//!   windows from the shared decisions, read spend and reservations, decide (the pure
//!   [`crate::gate::decide_with`], called by the caller's closure), record the decision, and
//!   reserve the worst case with a conditional insert (`spent + reserved + worst <= ceiling`).
//! - *settle* ([`Fleet::settle`]): delete the reservation and insert the usage in one
//!   transaction, idempotent by decision (reservation) id.
//! - *expiry* ([`Fleet::expire`]): one statement any instance may run at any time, with the
//!   database's clock; an expired reservation is charged its worst case.
//!
//! When the database cannot be reached every call fails with [`FleetError::Unavailable`] and
//! the callers fail closed (503); usage that could not be written goes to the [`spool`].

pub mod spool;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{IsolationLevel, NoTls};

use crate::config::{BudgetPeriod, FleetConfig};
use crate::gate::{BudgetState, WindowCounts};
use crate::request::{Hash, WireForm};
use crate::store::{period_start, DecisionRow, UsageRow};

/// The schema, in order; each applied once, recorded in `schema_migrations`.
const MIGRATIONS: &[(i32, &str)] = &[(1, include_str!("../../migrations/pg/0001_fleet.sql"))];

/// Taken while migrating, so instances starting together apply each migration once.
const MIGRATION_LOCK: i64 = 0x746f_6b65_6e73_6176;

/// How long one admission, settle or sweep may take before it counts as the database being
/// unreachable (the caller answers 503 rather than hold the client).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait for a connection (a stopped server refuses at once; a partitioned one
/// does not).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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
        tracing::warn!(code = ?e.code().map(|c| c.code()), "fleet database error");
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
#[derive(Debug, Clone, Copy)]
pub struct Observed {
    /// The decision time: the database's clock, strictly increasing per key.
    pub now_ms: u64,
    pub counts: WindowCounts,
    /// `None` when the key has no ceiling.
    pub budget: Option<BudgetState>,
}

/// A key's budget as admission reads it.
#[derive(Debug, Clone, Copy)]
pub struct KeyLimit {
    pub ceiling_nano: Option<u64>,
    pub period: BudgetPeriod,
}

/// What one admission writes: the decision row (the attempt the windows count) and, for a
/// forwarded decision, its reservation.
pub struct Booking {
    pub row: DecisionRow,
    pub reservation: Option<NewReservation>,
}

pub struct NewReservation {
    pub nano: u64,
    pub served_model: String,
    pub wire: WireForm,
    pub output_ceiling: Option<u64>,
    pub fingerprint: Hash,
    pub reusable: bool,
    /// A person's approval forwards past `exceeds_remaining_budget` (SPEC §2.7): the
    /// conditional reservation does not apply to it.
    pub approved_past_budget: bool,
}

/// An open reservation, as settling reads it back.
#[derive(Debug, Clone)]
pub struct OpenReservation {
    pub nano: u64,
    pub output_ceiling: Option<u64>,
    pub fingerprint: Option<Hash>,
    pub reusable: bool,
}

/// A key's budget figures at one instant (one statement, one snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetSample {
    pub spend_nano: u64,
    pub reserved_nano: u64,
}

pub struct Fleet {
    pool: Pool,
    reservation_ttl_ms: u64,
}

fn db(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn un(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Fleet {
    /// Apply the migrations (one connection, under an advisory lock) and build the pool. The
    /// pool connects lazily, on the runtime of whichever task asks first.
    pub async fn connect(config: &FleetConfig, reservation_ttl_ms: u64) -> Result<Fleet, String> {
        let mut pg: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(|_| "store.url: not a PostgreSQL connection URL".to_string())?;
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
            .map_err(|_| "fleet database: cannot build the connection pool".to_string())?;
        Ok(Fleet {
            pool,
            reservation_ttl_ms,
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
        key_id: &str,
        fingerprint: &Hash,
        step: &Hash,
        model: &str,
        limit: KeyLimit,
        decide: impl FnOnce(Observed) -> (T, Booking),
    ) -> Result<T, FleetError> {
        tokio::time::timeout(
            CALL_TIMEOUT,
            self.admit_inner(key_id, fingerprint, step, model, limit, decide),
        )
        .await
        .unwrap_or(Err(FleetError::Unavailable))
    }

    async fn admit_inner<T>(
        &self,
        key_id: &str,
        fingerprint: &Hash,
        step: &Hash,
        model: &str,
        limit: KeyLimit,
        decide: impl FnOnce(Observed) -> (T, Booking),
    ) -> Result<T, FleetError> {
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
                "INSERT INTO fleet_keys AS k (key_id, last_decided_ms) VALUES ($1, {DB_NOW_MS}) \
                 ON CONFLICT (key_id) DO UPDATE \
                 SET last_decided_ms = GREATEST({DB_NOW_MS}, k.last_decided_ms + 1) \
                 RETURNING last_decided_ms"
            ))
            .await?;
        let now: i64 = tx.query_one(&lock, &[&key_id]).await?.get(0);
        let now_ms = un(now);
        let since = db(period_start(limit.period, now_ms));
        let fp = fingerprint.to_hex();
        let step = step.to_hex();
        let read = tx.prepare_cached(OBSERVE).await?;
        let row = tx
            .query_one(&read, &[&key_id, &fp, &step, &model, &now, &since])
            .await?;
        let counts = counts_from(&row);
        let spend = un(row.get::<_, i64>(7));
        let reserved = un(row.get::<_, i64>(8));
        let budget = limit.ceiling_nano.map(|ceiling| BudgetState {
            ceiling_nano: ceiling,
            spend_nano: spend,
            reserved_nano: reserved,
        });
        let (out, booking) = decide(Observed {
            now_ms,
            counts,
            budget,
        });

        let row = &booking.row;
        let insert = tx.prepare_cached(INSERT_DECISION).await?;
        let row_json = serde_json::to_string(row).map_err(|_| FleetError::Unavailable)?;
        tx.execute(
            &insert,
            &[
                &row.decision_id,
                &key_id,
                &db(row.decided_at_ms),
                &row.fingerprint,
                &row.step_fingerprint,
                &row.model_requested,
                &row.verdict.as_str(),
                &row.reason,
                &db(row.reserved_nano),
                &row_json,
            ],
        )
        .await?;
        if let Some(r) = &booking.reservation {
            let reserve = tx.prepare_cached(RESERVE).await?;
            let ceiling = limit
                .ceiling_nano
                .filter(|_| !r.approved_past_budget)
                .map(db);
            let expires = db(now_ms.saturating_add(self.reservation_ttl_ms));
            let reserved = tx
                .execute(
                    &reserve,
                    &[
                        &row.decision_id,
                        &key_id,
                        &db(r.nano),
                        &expires,
                        &r.served_model,
                        &r.wire.as_str(),
                        &r.output_ceiling.map(db),
                        &r.fingerprint.to_hex(),
                        &r.reusable,
                        &ceiling,
                        &since,
                    ],
                )
                .await?;
            if reserved != 1 {
                tx.rollback().await?;
                return Err(FleetError::Overshoot);
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Settle a forwarded decision: take its reservation and book what `charge` makes of it,
    /// in one transaction; idempotent by decision id (a second settle, or one after expiry,
    /// finds no reservation and a usage row).
    pub async fn settle(
        &self,
        decision_id: &str,
        key_id: &str,
        wire: WireForm,
        served_model: &str,
        charge: impl FnOnce(&OpenReservation, u64) -> UsageRow,
    ) -> Result<(UsageRow, OpenReservation), SettleError> {
        tokio::time::timeout(
            CALL_TIMEOUT,
            self.settle_inner(decision_id, key_id, wire, served_model, charge),
        )
        .await
        .unwrap_or(Err(SettleError::Fleet(FleetError::Unavailable)))
    }

    async fn settle_inner(
        &self,
        decision_id: &str,
        key_id: &str,
        wire: WireForm,
        served_model: &str,
        charge: impl FnOnce(&OpenReservation, u64) -> UsageRow,
    ) -> Result<(UsageRow, OpenReservation), SettleError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let take = tx
            .prepare_cached(&format!(
                "DELETE FROM fleet_reservations \
                 WHERE decision_id = $1 AND key_id = $2 AND wire = $3 AND served_model = $4 \
                 RETURNING nano, output_ceiling, fingerprint, reusable, {DB_NOW_MS}"
            ))
            .await?;
        let taken = tx
            .query_opt(
                &take,
                &[&decision_id, &key_id, &wire.as_str(), &served_model],
            )
            .await?;
        let Some(taken) = taken else {
            let why = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM fleet_reservations \
                                    WHERE decision_id = $1 AND key_id = $2 AND wire = $3), \
                            EXISTS (SELECT 1 FROM fleet_usage WHERE decision_id = $1)",
                    &[&decision_id, &key_id, &wire.as_str()],
                )
                .await?;
            return Err(if why.get::<_, bool>(0) {
                SettleError::ModelMismatch
            } else if why.get::<_, bool>(1) {
                SettleError::AlreadySettled
            } else {
                SettleError::Unknown
            });
        };
        let reservation = OpenReservation {
            nano: un(taken.get::<_, i64>(0)),
            output_ceiling: taken.get::<_, Option<i64>>(1).map(un),
            fingerprint: Hash::from_hex(taken.get::<_, &str>(2)),
            reusable: taken.get(3),
        };
        let at_ms = un(taken.get::<_, i64>(4));
        let row = charge(&reservation, at_ms);
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
                &decision_id,
                &key_id,
                &db(at_ms),
                &db(row.spend_nano),
                &row_json,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok((row, reservation))
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
            Ok::<_, FleetError>(client.execute(&stmt, &[]).await?)
        };
        tokio::time::timeout(CALL_TIMEOUT, sweep)
            .await
            .unwrap_or(Err(FleetError::Unavailable))
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
                                  WHERE key_id = $1 AND at_ms >= $2), 0)::bigint, \
                        COALESCE((SELECT sum(nano) FROM fleet_reservations \
                                  WHERE key_id = $1), 0)::bigint",
                &[&key_id, &db(since_ms)],
            )
            .await?;
        Ok(BudgetSample {
            spend_nano: un(row.get(0)),
            reserved_nano: un(row.get(1)),
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
        let stmt = client.prepare_cached(OBSERVE).await?;
        let row = client
            .query_one(
                &stmt,
                &[
                    &key_id,
                    &fingerprint.to_hex(),
                    &step.to_hex(),
                    &model,
                    &db(now_ms),
                    &0_i64,
                ],
            )
            .await?;
        Ok(counts_from(&row))
    }

    /// Record a decision row without a decision (the windows' equivalence test).
    pub async fn record_attempt(&self, row: &DecisionRow) -> Result<(), FleetError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(INSERT_DECISION).await?;
        let row_json = serde_json::to_string(row).map_err(|_| FleetError::Unavailable)?;
        client
            .execute(
                &stmt,
                &[
                    &row.decision_id,
                    &row.key_id,
                    &db(row.decided_at_ms),
                    &row.fingerprint,
                    &row.step_fingerprint,
                    &row.model_requested,
                    &row.verdict.as_str(),
                    &row.reason,
                    &db(row.reserved_nano),
                    &row_json,
                ],
            )
            .await?;
        Ok(())
    }
}

/// The windows, spend and reservations of a key at `$5` (the decision time), in one
/// statement. Each window is the in-memory [`crate::gate::Windows`]'s, down to its caps: the
/// identical-request lists keep 64 entries, the key's request list 1024 (`LIMIT` bounds each
/// count the same way, and bounds the scan). An entry exactly the window's length old is
/// outside (`> now - len`).
const OBSERVE: &str = "SELECT \
    (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = $1 AND fingerprint = $2 \
        AND decided_at_ms > $5::bigint - 120000 LIMIT 64) s)::bigint, \
    (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = $1 \
        AND step_fingerprint = $3 AND decided_at_ms > $5::bigint - 120000 LIMIT 64) s)::bigint, \
    (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = $1 AND fingerprint = $2 \
        AND step_fingerprint = $3 AND decided_at_ms > $5::bigint - 120000 LIMIT 64) s)::bigint, \
    (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = $1 \
        AND decided_at_ms > $5::bigint - 60000 LIMIT 1024) s)::bigint, \
    (SELECT count(*) FROM (SELECT 1 FROM fleet_decisions WHERE key_id = $1 \
        AND decided_at_ms > $5::bigint - 3600000 LIMIT 1024) s)::bigint, \
    EXISTS (SELECT 1 FROM fleet_decisions WHERE key_id = $1 AND model = $4 \
        AND decided_at_ms > $5::bigint - 86400000), \
    EXISTS (SELECT 1 FROM fleet_decisions WHERE key_id = $1 AND fingerprint = $2 \
        AND decided_at_ms > $5::bigint - 86400000), \
    COALESCE((SELECT sum(spend_nano) FROM fleet_usage WHERE key_id = $1 AND at_ms >= $6), 0)::bigint, \
    COALESCE((SELECT sum(nano) FROM fleet_reservations WHERE key_id = $1), 0)::bigint";

const INSERT_DECISION: &str = "INSERT INTO fleet_decisions (decision_id, key_id, decided_at_ms, \
    fingerprint, step_fingerprint, model, verdict, reason, reserved_nano, row_json) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// The conditional reservation: inserted only if the key's spend in its period, its open
/// reservations and this worst case fit under the ceiling (`$10`; NULL: no ceiling), all read
/// by this same statement.
const RESERVE: &str = "INSERT INTO fleet_reservations (decision_id, key_id, nano, expires_ms, \
    served_model, wire, output_ceiling, fingerprint, reusable) \
    SELECT $1::text, $2::text, $3::bigint, $4::bigint, $5::text, $6::text, $7::bigint, \
           $8::text, $9::boolean \
    WHERE $10::bigint IS NULL \
       OR COALESCE((SELECT sum(spend_nano) FROM fleet_usage \
                    WHERE key_id = $2::text AND at_ms >= $11::bigint), 0) \
        + COALESCE((SELECT sum(nano) FROM fleet_reservations WHERE key_id = $2::text), 0) \
        + $3::bigint <= $10::bigint";

fn counts_from(row: &tokio_postgres::Row) -> WindowCounts {
    let same_fingerprint = un(row.get::<_, i64>(0));
    let same_step = un(row.get::<_, i64>(1));
    let same_both = un(row.get::<_, i64>(2));
    WindowCounts {
        earlier_identical: same_fingerprint + same_step.saturating_sub(same_both),
        earlier_key_minute: un(row.get::<_, i64>(3)),
        earlier_key_hour: un(row.get::<_, i64>(4)),
        model_seen: row.get(5),
        fingerprint_seen: row.get(6),
    }
}

/// Apply the migrations not yet recorded, in order, each in its own transaction, under a
/// session advisory lock (instances starting together wait for the first).
async fn migrate(pg: &tokio_postgres::Config) -> Result<(), String> {
    let unreachable = |_| "fleet database: cannot connect".to_string();
    let (mut client, connection) = pg.connect(NoTls).await.map_err(unreachable)?;
    let driver = tokio::spawn(connection);
    let result = async {
        let failed = |_| "fleet database: migration failed".to_string();
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
