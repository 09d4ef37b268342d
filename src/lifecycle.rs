//! The server's life as an operator meets it: SIGTERM drains, SIGQUIT hands the listening
//! sockets to a new binary and then drains, and a pid file names the process that serves.
//!
//! # Drain (SIGTERM; and the old process of an upgrade, after the hand-over)
//! pingora stops accepting on every listener, and closes the proxy's idle keep-alive
//! connections, the moment it broadcasts its shutdown; then it sleeps a fixed grace period
//! before it drops its runtimes, and with them every request still running. tokensaver does not
//! sleep that out. [`watch`] sees the shutdown begin and waits until no request is in flight —
//! each one holds an [`InFlight`] guard until its usage is recorded — then commits the ledger
//! and exits 0. A stream still running when the grace period ends is cut ([`unless_cut`]): the
//! upstream read fails, the client's stream is ended abnormally (never a complete-looking
//! answer), and the usage seen so far is recorded, marked incomplete, exactly as when a
//! provider breaks off. pingora's own grace period is set longer than ours, so its sleep never
//! decides anything.
//!
//! # Graceful upgrade (SIGQUIT)
//! A new process started with `--upgrade` waits for the listening sockets on the upgrade
//! socket; the old one, on SIGQUIT, sends them, keeps accepting for pingora's 5 s hand-over
//! (both accept meanwhile: no connection is refused), then drains as above. [`detach`] is that
//! sequence for a service manager: it starts the new server, signals the old one and returns
//! once the new one serves and has written the pid file.
//!
//! # Fast stop (SIGINT)
//! pingora drops its runtimes at once; what was queued for the ledger is committed and the
//! streams in flight are not recorded (their reservations are charged at their worst case
//! after `reservation_ttl_secs`, as after a crash).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use pingora::server::ExecutionPhase;
use pingora::{Error, ErrorType};
use tokio::sync::{broadcast, watch as watch_channel};

/// After the grace period, how long cut streams get to record their usage and end.
pub const CUT_WAIT: Duration = Duration::from_secs(5);
/// How long the drain watches an empty server before it believes it: a connection accepted
/// just before the listeners closed may still be sending its request header.
const SETTLE: Duration = Duration::from_millis(200);
/// How long [`detach`] waits for the new server to serve.
const DETACH_TIMEOUT: Duration = Duration::from_secs(120);

struct State {
    in_flight: AtomicUsize,
    draining: AtomicBool,
    /// `true` once the grace period is over: streams still running end.
    cut: watch_channel::Sender<bool>,
}

static STATE: LazyLock<State> = LazyLock::new(|| State {
    in_flight: AtomicUsize::new(0),
    draining: AtomicBool::new(false),
    cut: watch_channel::channel(false).0,
});

/// A request in flight, from its header to the end of its ledger record. The drain waits for
/// every guard to drop.
#[must_use]
pub struct InFlight(());

impl Drop for InFlight {
    fn drop(&mut self) {
        STATE.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Count a request in flight until the guard drops.
pub fn enter() -> InFlight {
    STATE.in_flight.fetch_add(1, Ordering::AcqRel);
    InFlight(())
}

/// Requests in flight now.
pub fn in_flight() -> usize {
    STATE.in_flight.load(Ordering::Acquire)
}

/// Whether the server has begun to shut down (it accepts nothing new; `/readyz` says so).
pub fn draining() -> bool {
    STATE.draining.load(Ordering::Acquire)
}

/// Run an upstream read unless the drain's grace period ends first; then it fails as a read
/// error, which the proxy treats like a provider that broke off.
pub async fn unless_cut<T>(read: impl Future<Output = pingora::Result<T>>) -> pingora::Result<T> {
    let mut cut = STATE.cut.subscribe();
    tokio::select! {
        biased;
        result = read => result,
        _ = cut.wait_for(|c| *c) => {
            Error::e_explain(ErrorType::ReadError, "cut at the end of the drain grace period")
        }
    }
}

/// What the drain needs: the grace period, the last commit of the ledger (once nothing is in
/// flight), the pid file to keep.
pub struct Drain {
    pub grace: Duration,
    pub commit: Box<dyn Fn() -> Result<(), crate::store::StoreError> + Send + Sync>,
    pub pid_file: Option<PathBuf>,
}

/// Follow the server's execution phases on a thread of its own: write the pid file once it
/// serves, and drain once it shuts down. Subscribe (`Server::watch_execution_phase`) before
/// `bootstrap`, so no phase is missed.
pub fn watch(mut phases: broadcast::Receiver<ExecutionPhase>, drain: Drain) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("tokensaver-lifecycle".into())
        .spawn(move || loop {
            let phase = match phases.blocking_recv() {
                Ok(phase) => phase,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            match phase {
                ExecutionPhase::Running => {
                    if let Some(path) = &drain.pid_file {
                        if let Err(e) = write_pid_file(path, std::process::id()) {
                            tracing::error!(error = %e.kind(), "cannot write the pid file");
                        }
                    }
                    tracing::info!(pid = std::process::id(), "serving");
                }
                ExecutionPhase::GracefulUpgradeTransferringFds => {
                    tracing::info!("SIGQUIT: handing the listening sockets to the new process");
                }
                ExecutionPhase::ShutdownStarted => {
                    STATE.draining.store(true, Ordering::Release);
                }
                ExecutionPhase::ShutdownGracePeriod => {
                    let code = drain.run();
                    std::process::exit(code);
                }
                // A fast shutdown (SIGINT) skips the grace period: `serve` commits the ledger
                // once pingora returns.
                ExecutionPhase::ShutdownRuntimes | ExecutionPhase::Terminated => return,
                _ => {}
            }
        })
        .map(drop)
}

impl Drain {
    /// Wait for the requests in flight (cutting streams at the deadline), commit the ledger,
    /// and return the exit code.
    fn run(&self) -> i32 {
        STATE.draining.store(true, Ordering::Release);
        let started = Instant::now();
        tracing::info!(
            in_flight = in_flight(),
            grace_secs = self.grace.as_secs(),
            "draining: no new connections; in-flight requests finish"
        );
        let mut cut = 0;
        if !wait_idle(started + self.grace) {
            cut = in_flight();
            tracing::warn!(
                in_flight = cut,
                "grace period over: ending the streams still running"
            );
            STATE.cut.send_replace(true);
            wait_idle(Instant::now() + CUT_WAIT);
        }
        let left = in_flight();
        let code = match (self.commit)() {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(error = %e, "ledger: the last commit failed");
                1
            }
        };
        if let Some(path) = &self.pid_file {
            // After an upgrade the file names the new process: leave it.
            if read_pid_file(path) == Some(std::process::id()) {
                let _ = std::fs::remove_file(path);
            }
        }
        tracing::info!(
            drained_ms = started.elapsed().as_millis() as u64,
            cut,
            abandoned = left,
            "drained; ledger committed; exiting"
        );
        code
    }
}

/// Wait until nothing is in flight (and stays so for [`SETTLE`]) or the deadline passes;
/// `true` if idle.
fn wait_idle(deadline: Instant) -> bool {
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if in_flight() == 0 {
            let since = *idle_since.get_or_insert(now);
            if now.duration_since(since) >= SETTLE {
                return true;
            }
        } else {
            idle_since = None;
        }
        if now >= deadline {
            return in_flight() == 0;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Write the pid file whole or not at all (a service manager may read it at any moment).
pub fn write_pid_file(path: &Path, pid: u32) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{pid}"));
    std::fs::write(&tmp, format!("{pid}\n"))?;
    std::fs::rename(&tmp, path)
}

pub fn read_pid_file(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether a process with this pid runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Stop a server this process started as an operator would: SIGTERM, so that it drains and
/// closes its ledger, then wait for it (SIGKILL after `timeout`).
pub fn terminate(
    child: &mut std::process::Child,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    signal(child.id(), libc::SIGTERM)?;
    let start = std::time::Instant::now();
    while child.try_wait()?.is_none() {
        if start.elapsed() > timeout {
            child.kill()?;
            child.wait()?;
            return Err(anyhow::anyhow!(
                "the server did not stop within its grace period"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

fn signal(pid: u32, sig: libc::c_int) -> anyhow::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| anyhow::anyhow!("pid out of range"))?;
    // SAFETY: kill(2) takes any pid and signal; a bad one is an error return, never UB.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().into())
    }
}

/// What `serve --detach` starts and how.
pub struct Detach<'a> {
    /// The serve arguments for the server itself (without `--detach`).
    pub args: Vec<String>,
    /// Extra environment (secrets stay out of the arguments).
    pub envs: Vec<(String, String)>,
    pub pid_file: &'a Path,
    /// Replace the server named by the pid file (graceful upgrade).
    pub upgrade: bool,
    pub upgrade_sock: &'a Path,
}

/// Start the server in the background and return once it serves: what a service manager's
/// `Type=forking` start and reload expect. With `upgrade`, the running server named by the
/// pid file gets SIGQUIT once the new one waits on the upgrade socket, hands it the listening
/// sockets and drains; this returns when the new one has written the pid file.
pub fn detach(d: Detach<'_>) -> anyhow::Result<u32> {
    let old = if d.upgrade {
        let pid = read_pid_file(d.pid_file).ok_or_else(|| {
            anyhow::anyhow!("--upgrade: no running server (the pid file is missing or unreadable)")
        })?;
        if !alive(pid) {
            return Err(anyhow::anyhow!(
                "--upgrade: the server in the pid file ({pid}) is not running"
            ));
        }
        // The new process binds it afresh; seeing it appear tells us it waits for the sockets.
        let _ = std::fs::remove_file(d.upgrade_sock);
        Some(pid)
    } else {
        None
    };
    let exe =
        std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find this binary: {e}"))?;
    let mut child = Command::new(exe)
        .args(&d.args)
        .envs(d.envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the server: {e}"))?;
    let pid = child.id();
    let started = Instant::now();
    let mut signalled = old.is_none();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(anyhow::anyhow!(
                "the server exited while starting ({status})"
            ));
        }
        if let (false, Some(old)) = (signalled, old) {
            if d.upgrade_sock.exists() {
                signal(old, libc::SIGQUIT)
                    .map_err(|e| anyhow::anyhow!("cannot signal the running server {old}: {e}"))?;
                signalled = true;
            }
        }
        if signalled && read_pid_file(d.pid_file) == Some(pid) {
            return Ok(pid);
        }
        if started.elapsed() > DETACH_TIMEOUT {
            let _ = child.kill();
            return Err(anyhow::anyhow!("the server did not start serving in time"));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}
