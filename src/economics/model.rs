//! The economics benchmark's data model, in seed 001's vocabulary: the query, the summary and
//! everything in it, the methodology declaration and the recorded evidence.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The input of `economics.summary`: optional narrowing of the pairs and metrics. The verdict
/// is always about all the evidence, whatever is narrowed, and a narrowed metric is never
/// verified: the publication rule was evaluated over all of it, not over a slice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EconomicsQuery {
    /// Only this suite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suite: Option<String>,
    /// Only tasks of this category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Only runs that asked for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Only this task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

impl EconomicsQuery {
    /// Whether any filter is set.
    pub fn is_narrowed(&self) -> bool {
        self.suite.is_some()
            || self.category.is_some()
            || self.model.is_some()
            || self.task.is_some()
    }
}

/// How a number came to be, ordered from strongest to weakest. A value computed from several
/// inputs is never stronger than the weakest of them ([`EconomicsClass::weakest`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EconomicsClass {
    /// Returned by the provider or its harness at run time and recorded unmodified.
    Observed,
    /// Computed deterministically from bytes on disk with a named, pinned tokenizer.
    Counted,
    /// Arithmetic over observed or counted values.
    Derived,
    /// A number standing in for one nobody measured. Never compared, never published.
    Estimated,
    /// What a mechanism would have avoided, modelled rather than observed.
    Counterfactual,
}

impl EconomicsClass {
    /// The weakest of `classes` (`None` for none).
    pub fn weakest(classes: &[EconomicsClass]) -> Option<EconomicsClass> {
        classes.iter().copied().max()
    }
}

/// A run's totals, derived from its raw usage: the four-part split.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EconomicsUsage {
    /// Input neither read from nor written to the cache.
    pub input_uncached: u64,
    /// Input written to the cache.
    pub cache_write: u64,
    /// Input read from the cache.
    pub cache_read: u64,
    /// Output, reasoning included.
    pub output: u64,
    /// All input.
    pub total_input: u64,
    /// All input and output.
    pub total: u64,
    /// Provider requests (a SERVE or a BLOCK is none).
    pub requests: u64,
    /// Tool calls.
    pub tool_calls: u64,
}

impl EconomicsUsage {
    /// Add one provider answer's usage.
    pub fn add_step(&mut self, u: &StepUsage) {
        self.input_uncached += u.input_uncached;
        self.cache_write += u.cache_write;
        self.cache_read += u.cache_read;
        self.output += u.output;
        self.total_input = self.input_uncached + self.cache_write + self.cache_read;
        self.total = self.total_input + self.output;
    }
}

/// The shape of a set of per-pair values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsDistribution {
    pub n: usize,
    pub mean: f64,
    pub median: f64,
    pub p25: f64,
    pub p75: f64,
    pub p95: f64,
    pub min: f64,
    pub max: f64,
    /// Sample standard deviation; absent for one value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sd: Option<f64>,
}

/// A bootstrap interval, with everything needed to reproduce it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsInterval {
    /// Confidence in basis points.
    pub level_bp: u32,
    pub low: f64,
    pub high: f64,
    /// How it was computed.
    pub method: String,
    pub resamples: u32,
    /// Generator seed.
    pub seed: u64,
}

/// Where a metric stands against the publication rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EconomicsMetricStatus {
    /// Measured, and meets the publication rule (only the primary metric over all evidence).
    Verified,
    /// Measured, but no claim may rest on it.
    Preliminary,
    /// Measured deterministically; the publication rule for sampled data does not apply.
    Measured,
    /// Nothing recorded to compute it from.
    NotMeasured,
}

/// One metric: its value, where it comes from, and how much it can bear.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsMetric {
    pub id: String,
    pub title: String,
    pub class: EconomicsClass,
    /// For a derived metric, the class of what it was derived from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<EconomicsClass>,
    /// `ratio`, `tokens`, `requests`.
    pub unit: String,
    pub formula: String,
    pub status: EconomicsMetricStatus,
    pub n: usize,
    pub suite: String,
    /// The headline value; absent when nothing was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<EconomicsDistribution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<EconomicsInterval>,
    /// The runs, pairs or sessions it rests on.
    #[serde(default)]
    pub evidence: Vec<String>,
    /// What the metric is not, where it is easily mistaken for something else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not: Option<String>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// Why a pair does or does not count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EconomicsPairStatus {
    /// Both runs succeeded, are comparable and report usage.
    Valid,
    /// The control run failed a success gate.
    ControlFailed,
    /// The treatment run failed a success gate.
    TreatmentFailed,
    /// Both failed.
    BothFailed,
    /// A run reports no usage to compare.
    UsageUnavailable,
    /// The runs differ in something the methodology requires them to share.
    Incomparable,
    /// One side was never recorded.
    Missing,
    /// A run is excluded under the outlier rule (this methodology declares none).
    Excluded,
}

/// A control run and its treatment run, and what follows from them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsPair {
    pub suite: String,
    pub task: String,
    pub category: String,
    /// Sessions the task spans.
    pub sessions: u32,
    pub repetition: u32,
    /// The model the session asks for.
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub treatment: Option<String>,
    pub status: EconomicsPairStatus,
    #[serde(default)]
    pub reasons: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_usage: Option<EconomicsUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub treatment_usage: Option<EconomicsUsage>,
    /// `1 - treatment / control` on total tokens. Negative: the treatment cost more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_reduction: Option<f64>,
    /// The same on provider requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_reduction: Option<f64>,
    /// The usage the provider reported for the answers the gate served from its store
    /// (observed; the gate's `tokens_not_bought`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_not_bought: Option<u64>,
}

/// Pair counts of a suite, so that nothing is dropped out of sight.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EconomicsPairCounts {
    pub declared: usize,
    pub attempted: usize,
    pub valid: usize,
    pub control_failed: usize,
    pub treatment_failed: usize,
    pub both_failed: usize,
    /// Pairs not comparable, missing a side, lacking usage, or excluded.
    pub other: usize,
}

/// How recorded evidence stands against the build and methodology as they are now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EconomicsFreshness {
    /// Recorded under this methodology and gate version, within the freshness window.
    Current,
    /// Recorded under this methodology, but the gate changed since or it is too old.
    Stale,
    /// Recorded under another methodology version: not comparable at all.
    Incompatible,
    /// Nothing recorded.
    NoEvidence,
}

/// A suite and the state of its evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsSuiteView {
    pub id: String,
    /// `live` or `context`.
    pub kind: String,
    pub version: u32,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub freshness: EconomicsFreshness,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freshness_detail: Option<String>,
    pub runs: usize,
    pub pairs: EconomicsPairCounts,
    /// The gate versions the evidence was recorded with.
    #[serde(default)]
    pub revisions: Vec<String>,
    #[serde(default)]
    pub harnesses: Vec<String>,
    #[serde(default)]
    pub models_reported: Vec<String>,
}

/// A metric's value within one segment of the pairs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsSegment {
    /// `category`, `model`.
    pub dimension: String,
    pub value: String,
    /// Valid pairs in it.
    pub n: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_reduction: Option<EconomicsDistribution>,
}

/// The identity of a tokenizer, recorded with every count it produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EconomicsTokenizer {
    pub encoding: String,
    pub implementation: String,
}

/// The context suite's measurement, in brief.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsContextView {
    pub suite: String,
    /// When the findings it reads were recorded.
    pub measured_at: String,
    pub tokenizer: EconomicsTokenizer,
    pub sessions: usize,
    pub requests: usize,
    /// Counted tokens of every request's context (system, turns, tool definitions).
    pub counted_tokens: u64,
    /// Counted tokens of the parts the gate's findings flag as removable (each part once).
    pub removable_tokens: u64,
    /// Counted removable tokens by finding code (a part flagged by two codes is in both).
    pub removable_by_finding: BTreeMap<String, u64>,
}

/// A recorded measurement over time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsHistoryPoint {
    pub suite: String,
    pub methodology: u32,
    /// The gate version.
    pub revision: String,
    pub at: String,
    pub metric: String,
    pub value: f64,
    pub n: usize,
}

/// A statement the benchmark exists to test. Never a result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EconomicsHypothesis {
    pub id: String,
    pub statement: String,
    /// `untested`, `supported`, `refuted` — set by a person reading the evidence.
    pub status: String,
}

/// One arm of the experiment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EconomicsVariant {
    pub id: String,
    /// `control` or `treatment`.
    pub role: String,
    pub title: String,
    pub description: String,
    #[serde(default)]
    pub excludes: Vec<String>,
}

/// When a quantitative total-token claim may be published. Every threshold must hold; none
/// has a default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EconomicsPublicationPolicy {
    /// Valid matched pairs, at least.
    pub min_valid_pairs: usize,
    /// Tasks with at least one valid pair, at least.
    pub min_tasks: usize,
    /// Task categories with enough valid pairs, at least.
    pub min_categories: usize,
    /// Valid pairs a category needs to count towards `min_categories`.
    pub min_pairs_per_category: usize,
    /// Repetitions of every task and arm, at least.
    pub min_repetitions: u32,
    /// Valid pairs over attempted pairs, in basis points, at least.
    pub min_valid_pair_rate_bp: u32,
    /// Width of the interval, in basis points of reduction, at most.
    pub max_interval_width_bp: u32,
    /// Whether the interval must exclude 0.
    pub interval_excludes_zero: bool,
    /// Whether the evidence must be current.
    pub require_current: bool,
    /// Evidence older than this is stale.
    pub freshness_window_days: u32,
}

/// The one sentence the evidence allows, and why it allows no stronger one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EconomicsVerdict {
    pub publishable: bool,
    /// Generated from the numbers and the rule's outcome, never typed.
    pub statement: String,
    #[serde(default)]
    pub unmet: Vec<String>,
}

/// The answer of `economics.summary`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsSummary {
    /// Whether a methodology is declared here at all.
    pub present: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methodology: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_metric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publication: Option<EconomicsPublicationPolicy>,
    /// What the total-token evidence allows to be said.
    pub verdict: EconomicsVerdict,
    pub metrics: Vec<EconomicsMetric>,
    pub suites: Vec<EconomicsSuiteView>,
    pub pairs: Vec<EconomicsPair>,
    pub segments: Vec<EconomicsSegment>,
    pub history: Vec<EconomicsHistoryPoint>,
    pub variants: Vec<EconomicsVariant>,
    pub hypotheses: Vec<EconomicsHypothesis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<EconomicsContextView>,
    /// The narrowing applied to pairs and metrics (never to the verdict).
    #[serde(default)]
    pub query: EconomicsQuery,
    #[serde(default)]
    pub diagnostics: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Declarations and evidence on disk
// ---------------------------------------------------------------------------------------------

/// A suite the methodology declares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteDecl {
    pub id: String,
    /// `live` or `context`.
    pub kind: String,
    pub version: u32,
    pub title: String,
    /// Live: repetitions of every task and arm the harness runs.
    #[serde(default)]
    pub repetitions: u32,
    /// Context: the live suite whose sessions and findings it reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads: Option<String>,
}

/// The bootstrap's fixed parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapDecl {
    pub seed: u64,
    pub resamples: u32,
    pub level_bp: u32,
}

/// How the context suite decides what the findings flag as removable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextDecl {
    /// The gate's `carrying_old_turns` threshold: turns older than the last N are removable.
    pub keep_recent_turns: usize,
    /// The finding codes whose flagged parts are counted as removable.
    pub removable_findings: Vec<String>,
}

/// `methodology.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Methodology {
    pub version: u32,
    pub question: String,
    pub primary_metric: String,
    pub variants: Vec<EconomicsVariant>,
    pub hypotheses: Vec<EconomicsHypothesis>,
    pub suites: Vec<SuiteDecl>,
    pub bootstrap: BootstrapDecl,
    pub context: ContextDecl,
    pub publication: EconomicsPublicationPolicy,
}

/// One request of a recorded agent session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionStep {
    /// Whether the task needs an answer to this step (a retry of an answered step does not).
    pub needed: bool,
    /// What the agent is doing.
    #[serde(default)]
    pub note: String,
    /// The provider request body, as the agent sent it.
    pub body: serde_json::Value,
}

/// A recorded agent session: one task (`sessions/<task>.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Session {
    pub task: String,
    pub category: String,
    pub title: String,
    /// `openai` (`/v1/chat/completions`) or `anthropic` (`/v1/messages`).
    pub provider: String,
    pub model: String,
    pub steps: Vec<SessionStep>,
}

/// Provider-reported usage of one answer, in the four-part split.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepUsage {
    pub input_uncached: u64,
    pub cache_write: u64,
    pub cache_read: u64,
    pub output: u64,
}

impl StepUsage {
    /// All four parts.
    pub fn total(&self) -> u64 {
        self.input_uncached + self.cache_write + self.cache_read + self.output
    }
}

/// One step of a recorded run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRecord {
    pub index: usize,
    pub needed: bool,
    /// HTTP status (0: transport failure).
    pub status: u16,
    /// Whether the agent got an answer.
    pub answered: bool,
    /// Treatment: the gate's `x-tokensaver-verdict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Usage bought from the provider for this step (none for a SERVE or an unanswered step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<StepUsage>,
    /// SERVE: the usage the stored answer reports (not bought again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_usage: Option<StepUsage>,
    /// The model the answer names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_reported: Option<String>,
    /// Treatment: the finding codes in the gate's receipt.
    #[serde(default)]
    pub findings: Vec<String>,
}

/// One arm of one task at one repetition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    pub id: String,
    pub task: String,
    pub category: String,
    pub model: String,
    /// `control` or `treatment`.
    pub arm: String,
    pub variant: String,
    pub repetition: u32,
    /// BLAKE3 of the session file replayed.
    pub session_digest: String,
    pub steps: Vec<StepRecord>,
}

/// An evidence file (`evidence/<suite>.json`), written by the live harness.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceFile {
    pub suite: String,
    pub methodology: u32,
    pub gate_version: String,
    pub harness: String,
    pub provider: String,
    pub recorded_at_unix_ms: u64,
    pub repetitions: u32,
    pub runs: Vec<RunRecord>,
}
