//! A fixed-rate (open-loop) load generator for `benches/load/run.sh`: requests leave at a set
//! rate whatever the server does, and each latency is measured from the moment its request was
//! *due*, so a stall shows as the latency every queued request really saw (no coordinated
//! omission, as wrk2 or `oha -q` with latency correction). Every request is an ALLOW-path
//! request of `gen.py`'s load: its own marker (own fingerprint), keys round-robin.
//!
//! A lane that cannot answer at RATE is reported as such, never as a huge p99: its backlog
//! grows with the run's length, so its percentiles measure the run, not the server. The run
//! therefore ends GRACE after the last request was due, whatever is still queued or in flight;
//! those requests are `late` and count as infinitely slow in the percentiles (printed `inf`
//! when they reach them). The verdict, the line's last field:
//! - `behind` when any request was late, or the lane answered at less than 99 % of RATE (at
//!   the schedule's end a backlog was still draining, for more than 1 % of the run), or the
//!   median request waited more than 1 ms for a free connection (all CONNECTIONS were busy
//!   most of the time: a queue that a longer run would only grow; a lane that keeps up takes a
//!   due request within ~0.1 ms);
//! - `errors` when it kept up but some requests failed (connection refused, reset, ...);
//! - `ok` otherwise: only then do its percentiles measure the server.
//!
//! usage: paced_load URL LOAD_DIR RATE SECONDS CONNECTIONS TAG (TAG keeps markers unique
//! across runs, so no run repeats an earlier request)
//! prints: `sent ok non2xx errors late achieved_rps p50_ms p99_ms max_ms verdict`, and on
//! stderr what the generator itself did: how long a due request waited for a free connection,
//! connections opened, its own CPU time. `PACED_TRACE=FILE` also writes one line per answered
//! request, `due_s latency_us wait_us`: whether slow answers come alone or in bursts (a stall).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use tokio::sync::{mpsc, Mutex};

mod load;
use load::Sender;

/// How long after the last request was due the run waits for answers before it gives up on
/// the rest. A lane that keeps up answers within milliseconds of the schedule's end.
const GRACE: Duration = Duration::from_secs(2);
/// Answers per second below this share of RATE: the lane fell behind.
const KEPT_UP: f64 = 0.99;
/// A median wait for a free connection above this: the lane fell behind.
const MEDIAN_WAIT: Duration = Duration::from_millis(1);

struct Load {
    authority: String,
    path: String,
    prefix: String,
    suffix: String,
    keys: Vec<String>,
    tag: String,
}

/// One request of the schedule: its index and when it was due.
struct Due {
    i: u64,
    at: Instant,
}

/// An answered request.
struct Answer {
    i: u64,
    /// From the due time to the end of the answer.
    latency_us: u64,
    /// From the due time to the moment a connection took the request: the pacer's lateness
    /// plus the time every connection was busy.
    wait_us: u64,
}

#[derive(Default)]
struct Tally {
    answers: Vec<Answer>,
    non2xx: u64,
    errors: u64,
    connects: u64,
    last_done: Option<Instant>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, dir, rate, seconds, conns, tag] = args.as_slice() else {
        eprintln!("usage: paced_load URL LOAD_DIR RATE SECONDS CONNECTIONS TAG");
        std::process::exit(2);
    };
    let uri: hyper::Uri = url.parse().expect("URL");
    let load = Arc::new(Load {
        authority: uri.authority().expect("host:port").to_string(),
        path: uri.path().to_string(),
        prefix: std::fs::read_to_string(format!("{dir}/body_prefix.txt")).unwrap(),
        suffix: std::fs::read_to_string(format!("{dir}/body_suffix.txt")).unwrap(),
        keys: std::fs::read_to_string(format!("{dir}/keys_allow.txt"))
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|k| format!("Bearer {k}"))
            .collect(),
        tag: tag.clone(),
    });
    let rate: f64 = rate.parse().expect("RATE");
    let total = (rate * seconds.parse::<f64>().expect("SECONDS")) as u64;
    let conns: usize = conns.parse().expect("CONNECTIONS");
    // One runtime thread for the connections: the generator must not take both cores from
    // the server it measures.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (start, tally) = runtime.block_on(run(load, rate, total, conns));
    // Tasks still waiting on the server are dropped with the runtime.
    drop(runtime);
    report(rate, total, start, &tally);
}

async fn run(load: Arc<Load>, rate: f64, total: u64, conns: usize) -> (Instant, Tally) {
    let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
    // Connections are opened before the clock starts, so the first requests do not wait for
    // 32 handshakes; a worker whose connection fails opens another.
    let mut opened = Vec::new();
    for _ in 0..conns {
        opened.push(load::connect(&load.authority).await);
    }
    tally.lock().unwrap().connects = opened.iter().flatten().count() as u64;
    let (tx, rx) = mpsc::unbounded_channel::<Due>();
    // One queue for all connections: a request goes to whichever connection is free, so a
    // slow answer delays only its own request, never the ones behind it.
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<_> = opened
        .into_iter()
        .map(|sender| {
            let (load, rx, tally) = (load.clone(), rx.clone(), tally.clone());
            tokio::spawn(worker(load, rx, tally, sender))
        })
        .collect();
    let start = Instant::now();
    let period = Duration::from_secs_f64(1.0 / rate);
    let deadline = start + period.mul_f64(total.saturating_sub(1) as f64) + GRACE;
    // The schedule: request i is due at start + i / rate, sent or not. The pacer is a plain
    // thread because tokio's timer has a resolution of 1 ms: a request released up to 1 ms
    // late would add that to every latency. A sleeping thread wakes within ~0.1 ms.
    let pacer = std::thread::spawn(move || {
        for i in 0..total {
            let at = start + period.mul_f64(i as f64);
            if let Some(ahead) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(ahead);
            }
            if tx.send(Due { i, at }).is_err() {
                break;
            }
        }
    });
    let all = async {
        for w in workers {
            let _ = w.await;
        }
    };
    // A lane that fell behind would keep the run going until its backlog drained (once,
    // 214 s for a 10 s run): stop at the deadline and count what was not answered.
    let _ = tokio::time::timeout_at(deadline.into(), all).await;
    let _ = pacer.join();
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    (start, tally)
}

async fn worker(
    load: Arc<Load>,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<Due>>>,
    tally: Arc<std::sync::Mutex<Tally>>,
    mut sender: Option<Sender>,
) {
    loop {
        let next = rx.lock().await.recv().await;
        let Some(Due { i, at }) = next else {
            return;
        };
        let waited = at.elapsed();
        if load::make_ready(&mut sender, &load.authority).await {
            tally.lock().unwrap().connects += 1;
        }
        let outcome = match sender.as_mut() {
            Some(s) => send(&load, s, i).await,
            None => None,
        };
        let done = Instant::now();
        let mut t = tally.lock().unwrap();
        t.last_done = Some(done);
        match outcome {
            Some(ok) => {
                t.answers.push(Answer {
                    i,
                    latency_us: (done - at).as_micros() as u64,
                    wait_us: waited.as_micros() as u64,
                });
                if !ok {
                    t.non2xx += 1;
                }
            }
            None => {
                t.errors += 1;
                sender = None;
            }
        }
    }
}

/// Some(2xx?) once the whole answer is read; None on a connection error.
async fn send(load: &Load, sender: &mut Sender, i: u64) -> Option<bool> {
    let body = format!("{}{}-{i}{}", load.prefix, load.tag, load.suffix);
    let key = &load.keys[i as usize % load.keys.len()];
    let req = load::chat_request(&load.authority, &load.path, key, body);
    let resp = sender.send_request(req).await.ok()?;
    let status = resp.status();
    resp.into_body().collect().await.ok()?;
    Some(status.is_success())
}

fn report(rate: f64, total: u64, start: Instant, tally: &Tally) {
    if let Some(path) = std::env::var_os("PACED_TRACE").filter(|p| !p.is_empty()) {
        let lines: String = tally
            .answers
            .iter()
            .map(|a| format!("{:.4} {} {}\n", a.i as f64 / rate, a.latency_us, a.wait_us))
            .collect();
        if let Err(e) = std::fs::write(&path, lines) {
            eprintln!("PACED_TRACE {}: {e}", path.to_string_lossy());
        }
    }
    let answered = tally.answers.len() as u64;
    let late = total - answered - tally.errors;
    let mut l: Vec<u64> = tally.answers.iter().map(|a| a.latency_us).collect();
    l.sort_unstable();
    let mut w: Vec<u64> = tally.answers.iter().map(|a| a.wait_us).collect();
    w.sort_unstable();
    // Late requests are slower than any answer: they rank after every latency.
    let n = (answered + late) as usize;
    let latency = |p: f64| match (at_rank(&l, n, p), n) {
        (Some(us), _) => format!("{:.3}", us as f64 / 1000.0),
        (None, 0) => "0".to_owned(),
        (None, _) => "inf".to_owned(),
    };
    let wait_ms = |p: f64| at_rank(&w, w.len(), p).map_or(0.0, |us| us as f64 / 1000.0);
    let achieved = match tally.last_done {
        Some(t) if t > start => (answered + tally.errors) as f64 / (t - start).as_secs_f64(),
        _ => 0.0,
    };
    let queued = wait_ms(0.5) > MEDIAN_WAIT.as_secs_f64() * 1000.0;
    let verdict = if late > 0 || achieved < rate * KEPT_UP || queued {
        "behind"
    } else if tally.errors > 0 {
        "errors"
    } else {
        "ok"
    };
    println!(
        "{} {} {} {} {} {:.0} {} {} {} {}",
        total,
        answered - tally.non2xx,
        tally.non2xx,
        tally.errors,
        late,
        achieved,
        latency(0.50),
        latency(0.99),
        latency(1.0),
        verdict
    );
    eprintln!(
        "generator: due → taken by a connection p50 {:.3} p99 {:.3} max {:.3} ms; {} connections \
         opened; CPU {}",
        wait_ms(0.5),
        wait_ms(0.99),
        wait_ms(1.0),
        tally.connects,
        own_cpu().map_or("?".to_owned(), |s| format!(
            "{:.2} s ({:.0} us/request)",
            s,
            s * 1e6 / total.max(1) as f64
        )),
    );
}

/// The value of rank ⌈n·p⌉ in `sorted`, of `n` values in all (None: a rank past the values
/// held, i.e. a late request).
fn at_rank(sorted: &[u64], n: usize, p: f64) -> Option<u64> {
    sorted
        .get(((n as f64 * p).ceil() as usize).saturating_sub(1))
        .copied()
}

/// This process's CPU time (user + system) in seconds, from /proc (Linux; clock ticks of
/// 10 ms).
fn own_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
