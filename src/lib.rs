//! tokensaver: a deterministic cost gate for language-model traffic.
//!
//! The request's path through the crate: `request` (provider body → shape, digest,
//! fingerprint) → `gate` (pure decision: rules, score, findings) → `receipt` (signed) →
//! `store`/`ledger` (answers, spend, budgets) ; `proxy` and `api` are the I/O shells around it.

pub mod api;
pub mod demo;
pub mod receipt;
pub mod split_profile;
pub mod auth;
pub mod config;
pub mod gate;
pub mod request;
pub mod ledger;
pub mod metrics;
pub mod store;
pub mod proxy;
pub mod spec_card;
pub mod server;
