//! The embedded SQLite store (`rusqlite`, bundled): one database file, `tokensaver.db`, in
//! the data directory.
//!
//! # Durability
//! The database runs in WAL mode with `synchronous = FULL`: every commit appends its frames
//! to the write-ahead log and fsyncs the log before `COMMIT` returns. With `NORMAL`, the log
//! is fsynced only at checkpoints, so a commit survives a process kill (the frames are in the
//! OS page cache) but not a power loss or kernel crash. The gate acknowledges a `/record`
//! only after its commit returned, so that acknowledgement must survive both: `FULL`. Its
//! cost is one fsync per *group* commit, not per event (see below).
//!
//! # Group commit
//! The hot path never touches the database: [`Store::submit`] pushes the event onto a
//! channel and returns. One writer thread owns the write connection. It blocks for the first
//! event, then drains whatever else is queued (up to [`BATCH_CAP`] events) and writes the
//! whole batch in one transaction, one fsync.
//! - If anyone waits on the batch ([`Store::submit_and_wait`], [`Store::flush`]), it commits
//!   as soon as the queue is empty: a waiter never waits for a timer, only for the fsync in
//!   progress (if any) and its own. Under load, events that arrive during one fsync form the
//!   next batch, so the batch size grows with the load and the fsync rate stays bounded.
//! - If nobody waits (fire-and-forget decisions), it keeps collecting for at most
//!   `commit_interval_ms` after the batch's first event, then commits. Nobody's latency
//!   depends on those events, so lingering costs nothing and saves fsyncs at moderate load.
//!
//! Each event is applied atomically on its own (one statement, or a savepoint): an event the
//! database rejects (a second usage row for a decision, a duplicate decision id) is rolled
//! back alone and reported to its waiter, and the rest of the batch commits. A failed
//! commit is reported to every waiter of the batch; the writer logs the error kind (never
//! row content) and keeps running.
//!
//! # What a SIGKILL can lose
//! Nothing acknowledged: `submit_and_wait` and `flush` return `Ok` only after `COMMIT`
//! returned (fsync done). A kill can lose only events submitted with [`Store::submit`] and
//! not yet committed: those of the last `commit_interval_ms` plus the duration of one
//! commit before the kill (more only if the writer had fallen behind and events were
//! queued). A power loss loses the same and no more, on storage that honours fsync.
//!
//! # Off the requests' CPU
//! The writer yields the CPU every 50 µs within a batch and the WAL is checkpointed by a
//! thread of its own at idle priority ([`background`]): on a gate with one core, a request
//! that became ready while the ledger worked waits a slice, not a batch or a checkpoint.
//!
//! # Reads
//! Reads use a second connection behind a mutex; WAL lets it read the last committed state
//! beside the writer. They see committed events only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::types::Type;
use rusqlite::{named_params, params, Connection, OptionalExtension, Row, TransactionBehavior};

mod background;
mod page_reads;

use background::{Checkpointer, WriterCpu, WRITER_CHECKPOINT_PAGES};

use super::ledger::{DecisionSums, LedgerFold, Settlement, UsageSums, MAX_DECISIONS_PAGE};
use super::{
    period_start, Acked, DecisionLine, DecisionPage, DecisionQuery, DecisionRow, Ending, Event,
    HoldOpening, HoldRow, HoldState, LeaseRow, LedgerDay, LedgerTotals, ResponseBinding, Snapshot,
    SpendBasis, Store, StoreError, UsageRow,
};
use super::{CacheHealth, DecisionListing, RecordSource, VerdictCount};
use crate::config::{BudgetPeriod, Prices};
use crate::receipt::DecisionId;
use tokensaver_core::gate::cache::CacheEdits;
use tokensaver_core::gate::{Usage, Verdict};
use tokensaver_core::request::{Hash, WireForm};

/// The database file inside the data directory.
pub const DB_FILE: &str = "tokensaver.db";
/// At most this many events are written in one transaction.
pub const BATCH_CAP: usize = 4096;
/// The most events queued for the writer: a submitter finding the queue full waits for room
/// (backpressure at the disk's pace) rather than grow memory without bound or drop an event.
/// Sixteen batches: the writer never starves, and a burst the disk cannot absorb slows the
/// requests that make it.
pub const WRITER_QUEUE_CAP: usize = 16 * BATCH_CAP;
/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
const DAY_MS: u64 = 86_400_000;

/// Ordered schema migrations (`migrations/sqlite/`, each file's opening comment says why):
/// entry `i` takes the schema from version `i` to `i + 1`. Never edit an entry once released;
/// append a new one.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/sqlite/0001_initial.sql"),
    include_str!("../../../migrations/sqlite/0002_cheaper_writes.sql"),
    include_str!("../../../migrations/sqlite/0003_hold_release.sql"),
    include_str!("../../../migrations/sqlite/0004_step_fingerprint.sql"),
    include_str!("../../../migrations/sqlite/0005_exact_usage.sql"),
    include_str!("../../../migrations/sqlite/0006_fingerprints_as_bytes.sql"),
    include_str!("../../../migrations/sqlite/0007_recorded_by.sql"),
    include_str!("../../../migrations/sqlite/0008_cache_saving.sql"),
    include_str!("../../../migrations/sqlite/0009_sessions.sql"),
    include_str!("../../../migrations/sqlite/0010_responses.sql"),
    include_str!("../../../migrations/sqlite/0011_no_session_index.sql"),
    include_str!("../../../migrations/sqlite/0012_response_upstream.sql"),
    include_str!("../../../migrations/sqlite/0013_cache_lifetimes_routing.sql"),
];

macro_rules! decision_columns {
    () => {
        "decision_id, key_id, fingerprint, verdict, reason, score, model_requested, \
         model_served, wire, decided_at_ms, reserved_nano, worst_case_tokens, \
         tokens_not_bought, worst_case_tokens_avoided, findings_tokens, hold_id, \
         step_fingerprint, recorded_by, session, paced_ms, cache_edits"
    };
}
const DECISION_COLUMNS: &str = decision_columns!();
/// Built once: the statement cache is keyed by the SQL text.
/// Its values bound by name (`named_params!` in [`apply`]): none can take another's place.
const INSERT_DECISION: &str = concat!(
    "INSERT INTO decisions (",
    decision_columns!(),
    ", open) VALUES (:decision_id, :key_id, :fingerprint, :verdict, :reason, :score, \
     :model_requested, :model_served, :wire, :decided_at_ms, :reserved_nano, \
     :worst_case_tokens, :tokens_not_bought, :worst_case_tokens_avoided, :findings_tokens, \
     :hold_id, :step_fingerprint, :recorded_by, :session, :paced_ms, :cache_edits, :open)"
);
/// Who a decisions query reads: the key `?1`, or every key (`?1` is NULL).
fn key_clause(by_key: bool) -> &'static str {
    if by_key {
        "d.key_id = ?1"
    } else {
        "?1 IS NULL"
    }
}

/// The page query of `GET /ledger/decisions` (one key's, or every key's): decisions with
/// their usage and expiry charge, optionally of one session, in (time, row) order after the
/// cursor.
fn decisions_sql(by_key: bool) -> String {
    let key_clause = key_clause(by_key);
    format!(
        "SELECT d.decision_id, d.key_id, d.decided_at_ms, d.verdict, d.reason, \
         d.model_requested, d.model_served, d.wire, d.hold_id, d.reserved_nano, \
         d.tokens_not_bought, d.worst_case_tokens_avoided, \
         d.session, d.paced_ms, d.step_fingerprint, d.cache_edits, \
         COALESCE(u1.id, u2.id) AS usage_row, COALESCE(u1.at_ms, u2.at_ms) AS usage_at_ms, \
         COALESCE(u1.complete, u2.complete) AS complete, \
         COALESCE(u1.ending, u2.ending) AS ending, COALESCE(u1.basis, u2.basis) AS basis, \
         COALESCE(u1.input, u2.input) AS input, \
         COALESCE(u1.cache_write, u2.cache_write) AS cache_write, \
         COALESCE(u1.cache_write_1h, u2.cache_write_1h) AS cache_write_1h, \
         COALESCE(u1.cache_read, u2.cache_read) AS cache_read, \
         COALESCE(u1.output, u2.output) AS output, \
         COALESCE(u1.web_search_requests, u2.web_search_requests) AS web_search_requests, \
         COALESCE(u1.spend_nano, u2.spend_nano) AS spend_nano, \
         e.at_ms AS expired_at_ms, e.charged_nano AS charged_nano, \
         COALESCE(u1.cache_saving_nano, u2.cache_saving_nano) AS cache_saving_nano, \
         COALESCE(u1.cache_saving_lifetimes_nano, u2.cache_saving_lifetimes_nano) \
             AS cache_saving_lifetimes_nano, \
         COALESCE(u1.cache_saving_routing_nano, u2.cache_saving_routing_nano) \
             AS cache_saving_routing_nano, \
         COALESCE(u1.cache_rebuild_nano, u2.cache_rebuild_nano) AS cache_rebuild_nano, \
         COALESCE(u1.cache_premium_1h_nano, u2.cache_premium_1h_nano, 0) \
             AS cache_premium_1h_nano \
         FROM decisions AS d \
         LEFT JOIN usage AS u1 ON u1.decision = d.id \
         LEFT JOIN usage AS u2 ON u2.decision IS NULL AND u2.decision_id = d.decision_id \
         LEFT JOIN reservation_expiries AS e ON e.decision_id = d.decision_id \
         WHERE {key_clause} AND d.decided_at_ms >= ?2 AND d.decided_at_ms < ?3 \
         AND (d.decided_at_ms, d.id) > (?4, ?5) AND (?7 IS NULL OR d.session = ?7) \
         ORDER BY d.decided_at_ms, d.id LIMIT ?6"
    )
}

/// Whether decision `d` is settled: it has a usage row (stored after it, or before it) or an
/// expiry charge.
macro_rules! settled {
    () => {
        "(EXISTS (SELECT 1 FROM usage AS u WHERE u.decision = d.id) \
          OR EXISTS (SELECT 1 FROM usage AS u \
                     WHERE u.decision IS NULL AND u.decision_id = d.decision_id) \
          OR EXISTS (SELECT 1 FROM reservation_expiries AS e \
                     WHERE e.decision_id = d.decision_id))"
    };
}
/// `open = 1` marks a decision that *may* hold an open reservation (see [`settle`]).
const SELECT_OPEN: &str = concat!(
    "SELECT ",
    decision_columns!(),
    " FROM decisions AS d WHERE open = 1 AND NOT ",
    settled!(),
    " ORDER BY decided_at_ms, id"
);

/// Where a commit's outcome goes: a thread blocked on it, or a task awaiting it.
enum Ack {
    Blocking(SyncSender<Result<(), StoreError>>),
    Async(tokio::sync::oneshot::Sender<Result<(), StoreError>>),
}

impl Ack {
    /// Hand over the outcome; a waiter that went away is no error.
    fn send(self, result: Result<(), StoreError>) {
        match self {
            Ack::Blocking(tx) => {
                let _ = tx.send(result);
            }
            Ack::Async(tx) => {
                let _ = tx.send(result);
            }
        }
    }
}

enum Msg {
    Event(Box<Event>, Option<Ack>),
    Flush(Ack),
    Shutdown,
}

#[derive(Default)]
struct Stats {
    commits: AtomicU64,
    events: AtomicU64,
    failed_commits: AtomicU64,
    rejected_events: AtomicU64,
}

/// The embedded store. Cheap to share behind an `Arc`; dropping it flushes and joins the
/// writer.
pub struct SqliteStore {
    tx: SyncSender<Msg>,
    /// The writer thread, unparked by anyone who waits on a commit.
    writer_thread: std::thread::Thread,
    reader: Mutex<Connection>,
    writer: Mutex<Option<JoinHandle<()>>>,
    checkpointer: Mutex<Option<Checkpointer>>,
    stats: Arc<Stats>,
    path: PathBuf,
}

impl SqliteStore {
    /// Open (creating on first start) `data_dir/tokensaver.db`, apply pending migrations and
    /// start the writer thread. `commit_interval_ms` bounds how long a batch nobody waits
    /// on may linger before it is committed.
    pub fn open(data_dir: &Path, commit_interval_ms: u64) -> Result<SqliteStore, StoreError> {
        Self::open_with_queue(data_dir, commit_interval_ms, WRITER_QUEUE_CAP)
    }

    /// [`Self::open`] with the writer's queue bounded at `queue_cap` events.
    fn open_with_queue(
        data_dir: &Path,
        commit_interval_ms: u64,
        queue_cap: usize,
    ) -> Result<SqliteStore, StoreError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| StoreError::Sqlite(format!("cannot create data dir: {}", e.kind())))?;
        let path = data_dir.join(DB_FILE);
        create_private(&path)?;

        let mut conn = Connection::open(&path).map_err(sql_error)?;
        configure_writer(&conn)?;
        migrate(&mut conn)?;
        clear_settled_marks(&conn)?;

        let reader = Connection::open(&path).map_err(sql_error)?;
        reader.busy_timeout(BUSY_TIMEOUT).map_err(sql_error)?;
        reader
            .pragma_update(None, "query_only", true)
            .map_err(sql_error)?;

        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::sync_channel(queue_cap);
        let writer = Writer {
            conn,
            rx,
            linger: Duration::from_millis(commit_interval_ms),
            stats: Arc::clone(&stats),
            failed_since_flush: 0,
        };
        let handle = std::thread::Builder::new()
            .name("tokensaver-store".into())
            .spawn(move || writer.run())
            .map_err(|e| StoreError::Sqlite(format!("cannot start writer: {}", e.kind())))?;

        let checkpointer = Checkpointer::start(&path);
        Ok(SqliteStore {
            tx,
            writer_thread: handle.thread().clone(),
            reader: Mutex::new(reader),
            writer: Mutex::new(Some(handle)),
            checkpointer: Mutex::new(checkpointer),
            stats,
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Transactions committed by the writer since open.
    pub fn commits(&self) -> u64 {
        self.stats.commits.load(Ordering::Relaxed)
    }

    /// Events committed since open.
    pub fn events_committed(&self) -> u64 {
        self.stats.events.load(Ordering::Relaxed)
    }

    /// Batches whose commit failed since open (their events are lost and were reported).
    pub fn failed_commits(&self) -> u64 {
        self.stats.failed_commits.load(Ordering::Relaxed)
    }

    /// Events the database rejected since open (rolled back alone; the batch committed).
    pub fn rejected_events(&self) -> u64 {
        self.stats.rejected_events.load(Ordering::Relaxed)
    }

    /// Commit everything queued, stop the writer and wait for it. Later submits are dropped
    /// (logged) and later waits answer [`StoreError::Unavailable`]. Idempotent.
    pub fn shutdown(&self) -> Result<(), StoreError> {
        if let Some(checkpointer) = lock(&self.checkpointer).take() {
            checkpointer.stop();
        }
        let handle = lock(&self.writer).take();
        let Some(handle) = handle else {
            return Ok(());
        };
        // The writer drains every message queued before this one, then exits.
        let _ = self.tx.send(Msg::Shutdown);
        self.writer_thread.unpark();
        handle.join().map_err(|_| StoreError::Unavailable)
    }

    fn send(&self, msg: Msg) -> Result<(), StoreError> {
        self.tx.send(msg).map_err(|_| StoreError::Unavailable)
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = lock(&self.reader);
        // One read transaction: every query sees the same committed state.
        let tx = conn.transaction().map_err(sql_error)?;
        let out = f(&tx)?;
        tx.commit().map_err(sql_error)?;
        Ok(out)
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "store: writer did not stop cleanly");
        }
    }
}

impl Store for SqliteStore {
    fn load(&self, now_ms: u64) -> Result<Snapshot, StoreError> {
        let since = now_ms.saturating_sub(DAY_MS);
        let month_start_day = period_start(BudgetPeriod::Month, now_ms) / DAY_MS;
        self.read(|tx| {
            let mut snap = Snapshot::default();

            let sql = format!(
                "SELECT {DECISION_COLUMNS} FROM decisions WHERE decided_at_ms > ?1 \
                 ORDER BY decided_at_ms, id"
            );
            let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
            snap.recent_decisions = stmt
                .query_map([to_i64(since)], decision_from_row)
                .and_then(Iterator::collect)
                .map_err(sql_error)?;

            let mut stmt = tx.prepare_cached(SELECT_OPEN).map_err(sql_error)?;
            snap.open_reservations = stmt
                .query_map([], decision_from_row)
                .and_then(Iterator::collect)
                .map_err(sql_error)?;

            // Spend (usage rows and expiry charges), summed per key and UTC day in the
            // current month and per key and UTC month before it; each row's time is the
            // start of its day or month. Every budget period (lifetime, UTC day, UTC month)
            // is a union of such buckets, so the sums the gate makes are exact.
            let mut stmt = tx
                .prepare_cached(
                    "SELECT key_id, day, SUM(spend >> 32) AS spend_high, SUM(spend & 4294967295) AS spend_low FROM ( \
                       SELECT key_id, at_ms / 86400000 AS day, spend_nano AS spend FROM usage \
                       UNION ALL \
                       SELECT key_id, at_ms / 86400000, charged_nano FROM reservation_expiries \
                     ) GROUP BY key_id, day",
                )
                .map_err(sql_error)?;
            let mut rows = stmt.query([]).map_err(sql_error)?;
            let mut spend: BTreeMap<(String, u64), u64> = BTreeMap::new();
            while let Some(row) = rows.next().map_err(sql_error)? {
                let key: String = row.get("key_id").map_err(sql_error)?;
                let day = get_u64(row, "day").map_err(sql_error)?;
                let sum = get_sum(row, "spend").map_err(sql_error)?;
                let at = if day < month_start_day {
                    period_start(BudgetPeriod::Month, day.saturating_mul(DAY_MS))
                } else {
                    day.saturating_mul(DAY_MS)
                };
                let slot = spend.entry((key, at)).or_default();
                *slot = slot.saturating_add(sum);
            }
            snap.spend = spend.into_iter().map(|((k, at), s)| (k, at, s)).collect();

            let mut stmt = tx
                .prepare_cached(
                    "SELECT hold_id, key_id, fingerprint, created_ms, expires_ms, state, \
                     worst_case_tokens, decision, receipt FROM holds \
                     WHERE state IN ('pending', 'approved') ORDER BY created_ms, hold_id",
                )
                .map_err(sql_error)?;
            let holds: Vec<(HoldRow, Option<HoldOpening>)> = stmt
                .query_map([], |r| {
                    let hold = HoldRow {
                        hold_id: r.get("hold_id")?,
                        key_id: r.get("key_id")?,
                        // One that does not read as a fingerprint indexes nothing, as blank.
                        fingerprint: r.get::<_, Option<Hash>>("fingerprint").ok().flatten(),
                        created_ms: get_u64(r, "created_ms")?,
                        expires_ms: get_u64(r, "expires_ms")?,
                        state: hold_state_from(r, "state")?,
                        worst_case_tokens: get_u64(r, "worst_case_tokens")?,
                    };
                    let decision: Option<String> = r.get("decision")?;
                    let receipt: Option<Vec<u8>> = r.get("receipt")?;
                    let opening = match (hold.state, decision, receipt) {
                        (HoldState::Pending, Some(decision), Some(receipt)) => Some(HoldOpening {
                            hold_id: hold.hold_id.clone(),
                            decision,
                            receipt,
                        }),
                        _ => None,
                    };
                    Ok((hold, opening))
                })
                .and_then(Iterator::collect)
                .map_err(sql_error)?;
            for (hold, opening) in holds {
                snap.holds.push(hold);
                snap.hold_openings.extend(opening);
            }

            let mut stmt = tx
                .prepare_cached(
                    "SELECT hold_id, key_id, granted_ms, until_ms FROM leases \
                     WHERE until_ms > ?1 ORDER BY granted_ms, hold_id",
                )
                .map_err(sql_error)?;
            snap.leases = stmt
                .query_map([to_i64(now_ms)], |r| {
                    Ok(LeaseRow {
                        hold_id: r.get("hold_id")?,
                        key_id: r.get("key_id")?,
                        granted_ms: get_u64(r, "granted_ms")?,
                        until_ms: get_u64(r, "until_ms")?,
                    })
                })
                .and_then(Iterator::collect)
                .map_err(sql_error)?;

            let mut stmt = tx
                .prepare_cached(
                    "SELECT key_id, fingerprint, wire, input, cache_write, cache_read, output, \
                     at_ms FROM recorded ORDER BY at_ms, key_id, fingerprint, wire",
                )
                .map_err(sql_error)?;
            // A fingerprint that does not read as one can match no request: left out.
            let recorded: Vec<Option<crate::store::RecordedRow>> = stmt
                .query_map([], |r| {
                    let Ok(fingerprint) = r.get::<_, Hash>("fingerprint") else {
                        return Ok(None);
                    };
                    Ok(Some((
                        r.get("key_id")?,
                        fingerprint,
                        wire_from(r, "wire")?,
                        usage_from(r)?,
                        r.get::<_, i64>("at_ms").map(|t| u64::try_from(t).unwrap_or(0))?,
                    )))
                })
                .and_then(Iterator::collect)
                .map_err(sql_error)?;
            snap.recorded = recorded.into_iter().flatten().collect();

            let mut stmt = tx
                .prepare_cached("SELECT key_id, ceiling_nano, period FROM budgets ORDER BY key_id")
                .map_err(sql_error)?;
            snap.budgets = stmt
                .query_map([], |r| {
                    let ceiling: Option<i64> = r.get("ceiling_nano")?;
                    Ok((
                        r.get("key_id")?,
                        ceiling.map(to_u64),
                        period_from(r, "period")?,
                    ))
                })
                .and_then(Iterator::collect)
                .map_err(sql_error)?;

            let mut stmt = tx
                .prepare_cached(
                    "SELECT model, input, cache_write, cache_read, output, max_output, \
                     cache_write_1h, web_search_per_1k FROM prices ORDER BY model",
                )
                .map_err(sql_error)?;
            snap.prices = stmt
                .query_map([], |r| {
                    Ok((
                        r.get("model")?,
                        Prices {
                            input: get_u64(r, "input")?,
                            cache_write: get_u64(r, "cache_write")?,
                            cache_read: get_u64(r, "cache_read")?,
                            output: get_u64(r, "output")?,
                            max_output: get_u64(r, "max_output")?,
                            cache_write_1h: r.get::<_, Option<i64>>("cache_write_1h")?.map(to_u64),
                            web_search_per_1k: r
                                .get::<_, Option<i64>>("web_search_per_1k")?
                                .map(to_u64),
                        },
                    ))
                })
                .and_then(Iterator::collect)
                .map_err(sql_error)?;

            Ok(snap)
        })
    }

    fn submit(&self, event: Event) {
        if self.send(Msg::Event(Box::new(event), None)).is_err() {
            tracing::warn!("store: closed, event dropped");
        }
    }

    fn submit_and_wait(&self, event: Event) -> Result<(), StoreError> {
        let (ack, done) = mpsc::sync_channel(1);
        self.send(Msg::Event(Box::new(event), Some(Ack::Blocking(ack))))?;
        self.writer_thread.unpark();
        done.recv().map_err(|_| StoreError::Unavailable)?
    }

    fn flush(&self) -> Result<(), StoreError> {
        let (ack, done) = mpsc::sync_channel(1);
        self.send(Msg::Flush(Ack::Blocking(ack)))?;
        self.writer_thread.unpark();
        done.recv().map_err(|_| StoreError::Unavailable)?
    }

    fn submit_acked(&self, event: Event) -> Acked {
        let (ack, done) = tokio::sync::oneshot::channel();
        // A closed writer drops the sender with the message: the receiver answers Unavailable.
        let _ = self.send(Msg::Event(Box::new(event), Some(Ack::Async(ack))));
        self.writer_thread.unpark();
        Acked::new(done)
    }

    fn flush_acked(&self) -> Acked {
        let (ack, done) = tokio::sync::oneshot::channel();
        let _ = self.send(Msg::Flush(Ack::Async(ack)));
        self.writer_thread.unpark();
        Acked::new(done)
    }

    fn close(&self) -> Result<(), StoreError> {
        let flushed = self.flush();
        self.shutdown()?;
        flushed
    }

    fn ledger(
        &self,
        key_id: Option<&str>,
        from_day: Option<&str>,
        to_day: Option<&str>,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), StoreError> {
        // Day bounds → a half-open time range [from, to), so the (key, time) indexes apply.
        let from_ms = match from_day {
            Some(d) => day_start_ms(d)?,
            None => i64::MIN,
        };
        let to_ms = match to_day {
            Some(d) => day_start_ms(d)?.saturating_add(DAY_MS as i64),
            None => i64::MAX,
        };
        let key_clause = if key_id.is_some() {
            "key_id = ?1"
        } else {
            "?1 IS NULL"
        };
        let bind = params![key_id, from_ms, to_ms];

        let fold = self.read(|tx| {
            let mut fold = LedgerFold::default();

            let sql = format!(
                "SELECT decided_at_ms / 86400000 AS day, verdict, COUNT(*) AS count, {}, {}, {} \
                 FROM decisions WHERE {key_clause} AND decided_at_ms >= ?2 AND decided_at_ms < ?3 \
                 GROUP BY day, verdict",
                split_sum("tokens_not_bought", "not_bought"),
                split_sum(
                    "CASE WHEN verdict = 'BLOCK' THEN worst_case_tokens_avoided ELSE 0 END",
                    "avoided"
                ),
                split_sum("findings_tokens", "findings"),
            );
            let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
            let mut rows = stmt.query(bind).map_err(sql_error)?;
            while let Some(r) = rows.next().map_err(sql_error)? {
                let sums = DecisionSums {
                    count: get_u64(r, "count")?,
                    tokens_not_bought: get_sum(r, "not_bought")?,
                    worst_case_tokens_avoided: get_sum(r, "avoided")?,
                    findings_tokens: get_sum(r, "findings")?,
                };
                fold.decisions(get_u64(r, "day")?, verdict_from(r, "verdict")?, sums);
            }
            drop(rows);

            let sql = format!(
                "SELECT at_ms / 86400000 AS day, {}, {}, {}, {}, {}, \
                 SUM(basis = 'unpriced') AS unpriced, \
                 COALESCE(SUM(cache_saving_nano), 0) AS cache_saving, \
                 COALESCE(SUM(cache_saving_lifetimes_nano), 0) AS cache_saving_lifetimes, \
                 COALESCE(SUM(cache_saving_routing_nano), 0) AS cache_saving_routing, \
                 COUNT(cache_rebuild_nano) AS rebuilds, \
                 COALESCE(SUM(cache_rebuild_nano), 0) AS rebuild, \
                 COALESCE(SUM(cache_premium_1h_nano), 0) AS premium_1h \
                 FROM usage WHERE {key_clause} AND at_ms >= ?2 AND at_ms < ?3 GROUP BY day",
                split_sum("spend_nano", "spend"),
                split_sum("input", "input"),
                split_sum("cache_write", "cache_write"),
                split_sum("cache_read", "cache_read"),
                split_sum("output", "output"),
            );
            let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
            let mut rows = stmt.query(bind).map_err(sql_error)?;
            while let Some(r) = rows.next().map_err(sql_error)? {
                let sums = UsageSums {
                    spend_nano: get_sum(r, "spend")?,
                    usage: Usage {
                        input: get_sum(r, "input")?,
                        cache_write: get_sum(r, "cache_write")?,
                        cache_read: get_sum(r, "cache_read")?,
                        output: get_sum(r, "output")?,
                    },
                    unpriced_calls: get_u64(r, "unpriced")?,
                    cache_saving_nano: r.get("cache_saving")?,
                    cache_saving_lifetimes_nano: r.get("cache_saving_lifetimes")?,
                    cache_saving_routing_nano: r.get("cache_saving_routing")?,
                    cache_rebuilds: get_u64(r, "rebuilds")?,
                    cache_rebuild_nano: get_u64(r, "rebuild")?,
                    cache_premium_1h_nano: get_u64(r, "premium_1h")?,
                };
                fold.usage(get_u64(r, "day")?, sums);
            }
            drop(rows);

            let sql = format!(
                "SELECT at_ms / 86400000 AS day, {} FROM reservation_expiries \
                 WHERE {key_clause} AND at_ms >= ?2 AND at_ms < ?3 GROUP BY day",
                split_sum("charged_nano", "charged"),
            );
            let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
            let mut rows = stmt.query(bind).map_err(sql_error)?;
            while let Some(r) = rows.next().map_err(sql_error)? {
                fold.expiry_charges(get_u64(r, "day")?, get_sum(r, "charged")?);
            }
            drop(rows);

            // A hold never used (expired, or denied by a person) counts on the day of the
            // request it held.
            let sql = format!(
                "SELECT created_ms / 86400000 AS day, {} FROM holds \
                 WHERE {key_clause} AND state IN ('expired', 'denied') \
                 AND created_ms >= ?2 AND created_ms < ?3 GROUP BY day",
                split_sum("worst_case_tokens", "worst_case"),
            );
            let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
            let mut rows = stmt.query(bind).map_err(sql_error)?;
            while let Some(r) = rows.next().map_err(sql_error)? {
                fold.unused_holds(get_u64(r, "day")?, get_sum(r, "worst_case")?);
            }
            Ok(fold)
        })?;
        Ok(fold.finish())
    }

    fn response_binding(&self, response_id: &str) -> Result<Option<ResponseBinding>, StoreError> {
        self.read(|tx| {
            tx.prepare_cached(
                "SELECT key_id, created_ms, context_tokens, upstream, answer FROM responses \
                 WHERE response_id = ?1",
            )
            .and_then(|mut s| {
                s.query_row([response_id], |r| {
                    Ok(ResponseBinding {
                        response_id: response_id.to_string(),
                        key_id: r.get("key_id")?,
                        created_ms: get_u64(r, "created_ms")?,
                        context_tokens: r.get::<_, Option<i64>>("context_tokens")?.map(to_u64),
                        upstream: r.get("upstream")?,
                        answer: r.get("answer")?,
                    })
                })
                .optional()
            })
            .map_err(sql_error)
        })
    }

    fn usage_recorded(&self, decision_id: &DecisionId) -> Result<bool, StoreError> {
        self.read(|tx| {
            tx.prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM usage WHERE decision = \
                                (SELECT id FROM decisions WHERE decision_id = ?1)) \
                     OR EXISTS (SELECT 1 FROM usage WHERE decision IS NULL AND decision_id = ?1)",
            )
            .and_then(|mut s| s.query_row([decision_id], |r| r.get(0)))
            .map_err(sql_error)
        })
    }

    fn decisions(&self, q: &DecisionQuery) -> Result<DecisionPage, StoreError> {
        let key_clause = key_clause(q.key_id.is_some());
        let limit = q.limit.clamp(1, MAX_DECISIONS_PAGE);
        self.read(|tx| {
            // The cursor: the (time, row) of the decision the previous page ended with, which
            // must be one the caller may see.
            let (after_ms, after_row) = match &q.after {
                None => (i64::MIN, i64::MIN),
                Some(id) => {
                    let sql = format!(
                        "SELECT decided_at_ms, id FROM decisions AS d \
                         WHERE {key_clause} AND decision_id = ?2"
                    );
                    tx.prepare_cached(&sql)
                        .and_then(|mut s| {
                            s.query_row(params![q.key_id, id], |r| {
                                Ok((r.get::<_, i64>("decided_at_ms")?, r.get::<_, i64>("id")?))
                            })
                            .optional()
                        })
                        .map_err(sql_error)?
                        .ok_or(StoreError::UnknownCursor)?
                }
            };
            let sql = decisions_sql(q.key_id.is_some());
            let from = q.from_ms.map(to_i64).unwrap_or(i64::MIN);
            let to = q.to_ms.map(to_i64).unwrap_or(i64::MAX);
            let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
            let lines: Vec<DecisionLine> = stmt
                .query_map(
                    params![
                        q.key_id,
                        from,
                        to,
                        after_ms,
                        after_row,
                        to_i64(limit as u64 + 1),
                        q.session,
                    ],
                    decision_line,
                )
                .and_then(Iterator::collect)
                .map_err(sql_error)?;
            Ok(DecisionPage::of(lines, limit))
        })
    }

    fn latest_decisions(
        &self,
        key_id: Option<&str>,
        verdict: Option<Verdict>,
        limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError> {
        page_reads::latest_decisions(self, key_id, verdict, limit)
    }

    fn verdicts_over_time(
        &self,
        key_id: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError> {
        page_reads::verdicts_over_time(self, key_id, since_ms, bucket_ms)
    }
}

/// A row of the decisions listing ([`Store::decisions`]), its columns read by name.
fn decision_line(r: &Row<'_>) -> rusqlite::Result<DecisionLine> {
    let verdict = verdict_from(r, "verdict")?;
    let ending = r
        .get::<_, Option<String>>("ending")?
        .and_then(|e| Ending::parse(&e));
    let expired_at: Option<i64> = r.get("expired_at_ms")?;
    let settlement = if r.get::<_, Option<i64>>("usage_row")?.is_some() {
        Settlement::Usage {
            ending,
            complete: r.get("complete")?,
            basis: r
                .get::<_, Option<String>>("basis")?
                .and_then(|b| SpendBasis::parse(&b)),
            at_ms: get_u64(r, "usage_at_ms")?,
            spend_nano: get_u64(r, "spend_nano")?,
        }
    } else if let Some(at) = expired_at {
        Settlement::Expired {
            at_ms: to_u64(at),
            charged_nano: get_u64(r, "charged_nano")?,
        }
    } else {
        Settlement::None
    };
    let (status, basis, settled_at_ms, spend_nano) = settlement.line_terms(verdict);
    let n = |name: &str| get_u64(r, name);
    Ok(DecisionLine {
        decision_id: r.get("decision_id")?,
        key_id: r.get("key_id")?,
        decided_at_ms: n("decided_at_ms")?,
        verdict,
        reason: r.get("reason")?,
        model_requested: r.get("model_requested")?,
        model_served: r.get("model_served")?,
        wire: wire_from(r, "wire")?,
        hold_id: r.get("hold_id")?,
        reserved_nano: n("reserved_nano")?,
        status,
        ending,
        basis,
        settled_at_ms,
        input: n("input")?,
        cache_write: n("cache_write")?,
        cache_write_1h: n("cache_write_1h")?,
        cache_read: n("cache_read")?,
        output: n("output")?,
        web_search_requests: n("web_search_requests")?,
        spend_nano,
        tokens_not_bought: n("tokens_not_bought")?,
        worst_case_tokens_avoided: if verdict == Verdict::Block {
            n("worst_case_tokens_avoided")?
        } else {
            0
        },
        cache_saving_nano: r.get("cache_saving_nano")?,
        cache: CacheHealth {
            cache_saving_lifetimes_nano: r.get("cache_saving_lifetimes_nano")?,
            cache_saving_routing_nano: r.get("cache_saving_routing_nano")?,
            cache_rebuild_nano: r.get::<_, Option<i64>>("cache_rebuild_nano")?.map(to_u64),
            cache_premium_1h_nano: n("cache_premium_1h_nano")?,
        },
        cache_edits: cache_edits_from(r, "cache_edits")?,
        session: r.get("session")?,
        paced_ms: n("paced_ms")?,
        step: r.get("step_fingerprint")?,
    })
}

// ---------------------------------------------------------------------------------------------
// The writer thread.

struct Writer {
    conn: Connection,
    rx: Receiver<Msg>,
    linger: Duration,
    stats: Arc<Stats>,
    /// Fire-and-forget events lost (rejected, or in a failed commit) since the last flush.
    failed_since_flush: u64,
}

#[derive(Default)]
struct Batch {
    events: Vec<(Box<Event>, Option<Ack>)>,
    flushes: Vec<Ack>,
    /// Someone waits on this batch: commit as soon as the queue is empty.
    urgent: bool,
}

impl Batch {
    /// Adds a message; returns true on `Shutdown`.
    fn push(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Event(event, ack) => {
                self.urgent |= ack.is_some();
                self.events.push((event, ack));
                false
            }
            Msg::Flush(ack) => {
                self.urgent = true;
                self.flushes.push(ack);
                false
            }
            Msg::Shutdown => true,
        }
    }
}

impl Writer {
    fn run(mut self) {
        let mut closing = false;
        let mut cpu = WriterCpu::start();
        loop {
            // Once closing, take only what is already queued.
            let first = if closing {
                self.rx.try_recv().ok()
            } else {
                self.rx.recv().ok()
            };
            let Some(first) = first else {
                return;
            };
            cpu.batch_started();
            let mut batch = Batch::default();
            closing |= batch.push(first);
            let started = Instant::now();
            while batch.events.len() < BATCH_CAP {
                match self.rx.try_recv() {
                    Ok(msg) => {
                        closing |= batch.push(msg);
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => {
                        closing = true;
                        break;
                    }
                    Err(TryRecvError::Empty) => {}
                }
                if batch.urgent || closing {
                    break;
                }
                let waited = started.elapsed();
                if waited >= self.linger {
                    break;
                }
                // Park rather than block on the channel: a blocked receiver is woken by every
                // fire-and-forget send (a context switch per request under load); a parked
                // writer is woken only by the linger running out or by a waiter's unpark.
                std::thread::park_timeout(self.linger - waited);
            }
            self.commit(batch, &mut cpu);
        }
    }

    fn commit(&mut self, batch: Batch, cpu: &mut WriterCpu) {
        let Batch {
            events, flushes, ..
        } = batch;
        let outcome = if events.is_empty() {
            Ok(Vec::new())
        } else {
            write_batch(&mut self.conn, &events, cpu)
        };
        let batch_error = match outcome {
            Ok(results) => {
                if !events.is_empty() {
                    let written = results.iter().filter(|r| r.is_ok()).count() as u64;
                    self.stats.commits.fetch_add(1, Ordering::Relaxed);
                    self.stats.events.fetch_add(written, Ordering::Relaxed);
                }
                for ((event, ack), result) in events.into_iter().zip(results) {
                    let result = result.map_err(|e| {
                        self.stats.rejected_events.fetch_add(1, Ordering::Relaxed);
                        rejection(&event, &e)
                    });
                    match ack {
                        Some(ack) => {
                            ack.send(result);
                        }
                        None if result.is_err() => self.failed_since_flush += 1,
                        None => {}
                    }
                }
                None
            }
            Err(e) => {
                self.stats.failed_commits.fetch_add(1, Ordering::Relaxed);
                let kind = error_kind(&e);
                tracing::error!(error = %kind, events = events.len(), "store: batch commit failed");
                for (_, ack) in events {
                    match ack {
                        Some(ack) => {
                            ack.send(Err(StoreError::Sqlite(kind.clone())));
                        }
                        None => self.failed_since_flush += 1,
                    }
                }
                Some(kind)
            }
        };
        if flushes.is_empty() {
            return;
        }
        // A flush answers for everything submitted before it: it fails if any of that was
        // lost since the previous flush answered.
        let lost = std::mem::take(&mut self.failed_since_flush);
        for ack in flushes {
            let result = match (&batch_error, lost) {
                (Some(kind), _) => Err(StoreError::Sqlite(kind.clone())),
                (None, 0) => Ok(()),
                (None, n) => Err(StoreError::Sqlite(format!(
                    "{n} events were not committed since the last flush"
                ))),
            };
            ack.send(result);
        }
    }
}

/// Writes the batch in one transaction. `Err`: the transaction itself failed (nothing of
/// the batch is committed); `Ok`: committed, with each event's own result.
///
/// An event of several statements runs in a savepoint so that it is applied whole or not at
/// all; a single statement is atomic by itself (SQLite undoes a failed statement alone), so
/// the common events (decisions, usage) skip the savepoint's cost (about a third of the
/// insert rate). Should SQLite roll back the whole transaction on an error (I/O error, disk
/// full), the batch fails as a whole.
fn write_batch(
    conn: &mut Connection,
    events: &[(Box<Event>, Option<Ack>)],
    cpu: &mut WriterCpu,
) -> rusqlite::Result<Vec<rusqlite::Result<()>>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut results = Vec::with_capacity(events.len());
    let mut pairs = Pairs::of(events);
    cpu.writing();
    for (event, _) in events {
        cpu.share();
        let guarded = !single_statement(event);
        if guarded {
            tx.prepare_cached("SAVEPOINT event")?.execute([])?;
        }
        let result = apply(&tx, event, &mut pairs);
        match result {
            Err(e) if tx.is_autocommit() => return Err(e),
            Err(_) if guarded => {
                tx.prepare_cached("ROLLBACK TO event")?.execute([])?;
                tx.prepare_cached("RELEASE event")?.execute([])?;
            }
            Ok(()) if guarded => {
                tx.prepare_cached("RELEASE event")?.execute([])?;
            }
            _ => {}
        }
        results.push(result);
    }
    tx.commit()?;
    Ok(results)
}

/// Decisions whose usage is in the same batch (a call that ended within one commit interval,
/// the common case). Such a decision is written already settled (`open` = 0) and its usage
/// row is linked to the row id it was just given: the usage skips the look-up of its decision
/// by id and the update of its `open` mark, about a third of what a decision and its usage
/// cost the writer.
struct Pairs {
    usage_of: HashSet<DecisionId>,
    /// Decisions written in this batch whose usage follows in it: their row ids.
    written: HashMap<DecisionId, i64>,
}

impl Pairs {
    fn of(events: &[(Box<Event>, Option<Ack>)]) -> Pairs {
        let usage_of = events
            .iter()
            .filter_map(|(event, _)| match &**event {
                Event::Usage(u) => Some(u.decision_id),
                _ => None,
            })
            .collect();
        Pairs {
            usage_of,
            written: HashMap::new(),
        }
    }
}

/// Whether [`apply`] writes the event with one statement (usage and expiries: one row, and
/// a [`settle`] that needs no atomicity with it).
fn single_statement(event: &Event) -> bool {
    match event {
        Event::Decision(_)
        | Event::Usage(_)
        | Event::ReservationExpired { .. }
        | Event::Hold(_)
        | Event::HoldOpened { .. }
        | Event::Lease(_)
        | Event::Recorded { .. }
        | Event::BudgetSet { .. }
        | Event::PricesSet { .. }
        | Event::ResponseBound(_) => true,
        Event::Forget { .. } => false,
    }
}

fn apply(conn: &Connection, event: &Event, pairs: &mut Pairs) -> rusqlite::Result<()> {
    match event {
        Event::Decision(d) => {
            // A usage or expiry written before its decision is accounted for at load; one
            // written after it in this batch settles it now (`Pairs`).
            let settled_here = pairs.usage_of.contains(&d.decision_id);
            let open = d.verdict.forwards() && d.reserved_nano > 0 && !settled_here;
            conn.prepare_cached(INSERT_DECISION)?
                .execute(named_params! {
                    ":decision_id": d.decision_id,
                    ":key_id": d.key_id,
                    ":fingerprint": d.fingerprint,
                    ":verdict": d.verdict.as_str(),
                    ":reason": d.reason,
                    // NaN would be stored as NULL; it reads back as NaN.
                    ":score": d.score,
                    ":model_requested": d.model_requested,
                    ":model_served": d.model_served,
                    ":wire": d.wire.as_str(),
                    ":decided_at_ms": to_i64(d.decided_at_ms),
                    ":reserved_nano": to_i64(d.reserved_nano),
                    ":worst_case_tokens": d.worst_case_tokens.map(to_i64),
                    ":tokens_not_bought": to_i64(d.tokens_not_bought),
                    ":worst_case_tokens_avoided": to_i64(d.worst_case_tokens_avoided),
                    ":findings_tokens": to_i64(d.findings_tokens),
                    ":hold_id": d.hold_id,
                    ":step_fingerprint": d.step_fingerprint,
                    ":recorded_by": d.recorded_by.as_str(),
                    ":session": d.session,
                    ":paced_ms": to_i64(d.paced_ms),
                    ":cache_edits": i64::from(d.cache_edits.0),
                    ":open": open,
                })?;
            if settled_here {
                pairs
                    .written
                    .insert(d.decision_id, conn.last_insert_rowid());
            }
        }
        Event::Usage(u) => {
            // Only the first usage of the batch meets its decision as written settled.
            let written = pairs.written.remove(&u.decision_id);
            let result = insert_usage(conn, u, written);
            if let (Err(_), Some(row), false) = (&result, written, conn.is_autocommit()) {
                // Written as settled by this usage, which was refused: mark the decision as
                // possibly open again (load checks what settles it). Not once the error has
                // ended the transaction: the batch fails whole.
                let reopened = conn
                    .prepare_cached("UPDATE decisions SET open = 1 WHERE id = ?1 AND open = 0")
                    .and_then(|mut s| s.execute([row]));
                settle(conn, reopened)?;
            }
            result?
        }
        Event::ReservationExpired {
            decision_id,
            key_id,
            at_ms,
            charged_nano,
        } => {
            // Charged once: a repeated expiry is a no-op. Never for a decision whose usage is
            // recorded: after a graceful upgrade, the old process records the usage of the
            // streams it drains, while the new one loaded their reservations as open.
            conn.prepare_cached(
                "INSERT INTO reservation_expiries (decision_id, key_id, at_ms, charged_nano) \
                 SELECT ?1, ?2, ?3, ?4 \
                 WHERE NOT EXISTS (SELECT 1 FROM usage AS u JOIN decisions AS d \
                                   ON u.decision = d.id WHERE d.decision_id = ?1) \
                   AND NOT EXISTS (SELECT 1 FROM usage AS u \
                                   WHERE u.decision IS NULL AND u.decision_id = ?1) \
                 ON CONFLICT (decision_id) DO NOTHING",
            )?
            .execute(params![
                decision_id,
                key_id,
                to_i64(*at_ms),
                to_i64(*charged_nano)
            ])?;
            let result = conn
                .prepare_cached("UPDATE decisions SET open = 0 WHERE decision_id = ?1 AND open = 1")
                .and_then(|mut s| s.execute([decision_id]));
            settle(conn, result)?;
        }
        // The latest state wins. The fingerprint is set when the hold is created and never
        // rewritten, so a `Forget` stays in force for the hold's later states. The opening is
        // written once, when the CHALLENGE opens the hold (`HoldOpened`); a later state keeps
        // it, a `Forget` blanks it.
        Event::Hold(h) => insert_hold(conn, h, None)?,
        Event::HoldOpened { hold, opening } => insert_hold(conn, hold, Some(opening))?,
        Event::Lease(l) => {
            conn.prepare_cached(
                "INSERT INTO leases (hold_id, key_id, granted_ms, until_ms) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (hold_id) DO UPDATE SET \
                 key_id = excluded.key_id, granted_ms = excluded.granted_ms, \
                 until_ms = excluded.until_ms",
            )?
            .execute(params![
                l.hold_id,
                l.key_id,
                to_i64(l.granted_ms),
                to_i64(l.until_ms)
            ])?;
        }
        Event::Recorded {
            key_id,
            fingerprint,
            wire,
            usage,
            at_ms,
        } => {
            conn.prepare_cached(
                "INSERT INTO recorded (key_id, fingerprint, wire, input, cache_write, cache_read, \
                 output, at_ms) VALUES (:key_id, :fingerprint, :wire, :input, :cache_write, \
                 :cache_read, :output, :at_ms) \
                 ON CONFLICT (key_id, fingerprint, wire) DO UPDATE SET input = excluded.input, \
                 cache_write = excluded.cache_write, cache_read = excluded.cache_read, \
                 output = excluded.output, at_ms = excluded.at_ms",
            )?
            .execute(named_params! {
                ":key_id": key_id,
                ":fingerprint": fingerprint,
                ":wire": wire.as_str(),
                ":input": to_i64(usage.input),
                ":cache_write": to_i64(usage.cache_write),
                ":cache_read": to_i64(usage.cache_read),
                ":output": to_i64(usage.output),
                ":at_ms": to_i64(*at_ms),
            })?;
        }
        Event::BudgetSet {
            key_id,
            ceiling_nano,
            period,
        } => {
            conn.prepare_cached(
                "INSERT INTO budgets (key_id, ceiling_nano, period) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (key_id) DO UPDATE SET ceiling_nano = excluded.ceiling_nano, \
                 period = excluded.period",
            )?
            .execute(params![key_id, ceiling_nano.map(to_i64), period.as_str()])?;
        }
        Event::PricesSet { model, prices } => {
            conn.prepare_cached(
                "INSERT INTO prices (model, input, cache_write, cache_read, output, max_output, \
                 cache_write_1h, web_search_per_1k) \
                 VALUES (:model, :input, :cache_write, :cache_read, :output, :max_output, \
                 :cache_write_1h, :web_search_per_1k) ON CONFLICT (model) DO UPDATE SET \
                 input = excluded.input, cache_write = excluded.cache_write, \
                 cache_read = excluded.cache_read, output = excluded.output, \
                 max_output = excluded.max_output, cache_write_1h = excluded.cache_write_1h, \
                 web_search_per_1k = excluded.web_search_per_1k",
            )?
            .execute(named_params! {
                ":model": model,
                ":input": to_i64(prices.input),
                ":cache_write": to_i64(prices.cache_write),
                ":cache_read": to_i64(prices.cache_read),
                ":output": to_i64(prices.output),
                ":max_output": to_i64(prices.max_output),
                ":cache_write_1h": prices.cache_write_1h.map(to_i64),
                ":web_search_per_1k": prices.web_search_per_1k.map(to_i64),
            })?;
        }
        Event::ResponseBound(b) => {
            // The first key keeps the id; the same key may fill in the context figure.
            conn.prepare_cached(
                "INSERT INTO responses (response_id, key_id, created_ms, context_tokens, \
                 upstream, answer) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (response_id) DO UPDATE SET \
                 context_tokens = coalesce(excluded.context_tokens, responses.context_tokens), \
                 upstream = coalesce(responses.upstream, excluded.upstream), \
                 answer = coalesce(excluded.answer, responses.answer) \
                 WHERE responses.key_id = excluded.key_id",
            )?
            .execute(params![
                b.response_id,
                b.key_id,
                to_i64(b.created_ms),
                b.context_tokens.map(to_i64),
                b.upstream,
                b.answer,
            ])?;
        }
        Event::Forget { key_id } => {
            conn.prepare_cached("DELETE FROM recorded WHERE key_id = ?1")?
                .execute([key_id])?;
            conn.prepare_cached(
                "UPDATE decisions SET fingerprint = NULL, step_fingerprint = NULL, session = NULL \
                 WHERE key_id = ?1 AND fingerprint IS NOT NULL",
            )?
            .execute([key_id])?;
            conn.prepare_cached(
                "UPDATE holds SET fingerprint = NULL, decision = NULL, receipt = NULL \
                 WHERE key_id = ?1 AND (fingerprint IS NOT NULL OR decision IS NOT NULL \
                 OR receipt IS NOT NULL)",
            )?
            .execute([key_id])?;
        }
    }
    Ok(())
}

/// A hold's row: inserted with its opening (`None` for a state change, which never carries
/// one), or its latest state over the row already there.
fn insert_hold(
    conn: &Connection,
    h: &HoldRow,
    opening: Option<&HoldOpening>,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO holds (hold_id, key_id, fingerprint, created_ms, expires_ms, state, \
         worst_case_tokens, decision, receipt) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT (hold_id) DO UPDATE SET key_id = excluded.key_id, \
         created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, \
         state = excluded.state, worst_case_tokens = excluded.worst_case_tokens",
    )?
    .execute(params![
        h.hold_id,
        h.key_id,
        h.fingerprint,
        to_i64(h.created_ms),
        to_i64(h.expires_ms),
        h.state.as_str(),
        to_i64(h.worst_case_tokens),
        opening.map(|o| &o.decision),
        opening.map(|o| &o.receipt),
    ])?;
    Ok(())
}

/// Writes a usage row, at most one per decision id (see migration 2): keyed by the decision's
/// row when the decision is stored (always so from the gate, the cheap case), else by the
/// decision id.
/// `written`: the row id of the decision, when it was written in this batch already settled
/// (`Pairs`); otherwise the decision is looked up by its id.
fn insert_usage(conn: &Connection, u: &UsageRow, written: Option<i64>) -> rusqlite::Result<()> {
    let id = u.decision_id;
    let decision: Option<(i64, bool)> = match written {
        Some(row) => Some((row, false)),
        None => conn
            .prepare_cached("SELECT id, open FROM decisions WHERE decision_id = ?1")?
            .query_row([&id], |r| Ok((r.get("id")?, r.get("open")?)))
            .optional()?,
    };
    if decision.is_some() {
        // A usage stored before its decision counts too.
        let early: bool = conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM usage WHERE decision IS NULL AND decision_id = ?1)",
            )?
            .query_row([&id], |r| r.get(0))?;
        if early {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE),
                None,
            ));
        }
    }
    // The unique indexes reject a second row for the same decision.
    conn.prepare_cached(
        "INSERT INTO usage (decision_id, decision, key_id, at_ms, served_model, wire, complete, \
         input, cache_write, cache_read, output, spend_nano, cache_write_1h, \
         web_search_requests, ending, basis, cache_saving_nano, cache_saving_lifetimes_nano, \
         cache_saving_routing_nano, cache_rebuild_nano, cache_premium_1h_nano) \
         VALUES (:decision_id, :decision, :key_id, :at_ms, :served_model, :wire, :complete, \
         :input, :cache_write, :cache_read, :output, :spend_nano, :cache_write_1h, \
         :web_search_requests, :ending, :basis, :cache_saving_nano, \
         :cache_saving_lifetimes_nano, :cache_saving_routing_nano, :cache_rebuild_nano, \
         :cache_premium_1h_nano)",
    )?
    .execute(named_params! {
        ":decision_id": id,
        ":decision": decision.map(|(row, _)| row),
        ":key_id": u.key_id,
        ":at_ms": to_i64(u.at_ms),
        ":served_model": u.served_model,
        ":wire": u.wire.as_str(),
        ":complete": u.complete,
        ":input": to_i64(u.usage.input),
        ":cache_write": to_i64(u.usage.cache_write),
        ":cache_read": to_i64(u.usage.cache_read),
        ":output": to_i64(u.usage.output),
        ":spend_nano": to_i64(u.spend_nano),
        ":cache_write_1h": to_i64(u.cache_write_1h),
        ":web_search_requests": to_i64(u.web_search_requests),
        ":ending": u.ending.map(Ending::as_str),
        ":basis": u.basis.as_str(),
        ":cache_saving_nano": u.cache_saving_nano,
        ":cache_saving_lifetimes_nano": u.cache.cache_saving_lifetimes_nano,
        ":cache_saving_routing_nano": u.cache.cache_saving_routing_nano,
        ":cache_rebuild_nano": u.cache.cache_rebuild_nano.map(to_i64),
        ":cache_premium_1h_nano": to_i64(u.cache.cache_premium_1h_nano),
    })?;
    if let Some((row, true)) = decision {
        let result = conn
            .prepare_cached("UPDATE decisions SET open = 0 WHERE id = ?1")
            .and_then(|mut s| s.execute([row]));
        settle(conn, result)?;
    }
    Ok(())
}

/// The outcome of clearing a decision's `open` mark once its usage or expiry row is written.
/// The mark only keeps the set that [`SELECT_OPEN`] checks small: that query also checks for
/// the usage and expiry rows, so a mark left set (this update failed, or the usage came
/// before its decision) never rebuilds a settled reservation. Hence no savepoint around the
/// event: its one row is written atomically by its own statement. An error that ended the
/// transaction is still returned (the batch fails).
fn settle(conn: &Connection, result: rusqlite::Result<usize>) -> rusqlite::Result<()> {
    match result {
        Err(e) if conn.is_autocommit() => Err(e),
        Err(e) => {
            tracing::warn!(error = %error_kind(&e), "store: open mark not cleared");
            Ok(())
        }
        Ok(_) => Ok(()),
    }
}

/// What a waiter is told when the database rejected its event.
fn rejection(event: &Event, e: &rusqlite::Error) -> StoreError {
    let constraint = e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation);
    let kind = error_kind(e);
    match event {
        Event::Usage(_) if constraint => {
            tracing::debug!(error = %kind, "store: usage already recorded for the decision");
            StoreError::Sqlite("usage already recorded for this decision".into())
        }
        Event::Decision(_) if constraint => {
            tracing::warn!(error = %kind, "store: decision rejected");
            StoreError::Sqlite("decision already stored".into())
        }
        _ => {
            tracing::warn!(error = %kind, "store: event rejected");
            StoreError::Sqlite(kind)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Opening.

/// Creates the database file owner-only (0600) on first start; SQLite gives its `-wal` and
/// `-shm` files the same mode.
fn create_private(path: &Path) -> Result<(), StoreError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::Sqlite(format!(
            "cannot create the database file: {}",
            e.kind()
        ))),
    }
}

fn configure_writer(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_error)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(sql_error)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Sqlite("journal mode WAL unavailable".into()));
    }
    // See the module docs: a commit must survive a power loss, not only a process kill.
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(sql_error)?;
    // The ledger's indexes are keyed by hashes (decision ids, fingerprints), so every batch
    // touches pages all over them: keep them in memory (64 MiB).
    conn.pragma_update(None, "cache_size", -65_536)
        .map_err(sql_error)?;
    // The checkpointer thread copies the log back, at idle priority (`background.rs`); the
    // writer does only if that thread fell far behind.
    conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)
        .map_err(sql_error)
}

/// Clears the `open` marks left on settled decisions (see [`settle`]), so that they are not
/// checked again at every load.
fn clear_settled_marks(conn: &Connection) -> Result<(), StoreError> {
    conn.execute(
        concat!(
            "UPDATE decisions SET open = 0 WHERE id IN (SELECT id FROM decisions AS d \
             WHERE open = 1 AND ",
            settled!(),
            ")"
        ),
        [],
    )
    .map(drop)
    .map_err(sql_error)
}

/// Applies the pending migrations, each in its own transaction together with the new
/// `user_version`. The version is read inside the (immediate, write-locked) transaction, so
/// two processes opening the same file at once cannot both apply a step.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_error)?;
        let version: u32 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql_error)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::Sqlite(format!(
                "database schema version {version} is newer than this build's {SCHEMA_VERSION}"
            )));
        }
        let Some(step) = MIGRATIONS.get(version as usize) else {
            return tx.commit().map_err(sql_error);
        };
        tx.execute_batch(step).map_err(sql_error)?;
        tx.pragma_update(None, "user_version", version + 1)
            .map_err(sql_error)?;
        tx.commit().map_err(sql_error)?;
        tracing::info!(version = version + 1, "store: schema migrated");
    }
}

// ---------------------------------------------------------------------------------------------
// Conversions.

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves the connection usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Integers are stored as SQLite's signed 64 bits; larger values (saturated figures) are
/// clamped to `i64::MAX`.
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Columns are read by name, never by position: a column added or moved in a SELECT cannot
/// shift what another field reads.
fn get_u64(row: &Row<'_>, column: &str) -> rusqlite::Result<u64> {
    Ok(row.get::<_, Option<i64>>(column)?.map(to_u64).unwrap_or(0))
}

/// `SUM(expr)` as two columns, its high and low 32 bits summed apart: SQLite's `SUM` raises
/// "integer overflow" past `i64::MAX`, and stored figures can be near it (saturated values,
/// absurd usage reported by a client), which would break a ledger for good. Each half is
/// below 2³², so the halves cannot overflow below 2³¹ rows per group. Read with [`get_sum`].
fn split_sum(expr: &str, name: &str) -> String {
    format!("SUM(({expr}) >> 32) AS {name}_high, SUM(({expr}) & 4294967295) AS {name}_low")
}

/// The two columns of the [`split_sum`] named `name`, recombined (saturating at `u64::MAX`).
fn get_sum(row: &Row<'_>, name: &str) -> rusqlite::Result<u64> {
    let high = u128::from(get_u64(row, &format!("{name}_high"))?);
    let low = u128::from(get_u64(row, &format!("{name}_low"))?);
    Ok(u64::try_from((high << 32) + low).unwrap_or(u64::MAX))
}

#[derive(Debug, thiserror::Error)]
#[error("unknown value in an enumerated column")]
struct UnknownValue;

fn bad_value(row: &Row<'_>, column: &str) -> rusqlite::Error {
    let idx = row.as_ref().column_index(column).unwrap_or(0);
    rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(UnknownValue))
}

fn verdict_from(row: &Row<'_>, column: &str) -> rusqlite::Result<Verdict> {
    Verdict::parse(row.get_ref(column)?.as_str()?).ok_or_else(|| bad_value(row, column))
}

fn wire_from(row: &Row<'_>, column: &str) -> rusqlite::Result<WireForm> {
    match row.get_ref(column)?.as_str()? {
        "json" => Ok(WireForm::Json),
        "sse" => Ok(WireForm::Sse),
        _ => Err(bad_value(row, column)),
    }
}

fn hold_state_from(row: &Row<'_>, column: &str) -> rusqlite::Result<HoldState> {
    match row.get_ref(column)?.as_str()? {
        "pending" => Ok(HoldState::Pending),
        "approved" => Ok(HoldState::Approved),
        "used" => Ok(HoldState::Used),
        "expired" => Ok(HoldState::Expired),
        "denied" => Ok(HoldState::Denied),
        _ => Err(bad_value(row, column)),
    }
}

fn period_from(row: &Row<'_>, column: &str) -> rusqlite::Result<BudgetPeriod> {
    match row.get_ref(column)?.as_str()? {
        "lifetime" => Ok(BudgetPeriod::Lifetime),
        "day" => Ok(BudgetPeriod::Day),
        "month" => Ok(BudgetPeriod::Month),
        _ => Err(bad_value(row, column)),
    }
}

/// The columns `input`, `cache_write`, `cache_read`, `output`.
fn usage_from(row: &Row<'_>) -> rusqlite::Result<Usage> {
    Ok(Usage {
        input: get_u64(row, "input")?,
        cache_write: get_u64(row, "cache_write")?,
        cache_read: get_u64(row, "cache_read")?,
        output: get_u64(row, "output")?,
    })
}

/// A row selected with [`DECISION_COLUMNS`].
fn decision_from_row(r: &Row<'_>) -> rusqlite::Result<DecisionRow> {
    Ok(DecisionRow {
        decision_id: r.get("decision_id")?,
        key_id: r.get("key_id")?,
        fingerprint: r.get("fingerprint")?,
        verdict: verdict_from(r, "verdict")?,
        reason: r.get("reason")?,
        score: r.get::<_, Option<f64>>("score")?.unwrap_or(f64::NAN),
        model_requested: r.get("model_requested")?,
        model_served: r.get("model_served")?,
        wire: wire_from(r, "wire")?,
        decided_at_ms: get_u64(r, "decided_at_ms")?,
        reserved_nano: get_u64(r, "reserved_nano")?,
        worst_case_tokens: r.get::<_, Option<i64>>("worst_case_tokens")?.map(to_u64),
        tokens_not_bought: get_u64(r, "tokens_not_bought")?,
        worst_case_tokens_avoided: get_u64(r, "worst_case_tokens_avoided")?,
        findings_tokens: get_u64(r, "findings_tokens")?,
        hold_id: r.get("hold_id")?,
        step_fingerprint: r.get("step_fingerprint")?,
        recorded_by: {
            let by: String = r.get("recorded_by")?;
            RecordSource::parse(&by).ok_or_else(|| bad_value(r, "recorded_by"))?
        },
        session: r.get("session")?,
        paced_ms: get_u64(r, "paced_ms")?,
        cache_edits: cache_edits_from(r, "cache_edits")?,
    })
}

fn cache_edits_from(r: &Row<'_>, column: &str) -> rusqlite::Result<CacheEdits> {
    Ok(CacheEdits(
        u8::try_from(r.get::<_, i64>(column)?).unwrap_or(0),
    ))
}

/// Start (unix ms) of a `YYYY-MM-DD` UTC day; anything else (including 2026-02-30) is
/// refused.
fn day_start_ms(day: &str) -> Result<i64, StoreError> {
    super::day_start_ms(day)
        .ok_or_else(|| StoreError::Sqlite("invalid day: expected YYYY-MM-DD".into()))
}

/// The error's kind, for logs and callers: SQLite's result code, never a message (which
/// could quote SQL).
fn error_kind(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => {
            format!("sqlite {:?} (code {})", f.code, f.extended_code)
        }
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnType(..) => "unexpected stored value".into(),
        rusqlite::Error::ToSqlConversionFailure(_) => "value not storable".into(),
        _ => "sqlite error".into(),
    }
}

fn sql_error(e: rusqlite::Error) -> StoreError {
    StoreError::Sqlite(error_kind(&e))
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        sql_error(e)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use tokensaver_core::gate::Usage;

    const T0: u64 = 1_795_991_949_000;

    fn hex(tag: &str) -> String {
        blake3::hash(tag.as_bytes()).to_hex().to_string()
    }

    fn usage(id: &str) -> UsageRow {
        UsageRow {
            decision_id: id.parse().unwrap(),
            key_id: "a".to_owned(),
            at_ms: T0 + 5,
            served_model: "m".to_owned(),
            wire: WireForm::Json,
            complete: true,
            usage: Usage::default(),
            cache_write_1h: 0,
            web_search_requests: 0,
            ending: Some(Ending::Complete),
            basis: SpendBasis::Reported,
            spend_nano: 7,
            cache_saving_nano: None,
            cache: Default::default(),
        }
    }

    /// Backpressure: a burst far past the queue's bound waits for room, and every event of it
    /// is committed.
    #[test]
    fn a_full_writer_queue_holds_the_submitter_back_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_with_queue(dir.path(), 50, 8).unwrap();
        let ids: Vec<String> = (0..500).map(|i| hex(&format!("queued {i}"))).collect();
        for id in &ids {
            store.submit(Event::Usage(usage(id)));
        }
        store.flush().unwrap();
        for id in &ids {
            assert!(store.usage_recorded(&id.parse().unwrap()).unwrap(), "{id}");
        }
    }

    /// The log is copied back into the database by the checkpointer thread, long before the
    /// writer's own checkpoint (at 32,768 pages, 128 MiB) would: without that thread the
    /// database file would not grow here at all.
    #[test]
    fn the_checkpointer_copies_the_log_back_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), 5).unwrap();
        let db = dir.path().join(DB_FILE);
        let size = || std::fs::metadata(&db).unwrap().len();
        let before = size();
        for i in 0..3_000 {
            store.submit(Event::Usage(usage(&hex(&format!("logged {i}")))));
        }
        store.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while size() < before + 256 * 1024 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            size() >= before + 256 * 1024,
            "database file {} bytes, {before} at open",
            size()
        );
        store.close().unwrap();
    }

    /// The decisions page, with or without a session, is read through a time index (the key's
    /// when it names one), never by scanning the table: migration 11 dropped the session index
    /// because no query needs it.
    #[test]
    fn a_session_listing_reads_by_key_and_time() {
        let dir = tempfile::tempdir().unwrap();
        drop(SqliteStore::open(dir.path(), 5).unwrap());
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        let indexes: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'decisions'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            !indexes.iter().any(|i| i == "decisions_by_session"),
            "{indexes:?}"
        );
        for (by_key, index) in [(true, "decisions_key_time"), (false, "decisions_time")] {
            for session in [None, Some(vec![7u8; 32])] {
                let key = by_key.then_some("a");
                let plan: Vec<String> = conn
                    .prepare(&format!("EXPLAIN QUERY PLAN {}", decisions_sql(by_key)))
                    .unwrap()
                    .query_map(params![key, 0, 1, 0, 0, 10, session], |r| r.get(3))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let decisions = plan.iter().find(|l| l.contains(" d ")).unwrap();
                assert!(
                    decisions.starts_with("SEARCH d USING INDEX") && decisions.contains(index),
                    "by key {by_key}, session {}: {plan:?}",
                    session.is_some()
                );
            }
        }
    }

    /// A database written by schema version 1 opens, and keeps every guarantee: ids read back
    /// as written, one usage per decision, open reservations rebuilt. (Its fourth id was a
    /// non-hex text, kept as text by migration 2; a typed `DecisionId` cannot name one, and the
    /// gate never made one, so it is a hex id like the others. Legacy text rows of hex digits
    /// are read by `sql_types`, tested there.)
    #[test]
    fn a_version_1_database_migrates() {
        let dir = tempfile::tempdir().unwrap();
        let (open_id, settled_id, early_id) = (hex("open"), hex("settled"), hex("early"));
        let legacy_id = hex("legacy");
        let fp = hex("fp");
        {
            let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            let decision = "INSERT INTO decisions (decision_id, key_id, fingerprint, verdict, \
                 reason, score, model_requested, wire, decided_at_ms, reserved_nano, \
                 tokens_not_bought, worst_case_tokens_avoided, findings_tokens, open) \
                 VALUES (?1, 'a', ?2, 'ALLOW', 'band', 0.5, 'm', 'json', ?3, 10, 0, 0, 0, ?4)";
            for (id, at, open) in [
                (open_id.as_str(), T0, 1),
                (settled_id.as_str(), T0 + 1, 0),
                (legacy_id.as_str(), T0 + 2, 1),
            ] {
                conn.execute(decision, params![id, fp, to_i64(at), open])
                    .unwrap();
            }
            let usage = "INSERT INTO usage (decision_id, key_id, at_ms, served_model, wire, \
                 complete, input, cache_write, cache_read, output, spend_nano) \
                 VALUES (?1, 'a', ?2, 'm', 'json', 1, 0, 0, 0, 0, 7)";
            for id in [settled_id.as_str(), early_id.as_str()] {
                conn.execute(usage, params![id, to_i64(T0 + 3)]).unwrap();
            }
        }

        let store = SqliteStore::open(dir.path(), 5).unwrap();
        let snap = store.load(T0 + 10).unwrap();
        let ids: Vec<String> = snap
            .recent_decisions
            .iter()
            .map(|d| d.decision_id.to_string())
            .collect();
        assert_eq!(ids, [open_id.as_str(), settled_id.as_str(), &legacy_id]);
        assert_eq!(
            snap.recent_decisions[0].fingerprint.map(|f| f.to_hex()),
            Some(fp.clone())
        );
        let open: Vec<String> = snap
            .open_reservations
            .iter()
            .map(|d| d.decision_id.to_string())
            .collect();
        assert_eq!(open, [open_id.as_str(), &legacy_id]);
        for id in [&settled_id, &early_id] {
            assert!(store.usage_recorded(&id.parse().unwrap()).unwrap());
            assert!(store.submit_and_wait(Event::Usage(usage(id))).is_err());
        }
        assert!(!store.usage_recorded(&open_id.parse().unwrap()).unwrap());

        // The early usage's decision arrives now: it is not open, and takes no second usage.
        let mut early = snap.recent_decisions[0].clone();
        early.decision_id = early_id.parse().unwrap();
        store.submit_and_wait(Event::Decision(early)).unwrap();
        assert!(store
            .submit_and_wait(Event::Usage(usage(&early_id)))
            .is_err());
        for id in [open_id.as_str(), &legacy_id] {
            store.submit_and_wait(Event::Usage(usage(id))).unwrap();
            assert!(store.submit_and_wait(Event::Usage(usage(id))).is_err());
        }
        let snap = store.load(T0 + 10).unwrap();
        assert!(snap.open_reservations.is_empty());
        assert_eq!(snap.recent_decisions.len(), 4);
        let (_, total) = store.ledger(Some("a"), None, None).unwrap();
        assert_eq!(total.spend_nano, 4 * 7);
        drop(store);
        // The early decision's mark stays set until the next open clears it.
        drop(SqliteStore::open(dir.path(), 5).unwrap());

        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        let kinds: Vec<String> = conn
            .prepare("SELECT typeof(decision_id) FROM decisions ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kinds, ["blob", "blob", "blob", "blob"]);
        let marked: u64 = conn
            .query_row("SELECT COUNT(*) FROM decisions WHERE open = 1", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(marked, 0);
    }

    /// Hold and recorded-usage fingerprints written as hex text by schema 5 read back as the
    /// same fingerprints, stored as bytes; a new record for the same request replaces the old.
    #[test]
    fn a_version_5_database_migrates_its_fingerprints() {
        let dir = tempfile::tempdir().unwrap();
        let fp = hex("fp");
        {
            let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
            for migration in &MIGRATIONS[..5] {
                conn.execute_batch(migration).unwrap();
            }
            conn.pragma_update(None, "user_version", 5).unwrap();
            conn.execute(
                "INSERT INTO holds (hold_id, key_id, fingerprint, created_ms, expires_ms, state, \
                 worst_case_tokens) VALUES ('h1', 'a', ?1, ?2, ?3, 'pending', 9)",
                params![fp, to_i64(T0), to_i64(T0 + 900_000)],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO recorded (key_id, fingerprint, wire, input, cache_write, \
                 cache_read, output, at_ms) VALUES ('a', ?1, 'json', 1, 0, 0, 2, ?2)",
                params![fp, to_i64(T0)],
            )
            .unwrap();
        }
        let store = SqliteStore::open(dir.path(), 5).unwrap();
        let fingerprint = Hash::from_hex(&fp).unwrap();
        let snap = store.load(T0 + 1).unwrap();
        assert_eq!(snap.holds.len(), 1);
        assert_eq!(snap.holds[0].fingerprint, Some(fingerprint));
        assert_eq!(snap.recorded.len(), 1);
        assert_eq!(snap.recorded[0].1, fingerprint);
        store
            .submit_and_wait(Event::Recorded {
                key_id: "a".into(),
                fingerprint,
                wire: WireForm::Json,
                usage: Usage {
                    output: 3,
                    ..Usage::default()
                },
                at_ms: T0 + 2,
            })
            .unwrap();
        let snap = store.load(T0 + 3).unwrap();
        assert_eq!(snap.recorded.len(), 1, "the record replaced, not doubled");
        assert_eq!(snap.recorded[0].3.output, 3);
        drop(store);
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        let kinds: (String, String) = conn
            .query_row(
                "SELECT (SELECT typeof(fingerprint) FROM holds), \
                        (SELECT typeof(fingerprint) FROM recorded)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(kinds, ("blob".to_owned(), "blob".to_owned()));
    }

    /// A response id stays with the first key that bound it: another key's binding changes
    /// nothing, the same key fills in the context figure, a later binding without a figure
    /// keeps the known one, and the binding is read back after a reopen.
    #[test]
    fn a_response_binding_keeps_its_first_key() {
        let dir = tempfile::tempdir().unwrap();
        let bind = |key: &str, context: Option<u64>| {
            Event::ResponseBound(ResponseBinding {
                response_id: "resp_1".to_owned(),
                key_id: key.to_owned(),
                created_ms: T0,
                context_tokens: context,
                upstream: None,
                answer: None,
            })
        };
        {
            let store = SqliteStore::open(dir.path(), 5).unwrap();
            assert_eq!(store.response_binding("resp_1").unwrap(), None);
            store.submit_and_wait(bind("alpha", None)).unwrap();
            store.submit_and_wait(bind("beta", Some(9))).unwrap();
            let read = store.response_binding("resp_1").unwrap().unwrap();
            assert_eq!((read.key_id.as_str(), read.context_tokens), ("alpha", None));
            store.submit_and_wait(bind("alpha", Some(7))).unwrap();
            store.submit_and_wait(bind("alpha", None)).unwrap();
        }
        let store = SqliteStore::open(dir.path(), 5).unwrap();
        let read = store.response_binding("resp_1").unwrap().unwrap();
        assert_eq!(
            (read.key_id.as_str(), read.context_tokens),
            ("alpha", Some(7))
        );
        assert_eq!(store.response_binding("resp_2").unwrap(), None);
    }
}
