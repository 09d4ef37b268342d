//! tokensaver: a deterministic cost gate for language-model traffic.
//!
//! This is the server crate: the I/O shells around the pure parts under `crates/`. A request's
//! path: `request` (provider body → shape, digest, fingerprint) → `gate` (pure decision:
//! rules, score, findings) → `receipt` (signed) — those three are the gate core,
//! `tokensaver-core`, re-exported here — then `store`/`gatekeeper` (answers, spend, budgets; embedded or a fleet's);
//! `proxy` and `api` are the shells that read the network and answer it; `cli` is the
//! command line (`src/main.rs` only calls it).

pub mod api;
pub mod api_http;
pub mod auth;
pub mod body;
pub mod cli;
pub mod config;
pub mod economics;
pub mod error;
pub mod gatekeeper;
pub mod http_client;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod processes;
pub mod proxy;
pub mod receipt;
pub mod report;
pub mod server;
pub mod spec_card;
pub mod split_profile;
pub mod store;
pub mod upstreams;

pub use tokensaver_core::{gate, prices, request, sql_types, utc};

/// The wall clock in unix milliseconds, read by the I/O shells only: the decision logic takes
/// the time as an argument.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
