//! Graceful drain: SIGTERM stops accepting, lets in-flight streams finish within the grace
//! period, records their usage, commits the ledger and exits 0; a stream still running at the
//! deadline is cut and recorded as incomplete. Also `/healthz`, `/readyz` and the log format.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

/// (complete, input, output) of every usage row in the ledger file, oldest first.
fn usage_rows(h: &Harness) -> Vec<(bool, u64, u64)> {
    let db = rusqlite::Connection::open_with_flags(
        h.db_path(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut stmt = db
        .prepare("SELECT complete, input, output FROM usage ORDER BY id")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)? == 1, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    rows
}

fn decisions(h: &Harness) -> u64 {
    let db = rusqlite::Connection::open_with_flags(
        h.db_path(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    db.query_row("SELECT count(*) FROM decisions", [], |r| r.get(0))
        .unwrap()
}

/// Start a streamed Anthropic call on its own thread; it returns the whole response and when
/// it ended.
fn stream_in_background(h: &Harness, text: &str) -> std::thread::JoinHandle<(Resp, Instant)> {
    let url = h.proxy_url(MESSAGES);
    let body = anthropic("claude-sonnet-4-5", text, json!({"stream": true})).to_string();
    std::thread::spawn(move || {
        let r = client::post(&url)
            .timeout(Duration::from_secs(60))
            .set("x-api-key", KEY_A)
            .set("x-tokensaver-human", "1")
            .set("content-type", "application/json")
            .send(body.as_bytes());
        (r, Instant::now())
    })
}

fn refuses_connections(addr: std::net::SocketAddr, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

#[test]
fn sigterm_lets_a_stream_in_flight_finish_then_commits_and_exits_0() {
    let mut h = Harness::start(Opts {
        stream_delay_ms: 250,
        rust_log: "info",
        ..Opts::default()
    });
    let ready = call(client::get(&h.admin_url("/readyz")), None);
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(ready.json()["checks"]["store_writable"], true);

    let stream = stream_in_background(&h, "Tell me a long story about a lighthouse.");
    std::thread::sleep(Duration::from_millis(600));
    h.signal("TERM");
    let signalled = Instant::now();

    // No new connections once the drain begins, on every listener.
    for addr in [h.proxy, h.api, h.admin] {
        assert!(
            refuses_connections(addr, Duration::from_secs(2)),
            "{addr} still accepts after SIGTERM"
        );
    }

    let (resp, ended) = stream.join().unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp.transport_error.is_none(), "{:?}", resp.transport_error);
    assert!(resp.text().contains("message_stop"), "{}", resp.text());
    assert!(
        ended.duration_since(signalled) > Duration::from_millis(500),
        "the stream should have been running well after SIGTERM"
    );

    let status = h
        .wait_exit(Duration::from_secs(20))
        .expect("the server exits once the stream is done");
    let exited = Instant::now();
    assert!(status.success(), "exit status {status}");
    assert!(
        exited.duration_since(ended) < Duration::from_secs(3),
        "the drain waits for requests, not for the grace period"
    );

    let rows = usage_rows(&h);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (complete, input, output) = rows[0];
    assert!(complete && input > 0 && output > 0, "{rows:?}");
    let log = h.log();
    assert!(log.contains("draining"), "{log}");
    assert!(log.contains("drained"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file: {log}");
}

#[test]
fn a_stream_still_running_at_the_deadline_is_cut_and_recorded_as_incomplete() {
    let mut h = Harness::start(Opts {
        stream_delay_ms: 500,
        grace_period_secs: Some(1),
        rust_log: "info",
        ..Opts::default()
    });
    let stream = stream_in_background(&h, "Tell me an even longer story about the sea.");
    std::thread::sleep(Duration::from_millis(300));
    h.signal("TERM");
    let signalled = Instant::now();

    let (resp, ended) = stream.join().unwrap();
    assert_eq!(resp.status, 200);
    assert!(
        resp.transport_error.is_some(),
        "a cut stream must end abnormally, never look complete: {}",
        resp.text()
    );
    assert!(!resp.text().contains("message_stop"), "{}", resp.text());
    let cut_after = ended.duration_since(signalled);
    assert!(
        cut_after >= Duration::from_millis(900) && cut_after < Duration::from_secs(4),
        "cut after {cut_after:?}"
    );

    let status = h.wait_exit(Duration::from_secs(20)).expect("exits");
    assert!(status.success(), "exit status {status}");
    assert!(signalled.elapsed() < Duration::from_secs(8));

    // Recorded as what it is: incomplete, with the input the provider reported at the start.
    let rows = usage_rows(&h);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (complete, input, _) = rows[0];
    assert!(!complete && input > 0, "{rows:?}");
    assert!(h.log().contains("grace period over"), "{}", h.log());
}

#[test]
fn an_idle_server_exits_at_once_and_a_restart_finds_the_ledger_whole() {
    let mut h = Harness::default();
    for i in 0..5 {
        let r = h.post(
            CHAT,
            KEY_A,
            &chat("gpt-4o-mini", &format!("question number {i}"), json!({})),
            &[HUMAN],
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    h.signal("TERM");
    let start = Instant::now();
    let status = h.wait_exit(Duration::from_secs(10)).expect("exits");
    assert!(status.success());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    // Nothing lost: the rows of requests answered just before SIGTERM were committed.
    assert_eq!(decisions(&h), 5);
    assert_eq!(usage_rows(&h).len(), 5);
}

#[test]
fn health_and_readiness_on_the_admin_listener_only() {
    let h = Harness::default();
    let health = call(client::get(&h.admin_url("/healthz")), None);
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "alive");
    assert_eq!(health.json()["pid"], h.pid().unwrap());
    let ready = call(client::get(&h.admin_url("/readyz")), None);
    assert_eq!(ready.status, 200, "{}", ready.text());
    let checks = &ready.json()["checks"];
    for check in ["store_writable", "signing_key", "upstreams_resolved"] {
        assert_eq!(checks[check], true, "{check}: {}", ready.text());
    }
    assert_eq!(checks["draining"], false);
    assert_eq!(ready.json()["upstreams"].as_array().unwrap().len(), 2);
    // Not on the API listener, and GET only.
    assert_eq!(call(client::get(&h.api_url("/healthz")), None).status, 404);
    assert_eq!(
        call(client::post(&h.admin_url("/readyz")), Some(b"")).status,
        405
    );
    // The CLI asks the same route.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokensaver"))
        .args(["health", "--ready", "--config"])
        .arg(h.config_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"ready\":true"));
}

#[test]
fn json_logs_are_one_object_per_line_without_colour() {
    let mut h = Harness::start(Opts {
        rust_log: "info",
        serve_args: vec!["--log-format".into(), "json".into()],
        ..Opts::default()
    });
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o-mini", "hello", json!({})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200);
    h.signal("TERM");
    assert!(h.wait_exit(Duration::from_secs(10)).unwrap().success());
    let log = h.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "{log}");
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
    }
    assert!(!log.contains('\u{1b}'));
    assert!(!log.contains("hello"), "request content in the log: {log}");
}
