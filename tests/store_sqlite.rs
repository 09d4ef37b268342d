//! The embedded SQLite store: schema migrations, group commit, durability of acknowledged
//! commits (including a real SIGKILL of a child process), forget, the ledger by tier, open
//! reservations and `/record` accepted once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokensaver::config::{BudgetPeriod, Prices};
use tokensaver::gate::{Usage, Verdict};
use tokensaver::receipt::DecisionId;
use tokensaver::request::{Hash, WireForm};
use tokensaver::store::sqlite::{SqliteStore, DB_FILE, SCHEMA_VERSION};
use tokensaver::store::{
    utc_day, DecisionRow, Ending, Event, HoldRow, HoldState, LedgerTotals, SpendBasis, Store,
    StoreError, UsageRow,
};

const DAY: u64 = 86_400_000;
/// 2026-11-29T22:39:09Z
const T0: u64 = 1_795_991_949_000;

/// The 32 bytes these tests name `tag` (at most 32 bytes, zero-padded): a readable name
/// survives the round trip through the typed ids, and sorts as its text would.
fn tagged(tag: &str) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[..tag.len()].copy_from_slice(tag.as_bytes());
    bytes
}

/// The name of [`tagged`] bytes.
fn tag_of(bytes: &[u8; 32]) -> String {
    String::from_utf8_lossy(bytes)
        .trim_end_matches('\0')
        .to_owned()
}

fn id_of(tag: &str) -> DecisionId {
    DecisionId(tagged(tag))
}

fn decision(id: &str, key: &str, verdict: Verdict, at: u64) -> DecisionRow {
    let forwarded = matches!(verdict, Verdict::Allow | Verdict::Downgrade);
    DecisionRow {
        decision_id: id_of(id),
        key_id: key.to_owned(),
        fingerprint: Some(Hash(tagged(&format!("fp-{id}")))),
        verdict,
        reason: "band".to_owned(),
        score: 0.25,
        model_requested: "gpt-4o".to_owned(),
        model_served: forwarded.then(|| "gpt-4o-mini".to_owned()),
        wire: WireForm::Json,
        decided_at_ms: at,
        reserved_nano: if forwarded { 1_000 } else { 0 },
        worst_case_tokens: Some(500),
        tokens_not_bought: if verdict == Verdict::Serve { 100 } else { 0 },
        worst_case_tokens_avoided: if verdict == Verdict::Block { 700 } else { 0 },
        findings_tokens: 3,
        hold_id: None,
        step_fingerprint: None,
        recorded_by: Default::default(),
        session: None,
        paced_ms: 0,
        cache_edits: Default::default(),
    }
}

fn usage_row(id: &str, key: &str, at: u64, spend: u64) -> UsageRow {
    UsageRow {
        decision_id: id_of(id),
        key_id: key.to_owned(),
        at_ms: at,
        served_model: "gpt-4o-mini".to_owned(),
        wire: WireForm::Sse,
        complete: true,
        usage: Usage {
            input: 10,
            cache_write: 1,
            cache_read: 2,
            output: 20,
        },
        cache_write_1h: 0,
        web_search_requests: 0,
        ending: Some(Ending::Complete),
        basis: SpendBasis::Reported,
        spend_nano: spend,
        cache_saving_nano: None,
        cache: Default::default(),
    }
}

fn hold(id: &str, key: &str, created: u64, state: HoldState, worst: u64) -> HoldRow {
    HoldRow {
        hold_id: id.to_owned(),
        key_id: key.to_owned(),
        fingerprint: Some(Hash(tagged(&format!("fp-{id}")))),
        created_ms: created,
        expires_ms: created + 900_000,
        state,
        worst_case_tokens: worst,
    }
}

fn expiry(id: &str, key: &str, at: u64, charged: u64) -> Event {
    Event::ReservationExpired {
        decision_id: id_of(id),
        key_id: key.to_owned(),
        at_ms: at,
        charged_nano: charged,
    }
}

fn recorded(key: &str, fp: &str, wire: WireForm, output: u64) -> Event {
    Event::Recorded {
        key_id: key.to_owned(),
        fingerprint: Hash(tagged(fp)),
        wire,
        usage: Usage {
            input: 1,
            cache_write: 0,
            cache_read: 0,
            output,
        },
        at_ms: T0,
    }
}

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(dir, 20).expect("open")
}

fn raw(dir: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.join(DB_FILE)).expect("raw connection")
}

fn ids(rows: &[DecisionRow]) -> Vec<String> {
    rows.iter().map(|d| tag_of(&d.decision_id.0)).collect()
}

#[test]
fn migrations_are_versioned_and_idempotent_on_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("nested").join("data");
    {
        let store = open(&data);
        store
            .submit_and_wait(Event::Decision(decision("d1", "a", Verdict::Allow, T0)))
            .expect("write");
        store.shutdown().expect("shutdown");
    }
    let conn = raw(&data);
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    const { assert!(SCHEMA_VERSION >= 1) };
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("mode");
    assert_eq!(mode, "wal");
    drop(conn);

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data.join(DB_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the database is owner-only");
    }

    for _ in 0..2 {
        let store = open(&data);
        let snap = store.load(T0 + 1).expect("load");
        assert_eq!(ids(&snap.recent_decisions), vec!["d1"]);
    }
    let version: u32 = raw(&data)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);

    // A database from a newer build is refused, not downgraded.
    raw(&data)
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .expect("bump");
    assert!(SqliteStore::open(&data, 20).is_err());
}

#[test]
fn load_returns_what_was_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let now = T0;

    let old = decision("old", "a", Verdict::Serve, now - DAY - 1);
    let edge = decision("edge", "a", Verdict::Block, now - DAY);
    let mut d1 = decision("d1", "a", Verdict::Allow, now - 5_000);
    d1.hold_id = Some("h-approved".to_owned());
    d1.score = f64::NAN;
    d1.worst_case_tokens = None;
    d1.fingerprint = None;
    let d2 = decision("d2", "b", Verdict::Downgrade, now - 4_000);
    let d3 = decision("d3", "a", Verdict::Challenge, now - 3_000);
    for d in [&old, &edge, &d1, &d2, &d3] {
        store.submit(Event::Decision(d.clone()));
    }
    store.submit(Event::Usage(usage_row("d2", "b", now - 3_500, 777)));
    store.submit(Event::Usage(usage_row("old", "a", now - DAY, 5)));
    // Last month: aggregated at the month's start.
    store.submit(Event::Usage(usage_row("x1", "a", T0 - 40 * DAY, 11)));
    store.submit(Event::Usage(usage_row("x2", "a", T0 - 45 * DAY, 22)));
    store.submit(expiry("x3", "a", now - 2 * DAY, 300));
    store.submit(Event::Usage(usage_row("x4", "a", now - 2 * DAY + 1, 4)));

    store.submit(Event::Hold(hold(
        "h-pending",
        "a",
        now - 10,
        HoldState::Pending,
        9,
    )));
    store.submit(Event::Hold(hold(
        "h-approved",
        "a",
        now - 20,
        HoldState::Pending,
        9,
    )));
    store.submit(Event::Hold(hold(
        "h-approved",
        "a",
        now - 20,
        HoldState::Approved,
        9,
    )));
    store.submit(Event::Hold(hold(
        "h-used",
        "a",
        now - 30,
        HoldState::Used,
        9,
    )));
    store.submit(Event::Hold(hold(
        "h-exp",
        "b",
        now - 40,
        HoldState::Expired,
        9,
    )));

    store.submit(recorded("a", "fp1", WireForm::Json, 5));
    store.submit(recorded("a", "fp1", WireForm::Sse, 6));
    store.submit(recorded("a", "fp1", WireForm::Json, 7)); // upsert
    store.submit(Event::BudgetSet {
        key_id: "a".to_owned(),
        ceiling_nano: Some(10),
        period: BudgetPeriod::Day,
    });
    store.submit(Event::BudgetSet {
        key_id: "a".to_owned(),
        ceiling_nano: Some(u64::MAX), // clamped to i64::MAX on disk
        period: BudgetPeriod::Month,
    });
    store.submit(Event::BudgetSet {
        key_id: "b".to_owned(),
        ceiling_nano: None,
        period: BudgetPeriod::Lifetime,
    });
    let p = Prices {
        input: 2_500_000,
        cache_write: 3_000_000,
        cache_read: 1_250_000,
        output: 10_000_000,
        max_output: 16_384,
        cache_write_1h: None,
        web_search_per_1k: None,
    };
    store.submit(Event::PricesSet {
        model: "gpt-4o".to_owned(),
        prices: Prices { input: 1, ..p },
    });
    store.submit(Event::PricesSet {
        model: "gpt-4o".to_owned(),
        prices: p,
    });
    store.flush().expect("flush");

    let snap = store.load(now).expect("load");
    // Strictly newer than now − 24 h, oldest first.
    assert_eq!(ids(&snap.recent_decisions), vec!["d1", "d2", "d3"]);
    let got1 = &snap.recent_decisions[0];
    assert!(got1.score.is_nan());
    let mut got1 = got1.clone();
    got1.score = d1.score;
    assert_eq!(format!("{got1:?}"), format!("{d1:?}"));
    assert_eq!(snap.recent_decisions[1], d2);
    assert_eq!(snap.recent_decisions[2], d3);

    assert_eq!(ids(&snap.open_reservations), vec!["d1"]);

    let month_start = tokensaver::store::period_start(BudgetPeriod::Month, now);
    let prev_month_start = tokensaver::store::period_start(BudgetPeriod::Month, month_start - 1);
    let day = |t: u64| t - t % DAY;
    assert_eq!(
        snap.spend,
        vec![
            ("a".to_owned(), prev_month_start, 33),
            ("a".to_owned(), day(now - 2 * DAY), 304),
            ("a".to_owned(), day(now - DAY), 5),
            ("b".to_owned(), day(now), 777),
        ]
    );

    let holds: Vec<(&str, HoldState)> = snap
        .holds
        .iter()
        .map(|h| (h.hold_id.as_str(), h.state))
        .collect();
    assert_eq!(
        holds,
        vec![
            ("h-approved", HoldState::Approved),
            ("h-pending", HoldState::Pending)
        ]
    );
    assert_eq!(
        snap.holds[1],
        hold("h-pending", "a", now - 10, HoldState::Pending, 9)
    );

    let rec: Vec<(String, String, WireForm, u64)> = snap
        .recorded
        .iter()
        .map(|(k, f, w, u, _)| (k.clone(), tag_of(&f.0), *w, u.output))
        .collect();
    assert_eq!(
        rec,
        vec![
            ("a".to_owned(), "fp1".to_owned(), WireForm::Json, 7),
            ("a".to_owned(), "fp1".to_owned(), WireForm::Sse, 6),
        ]
    );
    assert_eq!(
        snap.budgets,
        vec![
            ("a".to_owned(), Some(i64::MAX as u64), BudgetPeriod::Month),
            ("b".to_owned(), None, BudgetPeriod::Lifetime),
        ]
    );
    assert_eq!(snap.prices, vec![("gpt-4o".to_owned(), p)]);
}

#[test]
fn acknowledged_events_survive_without_a_clean_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    const N: usize = 200;
    {
        let store = open(dir.path());
        for i in 0..N {
            let id = format!("d{i}");
            store
                .submit_and_wait(Event::Decision(decision(&id, "a", Verdict::Allow, T0)))
                .expect("decision");
            store
                .submit_and_wait(Event::Usage(usage_row(&id, "a", T0, 1)))
                .expect("usage");
        }
        // No flush, no shutdown, no drop: the writer never runs again.
        std::mem::forget(store);
    }
    let store = open(dir.path());
    let snap = store.load(T0 + 1).expect("load");
    assert_eq!(snap.recent_decisions.len(), N);
    assert!(snap.open_reservations.is_empty());
    for i in 0..N {
        assert!(store
            .usage_recorded(&id_of(&format!("d{i}")))
            .expect("read"));
    }
    let (_, total) = store.ledger(Some("a"), None, None).expect("ledger");
    assert_eq!(total.spend_nano, N as u64);
}

const CHILD_ENV: &str = "TOKENSAVER_SQLITE_SIGKILL_CHILD_DIR";

/// Run by `sigkill_loses_nothing_acknowledged` in a child process: writes until killed,
/// printing each acknowledged `/record`.
#[test]
#[ignore = "child process of sigkill_loses_nothing_acknowledged"]
fn sigkill_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = open(Path::new(&dir));
    let mut out = std::io::stdout();
    for i in 0u64.. {
        let id = format!("d{i}");
        // The decision goes fire-and-forget, like the hot path; the usage is acknowledged.
        store.submit(Event::Decision(decision(&id, "a", Verdict::Allow, T0 + i)));
        store
            .submit_and_wait(Event::Usage(usage_row(&id, "a", T0 + i, 1)))
            .expect("usage");
        writeln!(out, "ack {i}").expect("stdout");
        out.flush().expect("stdout");
    }
}

#[test]
fn sigkill_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args(["--exact", "sigkill_child", "--ignored", "--nocapture"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut acked: Option<u64> = None;
    while acked.is_none_or(|a| a < 300) {
        let Some(line) = lines.next() else { break };
        let line = line.expect("line");
        if let Some(i) = line.strip_prefix("ack ") {
            acked = Some(i.parse().expect("index"));
        }
    }
    child.kill().expect("SIGKILL"); // SIGKILL on unix
    child.wait().expect("reap");
    // Acknowledgements printed before the kill landed.
    for line in lines {
        let line = line.expect("line");
        if let Some(i) = line.strip_prefix("ack ") {
            acked = Some(i.parse().expect("index"));
        }
    }
    let acked = acked.expect("the child acknowledged something");
    assert!(acked >= 300);

    let store = open(dir.path());
    for i in 0..=acked {
        assert!(
            store
                .usage_recorded(&id_of(&format!("d{i}")))
                .expect("read"),
            "acknowledged usage d{i} lost"
        );
    }
    let (_, total) = store.ledger(Some("a"), None, None).expect("ledger");
    assert!(total.spend_nano > acked);
    // Each usage went after its decision on the same queue: its decision is there too.
    assert!(total.requests > acked);
    eprintln!(
        "sigkill: {} acknowledged, {} usage rows and {} decisions after the kill",
        acked + 1,
        total.spend_nano,
        total.requests
    );
}

#[test]
fn group_commit_batches_fire_and_forget_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    const N: u64 = 5_000;
    let start = Instant::now();
    for i in 0..N {
        store.submit(Event::Decision(decision(
            &format!("d{i}"),
            "a",
            Verdict::Allow,
            T0 + i,
        )));
    }
    let queued = start.elapsed();
    store.flush().expect("flush");
    let done = start.elapsed();
    let commits = store.commits();
    eprintln!(
        "group commit: {N} events submitted in {queued:?} ({:.0}/s), committed in {done:?} \
         ({:.0}/s) with {commits} commits",
        N as f64 / queued.as_secs_f64(),
        N as f64 / done.as_secs_f64()
    );
    assert_eq!(store.events_committed(), N);
    assert!(commits >= 2, "{N} events exceed one batch cap");
    assert!(commits <= 20, "{commits} commits for {N} events");
    let (_, total) = store.ledger(None, None, None).expect("ledger");
    assert_eq!(total.requests, N);
}

#[test]
fn group_commit_batches_concurrent_waiters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(open(dir.path()));
    const THREADS: u64 = 8;
    const EACH: u64 = 100;
    let start = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let id = format!("t{t}-{i}");
                    store
                        .submit_and_wait(Event::Decision(decision(&id, "a", Verdict::Serve, T0)))
                        .expect("write");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("join");
    }
    let elapsed = start.elapsed();
    let commits = store.commits();
    eprintln!(
        "waiters: {} acknowledged writes from {THREADS} threads in {elapsed:?} ({:.0}/s), \
         {commits} commits",
        THREADS * EACH,
        (THREADS * EACH) as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(store.events_committed(), THREADS * EACH);
    assert!(commits < THREADS * EACH, "waiters share commits");
}

#[test]
fn forget_blanks_fingerprints_and_keeps_totals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    for (id, key, v) in [
        ("a1", "a", Verdict::Serve),
        ("a2", "a", Verdict::Block),
        ("a3", "a", Verdict::Allow),
        ("b1", "b", Verdict::Serve),
    ] {
        store.submit(Event::Decision(decision(id, key, v, T0)));
    }
    store.submit(Event::Usage(usage_row("a3", "a", T0, 40)));
    store.submit(recorded("a", "fp-a1", WireForm::Json, 5));
    store.submit(recorded("b", "fp-b1", WireForm::Json, 5));
    store.submit(Event::Hold(hold("ha", "a", T0, HoldState::Pending, 9)));
    store.flush().expect("flush");
    let before_a = store.ledger(Some("a"), None, None).expect("ledger");
    let before_b = store.ledger(Some("b"), None, None).expect("ledger");

    store
        .submit_and_wait(Event::Forget {
            key_id: "a".to_owned(),
        })
        .expect("forget");
    // A later state of the hold does not bring its fingerprint back.
    store
        .submit_and_wait(Event::Hold(hold("ha", "a", T0, HoldState::Approved, 9)))
        .expect("hold");

    let snap = store.load(T0 + 1).expect("load");
    for d in &snap.recent_decisions {
        if d.key_id == "a" {
            assert_eq!(d.fingerprint, None, "{}", d.decision_id);
        } else {
            assert_eq!(
                d.fingerprint.map(|f| tag_of(&f.0)).as_deref(),
                Some("fp-b1")
            );
        }
    }
    assert_eq!(snap.recent_decisions.len(), 4);
    assert_eq!(snap.recorded.len(), 1);
    assert_eq!(snap.recorded[0].0, "b");
    assert_eq!(snap.holds.len(), 1);
    assert_eq!(snap.holds[0].fingerprint, None);
    assert_eq!(snap.holds[0].state, HoldState::Approved);
    let nulls: u64 = raw(dir.path())
        .query_row(
            "SELECT COUNT(*) FROM holds WHERE fingerprint IS NULL",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(nulls, 1);

    assert_eq!(
        store.ledger(Some("a"), None, None).expect("ledger"),
        before_a
    );
    assert_eq!(
        store.ledger(Some("b"), None, None).expect("ledger"),
        before_b
    );
}

#[test]
fn ledger_by_day_tier_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let day1 = T0 - T0 % DAY; // 2026-11-29
    let day2 = day1 + DAY; // 2026-11-30

    // Key a, day 1.
    store.submit(Event::Decision(decision(
        "a-serve",
        "a",
        Verdict::Serve,
        day1 + 1,
    )));
    store.submit(Event::Decision(decision(
        "a-allow",
        "a",
        Verdict::Allow,
        day1 + 2,
    )));
    store.submit(Event::Usage(usage_row("a-allow", "a", day1 + 3, 5_000)));
    store.submit(Event::Decision(decision(
        "a-block",
        "a",
        Verdict::Block,
        day1 + 4,
    )));
    let mut challenge = decision("a-chal", "a", Verdict::Challenge, day1 + 5);
    challenge.worst_case_tokens_avoided = 123; // not a BLOCK: not counted from the row
    challenge.hold_id = Some("h1".to_owned());
    store.submit(Event::Decision(challenge));
    store.submit(Event::Hold(hold(
        "h1",
        "a",
        day1 + 5,
        HoldState::Pending,
        300,
    )));
    store.submit(Event::Hold(hold(
        "h1",
        "a",
        day1 + 5,
        HoldState::Expired,
        300,
    )));
    store.submit(Event::Hold(hold("h2", "a", day1 + 6, HoldState::Used, 999)));
    // Key a, day 2.
    store.submit(Event::Decision(decision(
        "a-allow2",
        "a",
        Verdict::Allow,
        day2 + 1,
    )));
    store.submit(expiry("a-allow2", "a", day2 + 600_000, 2_000));
    store.submit(Event::Decision(decision(
        "a-down",
        "a",
        Verdict::Downgrade,
        day2 + 2,
    )));
    store.submit(Event::Usage(usage_row("a-down", "a", day2 + 3, 1_000)));
    // Key b, day 1.
    store.submit(Event::Decision(decision(
        "b-serve",
        "b",
        Verdict::Serve,
        day1 + 1,
    )));
    store.submit(Event::Decision(decision(
        "b-block",
        "b",
        Verdict::Block,
        day1 + 2,
    )));
    store.submit(Event::Decision(decision(
        "b-allow",
        "b",
        Verdict::Allow,
        day1 + 3,
    )));
    store.submit(Event::Usage(usage_row("b-allow", "b", day1 + 4, 9_999)));
    store.submit(Event::Hold(hold(
        "hb",
        "b",
        day1 + 5,
        HoldState::Expired,
        50,
    )));
    store.flush().expect("flush");

    let verdicts = |pairs: &[(&str, u64)]| {
        let mut m: std::collections::BTreeMap<String, u64> = Verdict::ALL
            .iter()
            .map(|v| (v.as_str().to_owned(), 0))
            .collect();
        for (v, n) in pairs {
            m.insert((*v).to_owned(), *n);
        }
        m
    };
    let parts = |n: u64| Usage {
        input: 10 * n,
        cache_write: n,
        cache_read: 2 * n,
        output: 20 * n,
    };

    let a1 = LedgerTotals {
        requests: 4,
        by_verdict: verdicts(&[("SERVE", 1), ("ALLOW", 1), ("BLOCK", 1), ("CHALLENGE", 1)]),
        spend_nano: 5_000,
        usage: parts(1),
        tokens_not_bought: 100,
        worst_case_tokens_avoided: 700 + 300,
        findings_tokens_estimated: 12,
        unpriced_calls: 0,
        cache_saving_nano: 0,
        cache_premium_1h_nano: Default::default(),
        cache_rebuild_nano: Default::default(),
        cache_rebuilds: Default::default(),
        cache_saving_lifetimes_nano: Default::default(),
        cache_saving_routing_nano: Default::default(),
    };
    let a2 = LedgerTotals {
        requests: 2,
        by_verdict: verdicts(&[("ALLOW", 1), ("DOWNGRADE", 1)]),
        spend_nano: 2_000 + 1_000,
        usage: parts(1),
        tokens_not_bought: 0,
        worst_case_tokens_avoided: 0,
        findings_tokens_estimated: 6,
        unpriced_calls: 0,
        cache_saving_nano: 0,
        cache_premium_1h_nano: Default::default(),
        cache_rebuild_nano: Default::default(),
        cache_rebuilds: Default::default(),
        cache_saving_lifetimes_nano: Default::default(),
        cache_saving_routing_nano: Default::default(),
    };
    let (days, total) = store.ledger(Some("a"), None, None).expect("ledger");
    assert_eq!(days.len(), 2);
    assert_eq!(days[0].day, "2026-11-29");
    assert_eq!(days[0].day, utc_day(day1));
    assert_eq!(days[0].totals, a1);
    assert_eq!(days[1].day, "2026-11-30");
    assert_eq!(days[1].totals, a2);
    assert_eq!(
        total,
        LedgerTotals {
            requests: 6,
            by_verdict: verdicts(&[
                ("SERVE", 1),
                ("ALLOW", 2),
                ("DOWNGRADE", 1),
                ("BLOCK", 1),
                ("CHALLENGE", 1)
            ]),
            spend_nano: 8_000,
            usage: parts(2),
            tokens_not_bought: 100,
            worst_case_tokens_avoided: 1_000,
            findings_tokens_estimated: 18,
            unpriced_calls: 0,
            cache_saving_nano: 0,
            cache_premium_1h_nano: Default::default(),
            cache_rebuild_nano: Default::default(),
            cache_rebuilds: Default::default(),
            cache_saving_lifetimes_nano: Default::default(),
            cache_saving_routing_nano: Default::default(),
        }
    );

    let b1 = LedgerTotals {
        requests: 3,
        by_verdict: verdicts(&[("SERVE", 1), ("ALLOW", 1), ("BLOCK", 1)]),
        spend_nano: 9_999,
        usage: parts(1),
        tokens_not_bought: 100,
        worst_case_tokens_avoided: 700 + 50,
        findings_tokens_estimated: 9,
        unpriced_calls: 0,
        cache_saving_nano: 0,
        cache_premium_1h_nano: Default::default(),
        cache_rebuild_nano: Default::default(),
        cache_rebuilds: Default::default(),
        cache_saving_lifetimes_nano: Default::default(),
        cache_saving_routing_nano: Default::default(),
    };
    let (days_b, total_b) = store.ledger(Some("b"), None, None).expect("ledger");
    assert_eq!(days_b.len(), 1);
    assert_eq!(days_b[0].totals, b1);
    assert_eq!(total_b, b1);

    // The fleet: both keys.
    let (fleet_days, fleet) = store.ledger(None, None, None).expect("ledger");
    assert_eq!(fleet_days.len(), 2);
    assert_eq!(fleet.requests, 9);
    assert_eq!(fleet.spend_nano, 8_000 + 9_999);
    assert_eq!(fleet.tokens_not_bought, 200);
    assert_eq!(fleet.worst_case_tokens_avoided, 1_000 + 750);
    assert_eq!(fleet.usage, parts(3));

    // Inclusive day filters.
    let (only2, t2) = store
        .ledger(Some("a"), Some("2026-11-30"), None)
        .expect("ledger");
    assert_eq!(only2.len(), 1);
    assert_eq!(t2, a2);
    let (only1, t1) = store
        .ledger(Some("a"), Some("2026-11-29"), Some("2026-11-29"))
        .expect("ledger");
    assert_eq!(only1.len(), 1);
    assert_eq!(t1, a1);
    let (none, t0) = store
        .ledger(Some("a"), Some("2026-12-01"), Some("2027-01-01"))
        .expect("ledger");
    assert!(none.is_empty());
    assert_eq!(t0.requests, 0);
    assert_eq!(t0.by_verdict.len(), 5);
    let (unknown, _) = store.ledger(Some("c"), None, None).expect("ledger");
    assert!(unknown.is_empty());

    for bad in [
        "2026-11-31",
        "2026-1-30",
        "yesterday",
        "2026-13-01",
        "2026-11-3x",
    ] {
        assert!(store.ledger(Some("a"), Some(bad), None).is_err(), "{bad}");
    }
}

#[test]
fn open_reservations_exclude_settled_and_expired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let mut zero = decision("allow-zero", "a", Verdict::Allow, T0 + 7);
    zero.reserved_nano = 0;
    for d in [
        decision("settled", "a", Verdict::Allow, T0 + 1),
        decision("expired", "a", Verdict::Allow, T0 + 2),
        decision("open-allow", "a", Verdict::Allow, T0 + 3),
        decision("open-down", "b", Verdict::Downgrade, T0 + 4),
        decision("serve", "a", Verdict::Serve, T0 + 5),
        decision("block", "a", Verdict::Block, T0 + 6),
        zero,
    ] {
        store.submit(Event::Decision(d));
    }
    store.submit(Event::Usage(usage_row("settled", "a", T0 + 10, 1)));
    store.submit(expiry("expired", "a", T0 + 600_000, 1_000));
    // A usage row that arrives before its decision settles it too.
    store.submit(Event::Usage(usage_row("early", "a", T0 + 8, 1)));
    store.submit(Event::Decision(decision(
        "early",
        "a",
        Verdict::Allow,
        T0 + 8,
    )));
    store.flush().expect("flush");

    let snap = store.load(T0 + 1_000).expect("load");
    assert_eq!(
        ids(&snap.open_reservations),
        vec!["open-allow", "open-down"]
    );
    drop(store);

    // Also after a restart, and a settling of the remaining ones.
    let store = open(dir.path());
    store.submit(Event::Usage(usage_row("open-down", "b", T0 + 20, 1)));
    store.submit(expiry("open-allow", "a", T0 + 600_000, 1_000));
    store.submit(expiry("open-allow", "a", T0 + 600_001, 1_000)); // charged once
    store.flush().expect("flush");
    let snap = store.load(T0 + 1_000).expect("load");
    assert!(snap.open_reservations.is_empty());
    let (_, total) = store.ledger(Some("a"), None, None).expect("ledger");
    assert_eq!(total.spend_nano, 1 + 1_000 + 1 + 1_000);
}

/// A decision whose usage comes in the same batch is written settled, its usage linked to its
/// row; a second usage in the batch is refused; a usage refused because one came before the
/// decision leaves the decision marked as possibly open, and load finds it settled.
#[test]
fn a_decision_and_its_usage_in_one_batch_are_written_settled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    store
        .submit_and_wait(Event::Usage(usage_row("early", "a", T0, 7)))
        .expect("early usage");
    store.submit(Event::Decision(decision(
        "pair",
        "a",
        Verdict::Allow,
        T0 + 1,
    )));
    store.submit(Event::Usage(usage_row("pair", "a", T0 + 2, 500)));
    store.submit(Event::Usage(usage_row("pair", "a", T0 + 3, 9_000)));
    store.submit(Event::Decision(decision(
        "early",
        "a",
        Verdict::Allow,
        T0 + 4,
    )));
    store.submit(Event::Usage(usage_row("early", "a", T0 + 5, 9_000)));
    assert!(store.flush().is_err(), "two refused usage rows");
    assert_eq!(store.rejected_events(), 2);

    let db = raw(dir.path());
    let row = |tag: &str| -> (i64, i64, i64) {
        db.query_row(
            "SELECT d.open, (SELECT count(*) FROM usage AS u WHERE u.decision = d.id), \
                    (SELECT count(*) FROM usage AS u WHERE u.decision_id = d.decision_id) \
             FROM decisions AS d WHERE d.decision_id = ?1",
            [&tagged(tag)[..]],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("decision row")
    };
    // open, usage rows linked to the decision's row, usage rows with its id.
    assert_eq!(row("pair"), (0, 1, 1));
    assert_eq!(row("early"), (1, 0, 1));
    let snap = store.load(T0 + 1_000).expect("load");
    assert!(
        snap.open_reservations.is_empty(),
        "{:?}",
        ids(&snap.open_reservations)
    );
    let (_, total) = store.ledger(Some("a"), None, None).expect("ledger");
    assert_eq!(total.spend_nano, 500 + 7);
}

#[test]
fn a_record_is_accepted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    store.submit(Event::Decision(decision("d1", "a", Verdict::Allow, T0)));
    assert!(!store.usage_recorded(&id_of("d1")).expect("read"));
    store
        .submit_and_wait(Event::Usage(usage_row("d1", "a", T0 + 1, 500)))
        .expect("first record");
    assert!(store.usage_recorded(&id_of("d1")).expect("read"));
    let before = store.ledger(Some("a"), None, None).expect("ledger");

    let second = store.submit_and_wait(Event::Usage(usage_row("d1", "a", T0 + 2, 9_000)));
    match second {
        Err(StoreError::Sqlite(msg)) => assert!(msg.contains("already recorded"), "{msg}"),
        other => panic!("second record accepted: {other:?}"),
    }
    assert_eq!(store.rejected_events(), 1);
    assert_eq!(store.ledger(Some("a"), None, None).expect("ledger"), before);
    assert_eq!(before.1.spend_nano, 500);
    // The waiter got the failure; later flushes are clean.
    store.flush().expect("flush");
}

#[test]
fn a_rejected_event_does_not_sink_its_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    store.submit(Event::Decision(decision("d1", "a", Verdict::Serve, T0)));
    store.submit(Event::Decision(decision("d1", "a", Verdict::Block, T0 + 1)));
    store.submit(Event::Decision(decision("d2", "a", Verdict::Serve, T0 + 2)));
    // The flush reports the fire-and-forget event that was lost...
    assert!(store.flush().is_err());
    // ...once.
    store.flush().expect("flush");
    let snap = store.load(T0 + 10).expect("load");
    assert_eq!(ids(&snap.recent_decisions), vec!["d1", "d2"]);
    assert_eq!(snap.recent_decisions[0].verdict, Verdict::Serve);
    assert_eq!(store.failed_commits(), 0);
}

#[test]
fn shutdown_commits_queued_events_and_then_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path(), 10_000).expect("open");
    for i in 0..10 {
        store.submit(Event::Decision(decision(
            &format!("d{i}"),
            "a",
            Verdict::Serve,
            T0,
        )));
    }
    let start = Instant::now();
    store.shutdown().expect("shutdown");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "shutdown does not wait out the linger"
    );
    store.shutdown().expect("idempotent");
    assert!(matches!(store.flush(), Err(StoreError::Unavailable)));
    assert!(matches!(
        store.submit_and_wait(Event::Forget {
            key_id: "a".to_owned()
        }),
        Err(StoreError::Unavailable)
    ));
    store.submit(Event::Forget {
        key_id: "a".to_owned(),
    }); // dropped, no panic
        // Reads still work.
    assert_eq!(store.load(T0 + 1).expect("load").recent_decisions.len(), 10);
    drop(store);
    let store = open(dir.path());
    let snap = store.load(T0 + 1).expect("load");
    assert_eq!(snap.recent_decisions.len(), 10);
    assert!(snap
        .recent_decisions
        .iter()
        .all(|d| d.fingerprint.is_some()));
}

#[test]
fn a_waiter_does_not_wait_for_the_linger() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A long linger: fire-and-forget events may wait for it, acknowledged ones never do.
    let store = SqliteStore::open(dir.path(), 10_000).expect("open");
    store.submit(Event::Decision(decision("d0", "a", Verdict::Serve, T0)));
    let start = Instant::now();
    store
        .submit_and_wait(Event::Decision(decision("d1", "a", Verdict::Serve, T0)))
        .expect("write");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(store.events_committed(), 2);
}

#[test]
fn huge_figures_do_not_break_sums() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let clamped = i64::MAX as u64; // what a u64 beyond i64::MAX is stored as
    for i in 0..3 {
        let id = format!("d{i}");
        let mut d = decision(&id, "a", Verdict::Serve, T0 + i);
        d.tokens_not_bought = u64::MAX;
        store.submit(Event::Decision(d));
        let mut u = usage_row(&id, "a", T0 + i, u64::MAX);
        u.usage.output = u64::MAX;
        store.submit(Event::Usage(u));
    }
    store.flush().expect("flush");
    let (days, total) = store.ledger(Some("a"), None, None).expect("ledger");
    assert_eq!(days.len(), 1);
    // 2 × clamped fits in u64, 3 × clamped saturates.
    assert_eq!(total.spend_nano, u64::MAX);
    assert_eq!(total.tokens_not_bought, u64::MAX);
    assert_eq!(total.usage.output, u64::MAX);
    assert_eq!(total.usage.input, 30);
    store.ledger(None, None, None).expect("fleet ledger");
    let snap = store.load(T0 + 10).expect("load");
    assert_eq!(snap.spend.len(), 1);
    assert_eq!(snap.spend[0].2, u64::MAX);
    assert_eq!(snap.recent_decisions[0].tokens_not_bought, clamped);
}

#[test]
fn an_unbounded_commit_interval_is_harmless() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path(), u64::MAX).expect("open");
    store.submit(Event::Decision(decision("d0", "a", Verdict::Serve, T0)));
    store.flush().expect("flush");
    store.submit(Event::Decision(decision("d1", "a", Verdict::Serve, T0)));
    drop(store); // commits d1 without waiting for the interval
    let store = open(dir.path());
    assert_eq!(store.load(T0 + 1).expect("load").recent_decisions.len(), 2);
}

#[test]
fn an_expiry_never_charges_a_reservation_whose_usage_is_recorded() {
    // After a graceful upgrade the new process loaded the long stream's reservation as open;
    // the old one recorded its usage while draining. The new one's expiry must not charge it
    // again.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    store.submit(Event::Decision(decision(
        "drained",
        "a",
        Verdict::Allow,
        T0,
    )));
    store.submit(Event::Decision(decision(
        "lost",
        "a",
        Verdict::Allow,
        T0 + 1,
    )));
    store.submit(Event::Usage(usage_row("drained", "a", T0 + 50, 7)));
    store.submit(expiry("drained", "a", T0 + 600_000, 1_000));
    store.submit(expiry("lost", "a", T0 + 600_001, 1_000));
    store.flush().expect("flush");
    let (_, total) = store.ledger(Some("a"), None, None).expect("ledger");
    assert_eq!(total.spend_nano, 7 + 1_000);
    let expiries: u64 = raw(dir.path())
        .query_row("SELECT count(*) FROM reservation_expiries", [], |r| {
            r.get(0)
        })
        .expect("count");
    assert_eq!(expiries, 1);
}

#[test]
fn an_async_waiter_gets_its_acknowledgement_over_a_channel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        store.submit(Event::Decision(decision("d1", "a", Verdict::Allow, T0)));
        store
            .submit_acked(Event::Usage(usage_row("d1", "a", T0 + 1, 500)))
            .await
            .expect("committed");
        // A second record is refused, and the refusal arrives the same way.
        let second = store
            .submit_acked(Event::Usage(usage_row("d1", "a", T0 + 2, 9)))
            .await;
        assert!(matches!(second, Err(StoreError::Sqlite(_))), "{second:?}");
        store.flush_acked().await.expect("flush");
    });
    assert!(store.usage_recorded(&id_of("d1")).expect("read"));
    store.shutdown().expect("shutdown");
    // A closed store answers at once, never hangs.
    rt.block_on(async {
        assert!(matches!(
            store.flush_acked().await,
            Err(StoreError::Unavailable)
        ));
    });
}
