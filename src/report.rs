//! The ledger's renderings, the same for every reader: the terminal table (`tokensaver
//! ledger`), the CSV of `/ledger` and `/ledger/decisions`, and the sessions summary the page,
//! `/ledger/sessions` and the command line show. Pure: given rows, text.

use serde::Serialize;

use crate::store::{utc_day, DecisionPage, LedgerDay, LedgerTotals};
use tokensaver_core::gate::Verdict;

fn usd(nano: u64) -> String {
    format!(
        "${}.{:06}",
        nano / 1_000_000_000,
        (nano % 1_000_000_000) / 1_000
    )
}

/// A signed nano-USD amount (the cache saving is negative when writes were never read).
fn usd_signed(nano: i64) -> String {
    let sign = if nano < 0 { "-" } else { "" };
    format!("{sign}{}", usd(nano.unsigned_abs()))
}

/// Each day's totals, then the overall total under the label `total`.
fn rows<'a>(
    days: &'a [LedgerDay],
    total: &'a LedgerTotals,
) -> impl Iterator<Item = (&'a str, &'a LedgerTotals)> {
    days.iter()
        .map(|d| (d.day.as_str(), &d.totals))
        .chain([("total", total)])
}

/// Columns of `GET /ledger?format=csv`: every tier and usage part in its own column.
const LEDGER_COLUMNS: [&str; 16] = [
    "day",
    "requests",
    "serve",
    "allow",
    "downgrade",
    "challenge",
    "block",
    "spend_nano",
    "input",
    "cache_write",
    "cache_read",
    "output",
    "tokens_not_bought",
    "worst_case_tokens_avoided",
    "findings_tokens_estimated",
    "cache_saving_nano",
];

/// `GET /ledger?format=csv`: each day's row, then the total's (day `total`).
pub fn csv(days: &[LedgerDay], total: &LedgerTotals) -> String {
    table(
        LEDGER_COLUMNS,
        rows(days, total).map(|(day, t)| {
            [
                day.to_string(),
                t.requests.to_string(),
                t.count(Verdict::Serve).to_string(),
                t.count(Verdict::Allow).to_string(),
                t.count(Verdict::Downgrade).to_string(),
                t.count(Verdict::Challenge).to_string(),
                t.count(Verdict::Block).to_string(),
                t.spend_nano.to_string(),
                t.usage.input.to_string(),
                t.usage.cache_write.to_string(),
                t.usage.cache_read.to_string(),
                t.usage.output.to_string(),
                t.tokens_not_bought.to_string(),
                t.worst_case_tokens_avoided.to_string(),
                t.findings_tokens_estimated.to_string(),
                t.cache_saving_nano.to_string(),
            ]
        }),
    )
}

/// A CSV table by the `csv` crate (fields quoted where they must be). Every text field a
/// caller chose goes through [`defused`] first; the header is written even with no rows.
fn table<const N: usize>(header: [&str; N], rows: impl Iterator<Item = [String; N]>) -> String {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    // Writing to a Vec cannot fail.
    let _ = w.write_record(header);
    for row in rows {
        let _ = w.write_record(&row);
    }
    let bytes = w.into_inner().unwrap_or_default();
    String::from_utf8(bytes).unwrap_or_default()
}

/// A nano-USD amount as a decimal dollar figure with all nine places (exact).
pub fn usd_exact(nano: u64) -> String {
    format!("{}.{:09}", nano / 1_000_000_000, nano % 1_000_000_000)
}

/// A text field a caller chose (a key id, a model name): a leading `=`, `+`, `-`, `@`, tab or
/// carriage return (a formula to a spreadsheet) is defused with a `'`.
fn defused(s: &str) -> String {
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    }
}

/// Columns of `GET /ledger/decisions?format=csv`.
const DECISION_COLUMNS: [&str; 26] = [
    "decision_id",
    "key_id",
    "decided_at_ms",
    "decided_at",
    "verdict",
    "reason",
    "model_requested",
    "model_served",
    "wire",
    "status",
    "ending",
    "basis",
    "settled_at_ms",
    "input",
    "cache_write",
    "cache_write_1h",
    "cache_read",
    "output",
    "web_search_requests",
    "reserved_nano",
    "spend_nano",
    "spend_usd",
    "tokens_not_bought",
    "worst_case_tokens_avoided",
    "hold_id",
    "cache_saving_nano",
];

/// `GET /ledger/decisions?format=csv`: one line per decision, every usage part and billed
/// item in its own column, spend in nano-USD and as an exact dollar figure. Never content.
pub fn decisions_csv(page: &DecisionPage) -> String {
    table(
        DECISION_COLUMNS,
        page.decisions.iter().map(|d| {
            [
                d.decision_id.to_string(),
                defused(&d.key_id),
                d.decided_at_ms.to_string(),
                utc_time(d.decided_at_ms),
                d.verdict.as_str().to_string(),
                defused(&d.reason),
                defused(&d.model_requested),
                defused(d.model_served.as_deref().unwrap_or("")),
                d.wire.as_str().to_string(),
                d.status.to_string(),
                d.ending.map(|e| e.as_str()).unwrap_or("").to_string(),
                d.basis.map(|b| b.as_str()).unwrap_or("").to_string(),
                d.settled_at_ms.map(|t| t.to_string()).unwrap_or_default(),
                d.input.to_string(),
                d.cache_write.to_string(),
                d.cache_write_1h.to_string(),
                d.cache_read.to_string(),
                d.output.to_string(),
                d.web_search_requests.to_string(),
                d.reserved_nano.to_string(),
                d.spend_nano.to_string(),
                usd_exact(d.spend_nano),
                d.tokens_not_bought.to_string(),
                d.worst_case_tokens_avoided.to_string(),
                defused(d.hold_id.as_deref().unwrap_or("")),
                d.cache_saving_nano
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
            ]
        }),
    )
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a unix-milliseconds time.
pub fn utc_time(ms: u64) -> String {
    let secs = ms / 1000;
    format!(
        "{}T{:02}:{:02}:{:02}.{:03}Z",
        utc_day(ms),
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
        ms % 1000
    )
}

pub fn render(days: &[LedgerDay], total: &LedgerTotals) -> String {
    let mut out = format!(
        "{:<12} {:>8} {:>6} {:>6} {:>9} {:>9} {:>6} {:>14} {:>18} {:>26} {:>18} {:>22}\n",
        "day",
        "requests",
        "SERVE",
        "ALLOW",
        "DOWNGRADE",
        "CHALLENGE",
        "BLOCK",
        "spend",
        "tokens_not_bought",
        "worst_case_tokens_avoided",
        "findings (est.)",
        "cache saving (derived)"
    );
    for (day, t) in rows(days, total) {
        out.push_str(&format!(
            "{:<12} {:>8} {:>6} {:>6} {:>9} {:>9} {:>6} {:>14} {:>18} {:>26} {:>18} {:>22}\n",
            day,
            t.requests,
            t.count(Verdict::Serve),
            t.count(Verdict::Allow),
            t.count(Verdict::Downgrade),
            t.count(Verdict::Challenge),
            t.count(Verdict::Block),
            usd(t.spend_nano),
            t.tokens_not_bought,
            t.worst_case_tokens_avoided,
            t.findings_tokens_estimated,
            usd_signed(t.cache_saving_nano)
        ));
    }
    out.push_str(&cache_health(total));
    if total.unpriced_calls > 0 {
        out.push_str(&format!(
            "\n{} call(s) were billed for a model with no price: their spend is unknown and not in the spend column.\n",
            total.unpriced_calls
        ));
    }
    out.push_str("\ntokens_not_bought is the only savings total (provider-reported usage of answers served from store).\nworst_case_tokens_avoided is a ceiling on refused calls, reported apart; findings figures are estimates.\n\
         cache saving is derived and counterfactual, counted only where the gate placed the prompt-cache breakpoints: what the cached tokens would have cost uncached minus what they cost (read price and write premium); it is in no total.\n");
    out
}

/// The total's cache health: what the provider billed, then each mechanism's derived saving.
fn cache_health(t: &LedgerTotals) -> String {
    format!(
        "\ncache health: {} of {} prompt tokens read from the cache; {} rebuild(s) after a pause costing {}; one-hour premium {}\n\
         derived saving by mechanism (counterfactual, in no total): breakpoints {}, lifetimes {}, routing {}\n",
        percent(t.cache_read_share()),
        t.prompt_tokens(),
        t.cache_rebuilds,
        usd(t.cache_rebuild_nano),
        usd(t.cache_premium_1h_nano),
        usd_signed(t.cache_saving_nano),
        usd_signed(t.cache_saving_lifetimes_nano),
        usd_signed(t.cache_saving_routing_nano),
    )
}

/// One agent session as the ledger shows it (SPEC §2.11a): what it cost, how it was decided,
/// and where it stopped making progress. Counts and hashes only, never content.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionSummary {
    pub session: tokensaver_core::request::Hash,
    pub key_id: String,
    pub first_ms: u64,
    pub last_ms: u64,
    pub calls: u64,
    pub spend_nano: u64,
    pub by_verdict: std::collections::BTreeMap<&'static str, u64>,
    /// Decisions (SERVEs excepted: a SERVE buys nothing) whose step this session had already
    /// taken: a repeated tool call with the same (normalised) result.
    pub steps_repeated: u64,
    /// Time the gate held the session's repeated steps in all.
    pub paced_ms: u64,
    /// When the session last took a step it had not taken before, and how many decisions
    /// came after it: where it stopped making progress.
    pub last_progress_ms: u64,
    pub decisions_since_progress: u64,
    /// The rule or band of the session's last decision when it was refused or held (BLOCK,
    /// CHALLENGE): what ended it, if the gate did.
    pub ended_by: Option<String>,
    #[serde(flatten)]
    pub cache: CacheTally,
}

/// A span's cache health (SPEC §2.11b): what the provider reported and billed, then the
/// derived, counterfactual saving of each of the gate's mechanisms, never in any total.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CacheTally {
    /// Prompt tokens billed: uncached input, cache writes and cache reads.
    pub prompt_tokens: u64,
    pub cache_read_tokens: u64,
    /// `cache_read_tokens / prompt_tokens` (set by [`sessions_of`] once the span is summed);
    /// `None` before any call was billed.
    pub cache_read_share: Option<f64>,
    /// Calls that wrote the cache after a pause of their session, and what those writes cost.
    pub cache_rebuilds: u64,
    #[serde(rename = "cache_rebuild")]
    pub cache_rebuild_nano: u64,
    /// What one-hour writes cost above five-minute ones.
    #[serde(rename = "cache_premium_1h")]
    pub cache_premium_1h_nano: u64,
    /// Derived and counterfactual, by mechanism: breakpoints placed, lifetimes (one-hour
    /// entries, 24-hour retention), routing keys.
    #[serde(rename = "cache_saving")]
    pub cache_saving_nano: i64,
    #[serde(rename = "cache_saving_lifetimes")]
    pub cache_saving_lifetimes_nano: i64,
    #[serde(rename = "cache_saving_routing")]
    pub cache_saving_routing_nano: i64,
}

impl CacheTally {
    pub fn add(&mut self, d: &crate::store::DecisionLine) {
        let prompt = d
            .input
            .saturating_add(d.cache_write)
            .saturating_add(d.cache_read);
        self.prompt_tokens = self.prompt_tokens.saturating_add(prompt);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(d.cache_read);
        if let Some(nano) = d.cache.cache_rebuild_nano {
            self.cache_rebuilds += 1;
            self.cache_rebuild_nano = self.cache_rebuild_nano.saturating_add(nano);
        }
        self.cache_premium_1h_nano = self
            .cache_premium_1h_nano
            .saturating_add(d.cache.cache_premium_1h_nano);
        let signed = |total: &mut i64, part: Option<i64>| {
            *total = total.saturating_add(part.unwrap_or(0));
        };
        signed(&mut self.cache_saving_nano, d.cache_saving_nano);
        signed(
            &mut self.cache_saving_lifetimes_nano,
            d.cache.cache_saving_lifetimes_nano,
        );
        signed(
            &mut self.cache_saving_routing_nano,
            d.cache.cache_saving_routing_nano,
        );
    }
}

/// `83.4 %`, or `-` when nothing was billed.
pub fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_string(), |s| format!("{:.1} %", s * 100.0))
}

/// Decisions grouped into their sessions (decisions without one are left out), the most
/// recently active session first. `lines` are oldest first, as the store lists them.
pub fn sessions_of(lines: &[crate::store::DecisionLine]) -> Vec<SessionSummary> {
    use std::collections::{HashMap, HashSet};
    struct Open {
        summary: SessionSummary,
        steps: HashSet<tokensaver_core::request::Hash>,
    }
    let mut open: HashMap<(&str, tokensaver_core::request::Hash), Open> = HashMap::new();
    for d in lines {
        let Some(session) = d.session else { continue };
        let entry = open
            .entry((d.key_id.as_str(), session))
            .or_insert_with(|| Open {
                summary: SessionSummary {
                    session,
                    key_id: d.key_id.clone(),
                    first_ms: d.decided_at_ms,
                    last_ms: d.decided_at_ms,
                    calls: 0,
                    spend_nano: 0,
                    by_verdict: Default::default(),
                    steps_repeated: 0,
                    paced_ms: 0,
                    last_progress_ms: d.decided_at_ms,
                    decisions_since_progress: 0,
                    ended_by: None,
                    cache: CacheTally::default(),
                },
                steps: HashSet::new(),
            });
        let s = &mut entry.summary;
        s.calls += 1;
        s.last_ms = s.last_ms.max(d.decided_at_ms);
        s.spend_nano = s.spend_nano.saturating_add(d.spend_nano);
        *s.by_verdict.entry(d.verdict.as_str()).or_default() += 1;
        s.paced_ms = s.paced_ms.saturating_add(d.paced_ms);
        s.cache.add(d);
        let new_step = d.step.is_none_or(|step| entry.steps.insert(step));
        if new_step {
            s.last_progress_ms = d.decided_at_ms;
            s.decisions_since_progress = 0;
        } else {
            s.decisions_since_progress += 1;
            if d.verdict != Verdict::Serve {
                s.steps_repeated += 1;
            }
        }
        s.ended_by =
            matches!(d.verdict, Verdict::Block | Verdict::Challenge).then(|| d.reason.clone());
    }
    let mut sessions: Vec<SessionSummary> = open
        .into_values()
        .map(|o| {
            let mut s = o.summary;
            s.cache.cache_read_share =
                crate::store::read_share(s.cache.cache_read_tokens, s.cache.prompt_tokens);
            s
        })
        .collect();
    sessions
        .sort_by(|a, b| (b.last_ms, &b.key_id, b.session).cmp(&(a.last_ms, &a.key_id, a.session)));
    sessions
}

/// `tokensaver ledger --sessions`: one line per session.
pub fn sessions_table(sessions: &[SessionSummary]) -> String {
    let mut out = format!(
        "{:<12} {:<16} {:<20} {:>6} {:>14} {:>10} {:>8} {:>14} {:>9} {:>9} {:<24} {}\n",
        "session",
        "key",
        "last decided (UTC)",
        "calls",
        "spend",
        "cache read",
        "rebuilds",
        "rebuild cost",
        "repeated",
        "paced s",
        "ended by",
        "verdicts"
    );
    for s in sessions {
        let verdicts: Vec<String> = s
            .by_verdict
            .iter()
            .map(|(v, n)| format!("{v} {n}"))
            .collect();
        out.push_str(&format!(
            "{:<12} {:<16} {:<20} {:>6} {:>14} {:>10} {:>8} {:>14} {:>9} {:>9} {:<24} {}\n",
            &s.session.to_hex()[..12],
            s.key_id,
            utc_time(s.last_ms),
            s.calls,
            usd(s.spend_nano),
            percent(s.cache.cache_read_share),
            s.cache.cache_rebuilds,
            usd(s.cache.cache_rebuild_nano),
            s.steps_repeated,
            s.paced_ms / 1_000,
            s.ended_by.as_deref().unwrap_or("-"),
            verdicts.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_one_line_per_day_then_the_total() {
        let mut day = LedgerTotals {
            requests: 3,
            spend_nano: 1_500,
            tokens_not_bought: 40,
            cache_saving_nano: -25,
            ..LedgerTotals::default()
        };
        day.by_verdict.insert("SERVE".into(), 1);
        day.by_verdict.insert("ALLOW".into(), 2);
        let days = [LedgerDay {
            day: "2026-11-30".into(),
            totals: day.clone(),
        }];
        let text = csv(&days, &day);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "day,requests,serve,allow,downgrade,challenge,block,spend_nano,input,cache_write,cache_read,output,tokens_not_bought,worst_case_tokens_avoided,findings_tokens_estimated,cache_saving_nano"
        );
        assert_eq!(lines[1], "2026-11-30,3,1,2,0,0,0,1500,0,0,0,0,40,0,0,-25");
        assert_eq!(lines[2], "total,3,1,2,0,0,0,1500,0,0,0,0,40,0,0,-25");
        assert_eq!(lines.len(), 3);
    }

    /// A caller's text reads back as written (quoted where it holds a separator, a quote or a
    /// line break) and never as a formula; an empty page is its header alone.
    #[test]
    fn csv_fields_are_quoted_and_defused() {
        let text = table(
            ["key_id", "model"],
            [[defused("=HYPERLINK(1)"), defused("a,\"b\"\nc")]].into_iter(),
        );
        let mut r = csv::Reader::from_reader(text.as_bytes());
        assert_eq!(r.headers().unwrap(), vec!["key_id", "model"]);
        let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
        assert_eq!(rows.len(), 1);
        assert_eq!(&rows[0][0], "'=HYPERLINK(1)");
        assert_eq!(&rows[0][1], "a,\"b\"\nc");
        assert_eq!(table(["a", "b"], std::iter::empty()), "a,b\n");
    }

    #[test]
    fn the_table_shows_the_cache_saving_signed_and_says_what_it_is() {
        let total = LedgerTotals {
            cache_saving_nano: -1_250_000_000,
            ..LedgerTotals::default()
        };
        let text = render(&[], &total);
        assert!(text
            .lines()
            .next()
            .unwrap()
            .ends_with("cache saving (derived)"));
        assert!(
            text.lines().nth(1).unwrap().ends_with("-$1.250000"),
            "{text}"
        );
        assert!(text.contains("counterfactual"));
        assert_eq!(usd_signed(600_000_000), "$0.600000");
    }
}
