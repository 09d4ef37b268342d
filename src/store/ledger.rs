//! The one ledger read both databases share: each store's SQL sums its rows by UTC day, and
//! [`LedgerFold`] folds those sums into per-day rows and their total; each decision's
//! settlement is named by [`Settlement::line_terms`]. What a figure means is decided here once,
//! so the embedded ledger and the fleet's cannot drift apart.

use std::collections::BTreeMap;

use tokensaver_core::gate::{Usage, Verdict};

use super::{utc_day, Ending, LedgerDay, LedgerTotals, SpendBasis};

/// The most decisions one page lists.
pub const MAX_DECISIONS_PAGE: usize = 1000;

const DAY_MS: u64 = 86_400_000;

/// One day's decisions of one verdict.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecisionSums {
    pub count: u64,
    pub tokens_not_bought: u64,
    /// Of BLOCKs only (the store's SQL sums it for them alone).
    pub worst_case_tokens_avoided: u64,
    pub findings_tokens: u64,
}

/// One day's usage rows: what they were billed, and the derived cache figures beside it.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageSums {
    pub spend_nano: u64,
    pub usage: Usage,
    pub unpriced_calls: u64,
    pub cache_saving_nano: i64,
    pub cache_saving_lifetimes_nano: i64,
    pub cache_saving_routing_nano: i64,
    pub cache_rebuilds: u64,
    pub cache_rebuild_nano: u64,
    pub cache_premium_1h_nano: u64,
}

/// Per-day sums, keyed by the day's number since the epoch.
#[derive(Debug, Default)]
pub struct LedgerFold {
    days: BTreeMap<u64, LedgerTotals>,
}

impl LedgerFold {
    fn day(&mut self, day: u64) -> &mut LedgerTotals {
        self.days.entry(day).or_default()
    }

    pub fn decisions(&mut self, day: u64, verdict: Verdict, s: DecisionSums) {
        let t = self.day(day);
        t.requests = t.requests.saturating_add(s.count);
        let slot = t.by_verdict.entry(verdict.as_str().to_owned()).or_default();
        *slot = slot.saturating_add(s.count);
        t.tokens_not_bought = t.tokens_not_bought.saturating_add(s.tokens_not_bought);
        t.worst_case_tokens_avoided = t
            .worst_case_tokens_avoided
            .saturating_add(s.worst_case_tokens_avoided);
        t.findings_tokens_estimated = t
            .findings_tokens_estimated
            .saturating_add(s.findings_tokens);
    }

    pub fn usage(&mut self, day: u64, s: UsageSums) {
        add(
            self.day(day),
            &LedgerTotals {
                spend_nano: s.spend_nano,
                usage: s.usage,
                unpriced_calls: s.unpriced_calls,
                cache_saving_nano: s.cache_saving_nano,
                cache_saving_lifetimes_nano: s.cache_saving_lifetimes_nano,
                cache_saving_routing_nano: s.cache_saving_routing_nano,
                cache_rebuilds: s.cache_rebuilds,
                cache_rebuild_nano: s.cache_rebuild_nano,
                cache_premium_1h_nano: s.cache_premium_1h_nano,
                ..LedgerTotals::default()
            },
        );
    }

    /// Reservations never settled, charged their worst case when they expired.
    pub fn expiry_charges(&mut self, day: u64, charged_nano: u64) {
        let t = self.day(day);
        t.spend_nano = t.spend_nano.saturating_add(charged_nano);
    }

    /// Holds never used (expired, or denied by a person): their worst case counts as avoided
    /// on the day of the request they held.
    pub fn unused_holds(&mut self, day: u64, worst_case_tokens: u64) {
        let t = self.day(day);
        t.worst_case_tokens_avoided = t
            .worst_case_tokens_avoided
            .saturating_add(worst_case_tokens);
    }

    /// Each day's row (every verdict present, zero when none), oldest first, and the total.
    pub fn finish(self) -> (Vec<LedgerDay>, LedgerTotals) {
        let mut total = empty_totals();
        let mut out = Vec::with_capacity(self.days.len());
        for (day, t) in self.days {
            let mut totals = empty_totals();
            add(&mut totals, &t);
            add(&mut total, &t);
            out.push(LedgerDay {
                day: utc_day(day.saturating_mul(DAY_MS)),
                totals,
            });
        }
        (out, total)
    }
}

/// Totals with every verdict present (zero when none), so per-day rows share one shape.
fn empty_totals() -> LedgerTotals {
    let mut t = LedgerTotals::default();
    for v in Verdict::ALL {
        t.by_verdict.insert(v.as_str().to_owned(), 0);
    }
    t
}

fn add(into: &mut LedgerTotals, t: &LedgerTotals) {
    into.requests = into.requests.saturating_add(t.requests);
    for (v, n) in &t.by_verdict {
        let slot = into.by_verdict.entry(v.clone()).or_default();
        *slot = slot.saturating_add(*n);
    }
    into.spend_nano = into.spend_nano.saturating_add(t.spend_nano);
    into.usage.add(&t.usage);
    into.tokens_not_bought = into.tokens_not_bought.saturating_add(t.tokens_not_bought);
    into.worst_case_tokens_avoided = into
        .worst_case_tokens_avoided
        .saturating_add(t.worst_case_tokens_avoided);
    into.findings_tokens_estimated = into
        .findings_tokens_estimated
        .saturating_add(t.findings_tokens_estimated);
    into.unpriced_calls = into.unpriced_calls.saturating_add(t.unpriced_calls);
    into.cache_saving_nano = into.cache_saving_nano.saturating_add(t.cache_saving_nano);
    into.cache_saving_lifetimes_nano = into
        .cache_saving_lifetimes_nano
        .saturating_add(t.cache_saving_lifetimes_nano);
    into.cache_saving_routing_nano = into
        .cache_saving_routing_nano
        .saturating_add(t.cache_saving_routing_nano);
    into.cache_rebuilds = into.cache_rebuilds.saturating_add(t.cache_rebuilds);
    into.cache_rebuild_nano = into.cache_rebuild_nano.saturating_add(t.cache_rebuild_nano);
    into.cache_premium_1h_nano = into
        .cache_premium_1h_nano
        .saturating_add(t.cache_premium_1h_nano);
}

/// How a decision was settled, as either store reads it beside the decision.
#[derive(Debug, Clone, Copy)]
pub enum Settlement {
    /// The provider's usage was recorded.
    Usage {
        ending: Option<Ending>,
        /// Rows from before schema 5 have no ending: whether the answer was complete.
        complete: bool,
        basis: Option<SpendBasis>,
        at_ms: u64,
        spend_nano: u64,
    },
    /// Never settled: charged its reservation when the TTL ran out.
    Expired { at_ms: u64, charged_nano: u64 },
    /// Nothing yet.
    None,
}

impl Settlement {
    /// The decision's status on `GET /ledger/decisions` (`complete`, `incomplete`,
    /// `not_billed`, `expired`, `open`, `not_forwarded`), the basis of its spend, when it was
    /// settled and the spend.
    pub fn line_terms(
        self,
        verdict: Verdict,
    ) -> (&'static str, Option<SpendBasis>, Option<u64>, u64) {
        match self {
            Settlement::Usage {
                ending,
                complete,
                basis,
                at_ms,
                spend_nano,
            } => {
                let status = match ending {
                    Some(Ending::Complete) => "complete",
                    Some(e) if !e.billable() => "not_billed",
                    Some(_) => "incomplete",
                    None if complete => "complete",
                    None => "incomplete",
                };
                (status, basis, Some(at_ms), spend_nano)
            }
            Settlement::Expired {
                at_ms,
                charged_nano,
            } => (
                "expired",
                Some(SpendBasis::WorstCase),
                Some(at_ms),
                charged_nano,
            ),
            Settlement::None if verdict.forwards() => ("open", None, None, 0),
            Settlement::None => ("not_forwarded", None, None, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two days and a total: every verdict present on each row, usage and derived cache figures
    /// summed part by part, an expiry charge added to spend, an unused hold to avoided tokens.
    #[test]
    fn the_fold_keeps_each_figure_in_its_own_column() {
        let mut fold = LedgerFold::default();
        let day0 = 20_000;
        fold.decisions(
            day0,
            Verdict::Block,
            DecisionSums {
                count: 2,
                worst_case_tokens_avoided: 700,
                findings_tokens: 5,
                ..DecisionSums::default()
            },
        );
        fold.usage(
            day0 + 1,
            UsageSums {
                spend_nano: 1_000,
                usage: Usage {
                    input: 10,
                    cache_write: 20,
                    cache_read: 30,
                    output: 4,
                },
                cache_saving_lifetimes_nano: -7,
                cache_rebuilds: 1,
                cache_rebuild_nano: 300,
                cache_premium_1h_nano: 40,
                ..UsageSums::default()
            },
        );
        fold.expiry_charges(day0 + 1, 500);
        fold.unused_holds(day0, 60);
        let (days, total) = fold.finish();
        assert_eq!(days.len(), 2);
        assert_eq!(days[0].day, utc_day(day0 * DAY_MS));
        assert_eq!(days[0].totals.count(Verdict::Block), 2);
        assert_eq!(days[0].totals.by_verdict.len(), Verdict::ALL.len());
        assert_eq!(days[0].totals.worst_case_tokens_avoided, 760);
        assert_eq!(days[1].totals.spend_nano, 1_500);
        assert_eq!(total.usage.cache_read, 30);
        assert_eq!(total.cache_saving_lifetimes_nano, -7);
        assert_eq!(
            (
                total.cache_rebuilds,
                total.cache_rebuild_nano,
                total.cache_premium_1h_nano
            ),
            (1, 300, 40)
        );
        assert_eq!((total.requests, total.findings_tokens_estimated), (2, 5));
    }

    #[test]
    fn a_settlement_names_its_status() {
        let usage = |ending, complete| Settlement::Usage {
            ending,
            complete,
            basis: None,
            at_ms: 9,
            spend_nano: 3,
        };
        let status = |s: Settlement, v| s.line_terms(v).0;
        assert_eq!(
            status(usage(Some(Ending::Complete), false), Verdict::Allow),
            "complete"
        );
        assert_eq!(status(usage(None, true), Verdict::Allow), "complete");
        assert_eq!(status(usage(None, false), Verdict::Allow), "incomplete");
        let expired = Settlement::Expired {
            at_ms: 5,
            charged_nano: 70,
        };
        assert_eq!(
            expired.line_terms(Verdict::Allow),
            ("expired", Some(SpendBasis::WorstCase), Some(5), 70)
        );
        assert_eq!(status(Settlement::None, Verdict::Allow), "open");
        assert_eq!(status(Settlement::None, Verdict::Block), "not_forwarded");
    }
}
