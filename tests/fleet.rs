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
use tokensaver::fleet::Fleet;
use tokensaver::gate::{Verdict, Windows};
use tokensaver::request::{Hash, Route, WireForm};
use tokensaver::store::DecisionRow;

fn pg_url() -> Option<String> {
    let url = std::env::var("TOKENSAVER_TEST_PG_URL").ok();
    if url.is_none() {
        eprintln!("TOKENSAVER_TEST_PG_URL is not set: fleet test skipped");
    }
    url
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
    (0..3)
        .map(|_| {
            Harness::start(Opts {
                slow_ms,
                rust_log: "warn",
                extra_config: format!("{keys_toml}{}", store_toml(url)),
                ..Opts::default()
            })
        })
        .collect()
}

fn provider_calls(fleet: &[Harness]) -> usize {
    fleet.iter().map(|h| h.calls(CHAT)).sum()
}

// ---------------------------------------------------------------------------------------------

/// The windows counted by SQL from the shared decisions equal the in-memory windows, request by
/// request, for one long sequence (identical requests, steps, models, gaps across every window).
#[test]
fn sql_windows_equal_the_in_memory_windows() {
    let Some(url) = pg_url() else { return };
    let rt = runtime();
    rt.block_on(async {
        let fleet = Fleet::connect(
            &FleetConfig {
                url: url.clone(),
                max_connections: 2,
            },
            600_000,
        )
        .await
        .unwrap();
        let key = format!("win{}", run_tag());
        let mut windows = Windows::new();
        let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut now: u64 = 1_800_000_000_000;
        let mut compared = 0;
        for i in 0..700 {
            now += match next(20) {
                0 => 70_000,
                1 => 130_000,
                2 => 3_700_000,
                3 => 0,
                _ => next(3_000),
            };
            let fp = Hash([next(6) as u8; 32]);
            let step = Hash([100 + next(4) as u8; 32]);
            let model = ["gpt-4o", "gpt-4o-mini", "claude-sonnet-4-5"][next(3) as usize];
            let memory = windows.observe_step(&key, &fp, &step, model, now);
            let sql = fleet.observe(&key, &fp, &step, model, now).await.unwrap();
            assert_eq!(memory, sql, "request {i} at {now}");
            compared += 1;
            windows.record_step(&key, &fp, &step, model, now);
            fleet
                .record_attempt(&DecisionRow {
                    decision_id: format!("{key}-{i}"),
                    key_id: key.clone(),
                    fingerprint: Some(fp.to_hex()),
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
                    step_fingerprint: Some(step.to_hex()),
                })
                .await
                .unwrap();
        }
        assert_eq!(compared, 700);
    });
}

/// The budget race: a ceiling of exactly ten worst cases, 200 concurrent requests
/// released together round-robin across three instances, the provider holding each call:
/// exactly ten reach the provider, the ledger has exactly ten forwarded decisions, and
/// `spent + reserved <= ceiling` at every sample. Twenty repetitions, a fresh key each.
#[test]
fn budget_race_across_three_instances_admits_exactly_the_ceiling() {
    let Some(url) = pg_url() else { return };
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
    let fleet = three(&url, &keys_toml, 4_000);
    let rt = runtime();
    let db = rt.block_on(pg(&url));

    for (rep, key) in keys.iter().enumerate() {
        let before = provider_calls(&fleet);
        let stop = Arc::new(AtomicBool::new(false));
        let worst_seen = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(AtomicU64::new(0));
        let sampler = {
            let (stop, worst_seen, samples) = (stop.clone(), worst_seen.clone(), samples.clone());
            let (url, id) = (url.clone(), key.id.clone());
            std::thread::spawn(move || {
                let rt = runtime();
                rt.block_on(async {
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
                        worst_seen.fetch_max(total as u64, Ordering::SeqCst);
                        samples.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                });
            })
        };
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
                    let r = Resp::from(
                        ureq::post(&url)
                            .timeout(Duration::from_secs(30))
                            .set("authorization", &format!("Bearer {bearer}"))
                            .set("content-type", "application/json")
                            .send_string(&body),
                    );
                    (r.status, r.verdict().map(str::to_string))
                })
            })
            .collect();
        let results: Vec<(u16, Option<String>)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        // Every forwarded call has answered; let the settles land.
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::SeqCst);
        sampler.join().unwrap();

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
                (row.get(0), row.get(1), row.get(2))
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
            "rep {rep}: every decision in the ledger"
        );
        assert!(samples.load(Ordering::SeqCst) > 10, "rep {rep}: sampled");
        assert!(
            worst_seen.load(Ordering::SeqCst) <= ceiling_nano,
            "rep {rep}: spent + reserved {} over the ceiling {ceiling_nano}",
            worst_seen.load(Ordering::SeqCst)
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
fn runaway_rules_fire_across_instances_where_a_single_node_fires_them() {
    let Some(url) = pg_url() else { return };
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
    eprintln!(
        "loop blocked at attempt {} ({}); runaway_burst at request {}",
        expected.0 + 1,
        expected.1,
        burst + 1
    );
}
