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
    /// Tool calls the agent was asked to make (in every answer it got, served ones included).
    pub tool_calls: u64,
    /// The cost of the usage at the recorded price table, in nano-USD (derived); absent when
    /// a model had no price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_nano_usd: Option<u64>,
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
    /// `ratio`, `tokens`, `requests`, `pairs`.
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
    /// The value's range when each task in turn is left out: how much one task carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leave_one_task_out: Option<EconomicsRange>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// The lowest and highest of a metric recomputed without each task in turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EconomicsRange {
    pub low: f64,
    /// The task whose absence gives `low`.
    pub low_without: String,
    pub high: f64,
    pub high_without: String,
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
    /// The agent client that ran both arms (`claude-code`, `codex`, `agents-sdk`, ...).
    pub client: String,
    /// Sessions the task spans.
    pub sessions: u32,
    pub repetition: u32,
    /// The seed both arms were scripted (and their fixtures set up) with.
    #[serde(default)]
    pub seed: u64,
    /// The model the client asks for.
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
    /// The same on the cost of the usage at the recorded price table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_reduction: Option<f64>,
    /// The same on the tool calls the agent was asked to make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_reduction: Option<f64>,
    /// The same on the tokens of the last session only (a task of several sessions): what
    /// continuing cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation_reduction: Option<f64>,
    /// First-request input of the treatment minus that of the control: what the treatment
    /// adds before the model has done anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_request_overhead: Option<i64>,
    /// Whether each arm's own check passed (`[control, treatment]`), when both ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<[bool; 2]>,
    /// Treatment: the gate's refusals (verdict and reason) of requests the client sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<String>,
    /// The usage the provider reported for the answers the gate served from its store
    /// (observed; the gate's `tokens_not_bought`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_not_bought: Option<u64>,
    /// Wall-clock seconds of each arm's run (`[control, treatment]`), when both ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<[f64; 2]>,
    /// Treatment: the time the gate held the client's requests in all (paced repeated steps),
    /// in milliseconds, from its receipts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paced_ms: Option<u64>,
    /// Treatment: how many runs of its most repeated step the client sent (another step in
    /// between ends a run, and the schedule of repeated steps starts over), from the digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_runs: Option<u32>,
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

/// How recorded evidence stands against the build, gate config, methodology, tasks and
/// harness as they are now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EconomicsFreshness {
    /// Recorded under this methodology, by this build, with this gate config, over these
    /// task files and harness, within the freshness window.
    Current,
    /// Recorded under this methodology version, but something it measured changed since
    /// (every reason is named).
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
    pub kind: SuiteKind,
    pub version: u32,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub freshness: EconomicsFreshness,
    /// Why, when not current: every reason, joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freshness_detail: Option<String>,
    /// Every reason the evidence is not current.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_reasons: Vec<String>,
    pub runs: usize,
    pub pairs: EconomicsPairCounts,
    /// The builds the evidence was recorded with (source BLAKE3, and commit when known).
    #[serde(default)]
    pub revisions: Vec<String>,
    #[serde(default)]
    pub harnesses: Vec<String>,
    #[serde(default)]
    pub models_reported: Vec<String>,
    /// The provider the evidence was recorded against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderInfo>,
    /// The agent clients and their versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientInfo>,
    /// The evidence file judged (the latest of the suite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_file: Option<String>,
    /// Tasks the suite declares.
    #[serde(default)]
    pub tasks: usize,
}

/// One arm's means over a stuck task's runs by one client.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EconomicsStuckArm {
    pub runs: usize,
    /// Provider calls bought, mean per run.
    pub calls: f64,
    /// The most provider calls one run bought.
    pub max_calls: u64,
    /// Total tokens bought, mean per run.
    pub tokens: f64,
    /// Cost at the recorded price table, mean per run, in nano-USD.
    pub cost_nano_usd: f64,
    /// Wall-clock seconds until the client gave up or was stopped, mean per run.
    pub seconds: f64,
}

/// What one mechanism saved over one suite's evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsMechanism {
    pub suite: String,
    pub mechanism: tokensaver_core::gate::Mechanism,
    pub arm: String,
    /// The ablation file, relative to `ablation/`.
    pub ablation_file: String,
    /// Pairs of the suite's evidence that count (valid; for stuck agents, both arms recorded).
    pub pairs: usize,
    /// Of them, where the mechanism acted (recorded again without it).
    pub acted: usize,
    /// Of those, measured: the ablated pair counts as its full-gate pair does.
    pub measured: usize,
    /// The mechanism's saving, as a share of the control arm's cost (tokens) over the pairs
    /// that count: `Σ (ablated − full treatment) / Σ control`. Pairs where it acted and that
    /// could not be measured are left out of both sums.
    pub cost_saving: Option<f64>,
    pub cost_interval: Option<EconomicsInterval>,
    pub token_saving: Option<f64>,
    pub token_interval: Option<EconomicsInterval>,
    /// The gate's whole saving over the same pairs (`Σ (control − full treatment) / Σ
    /// control`), beside which the mechanisms' are read.
    pub gate_cost_saving: Option<f64>,
    pub gate_token_saving: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What a stuck session bought through the gate against straight to the provider.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsStuckRow {
    pub suite: String,
    pub task: String,
    pub client: String,
    pub control: EconomicsStuckArm,
    pub treatment: EconomicsStuckArm,
    /// Treatment runs the gate stopped (a BLOCK with `runaway_step`).
    pub stopped: usize,
    /// `1 - treatment cost / control cost` over the runs (pooled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_reduction: Option<f64>,
    /// The gate's holds (paced steps), mean seconds per treatment run.
    pub paced_seconds: f64,
    /// The most runs of its repeated step one treatment run's client sent: more than one means
    /// another step came in between and the schedule started over.
    #[serde(default)]
    pub most_repeat_runs: u32,
}

/// A metric's value within one segment of the pairs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EconomicsSegment {
    /// `category`, `client`, `model`, `sessions`, `session_length`, `complexity`.
    pub dimension: String,
    pub value: String,
    /// Valid pairs in it.
    pub n: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_reduction: Option<EconomicsDistribution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_reduction: Option<EconomicsDistribution>,
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
    /// The build (source BLAKE3, first 12 digits).
    pub revision: String,
    /// `simulated` or `real`.
    #[serde(default)]
    pub provider: String,
    /// The evidence file.
    #[serde(default)]
    pub file: String,
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
    /// `untested`, `supported`, `refuted` — set by a person reading the evidence. The summary
    /// says `tested` in its place where the evidence holds every metric of `tested_by` and the
    /// methodology left it `untested`: the data tests it, and a person has not yet judged how.
    pub status: String,
    /// The summary's metrics (ids) whose figures test it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tested_by: Vec<String>,
    /// Summary only: the figures of `tested_by` in the evidence judged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub figures: Vec<String>,
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
/// has a default. The code holds a floor under each ([`crate::FLOOR`]: the seed's seven
/// thresholds and this project's four): a methodology cannot loosen the rule below it, and evidence recorded against
/// a simulated provider is never publishable, whatever the thresholds say.
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
    /// Pairs whose treatment failed its check (alone or with the control) over attempted
    /// pairs, in basis points, at most: a saving bought with broken tasks is no saving.
    pub max_treatment_failed_rate_bp: u32,
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
    /// Whether the evidence the verdict rests on was recorded against a simulated provider.
    #[serde(default)]
    pub simulated: bool,
    /// The methodology file's BLAKE3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methodology_blake3: Option<String>,
    pub metrics: Vec<EconomicsMetric>,
    pub suites: Vec<EconomicsSuiteView>,
    pub pairs: Vec<EconomicsPair>,
    pub segments: Vec<EconomicsSegment>,
    pub history: Vec<EconomicsHistoryPoint>,
    pub variants: Vec<EconomicsVariant>,
    pub hypotheses: Vec<EconomicsHypothesis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<EconomicsContextView>,
    /// The stuck-agent suite: what a stuck session bought through the gate against straight,
    /// per task and client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<EconomicsStuckRow>,
    /// Each mechanism's saving, from the ablation arms recorded against a suite's latest
    /// evidence (`ablation/`), and per suite the sentence that reads them beside the gate's.
    #[serde(default)]
    pub mechanisms: Vec<EconomicsMechanism>,
    #[serde(default)]
    pub mechanism_notes: Vec<String>,
    /// The narrowing applied to pairs and metrics (never to the verdict).
    #[serde(default)]
    pub query: EconomicsQuery,
    #[serde(default)]
    pub diagnostics: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Declarations and evidence on disk
// ---------------------------------------------------------------------------------------------

/// The three kinds of suite: healthy work measured on real clients in two arms and judged by
/// the publication rule (`live`); stuck agents recorded the same way and reported as what a
/// stuck session bought in each arm, never judged by the rule nor pooled with healthy work
/// (`stuck`); or counted in a live suite's treatment requests (`context`). They are separate
/// metrics and never merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SuiteKind {
    Live,
    Stuck,
    Context,
}

impl SuiteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SuiteKind::Live => "live",
            SuiteKind::Stuck => "stuck",
            SuiteKind::Context => "context",
        }
    }

    /// Recorded by the harness in two arms (`tokensaver economics run`).
    pub fn is_recorded(self) -> bool {
        matches!(self, SuiteKind::Live | SuiteKind::Stuck)
    }
}

/// A suite the methodology declares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteDecl {
    pub id: String,
    pub kind: SuiteKind,
    pub version: u32,
    pub title: String,
    /// Live: repetitions of every task, client and arm the harness runs.
    #[serde(default)]
    pub repetitions: u32,
    /// Context: the live suite whose treatment requests and findings it reads.
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

/// The treatment arm's tokensaver key: one fresh key per pair, configured like this.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreatmentKeyDecl {
    /// The scoring profile (a `[profiles.NAME]` of the gate config), or absent for the
    /// gate's defaults.
    #[serde(default)]
    pub profile: Option<String>,
    /// The key's `human` default (false: unattended, as an agent runs).
    pub human: bool,
    /// The key's budget ceiling in micro-USD a day, or absent for none.
    #[serde(default)]
    pub budget_micro_usd_per_day: Option<u64>,
}

/// A client the suite runs, and the model it asks for unless the run names another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientDecl {
    /// What the client is.
    pub program: String,
    /// The model it asks for against the built-in provider.
    pub model: String,
    /// The model it asks for against a real provider (its default), if different.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub real_model: Option<String>,
}

/// `methodology.json`. Any change to it needs a new `version` (its BLAKE3 is recorded with
/// every evidence file; a change under the same version makes that evidence stale, and
/// `methodology-versions.json` pins the hash of every version).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Methodology {
    pub version: u32,
    pub question: String,
    pub primary_metric: String,
    pub variants: Vec<EconomicsVariant>,
    pub hypotheses: Vec<EconomicsHypothesis>,
    pub suites: Vec<SuiteDecl>,
    /// The clients, by id (`claude-code`, `codex`, `agents-sdk`, `agents-sdk-chat`).
    pub clients: BTreeMap<String, ClientDecl>,
    pub treatment_key: TreatmentKeyDecl,
    pub bootstrap: BootstrapDecl,
    pub context: ContextDecl,
    pub publication: EconomicsPublicationPolicy,
}

/// A fixture task (`tasks/<id>/task.json`; `<id>/workspace/` is copied for every run).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskDecl {
    /// The recorded suite it belongs to (`healthy-work`, `stuck-agents`).
    pub suite: String,
    pub category: String,
    pub title: String,
    /// The task as a user would type it (against the built-in provider the harness appends
    /// the task marker).
    pub prompt: String,
    /// Client sessions in a row, each with the prompt in a fresh copy of the workspace (the
    /// same job run again on a fresh checkout); the run succeeds when every session's check
    /// passes.
    pub sessions: u32,
    /// The clients that run it (ids of the methodology's `clients`).
    pub clients: Vec<String>,
    /// The temperature the Agents SDK sends (Claude Code and Codex send none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The client's turn limit, where it has one.
    pub max_turns: u32,
    /// Per session.
    pub timeout_s: u32,
    /// Run in a fresh workspace before the client, `{task}` the task directory, `{seed}` the
    /// repetition's seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<Vec<String>>,
    /// The task's own success check, run in the workspace after the sessions: exit 0 = done.
    pub check: Vec<String>,
    /// The scripted provider's plan for this task (`tokensaver-mock-provider --tasks`).
    pub script: tokensaver_mock_script::TaskScript,
}

/// Provider-reported usage of one answer, in the four-part split.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepUsage {
    pub input_uncached: u64,
    pub cache_write: u64,
    pub cache_read: u64,
    pub output: u64,
    /// Of `cache_write`, the tokens written as one-hour entries (Anthropic), priced apart.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_1h: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl StepUsage {
    /// All four parts.
    pub fn total(&self) -> u64 {
        self.input_uncached + self.cache_write + self.cache_read + self.output
    }

    /// The input parts.
    pub fn input(&self) -> u64 {
        self.input_uncached + self.cache_write + self.cache_read
    }
}

/// Counted (cl100k_base) context of one request the client sent, and what the gate's findings
/// on it flag as removable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextCount {
    pub counted: u64,
    pub removable: u64,
    #[serde(default)]
    pub by_finding: BTreeMap<String, u64>,
}

/// One request the client sent and what it got back (recorded in front of the gate in the
/// treatment arm, in front of the provider in the control arm).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRecord {
    pub index: usize,
    /// The client session (0-based) it belongs to.
    pub session: u32,
    pub path: String,
    /// HTTP status (0: transport failure).
    pub status: u16,
    /// Treatment: the gate's `x-tokensaver-verdict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Treatment: the reason in the gate's receipt (a rule, a band, or what earned it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Treatment: the finding codes in the gate's receipt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<String>,
    /// Treatment: how long the gate held the request before deciding it (a paced repeated
    /// step; the receipt's `paced_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paced_ms: Option<u64>,
    /// The usage the answer reports (for a SERVE: the stored answer's, not bought again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<StepUsage>,
    /// Tool calls the answer asks for.
    #[serde(default)]
    pub tool_calls: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_requested: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_reported: Option<String>,
    /// Treatment: counted context and what the findings flag as removable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextCount>,
    /// When the request reached the recording tap (in front of the gate, or of the provider in
    /// the control arm), in milliseconds after the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// From the request reaching the tap to its answer's end, in milliseconds (the gate's
    /// holds included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trip_ms: Option<u64>,
    /// Treatment: the request's digest (`tokensaver digest`: fingerprints and counts under the
    /// pair's key, no content), what the gate decided on, kept so that another build's gate can
    /// decide the recorded calls again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<serde_json::Value>,
}

/// One provider call an arm bought (recorded in front of the provider).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoughtCall {
    pub session: u32,
    pub path: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<StepUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Its cost at the recorded price table, in nano-USD (absent: no price for the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_nano_usd: Option<u64>,
}

/// One client session of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    pub index: u32,
    pub exit_code: i32,
    pub seconds: f64,
    /// The end of what the client printed.
    pub output_tail: String,
}

/// The task's own check, run in the workspace after the sessions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRecord {
    pub passed: bool,
    pub exit_code: i32,
    pub output: String,
}

/// One arm of one task, client and repetition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    pub id: String,
    /// The pair it belongs to: `<task>--<client>--r<repetition>`.
    pub pair: String,
    pub task: String,
    pub category: String,
    pub client: String,
    pub model: String,
    /// `control` or `treatment`.
    pub arm: String,
    pub variant: String,
    pub repetition: u32,
    pub seed: u64,
    /// 1 or 2: which arm of the pair ran first (drawn from the pair's id).
    pub order: u32,
    /// BLAKE3 of the task directory the run used.
    pub task_digest: String,
    pub started_at_unix_ms: u64,
    pub seconds: f64,
    pub sessions: Vec<SessionRecord>,
    pub check: CheckRecord,
    /// What the client sent and got.
    pub steps: Vec<StepRecord>,
    /// What the arm bought from the provider.
    pub bought: Vec<BoughtCall>,
}

/// Whether the provider was the built-in scripted one or a real one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// `tokensaver mock-provider`: a scripted provider. Evidence against it is a simulation
    /// and can never be verified.
    Simulated,
    /// A provider the user named (`--upstream`).
    Real,
}

/// The provider an evidence file was recorded against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderInfo {
    pub kind: ProviderKind,
    /// What it is, in words.
    pub name: String,
    /// Its base URL (loopback for the built-in one).
    pub upstream: String,
    /// How its usage was counted.
    pub usage_counting: String,
}

/// An agent client as it ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientInfo {
    pub id: String,
    pub program: String,
    /// The version the client reported.
    pub version: String,
    pub model: String,
}

/// The build that recorded an evidence file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildInfo {
    /// BLAKE3 of the sources (`build.rs`): what freshness compares.
    pub source_blake3: String,
    /// The crate version.
    pub version: String,
    /// `git describe --always --dirty` where the run was made, when available (information).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// The harness that drove the clients.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessInfo {
    pub path: String,
    pub version: String,
    /// BLAKE3 over the harness's files (the script, its tap, the shared client runner).
    pub blake3: String,
}

/// An evidence file (`evidence/<suite>/<UTC time>-<id>.json`), written once by
/// `tokensaver economics run` and never overwritten: every run appends a file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceFile {
    /// 2 (this layout).
    pub format: u32,
    pub suite: String,
    pub methodology: u32,
    /// BLAKE3 of `methodology.json` as it was when recorded.
    pub methodology_blake3: String,
    pub recorded_at_unix_ms: u64,
    pub build: BuildInfo,
    /// BLAKE3 of the effective gate policy of the treatment (see
    /// `tokensaver::economics::identity::gate_policy`).
    pub gate_config_blake3: String,
    pub provider: ProviderInfo,
    pub clients: Vec<ClientInfo>,
    pub harness: HarnessInfo,
    /// BLAKE3 of every task directory, by task id.
    pub tasks: BTreeMap<String, String>,
    pub repetitions: u32,
    /// The tokenizer that counted the context of the treatment's requests.
    pub tokenizer: EconomicsTokenizer,
    pub runs: Vec<RunRecord>,
}
