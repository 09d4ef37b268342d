//! Storage: the one trait the gate's durable state goes through, and its events.
//!
//! The hot path never waits on storage: decisions and usage are sent as [`Event`]s to a
//! background writer that group-commits them; reads for the hot path come from memory, rebuilt
//! from the store at start ([`Snapshot`]). `/record` is the exception: it is acknowledged only
//! once committed ([`Store::submit_and_wait`], or [`Store::submit_acked`] from async code). A PostgreSQL backend for a fleet of gate
//! instances implements this same trait.

pub mod answers;
pub mod booking;
pub mod ledger;
pub mod postgres;
pub mod sqlite;

use serde::{Deserialize, Serialize};
use tokensaver_core::gate::cache::CacheEdits;

use crate::config::{BudgetPeriod, Prices};
use crate::receipt::DecisionId;
use tokensaver_core::gate::{Usage, Verdict};
use tokensaver_core::request::{Hash, WireForm};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage is unavailable")]
    Unavailable,
    #[error("storage error: {0}")]
    Sqlite(String),
    /// A page cursor (`after`) that names no decision the caller may see.
    #[error("unknown cursor")]
    UnknownCursor,
}

/// Who reports a forwarded decision's usage: the one party that may settle it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordSource {
    /// The proxy itself, after relaying the answer (request mode): queued for the next group
    /// commit. The recorded usage that makes the answer servable stays in memory, like the
    /// answer. No caller can record it: a key settling its own call in flight could set its
    /// price and its savings.
    #[default]
    Proxy,
    /// A digest client's `POST /record` (a decision made by `POST /gate`): committed before it
    /// is acknowledged, and the recorded usage persisted, since the client's own store
    /// outlives a restart of the gate.
    Digest,
}

impl RecordSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordSource::Proxy => "proxy",
            RecordSource::Digest => "digest",
        }
    }

    pub fn parse(s: &str) -> Option<RecordSource> {
        match s {
            "proxy" => Some(RecordSource::Proxy),
            "digest" => Some(RecordSource::Digest),
            _ => None,
        }
    }
}

/// One gated request, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRow {
    pub decision_id: DecisionId,
    pub key_id: String,
    /// Blanked by `POST /forget`.
    pub fingerprint: Option<Hash>,
    pub verdict: Verdict,
    /// The rule or band id, or what earned the verdict.
    pub reason: String,
    pub score: f64,
    pub model_requested: String,
    pub model_served: Option<String>,
    pub wire: WireForm,
    pub decided_at_ms: u64,
    /// Worst-case cost reserved against the budget (ALLOW/DOWNGRADE), nano-USD.
    pub reserved_nano: u64,
    pub worst_case_tokens: Option<u64>,
    /// SERVE: the provider-reported usage of the stored answer.
    pub tokens_not_bought: u64,
    /// BLOCK: the worst case it could have cost, tokens.
    pub worst_case_tokens_avoided: u64,
    /// Σ estimated token figures of the findings (reported apart, never totalled with savings).
    pub findings_tokens: u64,
    pub hold_id: Option<String>,
    /// The step fingerprint (SPEC §2.1), for rebuilding the loop windows; blanked by
    /// `POST /forget` with the fingerprint. `None` in rows written before it existed.
    pub step_fingerprint: Option<Hash>,
    /// Who may settle this decision's reservation (rows written before it: the proxy).
    #[serde(default)]
    pub recorded_by: RecordSource,
    /// The agent session (SPEC §2.11a): a keyed hash; blanked by `POST /forget`. `None` in
    /// rows written before it and for a digest that carried none.
    #[serde(default)]
    pub session: Option<Hash>,
    /// How long the gate held the request before deciding it (a paced repeated step).
    #[serde(default)]
    pub paced_ms: u64,
    /// What the gate did to the call's caching, and what it knew then (SPEC §2.11b).
    #[serde(default)]
    pub cache_edits: CacheEdits,
}

/// A settled call's cache figures by the gate's mechanism (SPEC §2.11b;
/// [`crate::gatekeeper::settlement::cache_figures`]): derived and counterfactual, never in
/// spend or any total. Absent on a call the mechanism did not touch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheHealth {
    /// One-hour entries (Anthropic) or 24-hour retention (OpenAI): the saving after a pause,
    /// less the one-hour premium.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_saving_lifetimes_nano: Option<i64>,
    /// A routing key that spread the call off its prefix's crowded route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_saving_routing_nano: Option<i64>,
    /// The call came after a pause of its session and wrote the cache: what the write cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_rebuild_nano: Option<u64>,
    /// What its one-hour writes cost above 5-minute ones.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub cache_premium_1h_nano: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Provider-reported usage for a forwarded decision, and the spend it settles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    pub decision_id: DecisionId,
    pub key_id: String,
    pub at_ms: u64,
    pub served_model: String,
    pub wire: WireForm,
    /// The answer ended with its terminal marker and the provider's usage ([`Ending::Complete`]).
    pub complete: bool,
    /// The four parts the provider reported (for an incomplete answer: what it reported
    /// before the answer broke off, often nothing).
    pub usage: Usage,
    /// Of `usage.cache_write`, the 1-hour writes.
    #[serde(default)]
    pub cache_write_1h: u64,
    #[serde(default)]
    pub web_search_requests: u64,
    /// How the answer ended. `None` in rows written before schema 5.
    #[serde(default)]
    pub ending: Option<Ending>,
    /// What the spend was settled at.
    #[serde(default)]
    pub basis: SpendBasis,
    pub spend_nano: u64,
    /// Where the gate placed the call's prompt-cache breakpoints: what its cached tokens would
    /// have cost uncached minus what they did cost (read price and write premium), nano-USD.
    /// Derived and counterfactual (SPEC §2.11b): never part of spend or any savings total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_saving_nano: Option<i64>,
    /// The other mechanisms' figures and the session's cache health for this call.
    #[serde(default, flatten)]
    pub cache: CacheHealth,
}

impl UsageRow {
    /// The billed figures of the row.
    pub fn billed(&self) -> tokensaver_core::gate::Billed {
        tokensaver_core::gate::Billed {
            usage: self.usage,
            cache_write_1h: self.cache_write_1h,
            web_search_requests: self.web_search_requests,
        }
    }
}

/// How a forwarded call's answer ended, as the usage row records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// The route's terminal marker arrived and the provider reported usage.
    Complete,
    /// The provider answered with an error status (4xx/5xx, body received): providers bill
    /// no tokens for a refused request.
    ProviderError,
    /// Nothing reached the provider (no connection, no upstream configured).
    NotSent,
    /// The provider sent an error event in the middle of the answer.
    ErrorEvent,
    /// The Responses stream ended with `response.failed` (or a JSON answer with status
    /// `failed`).
    Failed,
    /// The answer ended (the connection closed cleanly) before its terminal marker.
    Truncated,
    /// The answer ended but carried no usage (e.g. a provider that ignores
    /// `stream_options.include_usage`).
    NoUsage,
    /// The connection to the provider broke in the middle of the answer.
    Reset,
    /// The provider stopped sending for longer than the upstream timeout.
    Timeout,
    /// The client went away; the proxy stopped reading the answer.
    ClientGone,
    /// The request was sent but no answer header came back (reset or timeout).
    Unanswered,
    /// A digest client reported the answer incomplete without saying why.
    ClientReported,
}

impl Ending {
    pub const ALL: [Ending; 12] = [
        Ending::Complete,
        Ending::ProviderError,
        Ending::NotSent,
        Ending::ErrorEvent,
        Ending::Failed,
        Ending::Truncated,
        Ending::NoUsage,
        Ending::Reset,
        Ending::Timeout,
        Ending::ClientGone,
        Ending::Unanswered,
        Ending::ClientReported,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Complete => "complete",
            Ending::ProviderError => "provider_error",
            Ending::NotSent => "not_sent",
            Ending::ErrorEvent => "error_event",
            Ending::Failed => "failed",
            Ending::Truncated => "truncated",
            Ending::NoUsage => "no_usage",
            Ending::Reset => "reset",
            Ending::Timeout => "timeout",
            Ending::ClientGone => "client_gone",
            Ending::Unanswered => "unanswered",
            Ending::ClientReported => "client_reported",
        }
    }

    pub fn parse(s: &str) -> Option<Ending> {
        Ending::ALL.into_iter().find(|e| e.as_str() == s)
    }

    /// Whether the provider can have billed anything: not when nothing reached it or when it
    /// refused the request with an error status.
    pub fn billable(self) -> bool {
        !matches!(self, Ending::ProviderError | Ending::NotSent)
    }
}

/// What a usage row's spend was settled at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpendBasis {
    /// The provider's reported usage at the price table.
    #[default]
    Reported,
    /// The answer ended without the provider's final usage: the decision's worst case (or the
    /// reported figures with output at the request's ceiling, if larger).
    WorstCase,
    /// Not billed: nothing reached the provider, or it refused the request.
    None,
    /// Billed at a price the gate does not know: the model has no price, so the spend is
    /// unknown — never zero. The row's spend is 0 and every total counts it apart
    /// (`unpriced_calls`), with its usage.
    Unpriced,
}

impl SpendBasis {
    pub fn as_str(self) -> &'static str {
        match self {
            SpendBasis::Reported => "reported",
            SpendBasis::WorstCase => "worst_case",
            SpendBasis::None => "none",
            SpendBasis::Unpriced => "unpriced",
        }
    }

    pub fn parse(s: &str) -> Option<SpendBasis> {
        [
            SpendBasis::Reported,
            SpendBasis::WorstCase,
            SpendBasis::None,
            SpendBasis::Unpriced,
        ]
        .into_iter()
        .find(|b| b.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HoldState {
    Pending,
    Approved,
    Used,
    Expired,
    /// A person refused it (`POST /holds/{id}/deny`): counted as avoided, like an expired hold.
    Denied,
}

impl HoldState {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldState::Pending => "pending",
            HoldState::Approved => "approved",
            HoldState::Used => "used",
            HoldState::Expired => "expired",
            HoldState::Denied => "denied",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldRow {
    pub hold_id: String,
    pub key_id: String,
    /// Blanked by `POST /forget`.
    pub fingerprint: Option<Hash>,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub state: HoldState,
    pub worst_case_tokens: u64,
}

/// The CHALLENGE that opened a hold, kept with it so that a re-send while the hold is
/// pending gets the same answer, across a restart too. No content: the decision holds counts,
/// keyed hashes and figures only, like its receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldOpening {
    pub hold_id: String,
    /// The decision as JSON (`gate::Decision`).
    pub decision: String,
    /// The exact signed receipt body bytes (signing them again gives the same envelope).
    pub receipt: Vec<u8>,
}

/// An attending lease: a person who approved a hold attends the key until `until_ms`; the
/// key's requests that declare nothing are scored as attended meanwhile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRow {
    /// The hold whose approval granted the lease (receipts name it).
    pub hold_id: String,
    pub key_id: String,
    pub granted_ms: u64,
    pub until_ms: u64,
}

/// Everything that changes durable state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    Decision(DecisionRow),
    Usage(UsageRow),
    /// A reservation never settled, charged at its worst case after the TTL.
    ReservationExpired {
        decision_id: DecisionId,
        key_id: String,
        at_ms: u64,
        charged_nano: u64,
    },
    Hold(HoldRow),
    /// A CHALLENGE opens a hold: the pending hold and the decision that opened it, together.
    HoldOpened {
        hold: HoldRow,
        opening: HoldOpening,
    },
    /// A person attends the key for a while (an approval with `attend_minutes`).
    Lease(LeaseRow),
    /// An answer's provider-reported usage is recorded for (key, fingerprint, wire form).
    Recorded {
        key_id: String,
        fingerprint: Hash,
        wire: WireForm,
        usage: Usage,
        at_ms: u64,
    },
    BudgetSet {
        key_id: String,
        ceiling_nano: Option<u64>,
        period: BudgetPeriod,
    },
    PricesSet {
        model: String,
        prices: Prices,
    },
    /// Delete the key's fingerprint records and blank the fingerprints in its ledger rows.
    Forget {
        key_id: String,
    },
    /// A stored Responses object is bound to the key whose call created it, or its context
    /// figure becomes known ([`ResponseBinding`]).
    ResponseBound(ResponseBinding),
}

/// Who created a stored Responses object (the provider's response id, as the gate saw it in
/// the answer it relayed), and the context the provider billed for it. Only that key may read,
/// delete, cancel or continue it (docs/routes-and-security.md, "Security"). No content: an id, a key id, a time and
/// a count. The first binding of an id is kept: a later one for another key changes nothing,
/// and one for the same key only fills in the context once it is known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseBinding {
    pub response_id: String,
    pub key_id: String,
    pub created_ms: u64,
    /// The answer's input plus output tokens as the provider reported them (what a call that
    /// continues it is billed again); `None` until the gate has seen them (a background
    /// response, an answer that broke off).
    pub context_tokens: Option<u64>,
    /// The named upstream that created it: reads, deletes and cancels go back to it. `None`
    /// for a binding written before upstreams were kept (the API shape's default then).
    pub upstream: Option<String>,
    /// The identity of its answer (a keyed hash of its tool calls, or of its text when it
    /// called none): what the step of a call continuing it names (SPEC §2.1). No content.
    pub answer: Option<Hash>,
}

/// A recorded usage as a snapshot reads it: key, fingerprint, wire form, usage, when it was
/// recorded.
pub type RecordedRow = (String, Hash, WireForm, Usage, u64);

/// What the gate rebuilds its memory from at start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Decisions of the last 24 h (windows are rebuilt by replaying them), oldest first.
    pub recent_decisions: Vec<DecisionRow>,
    /// Every usage row's (key, time, spend): budgets sum them per period.
    pub spend: Vec<(String, u64, u64)>,
    /// Forwarded decisions with no usage row and no expiry charge yet.
    pub open_reservations: Vec<DecisionRow>,
    /// Pending and approved holds.
    pub holds: Vec<HoldRow>,
    /// The openings of the pending holds that have one.
    pub hold_openings: Vec<HoldOpening>,
    /// Leases that have not ended.
    pub leases: Vec<LeaseRow>,
    /// Recorded usage, oldest first.
    pub recorded: Vec<RecordedRow>,
    pub budgets: Vec<(String, Option<u64>, BudgetPeriod)>,
    pub prices: Vec<(String, Prices)>,
}

/// Totals for one key (or the fleet) over a day range, by tier — never merged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerTotals {
    pub requests: u64,
    pub by_verdict: std::collections::BTreeMap<String, u64>,
    pub spend_nano: u64,
    pub usage: Usage,
    pub tokens_not_bought: u64,
    pub worst_case_tokens_avoided: u64,
    pub findings_tokens_estimated: u64,
    /// Calls billed for a model with no price: their spend is unknown and is not in
    /// `spend_nano` (their usage is in `usage`).
    #[serde(default)]
    pub unpriced_calls: u64,
    /// The derived, counterfactual cache saving of the calls whose breakpoints the gate placed
    /// (SPEC §2.11b), nano-USD: never added to spend, `tokens_not_bought` or any total.
    #[serde(default, rename = "cache_saving")]
    pub cache_saving_nano: i64,
    /// The same for one-hour entries and 24-hour retention (derived, counterfactual).
    #[serde(default, rename = "cache_saving_lifetimes")]
    pub cache_saving_lifetimes_nano: i64,
    /// The same for routing keys (derived, counterfactual).
    #[serde(default, rename = "cache_saving_routing")]
    pub cache_saving_routing_nano: i64,
    /// Cache health: calls that rewrote the cache after a pause, what those writes cost, and
    /// what one-hour entries cost above 5-minute ones.
    #[serde(default)]
    pub cache_rebuilds: u64,
    #[serde(default, rename = "cache_rebuild")]
    pub cache_rebuild_nano: u64,
    #[serde(default, rename = "cache_premium_1h")]
    pub cache_premium_1h_nano: u64,
}

impl LedgerTotals {
    /// Requests with this verdict (0 when none).
    pub fn count(&self, verdict: Verdict) -> u64 {
        self.by_verdict.get(verdict.as_str()).copied().unwrap_or(0)
    }

    /// Prompt tokens billed: uncached input, cache writes and cache reads.
    pub fn prompt_tokens(&self) -> u64 {
        let u = &self.usage;
        u.input
            .saturating_add(u.cache_write)
            .saturating_add(u.cache_read)
    }

    /// The share of prompt tokens read from the cache; `None` when none were billed.
    pub fn cache_read_share(&self) -> Option<f64> {
        read_share(self.usage.cache_read, self.prompt_tokens())
    }
}

/// `cache_read / prompt`; `None` when no prompt token was billed.
pub fn read_share(cache_read: u64, prompt: u64) -> Option<f64> {
    (prompt > 0).then(|| cache_read as f64 / prompt as f64)
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerDay {
    /// UTC day, `YYYY-MM-DD`.
    pub day: String,
    #[serde(flatten)]
    pub totals: LedgerTotals,
}

/// A decision as the ledger page lists it: its row and, once the provider's usage arrived,
/// the spend that usage settled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionListing {
    pub row: DecisionRow,
    pub spend_nano: Option<u64>,
}

/// How many decisions one time bucket holds for one verdict and rule (the ledger page's plot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictCount {
    /// Start of the bucket, unix ms (a multiple of the bucket width).
    pub bucket_start_ms: u64,
    pub verdict: Verdict,
    /// The rule, band or what earned the verdict (as `DecisionRow::reason`).
    pub reason: String,
    pub count: u64,
}

pub trait Store: Send + Sync {
    /// Read what the in-memory state is rebuilt from. `now_ms` bounds the recent windows.
    fn load(&self, now_ms: u64) -> Result<Snapshot, StoreError>;
    /// Queue an event for the next group commit; never blocks on disk.
    fn submit(&self, event: Event);
    /// Queue an event and return once it is committed.
    fn submit_and_wait(&self, event: Event) -> Result<(), StoreError>;
    /// Wait until everything submitted so far is committed.
    fn flush(&self) -> Result<(), StoreError>;
    /// Queue an event; the answer resolves once it is committed. For async callers: the task
    /// waits on a channel, no thread blocks on the disk.
    fn submit_acked(&self, event: Event) -> Acked;
    /// [`Store::flush`] for async callers.
    fn flush_acked(&self) -> Acked;
    /// Commit everything queued and stop writing (the server stopped serving). Later submits
    /// are dropped and later waits answer [`StoreError::Unavailable`].
    fn close(&self) -> Result<(), StoreError> {
        self.flush()
    }
    /// Per-day and total figures for a key (`None`: the fleet), days inclusive (`YYYY-MM-DD`).
    fn ledger(
        &self,
        key_id: Option<&str>,
        from_day: Option<&str>,
        to_day: Option<&str>,
    ) -> Result<(Vec<LedgerDay>, LedgerTotals), StoreError>;
    /// Whether a usage row exists for the decision (a `/record` is accepted once).
    fn usage_recorded(&self, decision_id: &DecisionId) -> Result<bool, StoreError>;
    /// Decisions with their settlements, oldest first (`GET /ledger/decisions`).
    fn decisions(&self, query: &DecisionQuery) -> Result<DecisionPage, StoreError>;
    /// The ledger page: the newest decisions first, of a key (`None`: every key) and
    /// optionally one verdict, at most `limit`.
    fn latest_decisions(
        &self,
        key_id: Option<&str>,
        verdict: Option<Verdict>,
        limit: usize,
    ) -> Result<Vec<DecisionListing>, StoreError>;
    /// The ledger page: decisions since `since_ms` counted per `bucket_ms`-wide bucket,
    /// verdict and rule, of a key (`None`: every key), oldest bucket first.
    fn verdicts_over_time(
        &self,
        key_id: Option<&str>,
        since_ms: u64,
        bucket_ms: u64,
    ) -> Result<Vec<VerdictCount>, StoreError>;
    /// The binding of a stored Responses object, if the gate has seen it created.
    fn response_binding(&self, response_id: &str) -> Result<Option<ResponseBinding>, StoreError>;
}

/// `GET /ledger/decisions`: which decisions, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecisionQuery {
    /// One key's decisions (`None`: every key's, the admin listener).
    pub key_id: Option<String>,
    /// Decided at or after (unix ms).
    pub from_ms: Option<u64>,
    /// Decided before (unix ms, exclusive).
    pub to_ms: Option<u64>,
    /// Start after this decision (the last one of the previous page).
    pub after: Option<DecisionId>,
    pub limit: usize,
    /// Only this session's decisions.
    pub session: Option<Hash>,
}

/// One decision as `GET /ledger/decisions` lists it, with its settlement: never content.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionLine {
    pub decision_id: DecisionId,
    pub key_id: String,
    pub decided_at_ms: u64,
    pub verdict: Verdict,
    pub reason: String,
    pub model_requested: String,
    pub model_served: Option<String>,
    pub wire: WireForm,
    pub hold_id: Option<String>,
    /// The worst case reserved against the budget when the call was forwarded.
    pub reserved_nano: u64,
    /// `not_forwarded` (SERVE, CHALLENGE, BLOCK), `open` (awaiting usage), `complete`,
    /// `incomplete` (charged at its worst case), `not_billed` (refused by the provider or
    /// never sent), `expired` (never settled: charged its reservation after the TTL).
    pub status: &'static str,
    /// How the answer ended (`None`: not forwarded, open, expired, or recorded before
    /// schema 5).
    pub ending: Option<Ending>,
    pub basis: Option<SpendBasis>,
    pub settled_at_ms: Option<u64>,
    pub input: u64,
    pub cache_write: u64,
    pub cache_write_1h: u64,
    pub cache_read: u64,
    pub output: u64,
    pub web_search_requests: u64,
    pub spend_nano: u64,
    /// SERVE: the provider-reported usage of the stored answer (tier `tokens_not_bought`).
    pub tokens_not_bought: u64,
    /// BLOCK: the worst case the call could have cost (reported apart, never added).
    pub worst_case_tokens_avoided: u64,
    /// Where the gate placed the call's prompt-cache breakpoints: the derived, counterfactual
    /// cache saving (nano-USD, SPEC §2.11b); absent on every other call.
    #[serde(rename = "cache_saving", skip_serializing_if = "Option::is_none")]
    pub cache_saving_nano: Option<i64>,
    /// The other mechanisms' figures and the call's cache health.
    #[serde(flatten)]
    pub cache: CacheHealth,
    /// What the gate did to the call's caching.
    pub cache_edits: CacheEdits,
    /// The agent session (SPEC §2.11a), a keyed hash; `None` before it was kept or after
    /// `POST /forget`.
    pub session: Option<Hash>,
    /// How long the gate held the request before deciding it (a paced repeated step).
    pub paced_ms: u64,
    /// The step fingerprint, for grouping sessions ([`crate::report::sessions_of`]);
    /// not listed.
    #[serde(skip)]
    pub step: Option<Hash>,
}

/// Pages of decisions read one after another, from `query` on, until the last page or until
/// at least `cap` lines: the lines, oldest first, and whether the range held more.
pub async fn read_pages<E, F>(
    mut query: DecisionQuery,
    cap: usize,
    mut read: impl FnMut(DecisionQuery) -> F,
) -> Result<(Vec<DecisionLine>, bool), E>
where
    F: std::future::Future<Output = Result<DecisionPage, E>>,
{
    let mut lines = Vec::new();
    loop {
        let page = read(query.clone()).await?;
        lines.extend(page.decisions);
        match page.next_after {
            None => return Ok((lines, false)),
            Some(_) if lines.len() >= cap => return Ok((lines, true)),
            Some(next) => query.after = Some(next),
        }
    }
}

/// A page of decisions, and where the next one starts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DecisionPage {
    pub decisions: Vec<DecisionLine>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub next_after: Option<DecisionId>,
}

impl DecisionPage {
    /// The page of `limit` lines from up to `limit + 1` read: one more than the page means a
    /// next page, which starts after the page's last line.
    pub fn of(mut lines: Vec<DecisionLine>, limit: usize) -> Self {
        let next_after = if lines.len() > limit {
            lines.truncate(limit);
            lines.last().map(|l| l.decision_id)
        } else {
            None
        };
        DecisionPage {
            decisions: lines,
            next_after,
        }
    }
}

/// A commit's outcome, awaited by an async caller: resolves when the writer has committed (or
/// refused) what it was given. A writer that went away answers [`StoreError::Unavailable`].
pub struct Acked(tokio::sync::oneshot::Receiver<Result<(), StoreError>>);

impl Acked {
    pub fn new(rx: tokio::sync::oneshot::Receiver<Result<(), StoreError>>) -> Self {
        Self(rx)
    }
}

impl std::future::Future for Acked {
    type Output = Result<(), StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(StoreError::Unavailable)))
    }
}

pub use tokensaver_core::utc::{civil_from_days, day as utc_day, day_start_ms};

/// Start (unix ms) of the budget period containing `now_ms`.
pub fn period_start(period: BudgetPeriod, now_ms: u64) -> u64 {
    match period {
        BudgetPeriod::Lifetime => 0,
        BudgetPeriod::Day => now_ms - now_ms % 86_400_000,
        BudgetPeriod::Month => tokensaver_core::utc::month_start_ms(now_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_periods() {
        assert_eq!(utc_day(0), "1970-01-01");
        // 2026-11-29T22:39:09Z
        let t = 1_795_991_949_000;
        assert_eq!(utc_day(t), "2026-11-29");
        assert_eq!(utc_day(period_start(BudgetPeriod::Month, t)), "2026-11-01");
        assert_eq!(period_start(BudgetPeriod::Month, t) % 86_400_000, 0);
        assert_eq!(utc_day(period_start(BudgetPeriod::Day, t)), "2026-11-29");
        assert_eq!(period_start(BudgetPeriod::Lifetime, t), 0);
    }
}
