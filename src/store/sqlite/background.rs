//! The ledger's background work, kept off the request threads' CPU.
//!
//! The gate may have one core (the field's benchmarks pin a gateway to its own), and the
//! ledger's work runs beside the requests there. At concurrency 1, before this, the slowest
//! 1 % of ALLOW requests were those that became ready while the writer ran: one request in
//! ~70 waited ~1.1 ms, once per commit interval (`perf sched timehist` of the gate's core; the
//! slow answers came every 21.7 ms, the 20 ms linger plus a commit), and a WAL checkpoint (the
//! writer copying ~32 MiB of log back into the database every 8,192 pages) stalled a request
//! for milliseconds. Two changes bound that:
//! - the writer yields the CPU every [`WRITER_SLICE`] within a batch ([`WriterCpu`]), so a ready
//!   request waits at most a slice, not a batch;
//! - checkpoints run on a thread of their own at the lowest CPU priority
//!   ([`Checkpointer`]), where a ready request always preempts them. If that thread cannot
//!   keep up (a machine saturated for long), the writer's own automatic checkpoint takes over
//!   at [`WRITER_CHECKPOINT_PAGES`]: the log stays bounded whatever the load.
//!
//! What was left after those (a quarter of the writer's time is the commit's own writes of the
//! batch's pages, which cannot be sliced) is the third: the writer runs at the lowest normal
//! priority (nice 19) while it keeps up ([`WriterCpu`]), so a request that becomes ready
//! during a commit gets the core at once. It returns to normal priority for a while whenever it
//! waited for a CPU more than four fifths of a quarter-second (a machine busy with other work): the
//! ledger can fall behind by a moment, never starve. Where the thread could not come back from
//! nice 19 (`RLIMIT_NICE`, no `CAP_SYS_NICE`), it keeps normal priority.

use std::os::unix::fs::FileExt;
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

/// The writer's niceness while it keeps up: the lowest normal priority (weight 15 against a
/// request thread's 1,024), which the scheduler preempts for any ready request thread.
const BACKGROUND_NICE: libc::c_int = 19;
/// The writer's runnable waits are summed over windows this long...
const WINDOW: Duration = Duration::from_millis(250);
/// ...and a window in which it waited for a CPU more than this share of the time means it is
/// starved. At concurrency 1 a background writer waits about a fifth of the time (behind the
/// request thread); behind a busy process of normal priority, nearly all of it.
const STARVED_SHARE: f64 = 0.8;
/// How long the writer keeps normal priority once it has been starved.
const CATCH_UP: Duration = Duration::from_secs(1);

/// The writer's CPU priority: background while it keeps up, normal while it catches up.
struct WriterPriority {
    /// The thread's `/proc/thread-self/schedstat` (its second field: nanoseconds spent runnable
    /// but waiting for a CPU); None where it cannot lower itself safely.
    schedstat: Option<std::fs::File>,
    /// The window's start, and the runnable wait then.
    window: (Instant, u64),
    normal_until: Option<Instant>,
}

impl WriterPriority {
    /// Called on the writer thread. Background only if the thread can come back: it tries a
    /// step down and back (nice 1, then 0) first, so a failure leaves it at a harmless nice 1.
    fn start() -> WriterPriority {
        let mut p = WriterPriority {
            schedstat: None,
            window: (Instant::now(), 0),
            normal_until: None,
        };
        if nice(1) && nice(0) {
            if let Ok(f) = std::fs::File::open("/proc/thread-self/schedstat") {
                p.schedstat = Some(f);
                p.window.1 = p.waited().unwrap_or(0);
                p.background(true);
            }
        }
        p
    }

    /// Before each batch and between its events (cheap within a window: one clock read):
    /// starved over the last window → normal priority for [`CATCH_UP`]; else background once
    /// the catch-up is over.
    fn check(&mut self) {
        if self.schedstat.is_none() || self.window.0.elapsed() < WINDOW {
            return;
        }
        if let Some(waited) = self.waited() {
            if let Some(background) = self.observe(waited, Instant::now()) {
                self.background(background);
            }
        }
    }

    /// The decision alone: the thread's total runnable wait now; Some(background?) when the
    /// priority is to change.
    fn observe(&mut self, waited_ns: u64, now: Instant) -> Option<bool> {
        let (start, waited_then) = self.window;
        let span = now.saturating_duration_since(start);
        if span < WINDOW {
            return None;
        }
        self.window = (now, waited_ns);
        let share = waited_ns.saturating_sub(waited_then) as f64 / span.as_nanos() as f64;
        if share > STARVED_SHARE {
            let was_background = self.normal_until.is_none();
            self.normal_until = Some(now + CATCH_UP);
            return was_background.then_some(false);
        }
        if self.normal_until.is_some_and(|t| now >= t) {
            self.normal_until = None;
            return Some(true);
        }
        None
    }

    fn waited(&self) -> Option<u64> {
        let mut buf = [0u8; 96];
        let n = self.schedstat.as_ref()?.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        text.split_whitespace().nth(1)?.parse().ok()
    }

    fn background(&mut self, on: bool) {
        if !nice(if on { BACKGROUND_NICE } else { 0 }) {
            // Could not come back to normal: stay out of the background from now on.
            self.schedstat = None;
        }
    }
}

/// Sets the calling thread's niceness (Linux: per thread); false if refused.
fn nice(value: libc::c_int) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions; setpriority on one's own tid touches only this
        // thread's scheduling.
        let tid = unsafe { libc::gettid() };
        unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, value) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = value;
        false
    }
}

/// The writer's share of the CPU: its slices within a batch (a batch is milliseconds of CPU,
/// about 10 µs an event) and its priority.
pub(super) struct WriterCpu {
    slice_started: Instant,
    priority: WriterPriority,
}

impl WriterCpu {
    /// Called on the writer thread.
    pub(super) fn start() -> WriterCpu {
        WriterCpu {
            slice_started: Instant::now(),
            priority: WriterPriority::start(),
        }
    }

    /// Before a batch is gathered: the priority judged.
    pub(super) fn batch_started(&mut self) {
        self.priority.check();
    }

    /// Before a batch is written: a fresh slice.
    pub(super) fn writing(&mut self) {
        self.slice_started = Instant::now();
    }

    /// Between a batch's events: yields once the writer has run a slice (with nothing else
    /// ready, a yield returns at once), and the priority judged.
    pub(super) fn share(&mut self) {
        if self.slice_started.elapsed() >= WRITER_SLICE {
            std::thread::yield_now();
            self.slice_started = Instant::now();
        }
        self.priority.check();
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn niceness() -> libc::c_int {
        // SAFETY: reads the calling thread's niceness.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn the_writer_runs_in_the_background_only_where_it_can_come_back() {
        std::thread::spawn(|| {
            let mut p = WriterPriority::start();
            if p.schedstat.is_none() {
                // Not allowed to come back from a lower priority: it stays where it was.
                assert!(niceness() <= 1);
                return;
            }
            assert_eq!(niceness(), BACKGROUND_NICE);
            p.background(false);
            assert_eq!(niceness(), 0, "and it can come back");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_starved_writer_takes_normal_priority_until_it_has_caught_up() {
        let t0 = Instant::now();
        let mut p = WriterPriority {
            schedstat: None,
            window: (t0, 0),
            normal_until: None,
        };
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ns = |ms: u64| ms * 1_000_000;
        // Within a window nothing is judged, however long the waits.
        assert_eq!(p.observe(ns(200), at(200)), None);
        // A fifth of a window spent waiting behind requests (concurrency 1): no change.
        assert_eq!(p.observe(ns(50), at(250)), None);
        // Nine tenths of the next one: starved, normal priority for CATCH_UP.
        assert_eq!(p.observe(ns(50 + 225), at(500)), Some(false));
        // Starved again while catching up: stays normal, the catch-up runs from now.
        assert_eq!(p.observe(ns(275 + 225), at(750)), None);
        let caught_up = at(750) + CATCH_UP;
        assert_eq!(
            p.observe(ns(500), caught_up - Duration::from_millis(1)),
            None
        );
        // Kept up for CATCH_UP: back to the background.
        assert_eq!(p.observe(ns(501), caught_up + WINDOW), Some(true));
        assert_eq!(p.observe(ns(502), caught_up + WINDOW * 2), None);
    }
}
