//! The tokenizer: cl100k_base counted exactly as gpt-tokenizer counts it. It lives in its own
//! crate (`crates/tokenizer`) because the mock provider, which is not linked into this binary,
//! reports usage with the same counting.

pub use tokensaver_tokenizer::*;
