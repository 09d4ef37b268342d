//! The gate: a pure decision over plain inputs. No I/O, no clock reads (the clock is an
//! argument), no model call. `decide` is the one function; the rest are its named parts.

pub mod cache;
mod decide;
mod findings;
pub mod keyed_memory;
pub mod mechanisms;
pub mod rules;
pub mod schedule;
mod score;
pub mod windows;

use serde::{Deserialize, Serialize};

pub use decide::{
    decide, decide_paced, decide_with, hold_id_for, Approvals, CacheTerms, Decision, GateInput,
    KeyState, Outcome, Policy,
};
pub use findings::{Finding, FindingCode};
pub use mechanisms::{Mechanism, Mechanisms};
pub use rules::{worst_case, BudgetState, Rule, WorstCase};
pub use score::Signals;
pub use windows::{WindowCounts, Windows};

/// The five verdicts (seed 003 vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    Serve,
    Allow,
    Downgrade,
    Challenge,
    Block,
}

impl Verdict {
    pub const ALL: [Verdict; 5] = [
        Verdict::Serve,
        Verdict::Allow,
        Verdict::Downgrade,
        Verdict::Challenge,
        Verdict::Block,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Serve => "SERVE",
            Verdict::Allow => "ALLOW",
            Verdict::Downgrade => "DOWNGRADE",
            Verdict::Challenge => "CHALLENGE",
            Verdict::Block => "BLOCK",
        }
    }

    /// The verdict [`as_str`](Self::as_str) names.
    pub fn parse(s: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Whether the request goes to the provider.
    pub fn forwards(self) -> bool {
        matches!(self, Verdict::Allow | Verdict::Downgrade)
    }
}

/// The score band a verdict came from, when it came from the score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Band {
    ScoreChallenge,
    ScoreBlock,
}

impl Band {
    pub fn as_str(self) -> &'static str {
        match self {
            Band::ScoreChallenge => "score_challenge",
            Band::ScoreBlock => "score_block",
        }
    }
}

/// Provider-reported usage, normalised to four parts (seed 001's `EconomicsUsage` split).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub input: u64,
    pub cache_write: u64,
    pub cache_read: u64,
    pub output: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.cache_write)
            .saturating_add(self.cache_read)
            .saturating_add(self.output)
    }

    pub fn add(&mut self, other: &Usage) {
        self.input = self.input.saturating_add(other.input);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.output = self.output.saturating_add(other.output);
    }

    /// Spend in nano-USD: each part × its price (micro-USD per million tokens), rounded up.
    pub fn cost_nano(&self, prices: &crate::prices::Prices) -> u64 {
        tokens_cost_nano(self.input, prices.input)
            .saturating_add(tokens_cost_nano(self.cache_write, prices.cache_write))
            .saturating_add(tokens_cost_nano(self.cache_read, prices.cache_read))
            .saturating_add(tokens_cost_nano(self.output, prices.output))
    }
}

/// What the provider bills for one answer: the four parts (the only figures the tiers use) and
/// the billed items the four parts cannot express. Spend is priced from this, so that it is
/// exact; the tiers (`tokens_not_bought`) keep using [`Usage`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Billed {
    pub usage: Usage,
    /// Of `usage.cache_write`, the tokens written to the 1-hour cache (Anthropic
    /// `ephemeral_1h_input_tokens`), priced apart from 5-minute writes. Never more than
    /// `usage.cache_write`.
    #[serde(default)]
    pub cache_write_1h: u64,
    /// Server-side web search requests, billed per request (Anthropic
    /// `server_tool_use.web_search_requests`).
    #[serde(default)]
    pub web_search_requests: u64,
}

impl Billed {
    /// Spend in nano-USD: every part at its own price, each rounded up. 5-minute writes are
    /// `cache_write − cache_write_1h`; 1-hour writes take `cache_write_1h` (absent: twice
    /// the input price, Anthropic's published rule); web search requests take
    /// `web_search_per_1k` (absent: not priced, see `/spec`).
    pub fn cost_nano(&self, prices: &crate::prices::Prices) -> u64 {
        let u = &self.usage;
        let one_hour = self.cache_write_1h.min(u.cache_write);
        tokens_cost_nano(u.input, prices.input)
            .saturating_add(tokens_cost_nano(
                u.cache_write - one_hour,
                prices.cache_write,
            ))
            .saturating_add(tokens_cost_nano(one_hour, prices.cache_write_1h()))
            .saturating_add(tokens_cost_nano(u.cache_read, prices.cache_read))
            .saturating_add(tokens_cost_nano(u.output, prices.output))
            .saturating_add(requests_cost_nano(
                self.web_search_requests,
                prices.web_search_per_1k.unwrap_or(0),
            ))
    }
}

impl From<Usage> for Billed {
    fn from(usage: Usage) -> Self {
        Billed {
            usage,
            ..Billed::default()
        }
    }
}

/// requests × micro-USD-per-1,000-requests → nano-USD (exact: one request costs the price
/// per thousand in nano-USD).
pub fn requests_cost_nano(requests: u64, micro_usd_per_1k: u64) -> u64 {
    requests.saturating_mul(micro_usd_per_1k)
}

/// tokens × micro-USD-per-million → nano-USD, rounded up (exact for prices in whole
/// thousandths of a dollar per million tokens, which covers every published price).
pub fn tokens_cost_nano(tokens: u64, micro_usd_per_mtok: u64) -> u64 {
    let product = u128::from(tokens) * u128::from(micro_usd_per_mtok);
    u64::try_from(product.div_ceil(1000)).unwrap_or(u64::MAX)
}

/// Weights of the score (seed 003 defaults). `unattended` lies outside the base sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Weights {
    pub exposure: f64,
    pub size: f64,
    pub ask: f64,
    pub depth: f64,
    pub tools: f64,
    #[serde(rename = "loop")]
    pub loop_: f64,
    pub burst: f64,
    pub grind: f64,
    pub novelty: f64,
    pub unattended: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            exposure: 0.18,
            size: 0.14,
            ask: 0.14,
            depth: 0.10,
            tools: 0.06,
            loop_: 0.16,
            burst: 0.09,
            grind: 0.07,
            novelty: 0.06,
            unattended: 0.10,
        }
    }
}

/// Where each signal reaches 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Saturation {
    pub size: u64,
    pub ask: u64,
    pub depth: u64,
    pub tools: u64,
    #[serde(rename = "loop")]
    pub loop_: u64,
    pub burst: u64,
    pub grind: u64,
}

impl Default for Saturation {
    fn default() -> Self {
        Self {
            size: 100_000,
            ask: 8_000,
            depth: 40,
            tools: 24,
            loop_: 5,
            burst: 20,
            grind: 200,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bands {
    pub challenge: f64,
    pub block: f64,
}

impl Default for Bands {
    fn default() -> Self {
        Self {
            challenge: 0.55,
            block: 0.80,
        }
    }
}

/// DOWNGRADE is earned, not suspected: every limit must hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DowngradeLimits {
    pub max_score: f64,
    pub max_prompt_chars: u64,
    pub max_turns: u64,
    pub max_output_tokens: u64,
    pub tools_allowed: u64,
}

impl Default for DowngradeLimits {
    fn default() -> Self {
        Self {
            max_score: 0.30,
            max_prompt_chars: 4_000,
            max_turns: 6,
            max_output_tokens: 1_000,
            tools_allowed: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FindingsThresholds {
    /// `carrying_old_turns` fires above this many turns.
    pub old_turns: u64,
    /// `unused_tool_definitions` needs at least this many turns of history.
    pub unused_tools_min_history: u64,
    /// `large_system_prompt_resent` fires at this many system characters.
    pub large_system_chars: u64,
    /// `output_ceiling_authorised` fires at this `max_tokens` (or when absent).
    pub output_ceiling: u64,
    /// `budget_nearly_gone` fires when spend + reserved reaches this percentage of the ceiling.
    pub budget_nearly_gone_percent: u64,
}

impl Default for FindingsThresholds {
    fn default() -> Self {
        Self {
            old_turns: 12,
            unused_tools_min_history: 4,
            large_system_chars: 4_000,
            output_ceiling: 4_096,
            budget_nearly_gone_percent: 90,
        }
    }
}

/// Repeated steps (SPEC §2.3, "Literal repeats and repeated steps"; the schedule is
/// [`schedule`]'s): at most [`rules::STEP_PACE_UNATTENDED`] unattended /
/// [`rules::STEP_PACE_ATTENDED`] attended identical steps are decided in any
/// `pace_window_secs`; past those, each further identical step of a run waits twice as long
/// after the one before as the last did, up to `max_hold_secs` — the longest the gate holds one
/// request, kept below what the clients tolerate — so that a stuck agent's rate falls to one per
/// `max_hold_secs`; a run older than `runaway_after_secs` is BLOCKed (`runaway_step`). The
/// defaults are the SPEC's window and this build's bounds; a test config may scale them down.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StepLimits {
    /// The window a repeated step is paced in (the loop rules' 120 s by default).
    pub pace_window_secs: u64,
    /// The longest one request is held (240 s by default: the tightest client timeout measured
    /// is 300 s — Claude Code's non-streaming fallback, Codex's stream idle timeout — and the
    /// SDKs allow 600 s); also the longest gap the schedule asks between two identical steps,
    /// and the silence after which a step starts a new run.
    pub max_hold_secs: u64,
    /// A run of one step repeated for this long is stopped (`runaway_step`): 90 minutes by
    /// default, so that a poll of a job of an hour (a CI pipeline, a deploy, a long test suite)
    /// completes, and a stuck agent buys at most ~27 calls in all.
    pub runaway_after_secs: u64,
}

impl Default for StepLimits {
    fn default() -> Self {
        Self {
            pace_window_secs: 120,
            max_hold_secs: 240,
            runaway_after_secs: 5_400,
        }
    }
}

impl StepLimits {
    pub fn pace_window_ms(&self) -> u64 {
        self.pace_window_secs.saturating_mul(1_000)
    }

    /// The longest a request may be held in all.
    pub fn max_hold_ms(&self) -> u64 {
        self.max_hold_secs.saturating_mul(1_000)
    }

    pub fn runaway_after_ms(&self) -> u64 {
        self.runaway_after_secs.saturating_mul(1_000)
    }
}

/// The lengths of the windows the hard rules and the score count in (SPEC §2.3–2.4: 120 s for
/// identical requests, 60 s for the burst, an hour for the grind). The hard rules' thresholds
/// are constants; their windows are the SPEC's unless a config shortens them — a
/// time-compressed test or recording against an instant provider, where the step windows
/// (`[gate.steps]`) are shortened by the same factor so that pacing and the score keep their
/// proportions. Never longer than the SPEC's, so a config can only make the windows see less.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WindowLengths {
    pub loop_secs: u64,
    pub burst_secs: u64,
    pub grind_secs: u64,
    /// The provider's default cache lifetime (Anthropic's 5 minutes), by which the gate judges
    /// a session's pauses (SPEC §2.11b: one-hour entries once a session has paused).
    pub cache_secs: u64,
    /// The minute in which the provider counts one cache route's requests (OpenAI: past about
    /// 15 a minute they overflow), by which the gate spreads sessions over routing keys.
    pub route_secs: u64,
}

impl Default for WindowLengths {
    /// The SPEC's lengths (§2.3, §2.4), as `windows.rs` states them once.
    fn default() -> Self {
        Self {
            loop_secs: windows::LOOP_WINDOW_MS / 1_000,
            burst_secs: windows::BURST_WINDOW_MS / 1_000,
            grind_secs: windows::GRIND_WINDOW_MS / 1_000,
            cache_secs: cache::CACHE_TTL_MS / 1_000,
            route_secs: cache::ROUTE_WINDOW_MS / 1_000,
        }
    }
}

/// The tunable part of the gate. Hard rules are absolute and live in `rules.rs` as constants.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GateConfig {
    pub weights: Weights,
    pub saturation: Saturation,
    pub bands: Bands,
    pub downgrade: DowngradeLimits,
    pub findings: FindingsThresholds,
    pub steps: StepLimits,
    pub windows: WindowLengths,
}

impl GateConfig {
    /// Returns the offending field and why.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        let w = &self.weights;
        let weights = [
            w.exposure,
            w.size,
            w.ask,
            w.depth,
            w.tools,
            w.loop_,
            w.burst,
            w.grind,
            w.novelty,
            w.unattended,
        ];
        if weights.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(("weights", "every weight must be a finite number ≥ 0"));
        }
        let s = &self.saturation;
        if [s.size, s.ask, s.depth, s.tools, s.loop_, s.burst, s.grind].contains(&0) {
            return Err(("saturation", "every saturation point must be at least 1"));
        }
        let b = &self.bands;
        if !(b.challenge.is_finite() && b.block.is_finite() && b.challenge <= b.block) {
            return Err(("bands", "challenge must be a number not above block"));
        }
        if !self.downgrade.max_score.is_finite() {
            return Err(("downgrade.max_score", "must be a finite number"));
        }
        let wl = &self.windows;
        let spec = WindowLengths::default();
        if !(1..=spec.loop_secs).contains(&wl.loop_secs) {
            return Err(("windows.loop_secs", "must be between 1 and 120"));
        }
        if !(1..=spec.burst_secs).contains(&wl.burst_secs) {
            return Err(("windows.burst_secs", "must be between 1 and 60"));
        }
        if !(wl.burst_secs..=spec.grind_secs).contains(&wl.grind_secs) {
            return Err(("windows.grind_secs", "must be between burst_secs and 3600"));
        }
        if !(1..=spec.cache_secs).contains(&wl.cache_secs) {
            return Err(("windows.cache_secs", "must be between 1 and 300"));
        }
        if !(1..=spec.route_secs).contains(&wl.route_secs) {
            return Err(("windows.route_secs", "must be between 1 and 60"));
        }
        let st = &self.steps;
        if !(1..=wl.loop_secs).contains(&st.pace_window_secs) {
            return Err((
                "steps.pace_window_secs",
                "must be between 1 and windows.loop_secs (the loop rules' window)",
            ));
        }
        // A digest client waits for the central gate's answer at most 300 s (remote.rs).
        if !(st.pace_window_secs..=280).contains(&st.max_hold_secs) {
            return Err((
                "steps.max_hold_secs",
                "must be between pace_window_secs and 280",
            ));
        }
        if !(st.max_hold_secs..=7 * 86_400).contains(&st.runaway_after_secs) {
            return Err((
                "steps.runaway_after_secs",
                "must be between max_hold_secs and 604800 (a week)",
            ));
        }
        if self.findings.budget_nearly_gone_percent > 100 {
            return Err(("findings.budget_nearly_gone_percent", "must be at most 100"));
        }
        Ok(())
    }
}
