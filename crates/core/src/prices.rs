//! What models cost: the price table's row.

use serde::{Deserialize, Serialize};

/// Per-model prices in micro-USD per million tokens, for each of the four usage parts,
/// and the model's maximum output (the worst case when `max_tokens` is absent). What the four
/// parts cannot express is priced apart: 1-hour cache writes, and web search requests per
/// thousand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    pub input: u64,
    /// A cache write of the default duration (Anthropic: 5 minutes).
    pub cache_write: u64,
    pub cache_read: u64,
    pub output: u64,
    pub max_output: u64,
    /// A 1-hour cache write (Anthropic), micro-USD per million tokens. Absent: twice
    /// `input`, Anthropic's published rule for every model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h: Option<u64>,
    /// Server-side web search, micro-USD per 1,000 requests (Anthropic: $10 = 10_000_000).
    /// Absent: web search requests are recorded but not priced (`/spec` lists the models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_per_1k: Option<u64>,
}

impl Prices {
    /// The price of a 1-hour cache write: the configured one, else twice the input price.
    pub fn cache_write_1h(&self) -> u64 {
        self.cache_write_1h
            .unwrap_or_else(|| self.input.saturating_mul(2))
    }
}
