//! Prompt caching as the providers bill it: the prompt's prefix boundaries, the entries of
//! each cache partition and the two billing rules (Anthropic breakpoints, OpenAI automatic
//! prefix caching). The rules, and the public pages they follow, are in the crate docs
//! ("Prompt caching"). Pure: no I/O, the clock is passed in as Unix milliseconds.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::UsageCounting;

/// Most `cache_control` breakpoints an Anthropic request may carry (a fifth is a 400).
pub const MAX_BREAKPOINTS: usize = 4;
/// Block positions an Anthropic breakpoint looks back over for an earlier entry, the
/// breakpoint's own block counted as the first.
pub const LOOKBACK_BLOCKS: usize = 20;
/// Anthropic `ttl: "5m"` (the default), in milliseconds.
pub const FIVE_MINUTES_MS: u64 = 5 * 60 * 1000;
/// Anthropic `ttl: "1h"`, and the most an OpenAI in-memory entry lives, in milliseconds.
pub const ONE_HOUR_MS: u64 = 60 * 60 * 1000;
/// OpenAI `prompt_cache_retention: "24h"`, in milliseconds.
pub const ONE_DAY_MS: u64 = 24 * 60 * 60 * 1000;
/// OpenAI: the shortest prompt that is cached, and the smallest hit.
pub const OPENAI_MIN_TOKENS: u64 = 1024;
/// OpenAI: hits grow in steps of this many tokens above [`OPENAI_MIN_TOKENS`].
pub const OPENAI_STEP_TOKENS: u64 = 128;
/// OpenAI routing: the prompt's first this many tokens (the docs: "typically the first 256
/// tokens") are hashed with `prompt_cache_key` to pick a machine.
pub const OPENAI_ROUTE_TOKENS: u64 = 256;
/// OpenAI routing: past this many requests a minute on one route, requests overflow to other
/// machines (the docs: "approximately 15 requests per minute").
pub const OPENAI_OVERFLOW_PER_MINUTE: usize = 15;
/// Machines an overflowing route spills over to, in turn.
pub const OPENAI_OVERFLOW_MACHINES: usize = 7;
/// The window a route's rate is counted in.
pub const OPENAI_ROUTE_WINDOW_MS: u64 = 60_000;
/// Entries kept over all partitions by default; past it the soonest to expire go first.
pub const DEFAULT_MAX_ENTRIES: usize = 200_000;
/// Expired entries are dropped at most this often (by the cache's clock), every partition in
/// one pass; until then an expired entry reads as absent. Dropping them on every request
/// walked the request's whole partition, so a request's cost grew with the entries held: one
/// credential's 100,000 entries cost ~0.4 ms a request, under the cache's lock.
const SWEEP_EVERY_MS: u64 = 1000;

/// The lifetime an Anthropic breakpoint asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ttl {
    /// `"5m"` (also the default when `ttl` is absent).
    FiveMinutes,
    /// `"1h"`.
    OneHour,
}

impl Ttl {
    /// The lifetime in milliseconds.
    pub fn ms(self) -> u64 {
        match self {
            Ttl::FiveMinutes => FIVE_MINUTES_MS,
            Ttl::OneHour => ONE_HOUR_MS,
        }
    }
}

/// Why an Anthropic request's `cache_control` markers are refused (HTTP 400).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheControlError {
    /// More than [`MAX_BREAKPOINTS`] blocks carry `cache_control` (the automatic form counted).
    TooMany(usize),
    /// A `cache_control` that is not an object with `type: "ephemeral"`.
    BadType,
    /// A `ttl` other than `"5m"` or `"1h"`.
    BadTtl(String),
    /// A `ttl: "1h"` breakpoint after a `ttl: "5m"` one (in the order tools, system, messages).
    TtlOrder,
}

impl CacheControlError {
    /// The error message of the 400 answer.
    pub fn message(&self) -> String {
        match self {
            CacheControlError::TooMany(n) => format!(
                "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {n}."
            ),
            CacheControlError::BadType => {
                "cache_control: Input tag does not match the expected tag 'ephemeral'".to_owned()
            }
            CacheControlError::BadTtl(t) => {
                format!("cache_control.ttl: Input should be '5m' or '1h', got {t}")
            }
            CacheControlError::TtlOrder => "A cache_control block with ttl='1h' must not come \
                 after a cache_control block with ttl='5m' (tools, system, messages order)."
                .to_owned(),
        }
    }
}

/// One position of a prompt where a cached prefix can end: after one block (Anthropic) or
/// one segment (OpenAI).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Boundary {
    /// BLAKE3 chain over the prefix's blocks: what an entry is stored under.
    pub hash: [u8; 32],
    /// The prefix's tokens (see the crate docs for how they are counted).
    pub tokens: u64,
    /// The breakpoint on this block, if any (Anthropic only).
    pub breakpoint: Option<Ttl>,
}

/// The cacheable layout of an Anthropic request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnthropicPrompt {
    /// One boundary per block, in the order tools, system, messages.
    pub boundaries: Vec<Boundary>,
    /// Whether the request carries any `cache_control` (top level or on a block).
    pub marked: bool,
}

/// What an Anthropic request is billed for caching.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnthropicBill {
    /// `cache_read_input_tokens`.
    pub read: u64,
    /// `cache_creation.ephemeral_5m_input_tokens`.
    pub write_5m: u64,
    /// `cache_creation.ephemeral_1h_input_tokens`.
    pub write_1h: u64,
}

impl AnthropicBill {
    /// `cache_creation_input_tokens`.
    pub fn written(&self) -> u64 {
        self.write_5m + self.write_1h
    }
}

/// OpenAI `prompt_cache_retention`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// `"in_memory"` (the default): 5 minutes after the last use, at most 1 hour after the
    /// write.
    InMemory,
    /// `"24h"`: 24 hours after the write.
    Extended,
}

impl Retention {
    /// The request's `prompt_cache_retention` (`"24h"` → extended; anything else in memory).
    pub fn of(body: &Value) -> Retention {
        match body.get("prompt_cache_retention").and_then(Value::as_str) {
            Some("24h") => Retention::Extended,
            _ => Retention::InMemory,
        }
    }
}

/// Which cache an entry lives in: never shared across these.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PartitionKey {
    /// `"messages"`, `"chat"` or `"responses"`.
    pub api: &'static str,
    /// BLAKE3 of the credential the request carried (empty when it carried none).
    pub credential: [u8; 32],
    /// The request's `model`.
    pub model: String,
    /// OpenAI: the cache machine the request was routed to ([`PromptCache::route_openai`];
    /// always `None` for Anthropic). Each machine holds its own entries.
    pub machine: Option<[u8; 32]>,
}

impl PartitionKey {
    /// The partition of a request of `api` with `credential` and `model`, on `machine`.
    pub fn new(
        api: &'static str,
        credential: &str,
        model: &str,
        machine: Option<[u8; 32]>,
    ) -> PartitionKey {
        PartitionKey {
            api,
            credential: *blake3::hash(credential.as_bytes()).as_bytes(),
            model: model.to_owned(),
            machine,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifetime {
    /// Anthropic: this long after the last use (write or read).
    Anthropic(u64),
    /// OpenAI, by retention.
    OpenAi(Retention),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    written_ms: u64,
    expires_ms: u64,
    lifetime: Lifetime,
}

impl Entry {
    fn alive(&self, now: u64) -> bool {
        now < self.expires_ms
    }

    fn new(lifetime: Lifetime, now: u64) -> Entry {
        let mut e = Entry {
            written_ms: now,
            expires_ms: now,
            lifetime,
        };
        e.touch(now);
        e
    }

    /// A use at `now` (a read, or a request that carries this prefix again).
    fn touch(&mut self, now: u64) {
        self.expires_ms = match self.lifetime {
            Lifetime::Anthropic(ttl) => now.saturating_add(ttl),
            Lifetime::OpenAi(Retention::InMemory) => now
                .saturating_add(FIVE_MINUTES_MS)
                .min(self.written_ms.saturating_add(ONE_HOUR_MS)),
            Lifetime::OpenAi(Retention::Extended) => self.written_ms.saturating_add(ONE_DAY_MS),
        };
    }
}

/// Every cache entry of the mock, by partition.
#[derive(Debug)]
pub struct PromptCache {
    parts: HashMap<PartitionKey, HashMap<[u8; 32], Entry>>,
    /// OpenAI routes (prefix and key) → when requests were routed there, the last minute.
    routes: HashMap<[u8; 32], std::collections::VecDeque<u64>>,
    len: usize,
    cap: usize,
    /// When expired entries were last dropped ([`SWEEP_EVERY_MS`]).
    swept_ms: Option<u64>,
}

impl Default for PromptCache {
    fn default() -> Self {
        PromptCache::new(DEFAULT_MAX_ENTRIES)
    }
}

impl PromptCache {
    /// An empty cache keeping at most `cap` entries.
    pub fn new(cap: usize) -> PromptCache {
        PromptCache {
            parts: HashMap::new(),
            routes: HashMap::new(),
            len: 0,
            cap: cap.max(1),
            swept_ms: None,
        }
    }

    /// Entries held (live or not yet purged).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every entry; returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.len;
        self.parts.clear();
        self.len = 0;
        n
    }

    /// The partition (its entries may include expired ones: read them through [`live`]).
    fn partition(&mut self, key: &PartitionKey, now: u64) -> &mut HashMap<[u8; 32], Entry> {
        self.sweep(now, false);
        self.parts.entry(key.clone()).or_default()
    }

    /// Drops the expired entries of every partition, unless that was done less than
    /// [`SWEEP_EVERY_MS`] ago (or `force`). A distance, not an order: the mock's clock can be
    /// set back.
    fn sweep(&mut self, now: u64, force: bool) {
        if !force
            && self
                .swept_ms
                .is_some_and(|t| now.abs_diff(t) < SWEEP_EVERY_MS)
        {
            return;
        }
        self.swept_ms = Some(now);
        for part in self.parts.values_mut() {
            part.retain(|_, e| e.alive(now));
        }
        self.parts.retain(|_, p| !p.is_empty());
        self.len = self.parts.values().map(HashMap::len).sum();
    }

    fn insert(&mut self, key: &PartitionKey, hash: [u8; 32], entry: Entry) {
        let part = self.parts.entry(key.clone()).or_default();
        if part.insert(hash, entry).is_none() {
            self.len += 1;
        }
    }

    /// Keeps the cache within its cap: drops expired entries everywhere, then the soonest to
    /// expire, down to 90 % of the cap. This pass walks every entry, so it must not run for
    /// every new entry: sorting all 200,000 entries on each request at the cap took ~96 ms a
    /// request (the load test's mock fell to ~10 requests/s); with the margin it runs once
    /// per cap/10 new entries, and a selection, not a sort, finds the entries to drop.
    fn enforce_cap(&mut self, now: u64) {
        if self.len <= self.cap {
            return;
        }
        self.sweep(now, true);
        if self.len <= self.cap {
            return;
        }
        let excess = self.len - (self.cap - self.cap / 10);
        let mut keys = Vec::with_capacity(self.parts.len());
        let mut all: Vec<(u64, [u8; 32], usize)> = Vec::with_capacity(self.len);
        for (i, (k, p)) in self.parts.iter().enumerate() {
            keys.push(k.clone());
            all.extend(p.iter().map(|(h, e)| (e.expires_ms, *h, i)));
        }
        // The `excess` soonest to expire (ties by hash) come first.
        all.select_nth_unstable(excess - 1);
        for (_, h, i) in all.into_iter().take(excess) {
            if let Some(p) = keys.get(i).and_then(|k| self.parts.get_mut(k)) {
                if p.remove(&h).is_some() {
                    self.len -= 1;
                }
            }
        }
        self.parts.retain(|_, p| !p.is_empty());
    }

    /// Bills an Anthropic request against partition `key` at `now` and records what it wrote
    /// and read (the rule is in the crate docs): the longest live entry found at a boundary
    /// within [`LOOKBACK_BLOCKS`] of an eligible breakpoint is read; each eligible breakpoint
    /// past it is written, with its TTL. A breakpoint is eligible when its prefix has at least
    /// `min_tokens`. The bill never exceeds `prompt_tokens`.
    pub fn bill_anthropic(
        &mut self,
        key: &PartitionKey,
        prompt: &AnthropicPrompt,
        min_tokens: u64,
        prompt_tokens: u64,
        now: u64,
    ) -> AnthropicBill {
        let b = &prompt.boundaries;
        let eligible: Vec<usize> = (0..b.len())
            .filter(|&i| b[i].breakpoint.is_some() && b[i].tokens >= min_tokens)
            .collect();
        let Some(&last) = eligible.last() else {
            return AnthropicBill::default();
        };
        let part = self.partition(key, now);
        let mut read_at: Option<usize> = None;
        for &bp in &eligible {
            let lo = bp.saturating_sub(LOOKBACK_BLOCKS - 1);
            if let Some(j) = (lo..=bp)
                .rev()
                .find(|&j| live(part, &b[j].hash, now).is_some())
            {
                read_at = Some(read_at.map_or(j, |r| r.max(j)));
            }
        }
        // A read uses every live entry the request's prefix passes through up to the read
        // point: each is refreshed.
        if let Some(r) = read_at {
            for boundary in &b[..=r] {
                if let Some(e) = live(part, &boundary.hash, now) {
                    e.touch(now);
                }
            }
        }
        let read_tokens = read_at.map_or(0, |r| b[r].tokens);
        let mut hour_end = None;
        for &bp in eligible.iter().filter(|&&i| read_at.is_none_or(|r| i > r)) {
            if let Some(ttl) = b[bp].breakpoint {
                if ttl == Ttl::OneHour {
                    hour_end = Some(bp);
                }
                let entry = Entry::new(Lifetime::Anthropic(ttl.ms()), now);
                self.insert(key, b[bp].hash, entry);
            }
        }
        self.enforce_cap(now);
        let end_tokens = if read_at.is_none_or(|r| last > r) {
            b[last].tokens
        } else {
            read_tokens
        };
        let hour_tokens = hour_end.map_or(read_tokens, |h| b[h].tokens);
        let read = read_tokens.min(prompt_tokens);
        let room = prompt_tokens - read;
        let write_1h = hour_tokens.saturating_sub(read_tokens).min(room);
        let write_5m = end_tokens
            .saturating_sub(hour_tokens.max(read_tokens))
            .min(room - write_1h);
        AnthropicBill {
            read,
            write_5m,
            write_1h,
        }
    }

    /// The OpenAI cache machine a request goes to: its route is the hash of the prompt's
    /// first [`OPENAI_ROUTE_TOKENS`] tokens (the first boundary that reaches them, else the
    /// whole prompt) with its `prompt_cache_key`, in its credential's, API's and model's
    /// partition family; a route that took [`OPENAI_OVERFLOW_PER_MINUTE`] requests in the last
    /// minute sends the next ones, in turn, to one of [`OPENAI_OVERFLOW_MACHINES`] other
    /// machines, each with its own cache.
    pub fn route_openai(
        &mut self,
        family: &PartitionKey,
        boundaries: &[Boundary],
        cache_key: Option<&str>,
        now: u64,
    ) -> [u8; 32] {
        let head = boundaries
            .iter()
            .find(|b| b.tokens >= OPENAI_ROUTE_TOKENS)
            .or(boundaries.last())
            .map_or([0; 32], |b| b.hash);
        let mut h = blake3::Hasher::new();
        h.update(family.api.as_bytes());
        h.update(&family.credential);
        h.update(family.model.as_bytes());
        h.update(b"\0");
        h.update(&head);
        h.update(cache_key.unwrap_or("").as_bytes());
        h.update(&[u8::from(cache_key.is_some())]);
        let route = *h.finalize().as_bytes();
        let times = self.routes.entry(route).or_default();
        while times
            .front()
            .is_some_and(|&t| now.saturating_sub(t) >= OPENAI_ROUTE_WINDOW_MS)
        {
            times.pop_front();
        }
        let recent = times.len();
        times.push_back(now);
        if times.len() > 4 * OPENAI_OVERFLOW_PER_MINUTE {
            times.pop_front();
        }
        if self.routes.len() > DEFAULT_MAX_ENTRIES {
            self.routes.retain(|_, t| {
                t.back()
                    .is_some_and(|&b| now.saturating_sub(b) < OPENAI_ROUTE_WINDOW_MS)
            });
        }
        if recent < OPENAI_OVERFLOW_PER_MINUTE {
            return route;
        }
        let spill = (recent - OPENAI_OVERFLOW_PER_MINUTE) % OPENAI_OVERFLOW_MACHINES + 1;
        let mut h = blake3::Hasher::new();
        h.update(&route);
        h.update(&(spill as u64).to_le_bytes());
        *h.finalize().as_bytes()
    }

    /// Bills an OpenAI request (chat or Responses) against partition `key` at `now`: returns
    /// `cached_tokens` and records the prompt's prefixes. Prompts under
    /// [`OPENAI_MIN_TOKENS`] are neither read nor written; otherwise the longest live earlier
    /// prefix is read, rounded down to [`openai_cached`], and every prefix of at least
    /// [`OPENAI_MIN_TOKENS`] is written (or refreshed).
    #[cfg(test)]
    pub fn bill_openai(
        &mut self,
        key: &PartitionKey,
        boundaries: &[Boundary],
        retention: Retention,
        prompt_tokens: u64,
        now: u64,
    ) -> u64 {
        self.bill_openai_writes(key, boundaries, retention, prompt_tokens, now)
            .0
    }

    /// [`Self::bill_openai`], and the tokens newly written: the longest prefix written now
    /// beyond the one read (what a model that bills cache writes reports, GPT-5.6 on).
    pub fn bill_openai_writes(
        &mut self,
        key: &PartitionKey,
        boundaries: &[Boundary],
        retention: Retention,
        prompt_tokens: u64,
        now: u64,
    ) -> (u64, u64) {
        if prompt_tokens < OPENAI_MIN_TOKENS {
            return (0, 0);
        }
        let part = self.partition(key, now);
        let matched = boundaries
            .iter()
            .rev()
            .find(|bd| live(part, &bd.hash, now).is_some())
            .map_or(0, |bd| bd.tokens);
        let mut fresh = Vec::new();
        for bd in boundaries
            .iter()
            .filter(|bd| bd.tokens >= OPENAI_MIN_TOKENS)
        {
            match live(part, &bd.hash, now) {
                Some(e) => e.touch(now),
                None => fresh.push(bd.hash),
            }
        }
        let written = boundaries
            .iter()
            .filter(|bd| fresh.contains(&bd.hash))
            .map(|bd| bd.tokens)
            .max()
            .unwrap_or(0);
        for hash in fresh {
            self.insert(key, hash, Entry::new(Lifetime::OpenAi(retention), now));
        }
        self.enforce_cap(now);
        let cached = openai_cached(matched.min(prompt_tokens));
        (cached, written.min(prompt_tokens).saturating_sub(cached))
    }
}

/// A partition's entry for `hash` if it is alive at `now`: one that expired since the last
/// sweep reads as absent (writing it again replaces it).
fn live<'a>(
    part: &'a mut HashMap<[u8; 32], Entry>,
    hash: &[u8; 32],
    now: u64,
) -> Option<&'a mut Entry> {
    part.get_mut(hash).filter(|e| e.alive(now))
}

/// OpenAI's hit rounding: 0 below [`OPENAI_MIN_TOKENS`], else `1024 + 128·⌊(matched − 1024) / 128⌋`.
pub fn openai_cached(matched: u64) -> u64 {
    if matched < OPENAI_MIN_TOKENS {
        0
    } else {
        matched - (matched - OPENAI_MIN_TOKENS) % OPENAI_STEP_TOKENS
    }
}

/// Whether an OpenAI model bills its cache writes (the provider's prompt-caching guide: "for
/// GPT-5.6 models and later model families, cache writes cost 1.25× the uncached input"):
/// reported as `cache_write_tokens`.
pub fn openai_bills_writes(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    ["gpt-5.6", "gpt-5.7", "gpt-5.8", "gpt-5.9", "gpt-6", "gpt-7"]
        .iter()
        .any(|family| m.starts_with(family))
}

/// The minimum cacheable prefix of an Anthropic model, in tokens, by its name (lowercased,
/// `.` read as `-`): `opus-4-5`, `opus-4-6` or `haiku-4-5` → 4096; `sonnet-4-6` or any other
/// `haiku` → 2048; anything else (Sonnet 4.5, 4, 3.7, Opus 4.1, 4, 3, the mock's own names) → 1024.
pub fn anthropic_min_tokens(model: &str) -> u64 {
    let m = model.to_ascii_lowercase().replace('.', "-");
    if ["opus-4-5", "opus-4-6", "haiku-4-5"]
        .iter()
        .any(|n| m.contains(n))
    {
        4096
    } else if m.contains("sonnet-4-6") || m.contains("haiku") {
        2048
    } else {
        1024
    }
}

/// Compact JSON with object keys sorted bytewise at every level (strings and numbers as
/// `serde_json` prints them): the text whose cl100k tokens a block counts.
pub fn canonical(v: &Value) -> String {
    fn write(out: &mut String, v: &Value) {
        match v {
            Value::Object(m) => {
                let mut entries: Vec<(&String, &Value)> = m.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(out, v);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(out, x);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(&mut out, v);
    out
}

/// One block (Anthropic) or segment (OpenAI) of a prompt, before the chain is built.
struct Block {
    /// What the prefix hash covers: the block and where it sits.
    identity: Value,
    /// The block without `cache_control`: what cl100k counts.
    counted: Value,
    /// Prompt characters of the block under the character rule.
    chars: u64,
    /// `cache_control` markers on the block (its own and its nested ones).
    marks: usize,
    ttl: Option<Ttl>,
    /// Whether the automatic form may put its breakpoint here.
    cacheable: bool,
}

impl Block {
    fn plain(identity: Value, counted: Value, chars: u64) -> Block {
        Block {
            identity,
            counted,
            chars,
            marks: 0,
            ttl: None,
            cacheable: true,
        }
    }
}

fn parse_mark(v: &Value) -> Result<Option<Ttl>, CacheControlError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(m) => {
            if m.get("type").and_then(Value::as_str) != Some("ephemeral") {
                return Err(CacheControlError::BadType);
            }
            match m.get("ttl") {
                None | Some(Value::Null) => Ok(Some(Ttl::FiveMinutes)),
                Some(Value::String(s)) if s == "5m" => Ok(Some(Ttl::FiveMinutes)),
                Some(Value::String(s)) if s == "1h" => Ok(Some(Ttl::OneHour)),
                Some(other) => Err(CacheControlError::BadTtl(other.to_string())),
            }
        }
        _ => Err(CacheControlError::BadType),
    }
}

/// Takes `cache_control` off an object, returning the parsed marker.
fn take_mark(m: &mut Map<String, Value>) -> Result<Option<Ttl>, CacheControlError> {
    match m.remove("cache_control") {
        Some(v) => parse_mark(&v),
        None => Ok(None),
    }
}

fn text_block(s: &str) -> Value {
    let mut m = Map::new();
    m.insert("text".into(), Value::String(s.to_owned()));
    m.insert("type".into(), Value::String("text".into()));
    Value::Object(m)
}

/// An Anthropic content block (or tool, or system block) with its markers taken off: its own
/// `cache_control` and those of the blocks in its `content` array (a `tool_result`'s).
fn anthropic_block(
    raw: &Value,
    identity: impl FnOnce(Value) -> Value,
    chars: u64,
) -> Result<Block, CacheControlError> {
    let mut counted = raw.clone();
    let mut marks = 0;
    let mut ttl = None;
    let mut cacheable = true;
    if let Value::Object(m) = &mut counted {
        if let Some(t) = take_mark(m)? {
            marks += 1;
            ttl = Some(t);
        }
        if let Some(Value::Array(inner)) = m.get_mut("content") {
            for part in inner.iter_mut() {
                if let Value::Object(pm) = part {
                    if let Some(t) = take_mark(pm)? {
                        marks += 1;
                        ttl = ttl.or(Some(t));
                    }
                }
            }
        }
        cacheable = !matches!(
            m.get("type").and_then(Value::as_str),
            Some("thinking" | "redacted_thinking")
        );
    }
    Ok(Block {
        identity: identity(counted.clone()),
        counted,
        chars,
        marks,
        ttl,
        cacheable,
    })
}

fn placed(part: &str, extra: &[(&str, Value)], block: Value) -> Value {
    let mut m = Map::new();
    m.insert("part".into(), Value::String(part.to_owned()));
    for (k, v) in extra {
        m.insert((*k).to_owned(), v.clone());
    }
    m.insert("block".into(), block);
    Value::Object(m)
}

fn str_chars(s: &str) -> u64 {
    s.chars().count() as u64
}

fn text_field_chars(v: &Value) -> u64 {
    v.get("text").and_then(Value::as_str).map_or(0, str_chars)
}

/// The blocks of an Anthropic request in cache order (tools, system, messages), its markers
/// checked. A string `system` or message `content` is one text block.
fn anthropic_blocks(body: &Value) -> Result<(Vec<Block>, bool), CacheControlError> {
    let mut blocks = Vec::new();
    if let Some(Value::Array(tools)) = body.get("tools") {
        for t in tools {
            blocks.push(anthropic_block(t, |b| placed("tools", &[], b), 0)?);
        }
    }
    match body.get("system") {
        Some(Value::String(s)) => {
            let b = text_block(s);
            blocks.push(Block::plain(
                placed("system", &[], b.clone()),
                b,
                str_chars(s),
            ));
        }
        Some(Value::Array(parts)) => {
            for p in parts {
                blocks.push(anthropic_block(
                    p,
                    |b| placed("system", &[], b),
                    text_field_chars(p),
                )?);
            }
        }
        _ => {}
    }
    if let Some(Value::Array(msgs)) = body.get("messages") {
        for (i, msg) in msgs.iter().enumerate() {
            let role = msg.get("role").cloned().unwrap_or(Value::Null);
            let at = [("message", Value::from(i as u64)), ("role", role)];
            match msg.get("content") {
                Some(Value::String(s)) => {
                    let b = text_block(s);
                    blocks.push(Block::plain(
                        placed("messages", &at, b.clone()),
                        b,
                        str_chars(s),
                    ));
                }
                Some(Value::Array(parts)) => {
                    for p in parts {
                        blocks.push(anthropic_block(
                            p,
                            |b| placed("messages", &at, b),
                            text_field_chars(p),
                        )?);
                    }
                }
                _ => {}
            }
        }
    }
    let mut marked = blocks.iter().any(|b| b.marks > 0);
    // The automatic form: a top-level cache_control puts a breakpoint on the last cacheable
    // block, unless that block already carries one.
    if let Some(top) = body.get("cache_control") {
        if let Some(ttl) = parse_mark(top)? {
            marked = true;
            if let Some(last) = blocks.iter_mut().rev().find(|b| b.cacheable) {
                if last.marks == 0 {
                    last.marks = 1;
                    last.ttl = Some(ttl);
                }
            }
        }
    }
    let total: usize = blocks.iter().map(|b| b.marks).sum();
    if total > MAX_BREAKPOINTS {
        return Err(CacheControlError::TooMany(total));
    }
    let mut seen_5m = false;
    for ttl in blocks.iter().filter_map(|b| b.ttl) {
        match ttl {
            Ttl::FiveMinutes => seen_5m = true,
            Ttl::OneHour if seen_5m => return Err(CacheControlError::TtlOrder),
            Ttl::OneHour => {}
        }
    }
    Ok((blocks, marked))
}

/// Checks an Anthropic body's `cache_control` markers without counting any token; returns
/// whether it carries one.
pub fn check_anthropic(body: &Value) -> Result<bool, CacheControlError> {
    anthropic_blocks(body).map(|(_, marked)| marked)
}

/// Builds the boundaries: the BLAKE3 chain over the blocks' identities (seeded by `api`) and
/// each prefix's tokens under `counting`.
fn chain(api: &str, blocks: &[Block], counting: UsageCounting) -> Vec<Boundary> {
    let mut h = *blake3::hash(format!("tokensaver-mock prompt cache/{api}").as_bytes()).as_bytes();
    let mut chars = 0u64;
    let mut tokens = 0u64;
    blocks
        .iter()
        .map(|b| {
            let mut hasher = blake3::Hasher::new();
            hasher.update(&h);
            hasher.update(canonical(&b.identity).as_bytes());
            h = *hasher.finalize().as_bytes();
            chars += b.chars;
            let prefix_tokens = match counting {
                UsageCounting::Chars => chars.div_ceil(4),
                UsageCounting::Cl100k => {
                    tokens += tokensaver_tokenizer::count(&canonical(&b.counted)).unwrap_or(0);
                    tokens
                }
            };
            Boundary {
                hash: h,
                tokens: prefix_tokens,
                breakpoint: if b.marks > 0 { b.ttl } else { None },
            }
        })
        .collect()
}

/// The cacheable layout of an Anthropic messages body, or why its markers are refused.
pub fn anthropic_prompt(
    body: &Value,
    counting: UsageCounting,
) -> Result<AnthropicPrompt, CacheControlError> {
    let (blocks, marked) = anthropic_blocks(body)?;
    // Without a breakpoint nothing is read or written: no need to count.
    let boundaries = if blocks.iter().any(|b| b.marks > 0) {
        chain("messages", &blocks, counting)
    } else {
        Vec::new()
    };
    Ok(AnthropicPrompt { boundaries, marked })
}

/// The prefix boundaries of an OpenAI chat-completions body: each `tools[]` element, then
/// each `messages[]` element.
pub fn chat_prompt(body: &Value, counting: UsageCounting) -> Vec<Boundary> {
    let mut blocks = Vec::new();
    if let Some(Value::Array(tools)) = body.get("tools") {
        for t in tools {
            blocks.push(Block::plain(placed("tools", &[], t.clone()), t.clone(), 0));
        }
    }
    if let Some(Value::Array(msgs)) = body.get("messages") {
        for m in msgs {
            let chars = m.get("content").map_or(0, crate::content_chars);
            blocks.push(Block::plain(
                placed("messages", &[], m.clone()),
                m.clone(),
                chars,
            ));
        }
    }
    chain("chat", &blocks, counting)
}

/// The prefix boundaries of an OpenAI Responses body: each `tools[]` element, `instructions`
/// (a string), then `input` (a string is one user message `{"content","role":"user"}`, an
/// array one segment per item).
pub fn responses_prompt(body: &Value, counting: UsageCounting) -> Vec<Boundary> {
    let mut blocks = Vec::new();
    if let Some(Value::Array(tools)) = body.get("tools") {
        for t in tools {
            blocks.push(Block::plain(placed("tools", &[], t.clone()), t.clone(), 0));
        }
    }
    if let Some(Value::String(s)) = body.get("instructions") {
        let v = Value::String(s.clone());
        blocks.push(Block::plain(
            placed("instructions", &[], v.clone()),
            v,
            str_chars(s),
        ));
    }
    match body.get("input") {
        Some(Value::String(s)) => {
            let mut m = Map::new();
            m.insert("content".into(), Value::String(s.clone()));
            m.insert("role".into(), Value::String("user".into()));
            let v = Value::Object(m);
            blocks.push(Block::plain(
                placed("input", &[], v.clone()),
                v,
                str_chars(s),
            ));
        }
        Some(Value::Array(items)) => {
            for item in items {
                blocks.push(Block::plain(
                    placed("input", &[], item.clone()),
                    item.clone(),
                    crate::responses::item_chars(item),
                ));
            }
        }
        _ => {}
    }
    chain("responses", &blocks, counting)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    fn key(cred: &str) -> PartitionKey {
        PartitionKey::new("messages", cred, "claude-sonnet-4-5", None)
    }

    /// A prompt of boundaries with the given prefix tokens and breakpoints; hashes from `tag`
    /// and the position, so two prompts with the same tag share their prefixes.
    fn prompt(tag: &str, spec: &[(u64, Option<Ttl>)]) -> AnthropicPrompt {
        AnthropicPrompt {
            boundaries: spec
                .iter()
                .enumerate()
                .map(|(i, &(tokens, breakpoint))| Boundary {
                    hash: *blake3::hash(format!("{tag}/{i}").as_bytes()).as_bytes(),
                    tokens,
                    breakpoint,
                })
                .collect(),
            marked: true,
        }
    }

    const M5: Option<Ttl> = Some(Ttl::FiveMinutes);
    const H1: Option<Ttl> = Some(Ttl::OneHour);

    #[test]
    fn openai_rounding() {
        assert_eq!(openai_cached(0), 0);
        assert_eq!(openai_cached(1023), 0);
        assert_eq!(openai_cached(1024), 1024);
        assert_eq!(openai_cached(1151), 1024);
        assert_eq!(openai_cached(1152), 1152);
        assert_eq!(openai_cached(5000), 1024 + 128 * 31);
    }

    #[test]
    fn minimum_lengths_by_model() {
        assert_eq!(anthropic_min_tokens("claude-sonnet-4-5-20250929"), 1024);
        assert_eq!(anthropic_min_tokens("claude-opus-4-1"), 1024);
        assert_eq!(anthropic_min_tokens("claude-3-7-sonnet-latest"), 1024);
        assert_eq!(anthropic_min_tokens("claude-opus-4-5-20251101"), 4096);
        assert_eq!(anthropic_min_tokens("claude-opus-4.6"), 4096);
        assert_eq!(anthropic_min_tokens("claude-haiku-4-5"), 4096);
        assert_eq!(anthropic_min_tokens("claude-3-5-haiku-20241022"), 2048);
        assert_eq!(anthropic_min_tokens("claude-sonnet-4-6"), 2048);
        assert_eq!(anthropic_min_tokens("mock-large"), 1024);
    }

    #[test]
    fn write_then_read_then_extend() {
        let mut c = PromptCache::default();
        let k = key("a");
        let p1 = prompt("x", &[(600, None), (1500, M5), (1700, None)]);
        let b = c.bill_anthropic(&k, &p1, 1024, 1800, 0);
        assert_eq!(
            b,
            AnthropicBill {
                read: 0,
                write_5m: 1500,
                write_1h: 0
            }
        );
        let b = c.bill_anthropic(&k, &p1, 1024, 1800, 1000);
        assert_eq!(
            b,
            AnthropicBill {
                read: 1500,
                write_5m: 0,
                write_1h: 0
            }
        );
        // The same prefix, a second breakpoint further on: read 1500, write the rest.
        let p2 = prompt("x", &[(600, None), (1500, M5), (1700, None), (2500, M5)]);
        let b = c.bill_anthropic(&k, &p2, 1024, 2600, 2000);
        assert_eq!(
            b,
            AnthropicBill {
                read: 1500,
                write_5m: 1000,
                write_1h: 0
            }
        );
        assert_eq!(c.len(), 2);
        // Another credential sees none of it.
        let b = c.bill_anthropic(&key("b"), &p1, 1024, 1800, 3000);
        assert_eq!(b.read, 0);
    }

    #[test]
    fn below_minimum_is_neither_written_nor_read() {
        let mut c = PromptCache::default();
        let p = prompt("x", &[(1000, M5)]);
        assert_eq!(
            c.bill_anthropic(&key("a"), &p, 1024, 1100, 0),
            AnthropicBill::default()
        );
        assert_eq!(c.len(), 0);
        assert_eq!(
            c.bill_anthropic(&key("a"), &p, 1024, 1100, 1),
            AnthropicBill::default()
        );
    }

    #[test]
    fn lookback_finds_an_entry_within_twenty_blocks() {
        let mut c = PromptCache::default();
        let k = key("a");
        let mut spec: Vec<(u64, Option<Ttl>)> = (0..40).map(|i| (2000 + i * 10, None)).collect();
        spec[10].1 = M5;
        c.bill_anthropic(&k, &prompt("x", &spec[..11]), 1024, 9999, 0);
        // Breakpoint at 29: the window is 10..=29, so the entry at 10 is read.
        spec[10].1 = None;
        spec[29].1 = M5;
        let b = c.bill_anthropic(&k, &prompt("x", &spec[..30]), 1024, 9999, 1);
        assert_eq!(b.read, 2100);
        assert_eq!(b.write_5m, 2290 - 2100);
        // Breakpoint at 31 on a fresh cache with the entry at 10 only: out of the window.
        let mut c = PromptCache::default();
        spec[29].1 = None;
        spec[10].1 = M5;
        c.bill_anthropic(&k, &prompt("x", &spec[..11]), 1024, 9999, 0);
        spec[10].1 = None;
        spec[30].1 = M5;
        let b = c.bill_anthropic(&k, &prompt("x", &spec[..31]), 1024, 9999, 1);
        assert_eq!(b.read, 0);
        assert_eq!(b.write_5m, 2300);
    }

    #[test]
    fn ttl_expiry_refresh_and_mixed_ttls() {
        let mut c = PromptCache::default();
        let k = key("a");
        let p = prompt("x", &[(2000, M5)]);
        c.bill_anthropic(&k, &p, 1024, 2100, 0);
        // Read just before expiry refreshes it.
        assert_eq!(
            c.bill_anthropic(&k, &p, 1024, 2100, FIVE_MINUTES_MS - 1)
                .read,
            2000
        );
        assert_eq!(
            c.bill_anthropic(&k, &p, 1024, 2100, 2 * FIVE_MINUTES_MS - 2)
                .read,
            2000
        );
        // Exactly at expiry it is gone (half-open): written again.
        let b = c.bill_anthropic(&k, &p, 1024, 2100, 3 * FIVE_MINUTES_MS - 2);
        assert_eq!(
            b,
            AnthropicBill {
                read: 0,
                write_5m: 2000,
                write_1h: 0
            }
        );
        // 1h before 5m: the split follows the breakpoints.
        let mut c = PromptCache::default();
        let p = prompt("y", &[(1500, H1), (1800, None), (3000, M5)]);
        let b = c.bill_anthropic(&k, &p, 1024, 3100, 0);
        assert_eq!(
            b,
            AnthropicBill {
                read: 0,
                write_5m: 1500,
                write_1h: 1500
            }
        );
        // After 10 minutes only the 1h entry lives.
        let b = c.bill_anthropic(&k, &p, 1024, 3100, 2 * FIVE_MINUTES_MS);
        assert_eq!(
            b,
            AnthropicBill {
                read: 1500,
                write_5m: 1500,
                write_1h: 0
            }
        );
    }

    #[test]
    fn the_bill_never_exceeds_the_prompt() {
        let mut c = PromptCache::default();
        let p = prompt("x", &[(1500, H1), (3000, M5)]);
        let b = c.bill_anthropic(&key("a"), &p, 1024, 2000, 0);
        assert_eq!(
            b,
            AnthropicBill {
                read: 0,
                write_5m: 500,
                write_1h: 1500
            }
        );
    }

    #[test]
    fn openai_longest_prefix_and_lifetime() {
        let mut c = PromptCache::default();
        let k = PartitionKey::new("chat", "a", "gpt-4o", None);
        let p = prompt("x", &[(500, None), (1300, None), (2000, None)]).boundaries;
        assert_eq!(c.bill_openai(&k, &p, Retention::InMemory, 2100, 0), 0);
        assert_eq!(c.len(), 2);
        let q = prompt("x", &[(500, None), (1300, None), (1900, None)]);
        let mut q = q.boundaries;
        q[2].hash = [7; 32];
        assert_eq!(c.bill_openai(&k, &q, Retention::InMemory, 2000, 1000), 1280);
        // Short prompts: nothing.
        assert_eq!(
            c.bill_openai(&k, &p[..1], Retention::InMemory, 600, 1000),
            0
        );
        // Inactivity: 5 minutes after the last use.
        assert_eq!(
            c.bill_openai(&k, &p, Retention::InMemory, 2100, 1000 + FIVE_MINUTES_MS),
            0
        );
        // Kept alive by use, but never past one hour after the write.
        let mut c = PromptCache::default();
        let mut t = 0;
        c.bill_openai(&k, &p, Retention::InMemory, 2100, t);
        while t + 4 * 60 * 1000 < ONE_HOUR_MS {
            t += 4 * 60 * 1000;
            assert_eq!(
                c.bill_openai(&k, &p, Retention::InMemory, 2100, t),
                1920,
                "{t}"
            );
        }
        assert_eq!(
            c.bill_openai(&k, &p, Retention::InMemory, 2100, ONE_HOUR_MS),
            0
        );
        // 24h retention: a day after the write.
        let mut c = PromptCache::default();
        c.bill_openai(&k, &p, Retention::Extended, 2100, 0);
        assert_eq!(
            c.bill_openai(&k, &p, Retention::Extended, 2100, ONE_DAY_MS - 1),
            1920
        );
        assert_eq!(
            c.bill_openai(&k, &p, Retention::Extended, 2100, ONE_DAY_MS),
            0
        );
    }

    #[test]
    fn the_cap_drops_the_soonest_to_expire() {
        let mut c = PromptCache::new(2);
        let k = key("a");
        c.bill_anthropic(&k, &prompt("a", &[(2000, M5)]), 1024, 2100, 0);
        c.bill_anthropic(&k, &prompt("b", &[(2000, H1)]), 1024, 2100, 1);
        c.bill_anthropic(&k, &prompt("c", &[(2000, M5)]), 1024, 2100, 2);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.bill_anthropic(&k, &prompt("b", &[(2000, H1)]), 1024, 2100, 3)
                .read,
            2000
        );
        assert_eq!(c.clear(), 2);
    }

    #[test]
    fn past_the_cap_it_drops_to_ninety_percent() {
        let mut c = PromptCache::new(20);
        let k = key("a");
        for (i, tag) in ["a", "b"].iter().cycle().take(21).enumerate() {
            let p = prompt(&format!("{tag}{i}"), &[(2000, M5)]);
            c.bill_anthropic(&k, &p, 1024, 2100, i as u64);
        }
        assert_eq!(c.len(), 18);
        // The three written first went; the fourth is still read.
        let read = |c: &mut PromptCache, tag: &str| {
            c.bill_anthropic(&k, &prompt(tag, &[(2000, M5)]), 1024, 2100, 30)
                .read
        };
        assert_eq!(read(&mut c, "a2"), 0);
        assert_eq!(read(&mut c, "b3"), 2000);
    }

    #[test]
    fn an_expired_entry_reads_as_absent_before_it_is_swept() {
        let mut c = PromptCache::default();
        let p = prompt("x", &[(2000, M5)]);
        c.bill_anthropic(&key("a"), &p, 1024, 2100, 0);
        // Another partition's request sweeps just before the entry expires...
        c.bill_anthropic(&key("b"), &p, 1024, 2100, FIVE_MINUTES_MS - 1);
        assert_eq!(c.len(), 2);
        // ...so the next sweep is not due when it does: still held, no longer read.
        let b = c.bill_anthropic(&key("a"), &p, 1024, 2100, FIVE_MINUTES_MS);
        assert_eq!((b.read, b.write_5m), (0, 2000));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn markers_are_counted_and_checked() {
        let text = |t: &str, cc: Option<Value>| {
            let mut b = json!({"type": "text", "text": t});
            if let Some(cc) = cc {
                b["cache_control"] = cc;
            }
            b
        };
        let eph = || Some(json!({"type": "ephemeral"}));
        let five: Vec<Value> = (0..5).map(|i| text(&format!("t{i}"), eph())).collect();
        let body = json!({"messages": [{"role": "user", "content": five}]});
        assert_eq!(
            anthropic_prompt(&body, UsageCounting::Chars),
            Err(CacheControlError::TooMany(5))
        );
        // Four explicit plus the automatic one on a fifth block: five.
        let mut four = five.clone();
        four[4] = text("t4", None);
        let body = json!({"cache_control": {"type": "ephemeral"},
                          "messages": [{"role": "user", "content": four.clone()}]});
        assert_eq!(
            anthropic_prompt(&body, UsageCounting::Chars),
            Err(CacheControlError::TooMany(5))
        );
        // ...but on a block that already has one, the automatic form adds nothing.
        four.pop();
        let body = json!({"cache_control": {"type": "ephemeral"},
                          "messages": [{"role": "user", "content": four}]});
        let p = anthropic_prompt(&body, UsageCounting::Chars).unwrap();
        assert_eq!(
            p.boundaries
                .iter()
                .filter(|b| b.breakpoint.is_some())
                .count(),
            4
        );
        let body = json!({"system": [text("a", Some(json!({"type": "ephemeral", "ttl": "5m"}))),
                                     text("b", Some(json!({"type": "ephemeral", "ttl": "1h"})))]});
        assert_eq!(
            anthropic_prompt(&body, UsageCounting::Chars),
            Err(CacheControlError::TtlOrder)
        );
        let body = json!({"system": [text("a", Some(json!({"type": "ephemeral", "ttl": "2h"})))]});
        assert!(matches!(
            anthropic_prompt(&body, UsageCounting::Chars),
            Err(CacheControlError::BadTtl(_))
        ));
        let body = json!({"system": [text("a", Some(json!({"type": "persistent"})))]});
        assert_eq!(
            anthropic_prompt(&body, UsageCounting::Chars),
            Err(CacheControlError::BadType)
        );
    }

    #[test]
    fn markers_do_not_change_the_prefix_and_strings_are_text_blocks() {
        // `a` marks only its last block (the automatic form), `b` two blocks explicitly.
        let a = json!({"cache_control": {"type": "ephemeral"}, "system": "S", "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]});
        let b = json!({"system": [{"type": "text", "text": "S",
                                   "cache_control": {"type": "ephemeral"}}],
                       "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "hi",
                                               "cache_control": {"type": "ephemeral"}}]}]});
        let pa = anthropic_prompt(&a, UsageCounting::Cl100k).unwrap();
        let pb = anthropic_prompt(&b, UsageCounting::Cl100k).unwrap();
        assert!(pa.marked && pb.marked);
        let strip = |p: &AnthropicPrompt| -> Vec<([u8; 32], u64)> {
            p.boundaries.iter().map(|b| (b.hash, b.tokens)).collect()
        };
        assert_eq!(strip(&pa), strip(&pb));
        // Characters: 1, 6, 8 → tokens ceil(c/4).
        let pc = anthropic_prompt(&a, UsageCounting::Chars).unwrap();
        let t: Vec<u64> = pc.boundaries.iter().map(|b| b.tokens).collect();
        assert_eq!(t, vec![1, 2, 2]);
        // The same text as a different role is a different prefix.
        let c = json!({"cache_control": {"type": "ephemeral"}, "system": "S",
                       "messages": [{"role": "assistant", "content": "hello"}]});
        let pc = anthropic_prompt(&c, UsageCounting::Chars).unwrap();
        assert_eq!(pc.boundaries[0].hash, pa.boundaries[0].hash);
        assert_ne!(pc.boundaries[1].hash, pa.boundaries[1].hash);
    }

    #[test]
    fn an_unmarked_request_is_not_counted() {
        let body = json!({"system": "S", "messages": [{"role": "user", "content": "q"}]});
        let p = anthropic_prompt(&body, UsageCounting::Cl100k).unwrap();
        assert_eq!(p, AnthropicPrompt::default());
        assert_eq!(
            PromptCache::default().bill_anthropic(&key("a"), &p, 1024, 10, 0),
            AnthropicBill::default()
        );
    }

    #[test]
    fn automatic_form_skips_thinking_blocks() {
        let body = json!({"cache_control": {"type": "ephemeral", "ttl": "1h"}, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                              {"type": "thinking", "thinking": "..."}]}]});
        let p = anthropic_prompt(&body, UsageCounting::Chars).unwrap();
        let marks: Vec<Option<Ttl>> = p.boundaries.iter().map(|b| b.breakpoint).collect();
        assert_eq!(marks, vec![None, H1, None]);
    }

    #[test]
    fn canonical_sorts_keys() {
        assert_eq!(
            canonical(&json!({"b": [1, {"d": "x", "c": null}], "a": "é\n"})),
            "{\"a\":\"é\\n\",\"b\":[1,{\"c\":null,\"d\":\"x\"}]}"
        );
    }
}
