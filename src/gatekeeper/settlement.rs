//! Settling a forwarded decision: what the provider reported ([`UsageReport`]), what the
//! decision is charged for it ([`settlement`]), and the derived saving of the cache breakpoints
//! the gate placed ([`cache_saving_nano`]). One rule for the embedded ledger, the fleet and the
//! fleet's spool, which all stand on it.

use serde::Serialize;
use tokensaver_core::gate::cache::CacheEdits;

use crate::receipt::DecisionId;
use crate::store::{Ending, SpendBasis, UsageRow};
use tokensaver_core::gate::{Billed, Usage};
use tokensaver_core::request::WireForm;

/// The most a `POST /record` may report of any one usage part, whatever the decision: no call
/// is billed 10^8 tokens, and with it no spend or total can overflow (4 parts × 10^8 tokens ×
/// $1,000 per million tokens is 4 × 10^14 nano-USD per call).
pub const MAX_RECORDED_TOKENS: u64 = 100_000_000;
/// Provider-side framing a record's input may add to the request's own text: chat templates,
/// tool-use system prompts (Anthropic's is up to ~530 tokens), per-message separators.
pub const RECORD_INPUT_FRAMING_TOKENS: u64 = 4_096;

/// What the provider reported for a forwarded decision: the proxy's own record, or a digest
/// client's `POST /record`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct UsageReport {
    pub key_id: String,
    pub decision_id: DecisionId,
    /// What the provider reported: its final figures for a complete answer, what it had
    /// reported before the end otherwise; `None`: nothing.
    pub usage: Option<Billed>,
    pub served_model: String,
    pub wire: WireForm,
    /// How the answer ended (only a complete answer is stored or counts as bought usage).
    pub ending: Ending,
}

/// The body of `POST /record`, as the digest client sends it and the gate reads it: one type
/// on both sides of the wire. Unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordBody {
    /// The decision's id, as its receipt's hash; kept as text so that an id that is not one
    /// reads as an unknown decision, not as malformed JSON.
    pub decision_id: String,
    pub wire: WireForm,
    pub served_model: String,
    pub complete: bool,
    /// The four parts the provider reported; absent or null: none.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Of `usage.cache_write`, the 1-hour writes.
    #[serde(default)]
    pub cache_write_1h: u64,
    #[serde(default)]
    pub web_search_requests: u64,
    /// How the answer ended; absent: `complete`, or `client_reported` when not complete.
    #[serde(default)]
    pub ending: Option<Ending>,
}

/// Why a `POST /record` body names no report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordBodyError {
    /// `complete` contradicts `ending`.
    InconsistentEnding,
    /// The id is not a decision id: it names no decision awaiting usage.
    UnknownDecision,
}

impl RecordBody {
    /// What the client sends for its report.
    pub fn of(report: &UsageReport) -> RecordBody {
        RecordBody {
            decision_id: report.decision_id.to_string(),
            wire: report.wire,
            served_model: report.served_model.clone(),
            complete: report.ending == Ending::Complete,
            ending: Some(report.ending),
            usage: report.usage.map(|b| b.usage),
            cache_write_1h: report.usage.map_or(0, |b| b.cache_write_1h),
            web_search_requests: report.usage.map_or(0, |b| b.web_search_requests),
        }
    }

    /// The ending it states, or `None` when it contradicts `complete`.
    fn stated_ending(&self) -> Option<Ending> {
        match (self.complete, self.ending) {
            (true, None | Some(Ending::Complete)) => Some(Ending::Complete),
            (true, Some(_)) | (false, Some(Ending::Complete)) => None,
            (false, None) => Some(Ending::ClientReported),
            (false, Some(e)) => Some(e),
        }
    }

    /// The report it makes for `key_id`; the 1-hour writes are at most the cache writes.
    pub fn into_report(self, key_id: &str) -> Result<UsageReport, RecordBodyError> {
        let ending = self
            .stated_ending()
            .ok_or(RecordBodyError::InconsistentEnding)?;
        let decision_id = self
            .decision_id
            .parse::<DecisionId>()
            .map_err(|_| RecordBodyError::UnknownDecision)?;
        Ok(UsageReport {
            key_id: key_id.to_string(),
            decision_id,
            usage: self.usage.map(|usage| Billed {
                usage,
                cache_write_1h: self.cache_write_1h.min(usage.cache_write),
                web_search_requests: self.web_search_requests,
            }),
            served_model: self.served_model,
            wire: self.wire,
            ending,
        })
    }
}

impl UsageReport {
    /// How the answer ended: a "complete" answer without usage is one that reported none.
    pub fn ending(&self) -> Ending {
        match (self.ending, self.usage) {
            (Ending::Complete, None) => Ending::NoUsage,
            (e, _) => e,
        }
    }

    /// The row that settles this report against its reservation (`reserved_nano`, the
    /// `output_ceiling` it was reserved with), priced with the served model's `prices`: one
    /// rule for the single node and the fleet.
    pub fn usage_row(
        &self,
        at_ms: u64,
        prices: Option<&crate::config::Prices>,
        reserved_nano: u64,
        output_ceiling: Option<u64>,
    ) -> UsageRow {
        let ending = self.ending();
        let usage = self.usage;
        let (spend, basis) = settlement(
            ending,
            usage.as_ref(),
            prices,
            reserved_nano,
            output_ceiling,
        );
        UsageRow {
            decision_id: self.decision_id,
            key_id: self.key_id.clone(),
            at_ms,
            served_model: self.served_model.clone(),
            wire: self.wire,
            complete: ending == Ending::Complete,
            usage: usage.map(|b| b.usage).unwrap_or_default(),
            cache_write_1h: usage.map(|b| b.cache_write_1h).unwrap_or(0),
            web_search_requests: usage.map(|b| b.web_search_requests).unwrap_or(0),
            ending: Some(ending),
            basis,
            spend_nano: spend,
            cache_saving_nano: None,
            cache: Default::default(),
        }
    }

    /// What a SERVE of this answer would not buy: its usage, when the answer is complete and
    /// the request reusable.
    pub fn reusable_usage(&self, reusable: bool) -> Option<Usage> {
        match (self.usage, self.ending() == Ending::Complete, reusable) {
            (Some(b), true, true) => Some(b.usage),
            _ => None,
        }
    }
}

/// What a call's cached tokens would have cost uncached minus what they did cost: cache reads
/// at the input price less the read price, less the write premium (writes at their price less
/// the input price). Negative when the writes were not read back. `None` without a price.
pub fn cache_saving_nano(row: &UsageRow, prices: Option<&crate::config::Prices>) -> Option<i64> {
    use tokensaver_core::gate::tokens_cost_nano as cost;
    let p = prices?;
    let u = &row.usage;
    let one_hour = row.cache_write_1h.min(u.cache_write);
    let five_minute = u.cache_write - one_hour;
    let gained =
        i128::from(cost(u.cache_read, p.input)) - i128::from(cost(u.cache_read, p.cache_read));
    let premium = i128::from(cost(five_minute, p.cache_write))
        + i128::from(cost(one_hour, p.cache_write_1h()))
        - i128::from(cost(u.cache_write, p.input));
    i64::try_from(gained - premium).ok()
}

/// A settled call's cache figures by the gate's mechanism (SPEC §2.11b): each derived and
/// counterfactual, never in spend or a savings total, and each taken from the provider's own
/// parts at the price table.
/// - `lifetimes`: one-hour entries (Anthropic) — after a pause, the reads would have been
///   5-minute rewrites; less the one-hour premium paid, pause or not. 24-hour retention
///   (OpenAI) — after a pause, the cached tokens would have been evicted.
/// - `routing`: a routing key that spread the call off its prefix's one route: its cached
///   tokens would have overflowed to a machine without them.
/// - `rebuild_nano`: the call came after a pause and wrote more than it read: the prefix the
///   session had cached was written again (what that write cost). A call that read the prefix
///   and wrote only what the session grew since is no rebuild.
/// - `premium_1h_nano`: what the one-hour writes cost above 5-minute ones.
pub fn cache_figures(
    row: &UsageRow,
    prices: Option<&crate::config::Prices>,
    edits: CacheEdits,
) -> CacheFigures {
    use tokensaver_core::gate::tokens_cost_nano as cost;
    let Some(p) = prices else {
        return CacheFigures::default();
    };
    let u = &row.usage;
    let one_hour = row.cache_write_1h.min(u.cache_write);
    let premium_1h =
        cost(one_hour, p.cache_write_1h()).saturating_sub(cost(one_hour, p.cache_write));
    let read_value =
        |at: u64| i128::from(cost(u.cache_read, at)) - i128::from(cost(u.cache_read, p.cache_read));
    let after_pause = edits.has(CacheEdits::AFTER_PAUSE);
    let lifetimes = if edits.has(CacheEdits::LIFETIME) {
        let gained = if after_pause {
            read_value(p.cache_write)
        } else {
            0
        };
        Some(gained - i128::from(premium_1h))
    } else if edits.has(CacheEdits::RETENTION) {
        Some(if after_pause { read_value(p.input) } else { 0 })
    } else {
        None
    };
    let routing = (edits.has(CacheEdits::ROUTING)).then(|| {
        if edits.has(CacheEdits::SPREAD) {
            read_value(p.input)
        } else {
            0
        }
    });
    let rebuild = (after_pause && u.cache_write > u.cache_read).then(|| {
        cost(u.cache_write - one_hour, p.cache_write)
            .saturating_add(cost(one_hour, p.cache_write_1h()))
    });
    CacheFigures {
        lifetimes_nano: lifetimes.and_then(|v| i64::try_from(v).ok()),
        routing_nano: routing.and_then(|v| i64::try_from(v).ok()),
        rebuild_nano: rebuild,
        premium_1h_nano: premium_1h,
    }
}

/// [`cache_figures`]' answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheFigures {
    pub lifetimes_nano: Option<i64>,
    pub routing_nano: Option<i64>,
    pub rebuild_nano: Option<u64>,
    pub premium_1h_nano: u64,
}

impl CacheFigures {
    /// Onto a usage row, with the breakpoints' saving (the gate placed them).
    pub fn apply(
        self,
        row: &mut UsageRow,
        prices: Option<&crate::config::Prices>,
        edits: CacheEdits,
    ) {
        if edits.has(CacheEdits::BREAKPOINTS) {
            row.cache_saving_nano = cache_saving_nano(row, prices);
        }
        row.cache = crate::store::CacheHealth {
            cache_saving_lifetimes_nano: self.lifetimes_nano,
            cache_saving_routing_nano: self.routing_nano,
            cache_rebuild_nano: self.rebuild_nano,
            cache_premium_1h_nano: self.premium_1h_nano,
        };
    }
}

/// What a settled decision is charged, and on what basis (docs/usage-accounting.md):
/// - a complete answer, or a failed one with the provider's final figures: the reported usage
///   at the served model's prices;
/// - an answer the provider refused (error status) or never received: what it reported
///   (normally nothing), else zero;
/// - any other incomplete answer may have been billed in full: the larger of the decision's
///   reserved worst case and the reported figures with output raised to the request's output
///   ceiling. Never below what may have been billed; the row says `worst_case`.
pub fn settlement(
    ending: Ending,
    usage: Option<&Billed>,
    prices: Option<&crate::config::Prices>,
    reserved_nano: u64,
    output_ceiling: Option<u64>,
) -> (u64, SpendBasis) {
    let priced = |b: &Billed| prices.map(|p| b.cost_nano(p)).unwrap_or(0);
    if prices.is_none() && (usage.is_some() || ending.billable()) {
        // A cost the gate cannot price is unknown, not zero.
        return (0, SpendBasis::Unpriced);
    }
    match (ending, usage) {
        (Ending::Complete | Ending::Failed, Some(u)) => (priced(u), SpendBasis::Reported),
        (e, Some(u)) if !e.billable() => (priced(u), SpendBasis::Reported),
        (e, None) if !e.billable() => (0, SpendBasis::None),
        (_, reported) => {
            let bound = reported
                .map(|u| {
                    let mut b = *u;
                    if let Some(ceiling) = output_ceiling {
                        b.usage.output = b.usage.output.max(ceiling);
                    }
                    priced(&b)
                })
                .unwrap_or(0);
            (reserved_nano.max(bound), SpendBasis::WorstCase)
        }
    }
}

/// What a digest client's `POST /record` may report for one decision: no more output than the
/// decision's output ceiling, no more input than every character of the request billed as a
/// token (3 × the one-per-3-characters estimate) plus provider framing, and no part above
/// [`MAX_RECORDED_TOKENS`]. The proxy's own records are the provider's word and are not
/// bounded: only a caller's claim is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordBound {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl RecordBound {
    pub fn of(input_tokens_estimated: u64, output_ceiling: Option<u64>) -> RecordBound {
        RecordBound {
            input_tokens: input_tokens_estimated
                .saturating_mul(3)
                .saturating_add(RECORD_INPUT_FRAMING_TOKENS)
                .min(MAX_RECORDED_TOKENS),
            output_tokens: output_ceiling
                .unwrap_or(MAX_RECORDED_TOKENS)
                .min(MAX_RECORDED_TOKENS),
        }
    }

    /// Whether a report's usage (if any) stays within the bound: the one check a digest
    /// client's record meets, on a single node and in a fleet.
    pub fn admits_report(&self, report: &UsageReport) -> bool {
        report
            .usage
            .as_ref()
            .is_none_or(|billed| self.admits(billed))
    }

    /// Whether `billed` stays within the bound.
    pub fn admits(&self, billed: &Billed) -> bool {
        let u = &billed.usage;
        let input = u
            .input
            .checked_add(u.cache_write)
            .and_then(|s| s.checked_add(u.cache_read));
        input.is_some_and(|i| i <= self.input_tokens)
            && u.output <= self.output_tokens
            && billed.cache_write_1h <= u.cache_write
            && billed.web_search_requests <= MAX_RECORDED_TOKENS
    }
}
