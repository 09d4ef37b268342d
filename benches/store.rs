//! Writer cost of the ALLOW path in the SQLite store: one `Event::Decision` and one
//! `Event::Usage` per request, submitted fire-and-forget as the proxy does; and of the SERVE
//! path: one decision row per request.
//!
//! The database is first filled with `PREFILL` pairs so the indexes have a realistic depth.
//! Each sample then submits its pairs, `PAIRS_PER_COMMIT` per commit (the batch size under
//! load), and waits for each commit and its fsync. Criterion reports the wall time per pair;
//! the writer thread's CPU time per pair and per SERVE row (what the proxy pays) is printed
//! after it.
//!
//! `cargo bench --bench store` (a few seconds; `-- zzz` skips criterion and prints only the
//! writer's CPU time).
#![allow(clippy::expect_used)]

use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};

use tokensaver::gate::{Usage, Verdict};
use tokensaver::receipt::DecisionId;
use tokensaver::request::{Hash, WireForm};
use tokensaver::store::sqlite::SqliteStore;
use tokensaver::store::{DecisionRow, Ending, Event, SpendBasis, Store, UsageRow};

const NOW_MS: u64 = 1_790_000_000_000;
const KEYS: u64 = 4_000;
const PREFILL: u64 = 20_000;
/// What arrives in one commit interval (20 ms) at a few thousand requests per second.
const PAIRS_PER_COMMIT: usize = 128;
const ROUNDS: usize = 7;
const ROUND_PAIRS: u64 = 5_000;

/// Distinct random-looking 32 bytes (the fingerprints, and what a decision id is made from).
fn hashed(tag: &str, i: u64) -> [u8; 32] {
    *blake3::hash(format!("{tag}{i}").as_bytes()).as_bytes()
}

/// Request `i`'s decision row, as an ALLOW.
fn decision(i: u64) -> DecisionRow {
    DecisionRow {
        decision_id: DecisionId::of(NOW_MS + i, &hashed("decision", i)),
        key_id: format!("tsk_load_{:05}", i % KEYS),
        fingerprint: Some(Hash(hashed("fingerprint", i))),
        verdict: Verdict::Allow,
        reason: "band:allow".to_owned(),
        score: 0.12,
        model_requested: "gpt-4o".to_owned(),
        model_served: Some("gpt-4o".to_owned()),
        wire: WireForm::Json,
        decided_at_ms: NOW_MS + i,
        reserved_nano: 164_000_000,
        worst_case_tokens: Some(16_884),
        tokens_not_bought: 0,
        worst_case_tokens_avoided: 0,
        findings_tokens: 0,
        hold_id: None,
        step_fingerprint: Some(Hash(hashed("step", i))),
        recorded_by: Default::default(),
        session: Some(Hash(hashed("session", i % KEYS))),
        paced_ms: 0,
        cache_edits: Default::default(),
    }
}

fn pair(i: u64) -> (Event, Event) {
    let decision = decision(i);
    let usage = UsageRow {
        decision_id: decision.decision_id,
        key_id: decision.key_id.clone(),
        at_ms: decision.decided_at_ms + 40,
        served_model: "gpt-4o".to_owned(),
        wire: WireForm::Json,
        complete: true,
        usage: Usage {
            input: 500,
            cache_write: 0,
            cache_read: 0,
            output: 120,
        },
        cache_write_1h: 0,
        web_search_requests: 0,
        ending: Some(Ending::Complete),
        basis: SpendBasis::Reported,
        spend_nano: 2_450_000,
        cache_saving_nano: None,
        cache: Default::default(),
    };
    (Event::Decision(decision), Event::Usage(usage))
}

/// The decision row of a SERVE (no reservation, no usage to come).
fn served(i: u64) -> Event {
    Event::Decision(DecisionRow {
        verdict: Verdict::Serve,
        reason: "answer_held".to_owned(),
        model_served: None,
        reserved_nano: 0,
        tokens_not_bought: 620,
        ..decision(i)
    })
}

/// Pairs `from..from + n`, built ahead so that building them is not timed.
fn pairs(from: &mut u64, n: u64) -> Vec<(Event, Event)> {
    let out = (*from..*from + n).map(pair).collect();
    *from += n;
    out
}

/// Submits the pairs, waiting for a commit every `PAIRS_PER_COMMIT` (a flush makes the writer
/// commit at once).
fn write(store: &SqliteStore, events: Vec<(Event, Event)>) {
    for (i, (d, u)) in events.into_iter().enumerate() {
        store.submit(d);
        store.submit(u);
        if (i + 1) % PAIRS_PER_COMMIT == 0 {
            store.flush().expect("flush");
        }
    }
    store.flush().expect("flush");
}

/// CPU time (ns) of the store's writer thread so far, from `/proc` (0 where unavailable).
fn writer_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        // Thread names are cut to 15 bytes.
        if comm.trim_end() == "tokensaver-stor" {
            let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
            return stat
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
    }
    0
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path(), 20).expect("open");
    let mut next = 0;
    write(&store, pairs(&mut next, PREFILL));

    let mut g = c.benchmark_group("store");
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    // One iteration is one (decision + usage) pair.
    g.bench_function("decision_usage_pair", |b| {
        b.iter_custom(|iters| {
            let events = pairs(&mut next, iters);
            let start = Instant::now();
            write(&store, events);
            start.elapsed()
        })
    });
    g.finish();

    // The writer thread's own CPU time, without the fsync waits of the wall time above:
    // rounds of ALLOW pairs and of SERVE rows, alternating.
    let (mut per_pair, mut per_served) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let events = pairs(&mut next, ROUND_PAIRS);
        let cpu = writer_cpu_ns();
        write(&store, events);
        let spent = writer_cpu_ns().saturating_sub(cpu);
        per_pair.push(spent as f64 / 1e3 / ROUND_PAIRS as f64);

        let rows: Vec<Event> = (next..next + ROUND_PAIRS).map(served).collect();
        next += ROUND_PAIRS;
        let cpu = writer_cpu_ns();
        for (i, row) in rows.into_iter().enumerate() {
            store.submit(row);
            if (i + 1) % PAIRS_PER_COMMIT == 0 {
                store.flush().expect("flush");
            }
        }
        store.flush().expect("flush");
        let spent = writer_cpu_ns().saturating_sub(cpu);
        per_served.push(spent as f64 / 1e3 / ROUND_PAIRS as f64);
    }
    for (what, figures) in [
        ("ALLOW pair", &mut per_pair),
        ("SERVE row", &mut per_served),
    ] {
        figures.sort_by(f64::total_cmp);
        eprintln!(
            "store: writer CPU per {what}: median {:.1} µs (min {:.1}, max {:.1}) over \
             {ROUNDS} rounds of {ROUND_PAIRS}, {PAIRS_PER_COMMIT} per commit",
            figures[ROUNDS / 2],
            figures[0],
            figures[ROUNDS - 1],
        );
    }
    eprintln!(
        "store: {next} requests' rows in the database, {} commits",
        store.commits()
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
