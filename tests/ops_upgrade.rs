//! Zero-downtime upgrade: under a steady stream of requests and one long stream, a new binary
//! takes the listening sockets over (`serve --detach --upgrade`, as the systemd unit's
//! `ExecReload` runs it). No request fails, the long stream completes on the old process,
//! the old process exits 0 once drained, and the ledger is whole.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use tokensaver_mock_provider::expected_usage;

/// A response and the body that was sent.
type Sent = (Resp, Vec<u8>);

/// A detached server, terminated (and waited for) when dropped.
struct Detached(u32);

impl Detached {
    fn stop(&self, within: Duration) -> bool {
        if tokensaver::lifecycle::alive(self.0) {
            send_signal(self.0, "TERM");
        }
        let start = Instant::now();
        while tokensaver::lifecycle::alive(self.0) {
            if start.elapsed() > within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        true
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if !self.stop(Duration::from_secs(10)) {
            send_signal(self.0, "KILL");
        }
    }
}

/// One proxy request on a fresh connection (a client that pools would retry a connection
/// the old process closed; this one must never need to).
fn steady_request(h: &Harness, i: usize) -> Sent {
    let key = if i.is_multiple_of(2) { KEY_A } else { KEY_B };
    let body = chat(
        "gpt-4o-mini",
        &format!("steady request number {i} during the upgrade"),
        json!({}),
    )
    .to_string();
    let r = client::post(&h.proxy_url(CHAT))
        .timeout(Duration::from_secs(30))
        .set("authorization", &format!("Bearer {key}"))
        .set("x-tokensaver-human", "1")
        .set("content-type", "application/json")
        .send(body.as_bytes());
    (r, body.into_bytes())
}

#[test]
fn a_new_binary_takes_over_without_dropping_a_request_or_the_long_stream() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("tokensaver.pid");
    // The old process is a plain `serve` (so its exit status can be checked) that writes the
    // pid file the upgrade reads.
    let h = Harness::start(Opts {
        // 10 to 15 SSE events: the long stream runs 9 to 14 s, past the 5 s hand-over.
        stream_delay_ms: 900,
        rust_log: "info",
        serve_args: vec!["--pid-file".into(), pid_file.display().to_string()],
        ..Opts::default()
    });
    let old_pid = h.pid().unwrap();
    let start = Instant::now();
    while tokensaver::lifecycle::read_pid_file(&pid_file) != Some(old_pid) {
        assert!(start.elapsed() < Duration::from_secs(10), "no pid file");
        std::thread::sleep(Duration::from_millis(20));
    }
    // "Replace the binary": the new process runs from another file.
    let new_binary: PathBuf = dir.path().join("tokensaver-new");
    std::fs::copy(env!("CARGO_BIN_EXE_tokensaver"), &new_binary).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let h = Arc::new(h);

    // The long stream: started on the old process, it must finish there.
    let long = {
        let h = h.clone();
        std::thread::spawn(move || {
            let body = anthropic(
                // No DOWNGRADE mapping: the provider answers the caller's own body.
                "claude-haiku-4-5",
                "A long streamed answer that outlives the upgrade, please.",
                json!({"stream": true}),
            )
            .to_string();
            let r = client::post(&h.proxy_url(MESSAGES))
                .timeout(Duration::from_secs(30))
                .set("x-api-key", KEY_A)
                .set("x-tokensaver-human", "1")
                .set("content-type", "application/json")
                .send(body.as_bytes());
            (r, body.into_bytes())
        })
    };

    // Steady traffic on the proxy, and liveness probes that name the answering process.
    let results: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let pids_seen: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let steady = {
        let (h, stop, results) = (h.clone(), stop.clone(), results.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = steady_request(&h, i);
                results.lock().unwrap().push(r);
                i += 1;
                std::thread::sleep(Duration::from_millis(60));
            }
        })
    };
    let probes = {
        let (h, stop, pids) = (h.clone(), stop.clone(), pids_seen.clone());
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = client::get(&h.admin_url("/healthz"))
                    .timeout(Duration::from_secs(30))
                    .call();
                match (r.status, r.transport_error.as_ref()) {
                    (200, None) => {
                        pids.lock()
                            .unwrap()
                            .insert(r.json()["pid"].as_u64().unwrap());
                    }
                    _ => failures.push(format!("{} {:?}", r.status, r.transport_error)),
                }
                std::thread::sleep(Duration::from_millis(40));
            }
            failures
        })
    };

    std::thread::sleep(Duration::from_millis(1000));
    // What `systemctl reload` runs: start the new binary, SIGQUIT the old one, return once
    // the new one serves.
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(h.log_path())
        .unwrap();
    let upgraded = std::process::Command::new(&new_binary)
        .args(["serve", "--detach", "--upgrade", "--pid-file"])
        .arg(&pid_file)
        .arg("--config")
        .arg(h.config_path())
        .env("OPENAI_API_KEY", PROVIDER_CREDENTIAL)
        .env("ANTHROPIC_API_KEY", PROVIDER_CREDENTIAL)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .status()
        .unwrap();
    assert!(upgraded.success(), "upgrade failed: {}", h.log());
    let new_pid = tokensaver::lifecycle::read_pid_file(&pid_file).unwrap();
    assert_ne!(new_pid, old_pid);
    let new_server = Detached(new_pid);

    // The long stream completes on the old process, which then exits by itself.
    let (long_resp, long_body) = long.join().unwrap();
    assert_eq!(long_resp.status, 200, "{}", long_resp.text());
    assert!(
        long_resp.transport_error.is_none(),
        "{:?}",
        long_resp.transport_error
    );
    assert_eq!(long_resp.verdict(), Some("ALLOW"));
    assert!(
        long_resp.text().contains("message_stop"),
        "{}",
        long_resp.text()
    );
    let waited = Instant::now();
    while tokensaver::lifecycle::alive(old_pid) {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the old process exits once drained"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    // Keep the traffic going after the old process is gone.
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::Relaxed);
    steady.join().unwrap();
    let probe_failures = probes.join().unwrap();
    let mut h = Arc::try_unwrap(h).unwrap_or_else(|_| panic!("harness still shared"));
    let old_status = h.wait_exit(Duration::from_secs(5)).expect("old exited");
    assert!(old_status.success(), "old process: {old_status}");

    let results = std::mem::take(&mut *results.lock().unwrap());
    assert!(results.len() > 50, "only {} steady requests", results.len());
    for (i, (r, _)) in results.iter().enumerate() {
        assert!(
            r.status == 200 && r.transport_error.is_none(),
            "steady request {i} failed: {} {:?} {}",
            r.status,
            r.transport_error,
            r.text()
        );
        assert_eq!(r.verdict(), Some("ALLOW"), "request {i}");
    }
    assert!(probe_failures.is_empty(), "{probe_failures:?}");
    let pids = pids_seen.lock().unwrap().clone();
    assert!(
        pids.contains(&u64::from(old_pid)) && pids.contains(&u64::from(new_pid)),
        "both processes answered: {pids:?}"
    );

    // The ledger is whole: after the new process drains too, every request has its decision
    // and one complete usage row, nothing was charged at a reservation's expiry, and the
    // usage is what the provider reported.
    assert!(
        new_server.stop(Duration::from_secs(20)),
        "new process drains"
    );
    let db = rusqlite::Connection::open_with_flags(
        h.db_path(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let count = |sql: &str| -> u64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    let requests = results.len() as u64 + 1;
    assert_eq!(count("SELECT count(*) FROM decisions"), requests);
    assert_eq!(
        count("SELECT count(*) FROM usage WHERE complete = 1"),
        requests
    );
    assert_eq!(count("SELECT count(*) FROM reservation_expiries"), 0);
    let (mut prompt, mut completion) = (0u64, 0u64);
    for body in results.iter().map(|(_, b)| b).chain([&long_body]) {
        let u = expected_usage(body).unwrap();
        prompt += u.prompt_tokens;
        completion += u.completion_tokens;
    }
    assert_eq!(
        count("SELECT sum(input + cache_write + cache_read) FROM usage"),
        prompt
    );
    assert_eq!(count("SELECT sum(output) FROM usage"), completion);
    let log = h.log();
    assert!(log.contains("handing the listening sockets"), "{log}");
    // The old process began its drain with the long stream still running (and, on a loaded
    // machine, perhaps a short request that had not finished yet).
    let in_flight_at_drain = log.lines().find_map(|l| {
        let rest = l.split("draining").nth(1)?;
        rest.split("in_flight=")
            .nth(1)?
            .split(' ')
            .next()?
            .parse::<u64>()
            .ok()
    });
    assert!(in_flight_at_drain.is_some_and(|n| n >= 1), "{log}");
}
