//! Usage capture on real answers: the typed serde readers against the gate's borrowed JSON
//! reader (`request::json`, what usage capture used before) on the same bytes.
//!
//! Two answers from `corpus/provider-answers/`: a 23 KB Anthropic JSON answer (web search
//! results) and a 59 KB Anthropic stream of ~150 events. For each, in the same run:
//!   * `typed`: `proxy::usage::json_usage` / an `SseTap` fed the whole stream (what the proxy
//!     runs: the readers name only the usage fields and skip the rest);
//!   * `borrowed_tree`: `request::json::parse` of the same bytes (per event for the stream),
//!     which builds a borrowed tree of every member: the floor of the previous readers.
//!
//! `cargo bench --bench usage` (about half a minute).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput};

use tokensaver::proxy::usage::{json_usage, SseTap};
use tokensaver::request::{json, Route};

fn answer(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/corpus/provider-answers/answers/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(path).unwrap_or_default()
}

/// The data of each SSE event, as the previous tap parsed them one by one.
fn event_data(stream: &[u8]) -> Vec<Vec<u8>> {
    String::from_utf8_lossy(stream)
        .split("\n\n")
        .map(|e| {
            e.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect::<Vec<_>>()
                .join("\n")
                .into_bytes()
        })
        .filter(|d| !d.is_empty())
        .collect()
}

fn bench(c: &mut Criterion) {
    let body = answer("a08_messages_json_web_search.json");
    let stream = answer("a07_messages_stream_web_search.sse");
    let events = event_data(&stream);

    let mut g = c.benchmark_group("usage_json_answer");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("typed", |b| {
        b.iter(|| json_usage(Route::AnthropicMessages, black_box(&body)))
    });
    g.bench_function("borrowed_tree", |b| {
        b.iter(|| {
            json::parse(black_box(&body))
                .ok()
                .and_then(|v| v.get("usage").map(|u| u.get("input_tokens").is_some()))
        })
    });
    g.finish();

    let mut g = c.benchmark_group("usage_sse_stream");
    g.throughput(Throughput::Bytes(stream.len() as u64));
    g.bench_function("typed", |b| {
        b.iter(|| {
            let mut tap = SseTap::new(Route::AnthropicMessages, false);
            black_box(tap.feed(black_box(&stream)));
            tap.usage()
        })
    });
    g.bench_function("borrowed_tree", |b| {
        b.iter(|| {
            events
                .iter()
                .filter(|d| json::parse(black_box(d)).is_ok())
                .count()
        })
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
}
