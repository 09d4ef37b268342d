//! A closed-loop load generator for `benches/load/field.sh`, the method the field publishes
//! gateway figures with (onthebench, GetBusbar/benchmarking): CONNECTIONS clients, each sending
//! its next request as soon as its last answer is read, so at one connection nothing ever
//! queues and every microsecond of the latency is the path's own.
//!
//! usage: field_load MODE URL LOAD_DIR CONNECTIONS SECONDS TAG
//!
//! MODE (the requests are `gen.py`'s ~8 KB OpenAI chat request):
//! - `allow`: every request its own marker (own fingerprint: ALLOW), keys round-robin;
//! - `warm`: each (key, prompt) pair of the SERVE set once (keys_serve.txt × PROMPTS), then
//!   stop: the answers the `serve` mode is SERVEd from;
//! - `serve`: the SERVE set's pairs in rounds (a pair is repeated once per round: SERVE);
//! - `stream`: as `allow`, with `"stream": true`; each answer's time to first frame and the
//!   gaps between its frames are measured.
//!
//! prints one JSON object: requests, errors, non-2xx, requests per second, latency percentiles
//! (µs, from the request's send to its answer's last byte), and for `stream` the time to
//! first frame and inter-frame percentiles, the longest gap and the frames later than
//! `STALL_US` (default 10 × `PACE_MS`, the mock's pause between frames). `TRACE=FILE` also writes
//! one line per answer, `start_us latency_us`, so slow answers can be matched with a profile.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;

mod load;
use load::Sender;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Allow,
    Warm,
    Serve,
    Stream,
}

struct Load {
    mode: Mode,
    authority: String,
    path: String,
    prefix: String,
    suffix: String,
    keys: Vec<String>,
    prompts: u64,
    tag: String,
    /// The next request's index, shared by every connection.
    next: AtomicU64,
    stop: AtomicBool,
}

#[derive(Default)]
struct Tally {
    /// (start µs since the run began, latency µs)
    answers: Vec<(u64, u64)>,
    first_frame_us: Vec<u64>,
    gaps_us: Vec<u64>,
    non2xx: u64,
    errors: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, url, dir, conns, seconds, tag] = args.as_slice() else {
        eprintln!("usage: field_load allow|warm|serve|stream URL LOAD_DIR CONNECTIONS SECONDS TAG");
        std::process::exit(2);
    };
    let mode = match mode.as_str() {
        "allow" => Mode::Allow,
        "warm" => Mode::Warm,
        "serve" => Mode::Serve,
        "stream" => Mode::Stream,
        other => panic!("unknown mode {other}"),
    };
    let uri: hyper::Uri = url.parse().expect("URL");
    let keys_file = match mode {
        Mode::Warm | Mode::Serve => "keys_serve.txt",
        Mode::Allow | Mode::Stream => "keys_allow.txt",
    };
    let mut prefix = std::fs::read_to_string(format!("{dir}/body_prefix.txt")).unwrap();
    if mode == Mode::Stream {
        assert!(prefix.starts_with('{'), "the body is a JSON object");
        // Usage asked for, as the SDKs' agents do: the gate then forwards every frame as it
        // came (asked by the gate alone, the usage frame is taken out of the caller's stream,
        // and the gap across it would count as one slow frame).
        prefix.insert_str(
            1,
            "\"stream\":true,\"stream_options\":{\"include_usage\":true},",
        );
    }
    let load = Arc::new(Load {
        mode,
        authority: uri.authority().expect("host:port").to_string(),
        path: uri.path().to_string(),
        prefix,
        suffix: std::fs::read_to_string(format!("{dir}/body_suffix.txt")).unwrap(),
        keys: std::fs::read_to_string(format!("{dir}/{keys_file}"))
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|k| format!("Bearer {k}"))
            .collect(),
        prompts: env_u64("PROMPTS", 16),
        tag: tag.clone(),
        next: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let conns: usize = conns.parse().expect("CONNECTIONS");
    let seconds: f64 = seconds.parse().expect("SECONDS");
    // One runtime thread: the generator must not take the gateway's core (the script pins it).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (elapsed, tally) = runtime.block_on(run(load, conns, Duration::from_secs_f64(seconds)));
    drop(runtime);
    report(mode, elapsed, &tally);
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn run(load: Arc<Load>, conns: usize, length: Duration) -> (Duration, Tally) {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut opened = Vec::new();
    for _ in 0..conns {
        opened.push(load::connect(&load.authority).await);
    }
    let start = Instant::now();
    if std::env::var_os("TRACE").is_some() {
        // The trace's zero on the machine's monotonic clock, to match it with a profile
        // recorded with `perf record -k CLOCK_MONOTONIC`.
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes the current time into `ts`, which outlives the call.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        eprintln!(
            "t0_monotonic_ns {}",
            ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
        );
    }
    let clients: Vec<_> = opened
        .into_iter()
        .map(|sender| tokio::spawn(client(load.clone(), tally.clone(), sender, start)))
        .collect();
    let all = async {
        for c in clients {
            let _ = c.await;
        }
    };
    tokio::pin!(all);
    // `warm` ends when every pair was sent, the others when the time is up.
    if tokio::time::timeout(length, &mut all).await.is_err() {
        load.stop.store(true, Ordering::Relaxed);
        all.await;
    }
    let elapsed = start.elapsed();
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    (elapsed, tally)
}

/// What one answer measured.
struct Answered {
    ok: bool,
    first_frame_us: Option<u64>,
    gaps_us: Vec<u64>,
}

async fn client(
    load: Arc<Load>,
    tally: Arc<Mutex<Tally>>,
    mut sender: Option<Sender>,
    t0: Instant,
) {
    while !load.stop.load(Ordering::Relaxed) {
        let i = load.next.fetch_add(1, Ordering::Relaxed);
        let Some((key, body)) = request(&load, i) else {
            return; // `warm`: every pair sent
        };
        load::make_ready(&mut sender, &load.authority).await;
        let start = Instant::now();
        let outcome = match sender.as_mut() {
            Some(s) => send(&load, s, key, body).await,
            None => None,
        };
        let latency = start.elapsed().as_micros() as u64;
        let mut t = tally.lock().unwrap();
        match outcome {
            Some(a) => {
                t.answers.push(((start - t0).as_micros() as u64, latency));
                t.non2xx += u64::from(!a.ok);
                t.first_frame_us.extend(a.first_frame_us);
                t.gaps_us.extend(a.gaps_us);
            }
            None => {
                t.errors += 1;
                sender = None;
            }
        }
    }
}

/// Request `i`'s key and body; None once `warm` has sent every pair.
fn request(load: &Load, i: u64) -> Option<(&str, String)> {
    let nk = load.keys.len() as u64;
    let (key, mark) = match load.mode {
        Mode::Allow | Mode::Stream => (i % nk, format!("{}-{i}", load.tag)),
        Mode::Warm | Mode::Serve => {
            let pairs = nk * load.prompts;
            if load.mode == Mode::Warm && i >= pairs {
                return None;
            }
            let idx = i % pairs;
            // The same markers as chat.lua's, so wrk's warm-up and this one are one set.
            (idx % nk, format!("p{}", idx / nk))
        }
    };
    let body = format!("{}{mark}{}", load.prefix, load.suffix);
    Some((&load.keys[key as usize], body))
}

/// The answer, read to its end; None on a connection error.
async fn send(load: &Load, sender: &mut Sender, key: &str, body: String) -> Option<Answered> {
    let req = load::chat_request(&load.authority, &load.path, key, body);
    let sent = Instant::now();
    let resp = sender.send_request(req).await.ok()?;
    let ok = resp.status().is_success();
    let mut body = resp.into_body();
    let (mut first, mut last, mut gaps) = (None, None::<Instant>, Vec::new());
    while let Some(frame) = body.frame().await {
        let frame = frame.ok()?;
        // Only a stream's frames are timed; other answers are just read to their end.
        if load.mode != Mode::Stream || frame.data_ref().is_none_or(|d| d.is_empty()) {
            continue;
        }
        let now = Instant::now();
        match last {
            None => first = Some((now - sent).as_micros() as u64),
            Some(prev) => gaps.push((now - prev).as_micros() as u64),
        }
        last = Some(now);
    }
    Some(Answered {
        ok,
        first_frame_us: first,
        gaps_us: gaps,
    })
}

fn report(mode: Mode, elapsed: Duration, tally: &Tally) {
    if let Some(path) = std::env::var_os("TRACE").filter(|p| !p.is_empty()) {
        let lines: String = tally
            .answers
            .iter()
            .map(|(at, us)| format!("{at} {us}\n"))
            .collect();
        std::fs::write(&path, lines).expect("TRACE");
    }
    let mut latency: Vec<u64> = tally.answers.iter().map(|a| a.1).collect();
    let n = latency.len() as u64;
    let mut out = format!(
        "{{\"requests\":{n},\"errors\":{},\"non2xx\":{},\"rps\":{:.1},\"latency_us\":{}",
        tally.errors,
        tally.non2xx,
        n as f64 / elapsed.as_secs_f64(),
        percentiles(&mut latency)
    );
    if mode == Mode::Stream {
        let stall_us = env_u64("STALL_US", 10 * 1000 * env_u64("PACE_MS", 10));
        let mut first = tally.first_frame_us.clone();
        let mut gaps = tally.gaps_us.clone();
        let stalled = gaps.iter().filter(|g| **g > stall_us).count();
        out += &format!(
            ",\"first_frame_us\":{},\"gap_us\":{},\"frames\":{},\"stalled\":{stalled},\"stall_us\":{stall_us}",
            percentiles(&mut first),
            percentiles(&mut gaps),
            gaps.len() + first.len()
        );
    }
    println!("{out}}}");
}

/// `{"p50":…,"p90":…,"p99":…,"p999":…,"max":…}` (rank ⌈n·p⌉), zeros when empty.
fn percentiles(v: &mut [u64]) -> String {
    v.sort_unstable();
    let at = |p: f64| {
        v.get(((v.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0)
    };
    format!(
        "{{\"p50\":{},\"p90\":{},\"p99\":{},\"p999\":{},\"max\":{}}}",
        at(0.5),
        at(0.9),
        at(0.99),
        at(0.999),
        at(1.0)
    )
}
