//! Usage capture on real answers: the typed serde readers against the previous readers (the
//! gate's borrowed JSON reader, `request::json`), on the same bytes.
//!
//! Two answers from `corpus/provider-answers/`: a 23 KB Anthropic JSON answer (web search
//! results) and a 59 KB Anthropic stream of ~150 events. For each, in the same run:
//!   * `typed`: `proxy::usage::json_usage` / an `SseTap` fed the whole stream (what the proxy
//!     runs: the readers name only the usage fields and skip the rest);
//!   * `borrowed_tree`: the previous readers, kept here as they were (commit 0eea9a6,
//!     Anthropic route): `request::json::parse` builds a borrowed tree of every member, then
//!     the usage members are looked up in it.
//!
//! `cargo bench --bench usage` (about half a minute).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput};

use tokensaver::gate::Usage;
use tokensaver::proxy::usage::{json_usage, SseTap};
use tokensaver::request::json::{self, Json};
use tokensaver::request::Route;

fn answer(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/corpus/provider-answers/answers/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(path).unwrap_or_default()
}

/// The previous readers (Anthropic route), as they were before the typed ones.
mod previous {
    use super::*;

    fn num(v: &Json, path: &[&str]) -> u64 {
        let mut cur = v;
        for p in path {
            match cur.get(p) {
                Some(next) => cur = next,
                None => return 0,
            }
        }
        cur.as_u64().unwrap_or(0)
    }

    fn anthropic_usage(usage: &Json) -> Option<Usage> {
        if !matches!(usage, Json::Object(_)) {
            return None;
        }
        Some(Usage {
            input: num(usage, &["input_tokens"]),
            cache_write: num(usage, &["cache_creation_input_tokens"]),
            cache_read: num(usage, &["cache_read_input_tokens"]),
            output: num(usage, &["output_tokens"]),
        })
    }

    pub fn json_usage(body: &[u8]) -> Option<Usage> {
        let value = json::parse(body).ok()?;
        anthropic_usage(value.get("usage")?)
    }

    #[derive(Default)]
    pub struct Tap {
        pending: Vec<u8>,
        pub usage: Option<Usage>,
        pub finished: bool,
    }

    impl Tap {
        pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
            self.pending.extend_from_slice(chunk);
            let mut out = Vec::with_capacity(self.pending.len());
            let mut start = 0;
            while let Some(end) = find_event_end(&self.pending[start..]) {
                let event_end = start + end;
                self.observe(start, event_end);
                out.extend_from_slice(&self.pending[start..event_end]);
                start = event_end;
            }
            self.pending.drain(..start);
            out
        }

        fn observe(&mut self, start: usize, end: usize) {
            let Ok(text) = std::str::from_utf8(&self.pending[start..end]) else {
                return;
            };
            let data: String = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect::<Vec<_>>()
                .join("\n");
            let Ok(value) = json::parse(data.as_bytes()) else {
                return;
            };
            let kind = value
                .get("type")
                .and_then(Json::as_string)
                .map(|t| t.to_cow());
            match kind.as_deref() {
                Some("message_start") => {
                    if let Some(u) = value
                        .get("message")
                        .and_then(|m| m.get("usage"))
                        .and_then(anthropic_usage)
                    {
                        self.usage = Some(u);
                    }
                }
                Some("message_delta") => {
                    if let Some(delta) = value.get("usage") {
                        let mut u = self.usage.unwrap_or_default();
                        if let Some(out) = delta.get("output_tokens").and_then(Json::as_u64) {
                            u.output = out;
                        }
                        if let Some(inp) = delta.get("input_tokens").and_then(Json::as_u64) {
                            u.input = inp;
                        }
                        self.usage = Some(u);
                    }
                }
                Some("message_stop") => self.finished = true,
                _ => {}
            }
        }
    }

    fn find_event_end(buf: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i + 1 < buf.len() {
            if buf[i] == b'\n' && buf[i + 1] == b'\n' {
                return Some(i + 2);
            }
            i += 1;
        }
        None
    }
}

fn bench(c: &mut Criterion) {
    let body = answer("a08_messages_json_web_search.json");
    let stream = answer("a07_messages_stream_web_search.sse");

    let mut g = c.benchmark_group("usage_json_answer");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("typed", |b| {
        b.iter(|| json_usage(Route::AnthropicMessages, black_box(&body)))
    });
    g.bench_function("borrowed_tree", |b| {
        b.iter(|| previous::json_usage(black_box(&body)))
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
            let mut tap = previous::Tap::default();
            black_box(tap.feed(black_box(&stream)));
            tap.usage
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
