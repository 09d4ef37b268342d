//! A fixed-rate (open-loop) load generator for `benches/load/run.sh`: requests leave at a set
//! rate whatever the server does, and each latency is measured from the moment its request was
//! *due*, so a stall shows as the latency every queued request really saw (no coordinated
//! omission, as wrk2 or `oha -q` with latency correction). Every request is an ALLOW-path
//! request of `gen.py`'s load: its own marker (own fingerprint), keys round-robin.
//!
//! usage: paced_load URL LOAD_DIR RATE SECONDS CONNECTIONS TAG (TAG keeps markers unique
//! across runs, so no run repeats an earlier request)
//! prints: `sent ok non2xx errors p50_ms p99_ms max_ms`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Mutex};

struct Load {
    authority: String,
    path: String,
    prefix: String,
    suffix: String,
    keys: Vec<String>,
    tag: String,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    non2xx: u64,
    errors: u64,
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
    // One runtime thread: the generator must not take both cores from the server it measures.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tally = runtime.block_on(run(load, rate, total, conns));
    let mut l = tally.latencies_us;
    l.sort_unstable();
    let pct = |p: f64| {
        l.get(((l.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .map_or(0.0, |&us| us as f64 / 1000.0)
    };
    println!(
        "{} {} {} {} {:.3} {:.3} {:.3}",
        total,
        l.len() as u64 - tally.non2xx,
        tally.non2xx,
        tally.errors,
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
}

async fn run(load: Arc<Load>, rate: f64, total: u64, conns: usize) -> Tally {
    let (tx, rx) = mpsc::channel::<(u64, Instant)>(total.max(1) as usize);
    let rx = Arc::new(Mutex::new(rx));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut workers = Vec::new();
    for _ in 0..conns {
        let (load, rx, tally) = (load.clone(), rx.clone(), tally.clone());
        workers.push(tokio::spawn(async move { worker(load, rx, tally).await }));
    }
    // The schedule: request i is due at start + i / rate, sent or not.
    let start = Instant::now();
    let period = Duration::from_secs_f64(1.0 / rate);
    for i in 0..total {
        let due = start + period.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        if tx.send((i, due)).await.is_err() {
            break;
        }
    }
    drop(tx);
    for w in workers {
        let _ = w.await;
    }
    Arc::try_unwrap(tally).ok().unwrap().into_inner()
}

async fn connect(load: &Load) -> Option<http1::SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(&load.authority).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(conn);
    Some(sender)
}

async fn worker(
    load: Arc<Load>,
    rx: Arc<Mutex<mpsc::Receiver<(u64, Instant)>>>,
    tally: Arc<Mutex<Tally>>,
) {
    let mut sender = None;
    loop {
        let Some((i, due)) = rx.lock().await.recv().await else {
            return;
        };
        if sender.is_none() {
            sender = connect(&load).await;
        }
        let Some(s) = sender.as_mut() else {
            tally.lock().await.errors += 1;
            continue;
        };
        let body = format!("{}{}-{i}{}", load.prefix, load.tag, load.suffix);
        let key = &load.keys[i as usize % load.keys.len()];
        let req = hyper::Request::post(&load.path)
            .header("host", &load.authority)
            .header("authorization", key)
            .header("content-type", "application/json")
            .header("x-tokensaver-human", "true")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let outcome = match s.send_request(req).await {
            Ok(resp) => {
                let status = resp.status();
                match resp.into_body().collect().await {
                    Ok(_) => Some(status.is_success()),
                    Err(_) => None,
                }
            }
            Err(_) => None,
        };
        let mut t = tally.lock().await;
        match outcome {
            Some(ok) => {
                t.latencies_us.push(due.elapsed().as_micros() as u64);
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
