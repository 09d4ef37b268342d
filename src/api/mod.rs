//! The API listener (public and keyed routes) and the admin listener.
//!
//! API listener (default 127.0.0.1:8788):
//! - `GET  /spec`                  public: the module card, generated from the running config
//! - `GET  /stats`                 public: fleet totals by verdict and tier (no per-key data)
//! - `POST /verify`                public: check a signed receipt envelope
//! - `POST /estimate`              keyed: a request body (`?route=`) or digest → the decision it would get; records nothing
//! - `POST /gate`                  keyed: digest → decision + receipt (digest mode); moves the windows
//! - `POST /record`                keyed: provider-reported usage and how the answer ended; committed before 200
//! - `POST /renew`                 keyed: a digest client keeps its decision's reservation live while it relays the answer
//! - `GET  /ledger`                keyed: spend and savings by tier, per day and total (`?format=csv`, `?from=&to=`)
//! - `GET  /ledger/decisions`      keyed: the key's decisions one by one with usage parts, billed items and spend (`?from=&to=&limit=&after=&format=csv`); never content
//! - `GET  /budget`                keyed: ceiling, period, spend, reserved, left
//! - `GET  /prices`                keyed: per-model prices (four parts, 1-hour writes, web search per 1,000) and max output
//! - `POST /forget`                keyed: delete stored answers and fingerprint records of the key
//! - `GET  /holds`                 the key (or its owner secret): its own pending and approved holds, and its attending lease
//! - `POST /holds/{id}/approve`    the key's owner secret (`x-tokensaver-owner`) approves its hold; body `{"attend_minutes": N}` (1..=1440) optional
//! - `POST /holds/{id}/deny`       the key's owner secret denies its hold (its worst case counts as avoided)
//! - `/page/...`                   the ledger page, a key's view: sign in with the key (see [`page`])
//! - `GET  /`                      303 to `/page/`
//!
//! Admin listener (default 127.0.0.1:8789; admin key on every route but `/metrics`, `/healthz`
//! and `/readyz`):
//! - `GET  /healthz`               the process is alive (also while draining); names its pid
//! - `GET  /readyz`                ready for traffic: store writable, signing key, upstreams resolved, not draining (503 otherwise)
//! - `PUT  /budget/{key_id}`       set a key's ceiling and period
//! - `PUT  /prices`                set per-model prices
//! - `GET  /holds`                 every key's pending and approved-unused holds (`?key=ID` for one key) and running leases; never content
//! - `POST /holds/{id}/approve`    approve a hold: the key's next identical request passes once; body `{"attend_minutes": N}` optional
//! - `POST /holds/{id}/deny`       deny a pending hold
//! - `GET  /metrics`               Prometheus exposition; never content
//! - `GET  /economics`             the evidence-grade savings report (`?suite=&category=&model=&task=`)
//! - `GET  /ledger/decisions`      every key's decisions (`?key=ID` for one key), as on the API listener
//! - `GET  /split-profile/criteria`, `POST /split-profile/{precheck,check,budget,catalogue,audit}`
//! - `/page/...`                   the ledger page: sign in with the admin key (every key) or a key (see [`page`])
//! - `GET  /`                      303 to `/page/`

mod holds;
/// The request/response pair of the API and admin handlers (`crate::api_http`; split-profile
/// speaks it too, without standing on the listener).
pub use crate::api_http as http;
pub mod ops;
pub mod page;
mod router;
mod routes;
pub mod server;

pub use routes::{Api, Listener};
