//! A fleet of gates on one PostgreSQL (issue 10): real `tokensaver serve` processes on
//! loopback, one database, the mock provider holding each call so calls overlap.
//!
//! Needs `TOKENSAVER_TEST_PG_URL` (a PostgreSQL the tests may write to; `scripts/ci-fleet.sh`
//! starts a private one and sets it). Without it every test here returns at once, saying so;
//! `.ci/run` always sets it. The outage test also needs `TOKENSAVER_TEST_PG_DIR` and
//! `TOKENSAVER_TEST_PG_PORT` to stop and start that server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use serde_json::json;
use support::*;
use tokensaver::config::{FleetConfig, Prices};
use tokensaver::gate::{Verdict, Windows};
use tokensaver::receipt::decision_id;
use tokensaver::request::{Hash, Route, WireForm};
use tokensaver::store::postgres::Fleet;
use tokensaver::store::DecisionRow;

/// The fleet's PostgreSQL. The tests are `#[ignore]`d, so they run only when asked for
/// (`--include-ignored`, as `scripts/ci-fleet.sh` does): then a missing database is a failure.
fn pg_url() -> String {
    std::env::var("TOKENSAVER_TEST_PG_URL")
        .expect("TOKENSAVER_TEST_PG_URL is not set: run the fleet tests with scripts/ci-fleet.sh")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A distinct prefix per test run, so runs against one database never share a key.
fn run_tag() -> String {
    format!("{:x}", tokensaver::now_ms() % 0xff_ffff)
}

async fn pg(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// The configured prices of every test model (tests/support).
fn test_prices() -> Prices {
    Prices {
        input: 2_500_000,
        cache_write: 2_500_000,
        cache_read: 1_250_000,
        output: 10_000_000,
        max_output: 16_384,
        cache_write_1h: None,
        web_search_per_1k: None,
    }
}

struct FleetKey {
    id: String,
    secret: String,
}

impl FleetKey {
    fn new(id: String) -> FleetKey {
        let secret = format!("{:0>48}", blake3::hash(id.as_bytes()).to_hex());
        FleetKey { id, secret }
    }
    fn bearer(&self) -> String {
        format!("tsk_{}_{}", self.id, self.secret)
    }
    fn toml(&self, ceiling_micro: Option<u64>) -> String {
        let hash: String = tokensaver::auth::secret_hash(&self.secret)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut s = format!(
            "\n[[keys]]\nid = \"{}\"\nsecret_hash = \"{hash}\"\nhuman = false\n",
            self.id
        );
        if let Some(c) = ceiling_micro {
            s.push_str(&format!(
                "budget = {{ ceiling_micro_usd = {c}, period = \"day\" }}\n"
            ));
        }
        s
    }
}

fn store_toml(url: &str) -> String {
    format!("\n[store]\nkind = \"postgres\"\nurl = \"{url}\"\nmax_connections = 24\n")
}

/// Three instances on one database, each with its own mock provider, data dir and ports.
fn three(url: &str, keys_toml: &str, slow_ms: u64) -> Vec<Harness> {
    three_with_limits(url, "", keys_toml, slow_ms)
}

/// [`three`] with extra `[limits]` lines.
fn three_with_limits(url: &str, limits: &str, keys_toml: &str, slow_ms: u64) -> Vec<Harness> {
    (0..3)
        .map(|_| {
            Harness::start(Opts {
                slow_ms,
                rust_log: "warn",
                // The harness appends this right after its `[limits]` lines.
                extra_config: format!("{limits}{keys_toml}{}", store_toml(url)),
                ..Opts::default()
            })
        })
        .collect()
}

/// Samples a key's `spent + reserved` from the database every few milliseconds, keeping the
/// largest value seen, until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(url: &str, key_id: &str) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, max, samples) = (stop.clone(), max.clone(), samples.clone());
            let (url, id) = (url.to_string(), key_id.to_string());
            std::thread::spawn(move || {
                runtime().block_on(async {
                    let db = pg(&url).await;
                    while !stop.load(Ordering::SeqCst) {
                        // One statement: one snapshot of spend and reservations together.
                        let row = db
                            .query_one(
                                "SELECT COALESCE((SELECT sum(spend_nano) FROM fleet_usage WHERE key_id = $1), 0)::bigint \
                                      + COALESCE((SELECT sum(nano) FROM fleet_reservations WHERE key_id = $1), 0)::bigint",
                                &[&id],
                            )
                            .await
                            .unwrap();
                        let total: i64 = row.get(0);
                        max.fetch_max(total as u64, Ordering::SeqCst);
                        samples.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                });
            })
        };
        Sampler {
            stop,
            max,
            samples,
            thread: Some(thread),
        }
    }

    /// Stop; the largest `spent + reserved` seen and how many samples were taken.
    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        (
            self.max.load(Ordering::SeqCst),
            self.samples.load(Ordering::SeqCst),
        )
    }
}

fn provider_calls(fleet: &[Harness]) -> usize {
    fleet.iter().map(|h| h.calls(CHAT)).sum()
}

// ---------------------------------------------------------------------------------------------

/// The windows counted by SQL from the shared decisions equal the in-memory windows, request by
/// request, for one long sequence (identical requests, steps, models, gaps across every window).
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn sql_windows_equal_the_in_memory_windows() {
    let url = pg_url();
    windows_agree(&url, Default::default(), 1);
}

/// The same with `[gate.windows]` shortened 30 times, as the economics recording runs: the
/// fleet's SQL counts in the configured lengths, as the in-memory windows do.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn sql_windows_take_the_configured_lengths() {
    let url = pg_url();
    let compressed = tokensaver::gate::WindowLengths {
        loop_secs: 4,
        burst_secs: 2,
        grind_secs: 120,
        cache_secs: 10,
        route_secs: 2,
    };
    windows_agree(&url, compressed, 30);
}

/// Compare the fleet's SQL windows with in-memory windows of `lengths` over one sequence whose
/// gaps are the SPEC's divided by `compression`.
fn windows_agree(url: &str, lengths: tokensaver::gate::WindowLengths, compression: u64) {
    let rt = runtime();
    rt.block_on(async {
        let fleet = Fleet::connect(
            &FleetConfig {
                url: url.to_string(),
                max_connections: 2,
            },
            tokensaver::store::postgres::FleetLimits {
                reservation_ttl_ms: 600_000,
                hold_ttl_ms: 900_000,
                answer_store_bytes: 1 << 20,
                windows: lengths,
                steps: Default::default(),
            },
        )
        .await
        .unwrap();
        let key = format!("win{compression}x{}", run_tag());
        let mut windows = Windows::configured(&tokensaver::gate::GateConfig {
            windows: lengths,
            ..Default::default()
        });
        let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut now: u64 = 1_800_000_000_000;
        let mut compared = 0;
        // 700 mixed requests (gaps across every window); then 80 identical ones 100 ms apart
        // (past the identical lists' cap of 64); then 1 100 distinct ones 10 ms apart (past
        // the key list's cap of 1 024 within one minute).
        const TOTAL: usize = 700 + 80 + 1_100;
        for i in 0..TOTAL {
            let (fp, step, model);
            if i < 700 {
                now += match next(20) {
                    0 => 70_000,
                    1 => 130_000,
                    2 => 3_700_000,
                    3 => 0,
                    _ => next(3_000),
                } / compression;
                fp = Hash([next(6) as u8; 32]);
                step = Hash([100 + next(4) as u8; 32]);
                model = ["gpt-4o", "gpt-4o-mini", "claude-sonnet-4-5"][next(3) as usize];
            } else if i < 780 {
                now += 100;
                (fp, step, model) = (Hash([7; 32]), Hash([107; 32]), "gpt-4o");
            } else {
                now += 10;
                let mut distinct = [0u8; 32];
                distinct[..8].copy_from_slice(&(i as u64).to_le_bytes());
                distinct[31] = 1;
                (fp, step, model) = (Hash(distinct), Hash(distinct), "gpt-4o");
            }
            // The fleet does not pace: it reads no step pacing columns.
            let memory = windows.observe_step(&key, &fp, &step, model, now).unpaced();
            let sql = fleet.observe(&key, &fp, &step, model, now).await.unwrap();
            assert_eq!(memory, sql, "request {i} at {now}");
            compared += 1;
            windows.record_step(&key, &fp, &step, model, now);
            fleet
                .record_attempt(&DecisionRow {
                    decision_id: decision_id(format!("{key}-{i}").as_bytes()),
                    key_id: key.clone(),
                    fingerprint: Some(fp),
                    verdict: Verdict::Allow,
                    reason: "score_allow".into(),
                    score: 0.0,
                    model_requested: model.into(),
                    model_served: Some(model.into()),
                    wire: WireForm::Json,
                    decided_at_ms: now,
                    reserved_nano: 0,
                    worst_case_tokens: None,
                    tokens_not_bought: 0,
                    worst_case_tokens_avoided: 0,
                    findings_tokens: 0,
                    hold_id: None,
                    step_fingerprint: Some(step),
                    recorded_by: Default::default(),
                    session: None,
                    paced_ms: 0,
                    cache_edits: Default::default(),
                })
                .await
                .unwrap();
        }
        assert_eq!(compared, TOTAL);
        // The caps were reached (so the comparison covered them); a burst window shortened
        // to 2 s holds 200 of the 10 ms-apart requests instead.
        let last = windows.observe(&key, &Hash([9; 32]), "gpt-4o", now);
        let burst = (lengths.burst_secs * 1_000 / 10).min(1_024);
        assert_eq!(last.earlier_key_minute, burst);
        // The sweep every instance runs each second (reservations, holds, answers) is valid SQL.
        fleet.expire().await.unwrap();
    });
}

/// The issue's budget race: a ceiling of exactly ten worst cases, 200 concurrent requests
/// released together round-robin across three instances, the provider holding each call:
/// exactly ten reach the provider, the ledger has exactly ten forwarded decisions, and
/// `spent + reserved <= ceiling` at every sample. Twenty repetitions, a fresh key each.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn budget_race_across_three_instances_admits_exactly_the_ceiling() {
    let url = pg_url();
    const REPS: usize = 20;
    const REQUESTS: usize = 200;
    let tag = run_tag();
    let keys: Vec<FleetKey> = (0..REPS)
        .map(|r| FleetKey::new(format!("race{tag}r{r:02}")))
        .collect();
    let body = |i: usize| {
        chat(
            "gpt-fault-slow",
            &format!("race request {i:04}"),
            json!({"max_tokens": 50}),
        )
    };
    // The worst case of every request (same size), from the gate's own rule.
    let shape = tokensaver::request::parse(
        Route::OpenAiChat,
        body(0).to_string().as_bytes(),
        &tokensaver::auth::fingerprint_key(&keys[0].secret),
    )
    .unwrap()
    .shape;
    let worst_nano = tokensaver::gate::worst_case(&shape, Some(&test_prices()))
        .cost_nano
        .unwrap();
    assert_eq!(
        worst_nano % 100,
        0,
        "ten worst cases must be whole micro-USD"
    );
    let ceiling_nano = 10 * worst_nano;
    let keys_toml: String = keys
        .iter()
        .map(|k| k.toml(Some(ceiling_nano / 1000)))
        .collect();
    // The provider holds each call long enough that all 200 are decided before any settles
    // (checked below): otherwise a settle frees budget and an eleventh admission is right.
    let fleet = three(&url, &keys_toml, 6_000);
    let rt = runtime();
    let db = rt.block_on(pg(&url));

    for (rep, key) in keys.iter().enumerate() {
        let before = provider_calls(&fleet);
        let sampler = Sampler::start(&url, &key.id);
        let barrier = Arc::new(Barrier::new(REQUESTS));
        let bearer = key.bearer();
        let proxies: Vec<String> = fleet.iter().map(|h| h.proxy_url(CHAT)).collect();
        let threads: Vec<_> = (0..REQUESTS)
            .map(|i| {
                let (barrier, bearer) = (barrier.clone(), bearer.clone());
                let url = proxies[i % 3].clone();
                let body = body(i).to_string();
                std::thread::spawn(move || {
                    barrier.wait();
                    let r = client::post(&url)
                        .timeout(Duration::from_secs(30))
                        .set("authorization", &format!("Bearer {bearer}"))
                        .set("content-type", "application/json")
                        .send(body.as_bytes());
                    (r.status, r.verdict().map(str::to_string))
                })
            })
            .collect();
        let results: Vec<(u16, Option<String>)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        // Every forwarded call has answered; let the settles land.
        std::thread::sleep(Duration::from_millis(300));
        let (worst_seen, samples) = sampler.finish();

        let passed = results.iter().filter(|(s, _)| *s == 200).count();
        let forwarded_verdicts = results
            .iter()
            .filter(|(_, v)| matches!(v.as_deref(), Some("ALLOW") | Some("DOWNGRADE")))
            .count();
        let reached = provider_calls(&fleet) - before;
        let mut statuses = std::collections::BTreeMap::new();
        for (s, v) in &results {
            *statuses.entry((*s, v.clone())).or_insert(0) += 1;
        }
        let (ledger_forwarded, ledger_all, first_settle_after_last_decision): (
            i64,
            i64,
            Option<bool>,
        ) =
            rt.block_on(async {
                // Refusals are answered before their rows' group commit: on a loaded machine
                // the last rows land after the 300 ms above, so wait for them (bounded).
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                loop {
                    let row = db
                        .query_one(
                            "SELECT count(*) FILTER (WHERE verdict IN ('ALLOW', 'DOWNGRADE')), count(*), \
                                    COALESCE((SELECT min(at_ms) FROM fleet_usage WHERE key_id = $1), 0) \
                                      > max(decided_at_ms) \
                             FROM fleet_decisions WHERE key_id = $1",
                            &[&key.id],
                        )
                        .await
                        .unwrap();
                    let all: i64 = row.get(1);
                    if all >= REQUESTS as i64 || std::time::Instant::now() > deadline {
                        break (row.get(0), all, row.get(2));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        assert_eq!(
            first_settle_after_last_decision,
            Some(true),
            "rep {rep}: a settle landed before the last decision (raise slow_ms), or no \
             decision at all: {statuses:?}\n{}",
            fleet[0].log()
        );
        assert_eq!(reached, 10, "rep {rep}: calls that reached the provider");
        assert_eq!(passed, 10, "rep {rep}: 200 answers");
        assert_eq!(forwarded_verdicts, 10, "rep {rep}: forwarded verdicts");
        assert_eq!(
            ledger_forwarded, 10,
            "rep {rep}: forwarded decisions in the ledger"
        );
        assert_eq!(
            ledger_all, REQUESTS as i64,
            "rep {rep}: every decision in the ledger: {statuses:?}"
        );
        assert!(samples > 10, "rep {rep}: sampled");
        assert!(
            worst_seen <= ceiling_nano,
            "rep {rep}: spent + reserved {worst_seen} over the ceiling {ceiling_nano}"
        );
    }
}

/// `(status, verdict, reason)` of one answer.
fn outcome(r: &Resp) -> (u16, String, String) {
    let reason = r
        .receipt_reason()
        .unwrap_or_else(|| format!("status {}", r.status));
    (r.status, r.verdict().unwrap_or("-").to_string(), reason)
}

trait ReceiptReason {
    fn receipt_reason(&self) -> Option<String>;
}

impl ReceiptReason for Resp {
    /// The reason the signed receipt names (rule, band, or what earned the verdict).
    fn receipt_reason(&self) -> Option<String> {
        self.header("x-tokensaver-receipt")?;
        self.receipt()["reason"].as_str().map(str::to_string)
    }
}

/// Send `bodies` in order, request `i` to `targets[i % targets.len()]`.
fn send_sequence(
    targets: &[&Harness],
    bearer: &str,
    bodies: &[serde_json::Value],
) -> Vec<(u16, String, String)> {
    bodies
        .iter()
        .enumerate()
        .map(|(i, b)| outcome(&targets[i % targets.len()].post(CHAT, bearer, b, &[])))
        .collect()
}

fn first_block(seq: &[(u16, String, String)]) -> Option<(usize, String)> {
    seq.iter()
        .position(|(_, v, _)| v == "BLOCK")
        .map(|i| (i, seq[i].2.clone()))
}

/// A runaway spread across instances is stopped exactly where one instance stops it: one
/// body sent 20 times round-robin, and 130 distinct requests within a minute round-robin,
/// each compared with the same sequence through a single SQLite-backed instance.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn runaway_rules_fire_across_instances_where_a_single_node_fires_them() {
    let url = pg_url();
    let tag = run_tag();
    let loop_key = FleetKey::new(format!("loop{tag}"));
    let burst_key = FleetKey::new(format!("burst{tag}"));
    let keys_toml = format!("{}{}", loop_key.toml(None), burst_key.toml(None));
    let single = Harness::start(Opts {
        extra_config: keys_toml.clone(),
        ..Opts::default()
    });
    let fleet = three(&url, &keys_toml, 3_000);
    let fleet_targets: Vec<&Harness> = fleet.iter().collect();

    // One body, 20 times: the loop rule.
    let same: Vec<_> = (0..20)
        .map(|_| chat("gpt-4o", "the same step again", json!({"max_tokens": 20})))
        .collect();
    let single_loop = send_sequence(&[&single], &loop_key.bearer(), &same);
    let fleet_loop = send_sequence(&fleet_targets, &loop_key.bearer(), &same);
    let expected = first_block(&single_loop).expect("the single node blocks the loop");
    assert_eq!(
        first_block(&fleet_loop),
        Some(expected.clone()),
        "single {single_loop:?}\nfleet {fleet_loop:?}"
    );
    // Whether each attempt was blocked, attempt by attempt.
    let blocked = |s: &[(u16, String, String)]| -> Vec<bool> {
        s.iter().map(|(_, v, _)| v == "BLOCK").collect()
    };
    assert_eq!(blocked(&single_loop), blocked(&fleet_loop));
    // `/estimate` on any instance sees the fleet's windows, as the single node sees its own.
    let estimate = |h: &Harness| {
        let r = call(
            client::post(&h.api_url("/estimate"))
                .set("authorization", &format!("Bearer {}", loop_key.bearer())),
            Some(same[0].to_string().as_bytes()),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let d = r.json()["decision"].clone();
        (d["verdict"].clone(), d["rule"].clone())
    };
    let single_estimate = estimate(&single);
    assert_eq!(single_estimate.0, "BLOCK");
    assert_eq!(estimate(&fleet[1]), single_estimate);

    // 130 distinct requests within a minute: the burst rule.
    let distinct: Vec<_> = (0..130)
        .map(|i| {
            chat(
                "gpt-4o",
                &format!("distinct task {i:04}"),
                json!({"max_tokens": 20}),
            )
        })
        .collect();
    let started = std::time::Instant::now();
    let single_burst = send_sequence(&[&single], &burst_key.bearer(), &distinct);
    let fleet_burst = send_sequence(&fleet_targets, &burst_key.bearer(), &distinct);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "both runs within a minute"
    );
    let burst = single_burst
        .iter()
        .position(|(_, _, r)| r == "runaway_burst")
        .expect("the single node fires runaway_burst");
    assert_eq!(
        fleet_burst
            .iter()
            .position(|(_, _, r)| r == "runaway_burst"),
        Some(burst),
        "single {single_burst:?}\nfleet {fleet_burst:?}"
    );
    // Every decision of the sequence is the same, not only the first block.
    assert_eq!(single_burst, fleet_burst);
    // Any instance's ledger is the fleet's: all 130 decisions, whichever instance made them,
    // with the same verdict counts as the single node's.
    let fleet_ledger = fleet[1].ledger(&burst_key.bearer());
    let single_ledger = single.ledger(&burst_key.bearer());
    assert_eq!(fleet_ledger["total"]["requests"], 130);
    assert_eq!(
        fleet_ledger["total"]["by_verdict"],
        single_ledger["total"]["by_verdict"]
    );
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_tokensaver"))
        .args(["ledger", "--config"])
        .arg(fleet[2].config_path())
        .args(["--key", &burst_key.id])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let printed = String::from_utf8_lossy(&cli.stdout);
    assert!(printed.contains("130"), "{printed}");
    eprintln!(
        "loop blocked at attempt {} ({}); runaway_burst at request {}",
        expected.0 + 1,
        expected.1,
        burst + 1
    );
}

/// Issue "fair over hours": a stuck agent whose calls are spread over three instances is paced
/// and stopped exactly as one instance paces and stops it — the same verdicts, the same calls
/// held, the same calls bought, to the request — from the runs the fleet keeps in PostgreSQL.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn a_repeated_step_is_paced_across_three_instances_as_on_one() {
    let url = pg_url();
    let key = FleetKey::new(format!("pace{}", run_tag()));
    // Scaled down: 3 steps per 2 s, then gaps of 1, 2 and 4 s, a run stopped once 10 s old.
    let keys_toml = format!(
        "{}\n[gate.steps]\npace_window_secs = 2\nmax_hold_secs = 4\nrunaway_after_secs = 10\n",
        key.toml(None)
    );
    let single = Harness::start(Opts {
        extra_config: keys_toml.clone(),
        ..Opts::default()
    });
    let fleet = three(&url, &keys_toml, 3_000);
    let run = |targets: &[&Harness]| {
        let mut seen = Vec::new();
        for i in 1..=12 {
            let r = targets[i % targets.len()].post(
                CHAT,
                &key.bearer(),
                &polling("Wait for job 7 (fleet).", i, 20),
                &[],
            );
            let paced = r
                .header("x-tokensaver-receipt")
                .and_then(|_| r.receipt()["paced_ms"].as_u64())
                .unwrap_or(0);
            let (status, verdict, reason) = outcome(&r);
            seen.push((status, verdict, reason, paced > 0));
            if status == 429 {
                break;
            }
        }
        seen
    };
    let one = run(&[&single]);
    let three_of = run(&fleet.iter().collect::<Vec<_>>());
    assert_eq!(three_of, one);
    let last = one.last().unwrap();
    assert_eq!((last.0, last.2.as_str()), (429, "runaway_step"), "{one:?}");
    assert!(one.iter().filter(|s| s.3).count() >= 3, "{one:?}");
    assert_eq!(provider_calls(&fleet), single.calls(CHAT));
    eprintln!("one node and three: {one:?}");
}

/// A provider call made on its own thread (the provider holds it): its status when it ends.
fn post_in_background(
    url: String,
    bearer: String,
    body: serde_json::Value,
) -> std::thread::JoinHandle<u16> {
    std::thread::spawn(move || {
        client::post(&url)
            .timeout(Duration::from_secs(30))
            .set("authorization", &format!("Bearer {bearer}"))
            .send(body.to_string().as_bytes())
            .status
    })
}

fn spool_lines(h: &Harness) -> usize {
    std::fs::read_to_string(h.dir.path().join("data").join("fleet-usage-spool.jsonl"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn pg_server(cmd: &str) {
    let dir = std::env::var("TOKENSAVER_TEST_PG_DIR").unwrap();
    let port = std::env::var("TOKENSAVER_TEST_PG_PORT").unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-test-server.sh");
    let status = std::process::Command::new(script)
        .args([cmd, &dir, &port])
        .status()
        .unwrap();
    assert!(status.success(), "pg-test-server.sh {cmd}");
}

/// (forwarded decisions, usage rows settled by usage, usage rows charged on expiry, open
/// reservations, decisions) of a key.
fn ledger_counts(url: &str, key_id: &str) -> (i64, i64, i64, i64, i64) {
    runtime().block_on(async {
        let db = pg(url).await;
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM fleet_decisions WHERE key_id = $1 \
                           AND verdict IN ('ALLOW', 'DOWNGRADE')), \
                        (SELECT count(*) FROM fleet_usage WHERE key_id = $1 AND kind = 'usage'), \
                        (SELECT count(*) FROM fleet_usage WHERE key_id = $1 AND kind = 'expired'), \
                        (SELECT count(*) FROM fleet_reservations WHERE key_id = $1), \
                        (SELECT count(*) FROM fleet_decisions WHERE key_id = $1)",
                &[&key_id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
    })
}

/// PostgreSQL stopped for 5 s under load: every gated request answers 503 (closed-form, with
/// `Retry-After`) and the provider sees no call; the calls in flight when it stopped complete,
/// their usage is spooled, and once the database is back it is in the ledger exactly once.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn postgres_outage_fails_closed_and_spooled_usage_lands_once() {
    let url = pg_url();
    if std::env::var("TOKENSAVER_TEST_PG_DIR").is_err() {
        eprintln!("TOKENSAVER_TEST_PG_DIR is not set: outage test skipped");
        return;
    }
    let key = FleetKey::new(format!("outage{}", run_tag()));
    let fleet = three(&url, &key.toml(None), 1_500);
    let bearer = key.bearer();
    // Each instance has connected.
    for (i, h) in fleet.iter().enumerate() {
        let r = h.post(
            CHAT,
            &bearer,
            &chat("gpt-4o", &format!("warm {i}"), json!({"max_tokens": 20})),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Six calls the provider holds for 1.5 s, two per instance.
    let in_flight: Vec<_> = (0..6)
        .map(|i| {
            let url = fleet[i % 3].proxy_url(CHAT);
            let (bearer, body) = (
                bearer.clone(),
                chat(
                    "gpt-fault-slow",
                    &format!("in flight {i}"),
                    json!({"max_tokens": 20}),
                ),
            );
            post_in_background(url, bearer, body)
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while provider_calls(&fleet) < 9 {
        assert!(
            std::time::Instant::now() < deadline,
            "the six calls reached the provider"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    pg_server("pause");
    let calls_before = provider_calls(&fleet);
    let stopped = std::time::Instant::now();
    let mut refused = 0;
    let mut i = 0;
    while stopped.elapsed() < Duration::from_secs(5) {
        let r = fleet[i % 3].post(
            CHAT,
            &bearer,
            &chat(
                "gpt-4o",
                &format!("during the outage {i}"),
                json!({"max_tokens": 20}),
            ),
            &[],
        );
        assert_eq!(r.status, 503, "request {i}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("2"));
        assert_eq!(r.json()["error"]["code"], "fleet_store_unavailable");
        refused += 1;
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        provider_calls(&fleet),
        calls_before,
        "no call went upstream"
    );
    let finished: Vec<u16> = in_flight.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(finished, vec![200; 6], "the calls in flight were answered");
    let spooled: usize = fleet.iter().map(spool_lines).sum();
    assert_eq!(spooled, 6, "their usage waits in the spools");
    pg_server("resume");

    // The sweep replays each spool within a second or two of the database answering again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (forwarded, usage, expired, open, _) = ledger_counts(&url, &key.id);
        if usage == 9 && open == 0 {
            assert_eq!((forwarded, expired), (9, 0));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "spooled usage not replayed: {:?}",
            ledger_counts(&url, &key.id)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let spooled: usize = fleet.iter().map(spool_lines).sum();
    assert_eq!(spooled, 0, "the spools are empty");
    // Serving again, and the replay does not run twice.
    let r = fleet[0].post(
        CHAT,
        &bearer,
        &chat("gpt-4o", "after the outage", json!({"max_tokens": 20})),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    std::thread::sleep(Duration::from_millis(1500));
    let (forwarded, usage, expired, open, _) = ledger_counts(&url, &key.id);
    assert_eq!((forwarded, usage, expired, open), (10, 10, 0, 0));
    eprintln!(
        "outage: {refused} requests refused with 503 in 5 s, 6 spooled reports replayed once"
    );
}

/// An instance SIGKILLed while holding reservations: the others keep serving, its
/// reservations expire (the database's clock) and are charged their worst case, the ceiling is
/// never exceeded, and its restart adds no ledger row.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn a_killed_instance_reservations_expire_and_are_charged_once() {
    let url = pg_url();
    let key = FleetKey::new(format!("kill{}", run_tag()));
    let body = |i: usize| {
        chat(
            "gpt-fault-slow",
            &format!("kill request {i:04}"),
            json!({"max_tokens": 50}),
        )
    };
    let shape = tokensaver::request::parse(
        Route::OpenAiChat,
        body(0).to_string().as_bytes(),
        &tokensaver::auth::fingerprint_key(&key.secret),
    )
    .unwrap()
    .shape;
    let worst_nano = tokensaver::gate::worst_case(&shape, Some(&test_prices()))
        .cost_nano
        .unwrap();
    let ceiling_nano = 10 * worst_nano;
    let mut fleet = three_with_limits(
        &url,
        "reservation_ttl_secs = 3\n",
        &key.toml(Some(ceiling_nano / 1000)),
        5_000,
    );
    let bearer = key.bearer();
    let sampler = Sampler::start(&url, &key.id);

    // Four calls held by the provider through instance 3.
    let doomed: Vec<_> = (0..4)
        .map(|i| {
            let (url, bearer, body) = (fleet[2].proxy_url(CHAT), bearer.clone(), body(i));
            post_in_background(url, bearer, body)
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fleet[2].calls(CHAT) < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the four calls reached the provider"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    fleet[2].signal("KILL");
    assert!(fleet[2].wait_exit(Duration::from_secs(5)).is_some());
    for t in doomed {
        assert_ne!(
            t.join().unwrap(),
            200,
            "the killed instance answered nothing"
        );
    }
    assert_eq!(
        ledger_counts(&url, &key.id).3,
        4,
        "its four reservations are open"
    );

    // The others keep serving: fast calls, settled at once.
    for i in 0..6 {
        let r = fleet[i % 2].post(
            CHAT,
            &bearer,
            &chat(
                "gpt-4o",
                &format!("survivor {i:04}"),
                json!({"max_tokens": 50}),
            ),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The TTL (3 s) passes; the survivors' sweep charges the four at their worst case.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (_, _, expired, open, _) = ledger_counts(&url, &key.id);
        if expired == 4 && open == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not expired: {:?}",
            ledger_counts(&url, &key.id)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let charged: i64 = runtime().block_on(async {
        pg(&url)
            .await
            .query_one(
                "SELECT COALESCE(sum(spend_nano), 0)::bigint FROM fleet_usage \
                 WHERE key_id = $1 AND kind = 'expired'",
                &[&key.id],
            )
            .await
            .unwrap()
            .get(0)
    });
    assert_eq!(
        charged as u64,
        4 * worst_nano,
        "each charged its worst case"
    );

    // It restarts on the same data dir: nothing is added or doubled.
    let before = ledger_counts(&url, &key.id);
    fleet[2].restart();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        ledger_counts(&url, &key.id),
        before,
        "the restart wrote nothing"
    );
    let r = fleet[2].post(
        CHAT,
        &bearer,
        &chat("gpt-4o", "after the restart", json!({"max_tokens": 50})),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    std::thread::sleep(Duration::from_millis(300));
    let (forwarded, usage, expired, open, decisions) = ledger_counts(&url, &key.id);
    assert_eq!(
        (forwarded, usage, expired, open, decisions),
        (11, 7, 4, 0, 11)
    );
    // Any instance lists the fleet's decisions with their settlements.
    let listed = call(
        client::get(&fleet[0].api_url("/ledger/decisions"))
            .set("authorization", &format!("Bearer {bearer}")),
        None,
    );
    assert_eq!(listed.status, 200, "{}", listed.text());
    let statuses: Vec<String> = listed.json()["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["status"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(statuses.len(), 11);
    assert_eq!(statuses.iter().filter(|s| *s == "expired").count(), 4);
    assert_eq!(statuses.iter().filter(|s| *s == "complete").count(), 7);
    let (max, samples) = sampler.finish();
    assert!(samples > 10);
    assert!(
        max <= ceiling_nano,
        "spent + reserved {max} over the ceiling {ceiling_nano}"
    );
}

/// An agent's long session that scores into the CHALLENGE band unattended (tests/holds_release).
fn agent_body(tag: &str) -> serde_json::Value {
    let mut messages =
        vec![json!({"role": "system", "content": format!("You are a coding agent {tag}.")})];
    for i in 0..40 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": format!("step {i}: {}", "x".repeat(700))}));
    }
    let tools: Vec<serde_json::Value> = (0..24)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
                "description": "does a thing", "parameters": {"type": "object", "properties": {}}}})
        })
        .collect();
    json!({"model": "gpt-4o", "messages": messages, "tools": tools})
}

/// A hold raised through instance 1 is re-sent through 2 (the same CHALLENGE), approved
/// through 2 and 3 at once (one approval wins), and the retry through 3 passes once; an answer
/// stored through instance 1 is served by instance 2 without a provider call.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn holds_and_answers_are_shared_by_the_fleet() {
    let url = pg_url();
    let key = FleetKey::new(format!("hold{}", run_tag()));
    let fleet = three(&url, &key.toml(None), 3_000);
    let bearer = key.bearer();
    let body = agent_body("fleet");

    let first = fleet[0].post(CHAT, &bearer, &body, &[]);
    assert_eq!(first.status, 409, "{}", first.text());
    assert_eq!(first.verdict(), Some("CHALLENGE"));
    let hold = first.header("x-tokensaver-hold").unwrap().to_string();
    // A re-send through another instance gets the same CHALLENGE: the same receipt body
    // (signed by the instance that answers: each data dir has its own key unless shared).
    let again = fleet[1].post(CHAT, &bearer, &body, &[]);
    assert_eq!(again.status, 409);
    assert_eq!(again.header("x-tokensaver-hold"), Some(hold.as_str()));
    assert_eq!(again.receipt(), first.receipt());
    // The hold is listed by a third instance.
    let listed = call(
        client::get(&fleet[2].admin_url("/holds"))
            .set("authorization", &format!("Bearer {ADMIN_KEY}")),
        None,
    );
    assert_eq!(listed.status, 200, "{}", listed.text());
    let holds = listed.json()["holds"].as_array().unwrap().clone();
    assert!(holds
        .iter()
        .any(|h| h["hold_id"] == hold.as_str() && h["state"] == "pending"));

    // Two approvals at once, through two instances: exactly one wins.
    let approvals: Vec<_> = [fleet[1].admin_url(""), fleet[2].admin_url("")]
        .into_iter()
        .map(|base| {
            let hold = hold.clone();
            std::thread::spawn(move || {
                call(
                    client::post(&format!("{base}/holds/{hold}/approve"))
                        .set("authorization", &format!("Bearer {ADMIN_KEY}")),
                    Some(b""),
                )
                .status
            })
        })
        .collect();
    let mut statuses: Vec<u16> = approvals.into_iter().map(|t| t.join().unwrap()).collect();
    statuses.sort();
    assert_eq!(
        statuses,
        vec![200, 409],
        "one approval wins, the other finds it decided"
    );

    let calls_before = provider_calls(&fleet);
    let released = fleet[2].post(CHAT, &bearer, &body, &[]);
    assert_eq!(released.status, 200, "{}", released.text());
    assert_eq!(released.receipt()["approved_hold"], hold.as_str());
    assert_eq!(provider_calls(&fleet), calls_before + 1);
    // Once: the next identical request is decided afresh (held again, a new hold).
    let after = fleet[0].post(CHAT, &bearer, &body, &[]);
    assert_eq!(after.status, 409, "{}", after.text());
    assert_ne!(after.header("x-tokensaver-hold"), Some(hold.as_str()));
    assert_eq!(provider_calls(&fleet), calls_before + 1);

    // An answer stored through instance 1 is served by instance 2.
    let reusable = chat(
        "gpt-4o",
        "what is the capital of France?",
        json!({"temperature": 0, "max_tokens": 30}),
    );
    let bought = fleet[0].post(CHAT, &bearer, &reusable, &[]);
    assert_eq!(bought.status, 200, "{}", bought.text());
    assert!(matches!(bought.verdict(), Some("ALLOW" | "DOWNGRADE")));
    settle();
    let calls = provider_calls(&fleet);
    let served = fleet[1].post(CHAT, &bearer, &reusable, &[]);
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(served.verdict(), Some("SERVE"));
    assert_eq!(served.body, bought.body, "the same answer");
    assert_eq!(
        provider_calls(&fleet),
        calls,
        "served without a provider call"
    );
    assert!(served.receipt()["tokens_not_bought"].as_u64().unwrap() > 0);
}

/// `POST /forget` through one instance forgets for the whole fleet: an answer stored through
/// instance 1 and served by instance 2 is no longer served once instance 3 forgot the key (it
/// is bought again), and the ledger's totals stay.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn a_forget_through_one_instance_forgets_for_the_fleet() {
    let url = pg_url();
    let key = FleetKey::new(format!("forget{}", run_tag()));
    let fleet = three(&url, &key.toml(None), 3_000);
    let bearer = key.bearer();
    let reusable = chat(
        "gpt-4o",
        "what is the capital of Peru?",
        json!({"temperature": 0, "max_tokens": 30}),
    );
    let bought = fleet[0].post(CHAT, &bearer, &reusable, &[]);
    assert_eq!(bought.status, 200, "{}", bought.text());
    settle();
    let served = fleet[1].post(CHAT, &bearer, &reusable, &[]);
    assert_eq!(served.verdict(), Some("SERVE"), "{}", served.text());
    let ledger = |h: &Harness| {
        let r = call(
            client::get(&h.api_url("/ledger")).set("authorization", &format!("Bearer {bearer}")),
            None,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["total"].clone()
    };
    let before = ledger(&fleet[0]);

    let forgot = call(
        client::post(&fleet[2].api_url("/forget"))
            .set("authorization", &format!("Bearer {bearer}")),
        Some(b""),
    );
    assert_eq!(forgot.status, 200, "{}", forgot.text());
    assert_eq!(forgot.json()["forgotten"], true);

    let calls = provider_calls(&fleet);
    let again = fleet[1].post(CHAT, &bearer, &reusable, &[]);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_ne!(
        again.verdict(),
        Some("SERVE"),
        "the stored answer is forgotten"
    );
    assert_eq!(provider_calls(&fleet), calls + 1, "bought again");
    settle();
    let after = ledger(&fleet[1]);
    assert_eq!(
        after["tokens_not_bought"], before["tokens_not_bought"],
        "the totals stay"
    );
}

/// A budget set through one instance (`PUT /budget`) binds every instance's admissions at once.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn a_budget_set_through_one_instance_binds_the_fleet() {
    let url = pg_url();
    let key = FleetKey::new(format!("budget{}", run_tag()));
    let fleet = three(&url, &key.toml(None), 3_000);
    let bearer = key.bearer();
    let ask = |h: &Harness, i: usize| {
        h.post(
            CHAT,
            &bearer,
            &chat(
                "gpt-4o",
                &format!("budget request {i}"),
                json!({"max_tokens": 20}),
            ),
            &[],
        )
    };
    assert_eq!(ask(&fleet[0], 0).status, 200, "no ceiling yet");
    let set = call(
        client::put(&fleet[2].admin_url(&format!("/budget/{}", key.id)))
            .set("authorization", &format!("Bearer {ADMIN_KEY}")),
        Some(br#"{"ceiling_micro_usd": 1, "period": "day"}"#),
    );
    assert_eq!(set.status, 200, "{}", set.text());
    let refused = ask(&fleet[1], 1);
    assert_eq!(refused.status, 402, "{}", refused.text());
    assert_eq!(refused.verdict(), Some("BLOCK"));
    let view = call(
        client::get(&fleet[0].api_url("/budget")).set("authorization", &format!("Bearer {bearer}")),
        None,
    );
    assert_eq!(view.json()["ceiling_nano"], 1_000, "{}", view.text());
    assert_eq!(view.json()["period"], "day");
}

/// Digest mode against the fleet, unchanged: `/gate` answered by one instance, `/record` by
/// another (booked once), a second `/record` by a third refused as already recorded, and the
/// spend in every instance's `/budget`.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn digest_mode_gates_and_records_on_any_instance() {
    let url = pg_url();
    let key = FleetKey::new(format!("digest{}", run_tag()));
    let fleet = three(&url, &key.toml(Some(1_000_000)), 3_000);
    let bearer = key.bearer();
    let body = chat("gpt-4o", "a digest-mode request", json!({"max_tokens": 40}));
    let shape = tokensaver::request::parse(
        Route::OpenAiChat,
        body.to_string().as_bytes(),
        &tokensaver::auth::fingerprint_key(&key.secret),
    )
    .unwrap()
    .shape;
    let digest = serde_json::to_vec(&tokensaver::request::Digest::new(shape)).unwrap();
    let gate = call(
        client::post(&fleet[0].api_url("/gate")).set("authorization", &format!("Bearer {bearer}")),
        Some(&digest),
    );
    assert_eq!(gate.status, 200, "{}", gate.text());
    let answer = gate.json();
    assert!(
        matches!(answer["verdict"].as_str(), Some("ALLOW" | "DOWNGRADE")),
        "{answer}"
    );
    let record = json!({
        "decision_id": answer["decision_id"],
        "wire": "json",
        "served_model": answer["model_served"],
        "complete": true,
        "usage": {"input": 12, "cache_write": 0, "cache_read": 0, "output": 30},
    })
    .to_string();
    let post_record = |h: &Harness| {
        call(
            client::post(&h.api_url("/record")).set("authorization", &format!("Bearer {bearer}")),
            Some(record.as_bytes()),
        )
    };
    let first = post_record(&fleet[1]);
    assert_eq!(first.status, 200, "{}", first.text());
    let spend = first.json()["spend_nano"].as_u64().unwrap();
    assert!(spend > 0);
    let second = post_record(&fleet[2]);
    assert_eq!(second.status, 409, "{}", second.text());
    assert_eq!(second.json()["error"]["code"], "already_recorded");
    for h in &fleet {
        let view = call(
            client::get(&h.api_url("/budget")).set("authorization", &format!("Bearer {bearer}")),
            None,
        );
        assert_eq!(view.json()["spend_nano"].as_u64(), Some(spend));
        assert_eq!(view.json()["reserved_nano"].as_u64(), Some(0));
    }
}

/// The conditional reservation is the last line: a decision that would reserve past the
/// ceiling (here a deliberately wrong one) is rolled back whole — no decision row, no
/// reservation — and the admission fails closed.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn the_conditional_reservation_refuses_an_overshoot_and_rolls_back() {
    let url = pg_url();
    use tokensaver::store::booking::{Booking, NewReservation};
    use tokensaver::store::postgres::{AdmitScope, FleetError, FleetLimits, KeyLimit};
    runtime().block_on(async {
        let fleet = Fleet::connect(
            &FleetConfig {
                url: url.clone(),
                max_connections: 2,
            },
            FleetLimits {
                reservation_ttl_ms: 600_000,
                hold_ttl_ms: 900_000,
                answer_store_bytes: 1 << 20,
                windows: Default::default(),
                steps: Default::default(),
            },
        )
        .await
        .unwrap();
        let key = format!("over{}", run_tag());
        let fp = Hash([3; 32]);
        let scope = AdmitScope {
            key_id: &key,
            fingerprint: &fp,
            step: &fp,
            action: None,
            model: "gpt-4o",
            limit: KeyLimit {
                ceiling_nano: Some(1_000),
                period: tokensaver::config::BudgetPeriod::Day,
            },
            wire: WireForm::Json,
            named_hold: None,
            cache_points: &[],
            session: &fp,
            route_prefix: Default::default(),
        };
        let booking = |id: &str, nano: u64| Booking {
            row: DecisionRow {
                decision_id: decision_id(id.as_bytes()),
                key_id: key.clone(),
                fingerprint: Some(fp),
                verdict: Verdict::Allow,
                reason: "allowed".into(),
                score: 0.0,
                model_requested: "gpt-4o".into(),
                model_served: Some("gpt-4o".into()),
                wire: WireForm::Json,
                decided_at_ms: 0,
                reserved_nano: nano,
                worst_case_tokens: None,
                tokens_not_bought: 0,
                worst_case_tokens_avoided: 0,
                findings_tokens: 0,
                hold_id: None,
                step_fingerprint: Some(fp),
                recorded_by: Default::default(),
                session: None,
                paced_ms: 0,
                cache_edits: Default::default(),
            },
            reservation: Some(NewReservation {
                nano,
                served_model: "gpt-4o".into(),
                wire: WireForm::Json,
                output_ceiling: None,
                fingerprint: fp,
                reusable: false,
                approved_past_budget: false,
                input_tokens: 0,
                recorded_by: Default::default(),
                cache_edits: Default::default(),
                session: fp,
            }),
            used_hold: None,
            new_hold: None,
            cache_breakpoints: Vec::new(),
            sent_prefixes: true,
        };
        // 600 fits under 1 000; another 600 does not, whatever the decision said.
        let first = fleet
            .admit(scope, |seen| (seen.budget, Some(booking(&format!("{key}-a"), 600))))
            .await
            .unwrap();
        assert_eq!(first.map(|b| b.reserved_nano), Some(0));
        let second = fleet
            .admit(scope, |seen| (seen.budget, Some(booking(&format!("{key}-b"), 600))))
            .await;
        assert_eq!(second.unwrap_err(), FleetError::Overshoot);
        let db = pg(&url).await;
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM fleet_decisions WHERE key_id = $1), \
                        (SELECT COALESCE(sum(nano), 0)::bigint FROM fleet_reservations WHERE key_id = $1)",
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (1, 600));
    });
}

/// Issue 20.7 and 20.4c in a fleet: a response id bound through one instance is bound for
/// every instance (PostgreSQL `fleet_responses`). Another key is refused it through any
/// instance without a provider call; its own key's read goes upstream through any instance;
/// a call chained through a third instance reserves the context the first instance's
/// provider reported.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn a_stored_response_is_bound_for_the_whole_fleet() {
    let url = pg_url();
    let tag = run_tag();
    let alice = FleetKey::new(format!("respa{tag}"));
    let bob = FleetKey::new(format!("respb{tag}"));
    let fleet = three(&url, &format!("{}{}", alice.toml(None), bob.toml(None)), 0);
    let responses = |text: &str, extra: serde_json::Value| {
        let mut body = json!({"model": "gpt-4o", "input": text, "max_output_tokens": 60});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    // The mock's response id is a function of the request: the run's tag keeps it this run's
    // (an id bound by an earlier run's key stays that key's).
    let long =
        format!("Run {tag}. ") + &"Every lamp along the harbour wall was lit by hand. ".repeat(120);
    let created = fleet[0].post(
        "/v1/responses",
        &alice.bearer(),
        &responses(&long, json!({})),
        &[HUMAN],
    );
    assert_eq!(created.status, 200, "{}", created.text());
    let id = created.json()["id"].as_str().unwrap().to_string();
    let path = format!("/v1/responses/{id}");
    let get = |h: &Harness, bearer: &str| {
        call(
            client::get(&h.proxy_url(&path)).set("authorization", &format!("Bearer {bearer}")),
            None,
        )
    };
    for h in &fleet {
        let r = get(h, &bob.bearer());
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "unknown_response");
        assert_eq!(h.mock.calls(&path), 0, "bob's read went upstream");
    }
    // Alice's read passes the gate on every instance (only the first one's mock keeps it).
    for (i, h) in fleet.iter().enumerate() {
        let r = get(h, &alice.bearer());
        assert_eq!(
            h.mock.calls(&path),
            1,
            "instance {i}: alice's read went upstream"
        );
        if i == 0 {
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    // The chained call through instance 2 reserves the context instance 0's provider reported.
    let usage = fleet[0].mock.stored_response(&id).unwrap()["usage"].clone();
    let context =
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap();
    let chained = fleet[2].post(
        "/v1/responses",
        &alice.bearer(),
        &responses("And then?", json!({"previous_response_id": id})),
        &[HUMAN],
    );
    assert_eq!(chained.status, 200, "{}", chained.text());
    let worst = chained.receipt()["worst_case"]["input_tokens_estimated"]
        .as_u64()
        .unwrap();
    assert!(worst >= context, "{worst} < {context}");
    let foreign = fleet[1].post(
        "/v1/responses",
        &bob.bearer(),
        &responses("And then?", json!({"previous_response_id": id})),
        &[HUMAN],
    );
    assert_eq!(foreign.status, 404, "{}", foreign.text());
    assert_eq!(fleet[1].calls("/v1/responses"), 0);
}

/// A stream relayed for longer than several reservation TTLs keeps its fleet reservation live
/// (renewed by the database's clock): it settles at its reported usage, never at an expiry.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn a_stream_outliving_its_ttl_settles_by_usage_in_the_fleet() {
    let url = pg_url();
    let key = FleetKey::new(format!("renew{}", run_tag()));
    let h = Harness::start(Opts {
        stream_delay_ms: 1_000,
        rust_log: "warn",
        extra_config: format!(
            "reservation_ttl_secs = 2\n{}{}",
            key.toml(None),
            store_toml(&url)
        ),
        ..Opts::default()
    });
    let started = std::time::Instant::now();
    let r = h.post(
        CHAT,
        &key.bearer(),
        &chat(
            "gpt-4o-mini",
            "Stream slowly past the TTL.",
            json!({"stream": true}),
        ),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("[DONE]"), "{}", r.text());
    assert!(
        started.elapsed() > Duration::from_secs(6),
        "three TTLs: {:?}",
        started.elapsed()
    );
    settle();
    // (forwarded, settled by usage, expired, open, decisions)
    assert_eq!(ledger_counts(&url, &key.id), (1, 1, 0, 0, 1));
}

/// A session that pauses, its calls spread over three instances: each call gets the lifetime it
/// gets on one instance (the pause memory is the fleet's, in PostgreSQL). Time is compressed
/// 300 times on both sides (the providers' five minutes last 1 s).
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn a_paused_session_gets_the_same_lifetimes_on_three_instances_as_on_one() {
    use support::cache_bodies::{session_call, SONNET_LISTED_PRICES};
    let url = pg_url();
    let key = FleetKey::new(format!("life{}", run_tag()));
    let config = format!(
        "{}\n[gate.windows]\ncache_secs = 1\n{SONNET_LISTED_PRICES}",
        key.toml(None)
    );
    let start = |store: &str| {
        Harness::start(Opts {
            time_scale: 300,
            rust_log: "warn",
            extra_config: format!("{config}{store}"),
            ..Opts::default()
        })
    };
    let single = start("");
    let fleet: Vec<Harness> = (0..3).map(|_| start(&store_toml(&url))).collect();
    let pauses = [2, 5];
    let run = |targets: &[&Harness], seed: &str| {
        let mut lifetimes = Vec::new();
        for turn in 0..8 {
            if pauses.contains(&turn) {
                std::thread::sleep(Duration::from_millis(1_400));
            }
            let r = targets[turn % targets.len()].post_raw(
                MESSAGES,
                None,
                session_call(seed, turn).as_bytes(),
                &[("x-api-key", &key.bearer()), ("x-tokensaver-session", seed)],
            );
            assert_eq!(r.status, 200, "turn {turn}: {}", r.text());
            lifetimes.push(r.receipt()["cache_lifetime"].as_str().map(str::to_string));
        }
        lifetimes
    };
    let one = run(&[&single], "one");
    let three_of = run(&fleet.iter().collect::<Vec<_>>(), "three");
    // Five-minute entries until the first pause, one-hour entries from it on.
    let expected: Vec<Option<String>> =
        (0..8).map(|t| (t >= 2).then(|| "1h".to_string())).collect();
    assert_eq!(one, expected);
    assert_eq!(three_of, one);
    // The ledger reads the session's cache health alike from SQLite and from PostgreSQL: the
    // rebuild at the first pause and the one-hour premium from it on (the fleet's read once
    // left them out).
    std::thread::sleep(Duration::from_millis(700));
    let total = |h: &Harness| {
        let r = call(
            client::get(&h.api_url("/ledger"))
                .set("authorization", &format!("Bearer {}", key.bearer())),
            None,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["total"].clone()
    };
    let (single_total, fleet_total) = (total(&single), total(&fleet[1]));
    let n = |v: &serde_json::Value, f: &str| v[f].as_u64().unwrap_or_default();
    assert_eq!(n(&single_total, "cache_rebuilds"), 1, "{single_total}");
    for field in ["cache_rebuilds", "requests"] {
        assert_eq!(
            n(&fleet_total, field),
            n(&single_total, field),
            "{field}: {fleet_total}"
        );
    }
    for field in ["cache_rebuild", "cache_premium_1h", "spend_nano"] {
        assert!(n(&fleet_total, field) > 0, "{field}: {fleet_total}");
    }
}

/// OpenAI routing keys: a lone session keeps the shared route at any rate, and past the rate
/// each session gets a route of its own — on three instances as on one (the rate and the
/// sessions on a prefix are counted in PostgreSQL).
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn routing_keys_are_placed_on_three_instances_as_on_one() {
    use support::cache_bodies::{long_text, GPT5_MINI};
    let url = pg_url();
    let key = FleetKey::new(format!("route{}", run_tag()));
    let start = |store: &str| {
        Harness::start(Opts {
            rust_log: "warn",
            extra_config: format!("{}{store}", key.toml(None)),
            ..Opts::default()
        })
    };
    let single = start("");
    let fleet: Vec<Harness> = (0..3).map(|_| start(&store_toml(&url))).collect();
    let system = serde_json::to_string(&long_text("agent")).unwrap();
    let run = |targets: &[&Harness]| {
        let mut n = 0;
        let mut call = |session: &str, turn: usize| {
            let body = format!(
                r#"{{"model":"{GPT5_MINI}","max_completion_tokens":50,"messages":[{{"role":"system","content":{system}}},{{"role":"user","content":"{session} step {turn}"}}]}}"#
            );
            let r = targets[n % targets.len()].post_raw(
                CHAT,
                None,
                body.as_bytes(),
                &[
                    ("authorization", &format!("Bearer {}", key.bearer())),
                    ("x-tokensaver-session", session),
                    ("x-tokensaver-human", "1"),
                ],
            );
            n += 1;
            assert_eq!(r.status, 200, "{}", r.text());
            r.receipt()["cache_routing_key"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let lone: Vec<String> = (0..20).map(|t| call("lone", t)).collect();
        let mut others = Vec::new();
        for turn in 0..3 {
            for s in ["a", "b", "c", "d"] {
                others.push(call(s, turn));
            }
        }
        (lone, others)
    };
    let (lone, others) = run(&[&single]);
    assert!(lone.iter().all(|k| *k == lone[0]), "{lone:?}");
    // Each of the four sessions its own key, kept across its calls, none the shared one.
    for s in 0..4 {
        let own: Vec<&String> = others.iter().skip(s).step_by(4).collect();
        assert!(own.iter().all(|k| *k == own[0]), "{others:?}");
        assert_ne!(*own[0], lone[0]);
    }
    let distinct: std::collections::BTreeSet<&String> = others.iter().collect();
    assert_eq!(distinct.len(), 4, "{others:?}");
    assert_eq!(run(&fleet.iter().collect::<Vec<_>>()), (lone, others));
}

/// `GET /stats` answers from the fleet's database on every instance (it read the instance's own
/// SQLite, which on a fleet holds nothing): what one instance decided, another counts.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn stats_on_any_instance_count_the_whole_fleet() {
    let url = pg_url();
    let key = FleetKey::new(format!("stats{}", run_tag()));
    let fleet = three(&url, &key.toml(None), 3_000);
    let bearer = key.bearer();
    let stats = || {
        let r = call(client::get(&fleet[2].api_url("/stats")), None);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["fleet"].clone()
    };
    let before = stats();
    for i in 0..3 {
        let r = fleet[0].post(
            CHAT,
            &bearer,
            &chat(
                "gpt-4o",
                &format!("stats request {i}"),
                json!({"max_tokens": 20}),
            ),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = stats();
    let n = |v: &serde_json::Value, f: &str| v[f].as_u64().unwrap();
    assert_eq!(n(&after, "requests") - n(&before, "requests"), 3, "{after}");
    let ledger = call(
        client::get(&fleet[1].api_url("/ledger")).set("authorization", &format!("Bearer {bearer}")),
        None,
    )
    .json();
    let spent = n(&ledger["total"], "spend_nano");
    assert!(spent > 0, "{ledger}");
    assert_eq!(
        n(&after, "spend_nano") - n(&before, "spend_nano"),
        spent,
        "{after}"
    );
}

/// The ledger page reads through the gate's home: on a fleet, an instance that made none of a
/// key's decisions lists them all (the key's view), and its admin page approves a hold the
/// fleet keeps, which another instance then releases once.
#[test]
#[ignore = "needs PostgreSQL: scripts/ci-fleet.sh starts one and runs these"]
fn the_page_on_any_instance_reads_the_fleet_and_decides_its_holds() {
    use support::page::{csrf_of, get, origin, post_form, sign_in};
    let url = pg_url();
    let key = FleetKey::new(format!("page{}", run_tag()));
    let fleet = three(&url, &key.toml(None), 3_000);
    let bearer = key.bearer();
    let body = agent_body("page");
    let held = fleet[1].post(CHAT, &bearer, &body, &[]);
    assert_eq!(held.status, 409, "{}", held.text());
    let hold = held.header("x-tokensaver-hold").unwrap().to_string();
    for i in 0..2 {
        let ask = chat(
            "gpt-4o",
            &format!("page request {i}"),
            json!({"max_tokens": 20}),
        );
        let r = fleet[0].post(CHAT, &bearer, &ask, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // The key's view on the third instance: the fleet's three decisions and the open hold.
    let api = origin(&fleet[2].api_url(""));
    let key_cookie = sign_in(&api, &bearer);
    let page = get(&format!("{api}/page/"), Some(&key_cookie));
    assert_eq!(page.status, 200);
    let page = page.text();
    let rows = |verdict: &str| {
        page.matches(&format!(r#"<tr class="decision" data-verdict="{verdict}""#))
            .count()
    };
    let forwarded = rows("ALLOW") + rows("DOWNGRADE");
    assert_eq!(
        (forwarded, rows("CHALLENGE")),
        (2, 1),
        "decisions listed: {page}"
    );
    // The plot and the ledger's figures count them too.
    assert!(
        page.contains(r#"data-verdict="CHALLENGE" data-reason="score_challenge" data-count="1""#)
    );
    assert!(page.contains(r#"data-figure="requests" data-value="3""#));
    assert!(page.contains(&hold), "the fleet's hold is listed");

    // The admin approves it from the third instance's page; the retry through the first
    // instance passes, once.
    let admin = origin(&fleet[2].admin_url(""));
    let admin_cookie = sign_in(&admin, ADMIN_KEY);
    let csrf = csrf_of(&get(&format!("{admin}/page/"), Some(&admin_cookie)).text());
    let approved = post_form(
        &format!("{admin}/page/holds/{hold}/approve"),
        Some(&admin_cookie),
        Some(&admin),
        &[("csrf", &csrf), ("attend_minutes", "")],
    );
    assert_eq!(
        approved.header("location"),
        Some("/page/?done=approved"),
        "{}",
        approved.text()
    );
    let retry = fleet[0].post(CHAT, &bearer, &body, &[]);
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(
        fleet[0].post(CHAT, &bearer, &body, &[]).status,
        409,
        "once only"
    );
}
