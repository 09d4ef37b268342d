//! split-profile: the tool-catalogue check (seed 000, criteria `token-efficiency/v1`
//! revision 1.2.0), served under `/split-profile/` on the admin listener and by the
//! `tokensaver split-profile FILE|-` command.
//!
//! It states how one submitted MCP tool catalogue's definition-token count is composed —
//! the shares carried by names, descriptions and parameter schemas, for the catalogue and
//! inside each tool, on the floor-to-0.5 grid with the derivability self-check — and which
//! tools have byte-identical schema serialisations. It reports no count of any kind.
//!
//! - [`json`]: JavaScript-compatible `JSON.parse` / `JSON.stringify` (part strings are
//!   defined by them).
//! - [`tokenizer`]: cl100k_base via tiktoken-rs, special-token spellings as ordinary text.
//! - [`derivability`]: the 0.5 grid and the closed-form self-check (proven against brute force).
//! - [`engine`]: input contract, part strings, shares, edge rules, schema-identity groups.
//! - [`report`]: the signed report and pre-check documents, the verdict line, a text render.
//! - [`criteria`]: the criteria as this build applies them (`GET /split-profile/criteria`).
//!
//! The routes (the free pre-check allowance, the admin listener's handlers) are the server's
//! (`tokensaver::split_profile::service`). Public entry points for the shells:
//! - CLI: [`profile`] then [`render_text`] / [`report_bytes`], or [`render_refusal_text`].

pub mod criteria;
pub mod derivability;
pub mod engine;
pub mod json;
pub mod report;
pub mod tokenizer;

pub use criteria::criteria_json;
pub use engine::{profile, Refusal, Report, Shares, MAX_BODY_BYTES, MAX_TOOLS};
pub use report::{render_refusal_text, render_text, report_bytes, signed_report};
