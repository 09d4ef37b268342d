//! The ledger's background work, kept off the request threads' CPU.
//!
//! The gate may have one core (the field's benchmarks pin a gateway to its own), and the
//! ledger's work runs beside the requests there. At concurrency 1, before this, the slowest
//! 1 % of ALLOW requests were those that became ready while the writer ran: one request in
//! ~70 waited ~1.1 ms, once per commit interval (`perf sched timehist` of the gate's core; the
//! slow answers came every 21.7 ms, the 20 ms linger plus a commit), and a WAL checkpoint (the
//! writer copying ~32 MiB of log back into the database every 8,192 pages) stalled a request
//! for milliseconds. Two changes bound that:
//! - the writer yields the CPU every [`WRITER_SLICE`] within a batch ([`Turn`]), so a ready
//!   request waits at most a slice, not a batch;
//! - checkpoints run on a thread of their own at the lowest CPU priority
//!   ([`Checkpointer`]), where a ready request always preempts them. If that thread cannot
//!   keep up (a machine saturated for long), the writer's own automatic checkpoint takes over
//!   at [`WRITER_CHECKPOINT_PAGES`]: the log stays bounded whatever the load.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// How long the writer runs before it lets a ready request thread have the CPU.
pub(super) const WRITER_SLICE: Duration = Duration::from_micros(50);
/// How often the checkpointer copies the log back into the database.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// The log's length (pages) past which the writer checkpoints itself: four times what the
/// writer let grow before there was a checkpointer, reached only if the checkpointer starved.
pub(super) const WRITER_CHECKPOINT_PAGES: i64 = 32_768;

/// The writer's turn on the CPU: a batch is milliseconds of CPU (about 10 µs an event).
pub(super) struct Turn(Instant);

impl Turn {
    pub(super) fn start() -> Turn {
        Turn(Instant::now())
    }

    /// Yields once the writer has run a slice; with nothing else ready, a yield returns at once.
    pub(super) fn share_cpu(&mut self) {
        if self.0.elapsed() >= WRITER_SLICE {
            std::thread::yield_now();
            self.0 = Instant::now();
        }
    }
}

/// The thread that checkpoints the WAL, at idle priority.
pub(super) struct Checkpointer {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl Checkpointer {
    /// Starts the thread, with its own connection to `path`. None if it cannot start: the
    /// writer's automatic checkpoint then does the work alone, as it did before.
    pub(super) fn start(path: &Path) -> Option<Checkpointer> {
        let conn = Connection::open(path).ok()?;
        conn.busy_timeout(super::BUSY_TIMEOUT).ok()?;
        // A checkpoint fsyncs the log before it copies and the database after, as the
        // writer's would.
        conn.pragma_update(None, "synchronous", "FULL").ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("tokensaver-ckpt".into())
            .spawn(move || {
                idle_priority();
                while !stopping.load(Ordering::Relaxed) {
                    std::thread::park_timeout(CHECKPOINT_EVERY);
                    // PASSIVE: never waits for the writer or a reader; what it cannot copy now
                    // it copies next time. A failure is retried the same way.
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        tracing::debug!(error = %super::error_kind(&e), "store: checkpoint deferred");
                    }
                }
            })
            .ok()?;
        Some(Checkpointer { stop, handle })
    }

    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.thread().unpark();
        let _ = self.handle.join();
    }
}

/// This thread runs only when no other thread of the machine wants the CPU (Linux
/// `SCHED_IDLE`); elsewhere it keeps the default priority.
fn idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sets the calling thread's policy (pid 0 is the caller); `param` outlives
        // the call. A failure leaves the default policy, which is only slower for requests.
        let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    }
}
