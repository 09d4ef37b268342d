//! What the page shows, read through the gatekeeper and `crate::economics` for one scope
//! (the admin: every key; a key: itself). Figures only: no prompt or answer text exists in
//! anything read here, and fingerprints are cut before they reach the page.

use serde_json::Value;

use super::session::Scope;
use crate::gatekeeper::{BudgetView, Gatekeeper, HoldView, LeaseView};
use crate::receipt::DecisionId;
use crate::store::{utc_day, DecisionListing, LedgerTotals, StoreError, VerdictCount};
use tokensaver_core::gate::Verdict;

/// How many of the latest decisions the page lists.
pub const LATEST: usize = 50;

/// The plot's time range and bucket width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// The last hour, per minute: watching an agent.
    Hour,
    /// The last 24 hours, per hour.
    Day,
    /// The last 30 days, per day.
    Month,
}

impl Range {
    pub const ALL: [Range; 3] = [Range::Hour, Range::Day, Range::Month];

    pub fn parse(s: Option<&str>) -> Range {
        match s {
            Some("1h") => Range::Hour,
            Some("30d") => Range::Month,
            _ => Range::Day,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "1h",
            Range::Day => "24h",
            Range::Month => "30d",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Range::Hour => "last hour, per minute",
            Range::Day => "last 24 hours, per hour",
            Range::Month => "last 30 days, per day (UTC)",
        }
    }

    /// `(bucket width, bucket count)`.
    pub fn buckets(self) -> (u64, usize) {
        match self {
            Range::Hour => (60_000, 60),
            Range::Day => (3_600_000, 24),
            Range::Month => (86_400_000, 30),
        }
    }

    /// The first bucket's start: the buckets end with the one that holds `now_ms`.
    pub fn first_ms(self, now_ms: u64) -> u64 {
        let (w, n) = self.buckets();
        (now_ms - now_ms % w).saturating_sub(w * (n as u64 - 1))
    }
}

/// One key's row: its budget now, today's and all-time ledger figures.
#[derive(Debug, Clone)]
pub struct KeyLine {
    pub key_id: String,
    pub budget: BudgetView,
    pub today: LedgerTotals,
    pub total: LedgerTotals,
    /// Whether the key has an owner secret (its owner can approve its holds).
    pub has_owner: bool,
}

/// One listed decision, with the finding codes of its receipt when the receipt is still kept.
#[derive(Debug, Clone)]
pub struct DecisionLine {
    pub listing: DecisionListing,
    /// `None`: the receipt is no longer in memory (older than the ring, or before a restart).
    pub finding_codes: Option<Vec<String>>,
}

/// The economics verdict, as far as the page shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct EconomicsBrief {
    pub statement: String,
    pub publishable: bool,
    /// The statement is about a simulation (a scripted provider), never a measurement.
    pub simulation: bool,
    pub metric: Option<String>,
    pub status: Option<String>,
    pub value: Option<f64>,
    /// `(low, high, level in basis points)`.
    pub interval: Option<(f64, f64, u64)>,
}

impl EconomicsBrief {
    /// Read the summary as JSON, so the page depends on its published field names only.
    pub fn from_summary(summary: &Value) -> EconomicsBrief {
        let verdict = &summary["verdict"];
        let statement = verdict["statement"].as_str().unwrap_or("").to_string();
        let flagged = |v: &Value| {
            ["simulation", "simulated"]
                .iter()
                .any(|k| v[*k].as_bool() == Some(true))
        };
        let simulation =
            statement.starts_with("In a simulation") || flagged(summary) || flagged(verdict);
        let primary = summary["primary_metric"].as_str();
        let metric = summary["metrics"].as_array().and_then(|ms| {
            ms.iter()
                .find(|m| primary.is_some_and(|p| m["id"].as_str() == Some(p)))
        });
        let interval = metric.and_then(|m| {
            let i = &m["interval"];
            Some((
                i["low"].as_f64()?,
                i["high"].as_f64()?,
                i["level_bp"].as_u64().unwrap_or(9_500),
            ))
        });
        EconomicsBrief {
            statement,
            publishable: verdict["publishable"].as_bool() == Some(true),
            simulation,
            metric: primary.map(str::to_string),
            status: metric
                .and_then(|m| m["status"].as_str())
                .map(str::to_string),
            value: metric.and_then(|m| m["value"].as_f64()),
            interval,
        }
    }
}

/// Everything one page view shows.
#[derive(Debug, Clone)]
pub struct View {
    pub scope: Scope,
    pub now_ms: u64,
    pub today: String,
    pub range: Range,
    pub keys: Vec<KeyLine>,
    /// The admin's fleet totals (every key, also keys no longer configured).
    pub fleet: Option<LedgerTotals>,
    pub verdict_counts: Vec<VerdictCount>,
    pub verdict_filter: Option<Verdict>,
    pub decisions: Vec<DecisionLine>,
    pub holds: Vec<HoldView>,
    pub leases: Vec<LeaseView>,
    pub economics: Option<EconomicsBrief>,
    /// The agent sessions active in the last 24 h, most recent first (at most [`SESSIONS`]).
    pub sessions: Vec<crate::report::SessionSummary>,
}

/// Sessions the page lists, and the decisions it reads to group them.
pub const SESSIONS: usize = 10;
const SESSION_DECISIONS: usize = 5_000;

/// The sessions of the last 24 h (`key_filter`: one key's).
async fn recent_sessions(
    gatekeeper: &Gatekeeper,
    key_filter: Option<&str>,
    now_ms: u64,
) -> Result<Vec<crate::report::SessionSummary>, StoreError> {
    // The newest decisions of the day, not the oldest: another key's flood must not push the
    // sessions running now off the page. The newest `SESSION_DECISIONS` give the time to read
    // from; the page reads forward from there.
    let day_ago = now_ms.saturating_sub(86_400_000);
    let newest = gatekeeper
        .latest_decisions(key_filter, None, SESSION_DECISIONS)
        .await?;
    let from_ms = match newest.last() {
        Some(oldest) if newest.len() >= SESSION_DECISIONS => oldest.row.decided_at_ms.max(day_ago),
        _ => day_ago,
    };
    let query = crate::store::DecisionQuery {
        key_id: key_filter.map(str::to_string),
        from_ms: Some(from_ms),
        limit: crate::store::ledger::MAX_DECISIONS_PAGE,
        ..Default::default()
    };
    // Decisions that share the oldest one's millisecond, and those made since, come too:
    // twice the count bounds them.
    let (lines, _) = crate::store::read_pages(query, 2 * SESSION_DECISIONS, |q| async move {
        gatekeeper.decision_page(&q).await
    })
    .await?;
    let mut sessions = crate::report::sessions_of(&lines);
    sessions.truncate(SESSIONS);
    Ok(sessions)
}

/// The finding codes a receipt body names.
fn finding_codes(gatekeeper: &Gatekeeper, decision_id: &DecisionId) -> Option<Vec<String>> {
    let envelope = gatekeeper.recent_receipt(decision_id, None)?;
    let body: Value = serde_json::from_slice(&envelope.body_bytes().ok()?).ok()?;
    Some(
        body["findings"]
            .as_array()?
            .iter()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect(),
    )
}

pub struct Request<'a> {
    pub scope: &'a Scope,
    pub range: Range,
    pub verdict_filter: Option<Verdict>,
    pub now_ms: u64,
    pub economics: Option<EconomicsBrief>,
}

/// Read one view. A key scope reads that key only; every read below is filtered by it.
/// Every read goes through the gate's home: on a fleet, the whole fleet's ledger.
pub async fn read(gatekeeper: &Gatekeeper, req: Request<'_>) -> Result<View, StoreError> {
    let key_filter = req.scope.key_id();
    let today = utc_day(req.now_ms);
    let config = &gatekeeper.core.config;
    let mut keys = Vec::new();
    for key in config
        .keys
        .iter()
        .filter(|k| key_filter.is_none_or(|id| id == &*k.id))
    {
        let (days, total) = gatekeeper.ledger_report(Some(&key.id), None, None).await?;
        let today_totals = days
            .into_iter()
            .find(|d| d.day == today)
            .map(|d| d.totals)
            .unwrap_or_default();
        keys.push(KeyLine {
            key_id: key.id.to_string(),
            budget: gatekeeper
                .budget(&key.id, req.now_ms)
                .await
                .map_err(|_| StoreError::Unavailable)?,
            today: today_totals,
            total,
            has_owner: key.owner_secret_hash.is_some(),
        });
    }
    let fleet = match req.scope {
        Scope::Admin => Some(gatekeeper.ledger_report(None, None, None).await?.1),
        Scope::Key(_) => None,
    };
    let (bucket_ms, _) = req.range.buckets();
    let verdict_counts = gatekeeper
        .verdicts_over_time(key_filter, req.range.first_ms(req.now_ms), bucket_ms)
        .await?;
    let decisions = gatekeeper
        .latest_decisions(key_filter, req.verdict_filter, LATEST)
        .await?
        .into_iter()
        .map(|listing| DecisionLine {
            finding_codes: finding_codes(gatekeeper, &listing.row.decision_id),
            listing,
        })
        .collect();
    let holds = gatekeeper
        .open_holds(key_filter, req.now_ms)
        .await
        .map_err(|_| StoreError::Unavailable)?;
    let sessions = recent_sessions(gatekeeper, key_filter, req.now_ms).await?;
    Ok(View {
        scope: req.scope.clone(),
        now_ms: req.now_ms,
        today,
        range: req.range,
        keys,
        fleet,
        verdict_counts,
        verdict_filter: req.verdict_filter,
        decisions,
        holds: holds.holds,
        leases: holds.leases,
        economics: req.economics,
        sessions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ranges_end_with_the_bucket_of_now() {
        let now = 1_795_991_949_000; // 2026-11-29T22:39:09Z
        for r in Range::ALL {
            let (w, n) = r.buckets();
            let first = r.first_ms(now);
            assert_eq!(first % w, 0);
            let last = first + w * (n as u64 - 1);
            assert!(last <= now && now < last + w, "{r:?}");
            assert_eq!(Range::parse(Some(r.as_str())), r);
        }
        assert_eq!(Range::parse(None), Range::Day);
        assert_eq!(Range::parse(Some("<bogus>")), Range::Day);
    }

    #[test]
    fn the_economics_brief_reads_the_primary_metric_and_the_simulation_label() {
        let summary = json!({
            "primary_metric": "token_reduction",
            "verdict": {"publishable": false, "statement": "In a simulation against a scripted provider, the median …"},
            "metrics": [
                {"id": "other", "value": 9.0},
                {"id": "token_reduction", "status": "preliminary", "value": 0.31,
                 "interval": {"level_bp": 9500, "low": 0.2, "high": 0.4}}
            ]
        });
        let b = EconomicsBrief::from_summary(&summary);
        assert!(b.simulation && !b.publishable);
        assert_eq!(b.metric.as_deref(), Some("token_reduction"));
        assert_eq!(b.status.as_deref(), Some("preliminary"));
        assert_eq!(b.value, Some(0.31));
        assert_eq!(b.interval, Some((0.2, 0.4, 9500)));
        let plain = EconomicsBrief::from_summary(&json!({
            "verdict": {"publishable": true, "statement": "Through the gate, …"}
        }));
        assert!(!plain.simulation && plain.publishable && plain.interval.is_none());
        let flagged = EconomicsBrief::from_summary(&json!({"simulation": true, "verdict": {}}));
        assert!(flagged.simulation);
    }
}
