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

use serde::{Deserialize, Serialize};

use crate::prices::Prices;
use crate::request::{CachePoint, Hash};

/// Anthropic's default ephemeral entry lives 5 minutes (refreshed by each read).
pub const CACHE_TTL_MS: u64 = 300_000;
/// Anthropic allows at most 4 breakpoints per request.
pub const MAX_BREAKPOINTS: usize = 4;
/// Characters per token assumed when checking a prefix against the minimum: more than most
/// text has, so an estimate that clears the minimum is a prefix that does.
pub const CHARS_PER_TOKEN_FOR_MINIMUM: u64 = 4;

/// OpenAI caches prompts of at least 1,024 tokens (its prompt-caching guide).
pub const OPENAI_MIN_CACHEABLE_TOKENS: u64 = 1_024;

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

/// A pause: a session's silence past the cache's lifetime (Anthropic's 5 minutes, or
/// `[gate.windows] cache_secs` in a time-compressed run) and under 12 lifetimes (the hour:
/// longer, a one-hour entry would have expired too).
pub const PAUSE_MAX_LIFETIMES: u64 = 12;

/// What the gate keeps of an agent session for its cache decisions (SPEC §2.11b): times and
/// the provider's own figures, never content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCache {
    /// When the session's latest call was forwarded.
    pub last_ms: Option<u64>,
    /// Calls forwarded.
    pub calls: u64,
    /// Pauses seen between them (a lifetime to [`PAUSE_MAX_LIFETIMES`] of them).
    pub pauses: u64,
    /// The latest settled call's prompt, in tokens (uncached + cache write + cache read): what
    /// a rebuild after a pause writes again.
    pub prompt_tokens: u64,
    /// How much the session's prompt grew over its settled calls, after its first: what a
    /// cache that never expires writes (a rebuild after a pause is not growth).
    pub grown_tokens: u64,
}

impl SessionCache {
    /// Whether a call now comes after a pause, for a cache that lives `lifetime_ms`.
    pub fn paused_at(&self, now_ms: u64, lifetime_ms: u64) -> bool {
        self.last_ms.is_some_and(|t| {
            let gap = now_ms.saturating_sub(t);
            (lifetime_ms..lifetime_ms.saturating_mul(PAUSE_MAX_LIFETIMES)).contains(&gap)
        })
    }

    /// The session once a call is forwarded at `now_ms`; `after_pause`: its decision found it
    /// came after a pause ([`Self::paused_at`], judged once, by the decision).
    pub fn forwarded(self, now_ms: u64, after_pause: bool) -> SessionCache {
        SessionCache {
            last_ms: Some(self.last_ms.map_or(now_ms, |t| t.max(now_ms))),
            calls: self.calls.saturating_add(1),
            pauses: self.pauses + u64::from(after_pause),
            ..self
        }
    }

    /// The session once a call's usage is settled (its prompt, in tokens).
    pub fn settled(self, prompt_tokens: u64) -> SessionCache {
        let growth = if self.prompt_tokens == 0 {
            0
        } else {
            prompt_tokens.saturating_sub(self.prompt_tokens)
        };
        SessionCache {
            prompt_tokens,
            grown_tokens: self.grown_tokens.saturating_add(growth),
            ..self
        }
    }
}

/// The cache lifetime a key asks for (`[[keys]] cache_ttl`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LifetimePolicy {
    /// One hour where the session's own figures say it pays ([`one_hour_pays`]).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Never changed: five-minute entries.
    #[serde(rename = "5m")]
    FiveMinutes,
    /// Always one hour.
    #[serde(rename = "1h")]
    OneHour,
}

/// Whether one-hour entries pay for this session (Anthropic): only once it has paused past
/// the 5-minute lifetime (and under the hour), and only while the premium a pause cycle costs
/// — the one-hour write's extra over the 5-minute write on what the session newly writes
/// between two pauses (its prompt's growth) — stays below what a pause costs without it: the
/// prompt written again at the 5-minute price instead of read. At the list prices (5-minute
/// write 1.25×, one-hour 2×, read 0.1× the input price): 0.75× the growth per pause against
/// 1.15× the prompt.
pub fn one_hour_pays(
    session: &SessionCache,
    now_ms: u64,
    lifetime_ms: u64,
    prices: &Prices,
) -> bool {
    let pauses = session.pauses + u64::from(session.paused_at(now_ms, lifetime_ms));
    if pauses == 0 {
        return false;
    }
    let premium_per_token = prices.cache_write_1h().saturating_sub(prices.cache_write);
    let saved_per_token = prices.cache_write.saturating_sub(prices.cache_read);
    let grown_per_pause = session.grown_tokens / pauses;
    u128::from(premium_per_token) * u128::from(grown_per_pause)
        < u128::from(saved_per_token) * u128::from(session.prompt_tokens)
}

/// How many requests a minute one OpenAI cache route takes before requests overflow to other
/// machines (the provider's prompt-caching guide: about 15), and how many the gate sends to
/// one of its routing keys (a margin below).
pub const ROUTE_OVERFLOW_PER_MINUTE: u64 = 15;
pub const ROUTE_TARGET_PER_MINUTE: u64 = 12;

/// The window in which the provider counts a route's requests (its "a minute").
pub const ROUTE_WINDOW_MS: u64 = 60_000;

/// The routing bucket of a session (OpenAI, `prompt_cache_key`): below
/// [`ROUTE_TARGET_PER_MINUTE`] requests a minute of the prefix, or with one session alone on it,
/// bucket 0 — every session of the prefix shares its route and the cached prefix; above it,
/// each session a route of its own (a bucket drawn from the session's hash, never 0), so that
/// its history stays on the one machine that cached it whatever the rate does next (a shared
/// bucket overflows past the provider's rate and a session moved between buckets misses its own
/// cache). `shared`: another session sent the prefix in that minute. Returns
/// `(bucket, spread)`.
pub fn routing_bucket(requests_last_minute: u64, shared: bool, session: &Hash) -> (u32, bool) {
    let spread = requests_last_minute.saturating_add(1) > ROUTE_TARGET_PER_MINUTE && shared;
    if !spread {
        return (0, false);
    }
    let own = u32::from_le_bytes(session.0[..4].try_into().unwrap_or([0; 4]));
    (own.max(1), true)
}

/// The `prompt_cache_key` the gate places for a prefix's bucket: a keyed hash of the keyed
/// route prefix and the bucket (no content; another key's prefix hash differs, so no two keys
/// ever share one).
pub fn routing_key(route_prefix: &Hash, bucket: u32) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"tokensaver routing key v1\0");
    h.update(&route_prefix.0);
    h.update(&bucket.to_le_bytes());
    format!("ts_{}", &h.finalize().to_hex()[..24])
}

/// Whether `key` is one [`routing_key`] makes (a digest client writes only such a key).
pub fn is_routing_key(key: &str) -> bool {
    key.strip_prefix("ts_")
        .is_some_and(|hex| hex.len() == 24 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether the gate sets `prompt_cache_retention: "24h"` on an OpenAI request that sets none:
/// for the models that take it (the provider's list: GPT-4.1 and GPT-5 to GPT-5.5; from
/// GPT-5.6 on the parameter is deprecated for `prompt_cache_options`), and only where the price
/// table bills no cache write above the input price — then the longer retention costs nothing
/// more (both retentions are priced alike), and a session that pauses past the in-memory
/// eviction keeps its prefix.
pub fn extended_retention(model: &str, prices: &Prices) -> bool {
    let m = model.to_ascii_lowercase();
    let takes_it = m.starts_with("gpt-4.1")
        || [
            "gpt-5", "gpt-5.1", "gpt-5.2", "gpt-5.3", "gpt-5.4", "gpt-5.5",
        ]
        .iter()
        .any(|family| {
            m.strip_prefix(family)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
        });
    takes_it && prices.cache_write <= prices.input
}

/// What the gate did to a forwarded call's caching, and what it knew then (a decision row
/// keeps it, so settlement can attribute a saving to its mechanism, and the ledger can tell a
/// rebuild after a pause). Bits, stored as one small integer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CacheEdits(pub u8);

impl CacheEdits {
    /// Breakpoints placed by the gate.
    pub const BREAKPOINTS: u8 = 1;
    /// One-hour lifetime set (Anthropic).
    pub const LIFETIME: u8 = 2;
    /// A routing key placed (OpenAI).
    pub const ROUTING: u8 = 4;
    /// 24-hour retention set (OpenAI).
    pub const RETENTION: u8 = 8;
    /// The call came after a pause of its session (5 minutes to an hour).
    pub const AFTER_PAUSE: u8 = 16;
    /// The routing key moved the call off the prefix's one route (its prefix needed more
    /// than one).
    pub const SPREAD: u8 = 32;

    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    pub fn with(self, bit: u8, on: bool) -> CacheEdits {
        if on {
            CacheEdits(self.0 | bit)
        } else {
            self
        }
    }
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

    fn prices() -> Prices {
        Prices {
            input: 3_000_000,
            cache_write: 3_750_000,
            cache_read: 300_000,
            output: 15_000_000,
            max_output: 64_000,
            cache_write_1h: Some(6_000_000),
            web_search_per_1k: None,
        }
    }

    #[test]
    fn one_hour_entries_pay_only_after_a_pause_and_while_the_premium_is_below_the_rebuild() {
        let p = prices();
        let mut s = SessionCache::default();
        // A session that never pauses: 20 calls a minute apart, each writing 2,000 tokens.
        for i in 0..20 {
            s = s
                .forwarded(NOW + i * 60_000, false)
                .settled(50_000 + i * 2_000);
        }
        let then = NOW + 20 * 60_000;
        assert!(
            !one_hour_pays(&s, then, CACHE_TTL_MS, &p),
            "no pause, no one-hour entries"
        );
        // Six minutes of silence: this call comes after a pause.
        let after = then + 360_000;
        assert!(s.paused_at(after, CACHE_TTL_MS));
        assert!(one_hour_pays(&s, after, CACHE_TTL_MS, &p));
        // An hour or more is no pause: a one-hour entry would have gone too.
        assert!(!s.paused_at(then + 3_600_000, CACHE_TTL_MS));
        // A compressed run (a lifetime of 1 s): a silence of 1.5 s is a pause, of 12 s none.
        let last = s.last_ms.unwrap();
        assert!(s.paused_at(last + 1_500, 1_000));
        assert!(!s.paused_at(last + 999, 1_000) && !s.paused_at(last + 12_000, 1_000));
        // A rebuild after a pause writes the prompt again: that is not growth.
        let rebuilt = s.forwarded(after, true).settled(s.prompt_tokens);
        assert_eq!(rebuilt.grown_tokens, s.grown_tokens);
        // Growth far beyond the prompt per pause: the premium outweighs the rebuild.
        let heavy = SessionCache {
            grown_tokens: 10_000_000,
            ..s.forwarded(after, true)
        };
        assert!(!one_hour_pays(&heavy, after + 1_000, CACHE_TTL_MS, &p));
    }

    #[test]
    fn past_the_rate_each_session_gets_a_route_of_its_own_and_keeps_it() {
        let sessions: Vec<Hash> = (1..=200u8).map(|i| Hash([i; 32])).collect();
        // Below the target rate: one bucket, every session on it.
        assert!(sessions
            .iter()
            .all(|s| routing_bucket(11, true, s) == (0, false)));
        // Above it: each session its own bucket, the same at any rate above.
        let at = |rate| -> Vec<u32> {
            sessions
                .iter()
                .map(|s| routing_bucket(rate, true, s).0)
                .collect()
        };
        let (low, high) = (at(12), at(600));
        assert_eq!(low, high);
        assert!(low.iter().all(|&b| b > 0));
        let distinct: std::collections::HashSet<_> = low.iter().collect();
        assert_eq!(distinct.len(), sessions.len());
        // A lone session keeps the shared bucket at any rate.
        assert!(sessions
            .iter()
            .all(|s| routing_bucket(600, false, s) == (0, false)));
        // The keys differ by bucket and by prefix.
        let (p, q) = (Hash([1; 32]), Hash([2; 32]));
        assert_ne!(routing_key(&p, 0), routing_key(&p, 1));
        assert_ne!(routing_key(&p, 0), routing_key(&q, 0));
    }

    #[test]
    fn retention_where_the_model_takes_it_and_costs_nothing_more() {
        let free = Prices {
            cache_write: 2_000_000,
            input: 2_000_000,
            ..prices()
        };
        assert!(extended_retention("gpt-5.5", &free));
        assert!(extended_retention("gpt-5-codex", &free));
        assert!(extended_retention("gpt-4.1-mini", &free));
        assert!(!extended_retention("gpt-5.6-luna", &free));
        assert!(!extended_retention("gpt-4o", &free));
        // A write premium in the table: not set.
        assert!(!extended_retention("gpt-5.5", &prices()));
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
