//! Gate cost against a bare JSON parse of the same bytes.
//!
//! For a realistic ~8 KB OpenAI chat request (≈2 KB system prompt, 8 turns, 2 tools) and a
//! ~200 KB one, measures in the same run:
//!   * `parse_value`: `serde_json::from_slice::<serde_json::Value>` of the bytes (the floor any
//!     JSON-reading proxy pays);
//!   * `gate`: `request::parse(Route::OpenAiChat, ..)` + `Windows::observe` + `gate::decide`
//!     (what the proxy runs per request, minus I/O, auth and the ledger);
//!   * `request_parse` and `decide` alone, to show where the difference goes.
//!
//! The ratio gate ÷ parse_value is printed at the end from an interleaved A/B timing loop
//! (independent of criterion's output files), next to criterion's own estimates when found.
//! Targets: ≤ 2× (issue), ≤ 1.5× (spec).
//!
//! `cargo bench --bench gate` (about a minute), with the system allocator in both arms;
//! `cargo bench --bench gate_mimalloc` runs the same with mimalloc, the `tokensaver` binary's
//! allocator (the bare parse allocates far more than the gate, so it gains more from it).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use serde_json::{json, Value};

use tokensaver::config::Prices;
use tokensaver::gate::{self, GateInput, KeyState, Policy, Windows};
use tokensaver::request::{self, Route};

const NOW_MS: u64 = 1_790_000_000_000;
const KEY: [u8; 32] = [7u8; 32];

/// Deterministic prose of about `n` bytes, with the escapes real prompts carry.
fn prose(seed: usize, n: usize) -> String {
    const WORDS: &[&str] = &[
        "the",
        "request",
        "function",
        "returns",
        "a",
        "value",
        "when",
        "error",
        "user",
        "should",
        "config",
        "handler",
        "\"quoted\"",
        "path/to/file.rs",
        "line",
        "build",
        "test",
        "cache",
        "async",
        "token",
        "budget",
        "model",
        "answer",
        "because",
        "then",
        "check",
        "é",
        "→",
    ];
    let mut s = String::with_capacity(n + 16);
    let mut i = seed.wrapping_mul(2_654_435_761);
    while s.len() < n {
        i = i
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        s.push_str(WORDS[(i >> 33) % WORDS.len()]);
        s.push(match (i >> 20) % 23 {
            0 => '\n',
            1 => '.',
            _ => ' ',
        });
    }
    s
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "read_file",
            "description": "Read a file from the workspace and return its contents.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace root"},
                "max_bytes": {"type": "integer", "minimum": 1}
            }, "required": ["path"]}
        }},
        {"type": "function", "function": {
            "name": "run_tests",
            "description": "Run the test suite, optionally filtered, and return the summary.",
            "parameters": {"type": "object", "properties": {
                "filter": {"type": "string"},
                "timeout_secs": {"type": "integer", "minimum": 1, "maximum": 600}
            }}
        }}
    ])
}

/// An OpenAI chat request: system prompt, `turns` messages (user / assistant with a tool call /
/// tool result / ...), the two tools, temperature 0.
fn chat_request(system_bytes: usize, turns: usize, turn_bytes: usize) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": prose(0, system_bytes)})];
    for t in 0..turns {
        let text = prose(t + 1, turn_bytes);
        let m = match t % 4 {
            0 => json!({"role": "user", "content": text}),
            1 => json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call_{t}"), "type": "function",
                "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/mod{t}.rs\"}}")}
            }]}),
            2 => {
                json!({"role": "tool", "tool_call_id": format!("call_{}", t - 1), "content": text})
            }
            _ => json!({"role": "assistant", "content": text}),
        };
        messages.push(m);
    }
    messages.push(json!({"role": "user", "content": prose(999, turn_bytes.min(900))}));
    let body = json!({
        "model": "gpt-4o",
        "messages": messages,
        "tools": tools(),
        "temperature": 0,
        "max_tokens": 1024,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

fn policy() -> Policy {
    let mut prices = BTreeMap::new();
    prices.insert(
        "gpt-4o".to_string(),
        Prices {
            input: 2_500_000,
            cache_write: 2_500_000,
            cache_read: 1_250_000,
            output: 10_000_000,
            max_output: 16_384,
            cache_write_1h: None,
            web_search_per_1k: None,
        },
    );
    Policy {
        prices,
        ..Policy::default()
    }
}

/// A window with some history for the key: 40 earlier requests over the last hour.
fn windows_with_history(bytes: &[u8]) -> Windows {
    let mut w = Windows::new();
    let Ok(parsed) = request::parse(Route::OpenAiChat, bytes, &KEY) else {
        return w;
    };
    for i in 0..40u64 {
        let mut fp = parsed.shape.fingerprint;
        fp.0[0] = i as u8; // other fingerprints
        w.record("bench", &fp, "gpt-4o", NOW_MS - 3_000_000 + i * 70_000);
    }
    w
}

/// The gate path per request as the proxy takes it: shape the body (for a decision: only the
/// turn hashes it compares), read the key's windows, decide.
#[inline(never)]
fn gate_once(bytes: &[u8], policy: &Policy, windows: &Windows) -> Option<gate::Decision> {
    let parsed = request::parse_for_decision(Route::OpenAiChat, bytes, &KEY).ok()?;
    let shape = &parsed.shape;
    let counts = windows.observe("bench", &shape.fingerprint, &shape.model, NOW_MS);
    let state = KeyState {
        counts,
        budget: None,
    };
    let input = GateInput {
        key_id: "bench",
        shape,
        human: true,
        held: false,
        held_usage: None,
        approved_hold: false,
    };
    Some(gate::decide(policy, &input, &state, NOW_MS))
}

#[inline(never)]
fn parse_value(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice::<Value>(bytes).ok()
}

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
}

fn cases() -> Vec<Case> {
    vec![
        // ≈2 KB system, 8 turns of ≈700 B, 2 tools → ≈8 KB.
        Case {
            name: "8KB",
            bytes: chat_request(2_000, 8, 640),
        },
        // ≈2 KB system, 64 turns of ≈4 KB → ≈200 KB.
        Case {
            name: "200KB",
            bytes: chat_request(2_000, 64, 4_100),
        },
    ]
}

fn bench(c: &mut Criterion, cases: &[Case], policy: &Policy, label: &str) {
    for case in cases {
        let windows = windows_with_history(&case.bytes);
        let mut g = c.benchmark_group(format!("{label}_{}", case.name));
        g.throughput(Throughput::Bytes(case.bytes.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("parse_value", case.bytes.len()),
            &case.bytes,
            |b, bytes| b.iter(|| parse_value(black_box(bytes))),
        );
        g.bench_with_input(
            BenchmarkId::new("gate", case.bytes.len()),
            &case.bytes,
            |b, bytes| b.iter(|| gate_once(black_box(bytes), policy, &windows)),
        );
        g.bench_with_input(
            BenchmarkId::new("request_parse", case.bytes.len()),
            &case.bytes,
            |b, bytes| {
                b.iter(|| {
                    request::parse_for_decision(Route::OpenAiChat, black_box(bytes), &KEY).ok()
                })
            },
        );
        // Every turn hash, as a digest carries them (the digest-mode client's cost).
        g.bench_with_input(
            BenchmarkId::new("digest_parse", case.bytes.len()),
            &case.bytes,
            |b, bytes| b.iter(|| request::parse(Route::OpenAiChat, black_box(bytes), &KEY).ok()),
        );
        if let Ok(parsed) = request::parse(Route::OpenAiChat, &case.bytes, &KEY) {
            let counts = windows.observe("bench", &parsed.shape.fingerprint, "gpt-4o", NOW_MS);
            let state = KeyState {
                counts,
                budget: None,
            };
            g.bench_function(BenchmarkId::new("decide", case.bytes.len()), |b| {
                b.iter(|| {
                    let input = GateInput {
                        key_id: "bench",
                        shape: black_box(&parsed.shape),
                        human: true,
                        held: false,
                        held_usage: None,
                        approved_hold: false,
                    };
                    gate::decide(policy, &input, &state, NOW_MS)
                })
            });
            // Not part of the gate's ratio: the receipt the proxy signs after deciding, for
            // the load figures (README, Performance).
            let input = GateInput {
                key_id: "bench",
                shape: &parsed.shape,
                human: true,
                held: false,
                held_usage: None,
                approved_hold: false,
            };
            let body = gate::decide(policy, &input, &state, NOW_MS).receipt_body();
            let signer = tokensaver::receipt::ReceiptSigner::from_seed([9; 32]);
            g.bench_function(BenchmarkId::new("receipt_sign", case.bytes.len()), |b| {
                b.iter(|| signer.sign(black_box(&body)))
            });
        }
        g.finish();
    }
}

/// Median ns per call over `rounds` interleaved batches of A and B.
fn ab_ratio(case: &Case, policy: &Policy) -> (f64, f64) {
    let windows = windows_with_history(&case.bytes);
    let per_batch = (2_000_000 / case.bytes.len()).clamp(20, 2_000);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline || a.len() < 15 {
        let t = Instant::now();
        for _ in 0..per_batch {
            black_box(parse_value(black_box(&case.bytes)));
        }
        a.push(t.elapsed().as_nanos() as f64 / per_batch as f64);
        let t = Instant::now();
        for _ in 0..per_batch {
            black_box(gate_once(black_box(&case.bytes), policy, &windows));
        }
        b.push(t.elapsed().as_nanos() as f64 / per_batch as f64);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    (median(&mut a), median(&mut b))
}

/// criterion's point estimate (ns) of the mean, when its output directory is where we look.
fn criterion_mean(group: &str, func: &str, len: usize) -> Option<f64> {
    let root = std::env::var_os("CRITERION_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(|d| std::path::PathBuf::from(d).join("criterion"))
        })
        .unwrap_or_else(|| std::path::PathBuf::from("target/criterion"));
    let path = root
        .join(group)
        .join(func)
        .join(len.to_string())
        .join("new/estimates.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

// Also compiled as a module of `gate_mimalloc.rs`, where `run` is the entry point.
#[allow(dead_code)]
fn main() {
    run("gate");
}

/// The whole benchmark; `label` names its criterion groups (`{label}_8KB`, …).
pub fn run(label: &str) {
    let cases = cases();
    // `GATE_BODIES=DIR` writes the benchmark's request bodies there, for other tools.
    if let Some(dir) = std::env::var_os("GATE_BODIES") {
        for case in &cases {
            let path = std::path::Path::new(&dir).join(format!("{}.json", case.name));
            if let Err(e) = std::fs::write(&path, &case.bytes) {
                eprintln!("{}: {e}", path.display());
            }
        }
        return;
    }
    let policy = policy();
    for case in &cases {
        // The bench must measure the ALLOW path on a valid request.
        let windows = windows_with_history(&case.bytes);
        match gate_once(&case.bytes, &policy, &windows) {
            Some(d) => eprintln!(
                "{}: {} bytes, verdict {:?}",
                case.name,
                case.bytes.len(),
                d.verdict
            ),
            None => eprintln!(
                "{}: {} bytes, request::parse FAILED",
                case.name,
                case.bytes.len()
            ),
        }
    }

    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    bench(&mut c, &cases, &policy, label);
    c.final_summary();

    println!();
    println!("gate ÷ parse_value (targets: ≤ 2.0× issue, ≤ 1.5× spec)");
    println!(
        "{:<7} {:>9} {:>14} {:>12} {:>7} {:>16}",
        "case", "bytes", "parse_value", "gate", "ratio", "criterion ratio"
    );
    for case in &cases {
        let (parse_ns, gate_ns) = ab_ratio(case, &policy);
        let crit = match (
            criterion_mean(
                &format!("{label}_{}", case.name),
                "parse_value",
                case.bytes.len(),
            ),
            criterion_mean(&format!("{label}_{}", case.name), "gate", case.bytes.len()),
        ) {
            (Some(p), Some(g)) => format!("{:.2}×", g / p),
            _ => "n/a".to_string(),
        };
        println!(
            "{:<7} {:>9} {:>11.1} µs {:>9.1} µs {:>6.2}× {:>16}",
            case.name,
            case.bytes.len(),
            parse_ns / 1e3,
            gate_ns / 1e3,
            gate_ns / parse_ns,
            crit
        );
    }
}
