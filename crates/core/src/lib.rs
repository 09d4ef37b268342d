//! The gate core: everything the gate decides with, and nothing that waits on the world.
//!
//! A request's path through it: [`request`] (provider body → shape, digest, fingerprint) →
//! [`gate`] (the pure decision: rules, score, findings; the clock is an argument) →
//! [`receipt`] (the decision, signed). [`prices`] is the price table's row the decision costs
//! with, [`utc`] the calendar the ledger and reports date with. No I/O, no pingora: the
//! server crate (`tokensaver`) is the shell around it.

pub mod gate;
pub mod html;
pub mod prices;
pub mod receipt;
pub mod request;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod sql_types;
pub mod utc;
