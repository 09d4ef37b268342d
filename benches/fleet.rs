//! Added latency of a gated decision in fleet mode (PostgreSQL) over the single-node path
//! (in-memory windows and budgets, SQLite written behind), on loopback.
//!
//! Each sample is what the proxy does for one distinct request before forwarding it: the
//! answer-store lookup and the committed decision — `answer` + `Gatekeeper::gate` (single
//! node), `stored_answer` + `Gatekeeper::admit` on a fleet home (a primary-key read, then one admission
//! transaction: key lock, windows, holds, budget, decision row, conditional reservation,
//! commit) — interleaved, 50 keys round-robin. The HTTP
//! path around the decision is the same in both modes, so the difference of the medians is
//! what fleet mode adds per gated request. Target (issue 10): p50 ≤ 2 ms more.
//!
//! `TOKENSAVER_TEST_PG_URL=postgres://… cargo bench --bench fleet` (scripts/pg-test-server.sh
//! starts a private server). Prints the figures; without the URL it says so and exits.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokensaver::config::Config;
use tokensaver::gatekeeper::{GateRequest, Gatekeeper, Mode};
use tokensaver::receipt::ReceiptSigner;
use tokensaver::request::Route;
use tokensaver::store::answers::AnswerKey;
use tokensaver::store::sqlite::SqliteStore;

const KEYS: usize = 50;
const REQUESTS: usize = 3_000;

fn secret(i: usize) -> String {
    format!(
        "{:0>48}",
        blake3::hash(format!("bench-{i}").as_bytes()).to_hex()
    )
}

fn config_text(tag: &str, url: &str) -> String {
    let mut c = String::from(
        "[listen]\nproxy = \"127.0.0.1:1\"\napi = \"127.0.0.1:2\"\nadmin = \"127.0.0.1:3\"\n\n",
    );
    for i in 0..KEYS {
        let hash: String = tokensaver::auth::secret_hash(&secret(i))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        c.push_str(&format!(
            "[[keys]]\nid = \"b{tag}k{i}\"\nsecret_hash = \"{hash}\"\nhuman = true\n\
             budget = {{ ceiling_micro_usd = 1000000000000, period = \"day\" }}\n\n"
        ));
    }
    c.push_str(
        "[prices.\"gpt-4o\"]\ninput = 2_500_000\ncache_write = 2_500_000\ncache_read = 1_250_000\n\
         output = 10_000_000\nmax_output = 16_384\n\n",
    );
    c.push_str(&format!(
        "[store]\nkind = \"postgres\"\nurl = \"{url}\"\nmax_connections = 4\n"
    ));
    c
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let Ok(url) = std::env::var("TOKENSAVER_TEST_PG_URL") else {
        eprintln!("fleet bench: set TOKENSAVER_TEST_PG_URL (scripts/pg-test-server.sh start)");
        return;
    };
    let tag = format!("{:x}", tokensaver::now_ms() % 0xff_ffff);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fleet_config = Config::parse(&config_text(&tag, &url)).expect("config");
    fleet_config.data_dir = dir.path().join("fleet");
    let mut single_config = fleet_config.clone();
    single_config.fleet = None;
    single_config.data_dir = dir.path().join("single");
    for d in [&fleet_config.data_dir, &single_config.data_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let open = |config: Config| {
        let store = SqliteStore::open(&config.data_dir, 20).expect("sqlite");
        Gatekeeper::new(
            config,
            ReceiptSigner::from_seed([7; 32]),
            Arc::new(store),
            tokensaver::now_ms(),
        )
        .expect("gatekeeper")
    };
    let fleet_settings = fleet_config.fleet.clone().expect("fleet config");
    let limits = tokensaver::store::postgres::FleetLimits::from_config(&fleet_config);
    let single = open(single_config);
    let fleet = open(fleet_config).with_fleet(
        rt.block_on(tokensaver::store::postgres::Fleet::connect(
            &fleet_settings,
            limits,
        ))
        .expect("fleet database"),
    );

    let requests: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let body = format!(
                r#"{{"model":"gpt-4o","max_tokens":200,"messages":[{{"role":"user","content":"bench request {i:05}: summarise the attached notes"}}]}}"#
            );
            let k = i % KEYS;
            let shape = tokensaver::request::parse(
                Route::OpenAiChat,
                body.as_bytes(),
                &tokensaver::auth::fingerprint_key(&secret(k)),
            )
            .expect("request")
            .shape;
            (format!("b{tag}k{k}"), shape)
        })
        .collect();
    let (mut single_t, mut fleet_t) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for (i, (key_id, shape)) in requests.iter().enumerate() {
            let key = single.core.config.key(key_id).expect("key");
            let req = GateRequest {
                key,
                shape,
                human: Some(true),
                held: false,
                hold_id: None,
                now_ms: tokensaver::now_ms(),
                recorded_by: tokensaver::gatekeeper::RecordSource::Proxy,
            };
            // What the proxy does per gated request: look the answer up, then decide.
            let answer_key = AnswerKey {
                key_id: key.id.clone(),
                fingerprint: shape.fingerprint,
                wire: shape.wire_form(),
            };
            let t = Instant::now();
            std::hint::black_box(single.local().answer(&answer_key));
            std::hint::black_box(single.local().gate(&single.core, &req, Mode::Commit));
            let s = t.elapsed();
            let t = Instant::now();
            std::hint::black_box(fleet.stored_answer(&answer_key).await);
            std::hint::black_box(
                fleet
                    .admit(&req, tokensaver::gatekeeper::Holding::staying(0))
                    .await
                    .expect("fleet admission"),
            );
            let f = t.elapsed();
            // The first requests warm the connections and the statement caches.
            if i >= 100 {
                single_t.push(s);
                fleet_t.push(f);
            }
        }
    });
    single_t.sort();
    fleet_t.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "fleet bench: {} decisions per mode, {KEYS} keys, loopback PostgreSQL",
        single_t.len()
    );
    for (name, t) in [("single-node", &single_t), ("fleet", &fleet_t)] {
        println!(
            "  {name:<12} p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms",
            ms(percentile(t, 0.5)),
            ms(percentile(t, 0.9)),
            ms(percentile(t, 0.99))
        );
    }
    println!(
        "  added by fleet mode: p50 {:.3} ms, p99 {:.3} ms (target p50 <= 2 ms)",
        ms(percentile(&fleet_t, 0.5)) - ms(percentile(&single_t, 0.5)),
        ms(percentile(&fleet_t, 0.99)) - ms(percentile(&single_t, 0.99))
    );
    single.close_store().ok();
    fleet.close_store().ok();
}
