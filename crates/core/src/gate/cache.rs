//! Prompt caching placed by the gate (SPEC §2.11b): a breakpoint only where this key has sent
//! the same prefix within the cache's lifetime, so a prefix the key never sends again never
//! pays the write premium.
//!
//! The rule, over the request's cache points (`RequestShape::cache_points`) and what the gate
//! remembers of each (the last time the key sent that prefix, and the last time a breakpoint
//! was placed there):
//! - the *write* point is the longest prefix seen within [`CACHE_TTL_MS`] and long enough to be
//!   cached by the model ([`min_cacheable_tokens`], at a cautious 4 characters a token): in an
//!   agent's loop, the previous call's whole prompt, which this call repeats;
//! - the *read* points are up to three shorter prefixes where a breakpoint was placed within
//!   the lifetime (their entries are live; a read refreshes them);
//! - at most [`MAX_BREAKPOINTS`], the provider's limit; none when nothing was seen.
//!
//! Pure: the memory and the clock come in; the chosen point indices go out.

use crate::request::CachePoint;

/// Anthropic's default ephemeral entry lives 5 minutes (refreshed by each read).
pub const CACHE_TTL_MS: u64 = 300_000;
/// Anthropic allows at most 4 breakpoints per request.
pub const MAX_BREAKPOINTS: usize = 4;
/// Characters per token assumed when checking a prefix against the minimum: more than most
/// text has, so an estimate that clears the minimum is a prefix that does.
pub const CHARS_PER_TOKEN_FOR_MINIMUM: u64 = 4;

/// The minimum cacheable prefix of a model, in tokens (Anthropic's prompt-caching page: 4,096
/// for Claude Opus 4.5/4.6 and Haiku 4.5, 2,048 for Sonnet 4.6 and the older Haiku models,
/// 1,024 for the others).
pub fn min_cacheable_tokens(model: &str) -> u64 {
    const LONG: &[&str] = &["opus-4-5", "opus-4-6", "haiku-4-5"];
    if LONG.iter().any(|m| model.contains(m)) {
        4_096
    } else if model.contains("sonnet-4-6") || model.contains("haiku") {
        2_048
    } else {
        1_024
    }
}

/// What the gate remembers of one cache point for this key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PointMemory {
    /// The last time the key sent a request with this prefix.
    pub seen_ms: Option<u64>,
    /// The last time the gate placed a breakpoint at this prefix (or read it through one).
    pub placed_ms: Option<u64>,
}

fn live(at: Option<u64>, now_ms: u64) -> bool {
    at.is_some_and(|t| now_ms.saturating_sub(t) < CACHE_TTL_MS)
}

/// The indices (into `points`) where breakpoints go, ascending; empty when none earns one.
pub fn place(points: &[CachePoint], memory: &[PointMemory], model: &str, now_ms: u64) -> Vec<u16> {
    let minimum = min_cacheable_tokens(model);
    let long_enough = |p: &CachePoint| p.chars / CHARS_PER_TOKEN_FOR_MINIMUM >= minimum;
    let remembered = |i: usize| memory.get(i).copied().unwrap_or_default();
    let Some(write) = (0..points.len())
        .rev()
        .find(|&i| long_enough(&points[i]) && live(remembered(i).seen_ms, now_ms))
    else {
        return Vec::new();
    };
    let mut chosen: Vec<usize> = (0..write)
        .rev()
        .filter(|&i| long_enough(&points[i]) && live(remembered(i).placed_ms, now_ms))
        .take(MAX_BREAKPOINTS - 1)
        .collect();
    chosen.push(write);
    chosen.sort_unstable();
    chosen
        .into_iter()
        .filter_map(|i| u16::try_from(i).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{CacheUnit, Hash};

    fn points(chars: &[u64]) -> Vec<CachePoint> {
        chars
            .iter()
            .enumerate()
            .map(|(i, &c)| CachePoint {
                prefix: Hash([i as u8; 32]),
                chars: c,
                unit: CacheUnit::Message(i),
            })
            .collect()
    }

    const NOW: u64 = 10_000_000;

    #[test]
    fn nothing_seen_nothing_placed() {
        let p = points(&[5_000, 10_000]);
        assert!(place(&p, &[PointMemory::default(); 2], "claude-sonnet-4-5", NOW).is_empty());
    }

    #[test]
    fn the_longest_seen_prefix_is_written_and_placed_ones_are_read() {
        let p = points(&[5_000, 6_000, 7_000, 8_000, 9_000, 10_000]);
        let seen = |ago: u64| PointMemory {
            seen_ms: Some(NOW - ago),
            placed_ms: None,
        };
        let mut memory = vec![seen(1_000); 5];
        memory.push(PointMemory::default());
        memory[1].placed_ms = Some(NOW - 2_000);
        memory[3].placed_ms = Some(NOW - 2_000);
        // Write at 4 (the longest seen), read at 3 and 1 (placed, live).
        assert_eq!(place(&p, &memory, "claude-sonnet-4-5", NOW), vec![1, 3, 4]);
        // A placement 5 minutes old is gone (half-open: exactly the TTL is outside).
        memory[3].placed_ms = Some(NOW - CACHE_TTL_MS);
        assert_eq!(place(&p, &memory, "claude-sonnet-4-5", NOW), vec![1, 4]);
        // Never more than four.
        for m in memory.iter_mut().take(4) {
            m.placed_ms = Some(NOW - 1);
        }
        assert_eq!(
            place(&p, &memory, "claude-sonnet-4-5", NOW),
            vec![1, 2, 3, 4]
        );
    }

    #[test]
    fn below_the_minimum_no_breakpoint_goes() {
        // 4,000 characters are 1,000 tokens at the cautious rate: below Sonnet 4.5's 1,024.
        let p = points(&[4_000, 4_096]);
        let memory = [PointMemory {
            seen_ms: Some(NOW - 1),
            placed_ms: None,
        }; 2];
        assert_eq!(place(&p, &memory, "claude-sonnet-4-5", NOW), vec![1]);
        assert!(place(&p[..1], &memory[..1], "claude-sonnet-4-5", NOW).is_empty());
        // Haiku 4.5 needs 4,096 tokens.
        assert!(place(&p, &memory, "claude-haiku-4-5", NOW).is_empty());
    }
}
