//! Reads for the ledger page (`src/api/page`): the newest decisions and the verdicts over
//! time. Read-only, on the reader connection, committed rows only; nothing here is on the
//! request path.

use rusqlite::params;

use super::{
    decision_from_row, get_u64, sql_error, to_i64, verdict_from, SqliteStore, DECISION_COLUMNS,
};
use crate::store::{DecisionListing, StoreError, VerdictCount};
use tokensaver_core::gate::Verdict;

/// The spend a decision settled: its usage row (stored after the decision, or before it),
/// else the worst case charged when its reservation expired.
const SPEND: &str = "COALESCE(\
    (SELECT u.spend_nano FROM usage AS u WHERE u.decision = d.id), \
    (SELECT u.spend_nano FROM usage AS u \
     WHERE u.decision IS NULL AND u.decision_id = d.decision_id), \
    (SELECT e.charged_nano FROM reservation_expiries AS e WHERE e.decision_id = d.decision_id))";

pub(super) fn latest_decisions(
    store: &SqliteStore,
    key_id: Option<&str>,
    verdict: Option<Verdict>,
    limit: usize,
) -> Result<Vec<DecisionListing>, StoreError> {
    let key_clause = if key_id.is_some() {
        "key_id = ?1"
    } else {
        "?1 IS NULL"
    };
    let sql = format!(
        "SELECT {DECISION_COLUMNS}, {SPEND} AS spend_nano FROM decisions AS d \
         WHERE {key_clause} AND (?2 IS NULL OR verdict = ?2) \
         ORDER BY decided_at_ms DESC, id DESC LIMIT ?3"
    );
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    store.read(|tx| {
        let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
        stmt.query_map(params![key_id, verdict.map(Verdict::as_str), limit], |r| {
            Ok(DecisionListing {
                row: decision_from_row(r)?,
                spend_nano: r.get::<_, Option<i64>>("spend_nano")?.map(super::to_u64),
            })
        })
        .and_then(Iterator::collect)
        .map_err(sql_error)
    })
}

pub(super) fn verdicts_over_time(
    store: &SqliteStore,
    key_id: Option<&str>,
    since_ms: u64,
    bucket_ms: u64,
) -> Result<Vec<VerdictCount>, StoreError> {
    let key_clause = if key_id.is_some() {
        "key_id = ?1"
    } else {
        "?1 IS NULL"
    };
    let sql = format!(
        "SELECT (decided_at_ms / ?3) * ?3 AS bucket, verdict, reason, COUNT(*) AS count \
         FROM decisions \
         WHERE {key_clause} AND decided_at_ms >= ?2 \
         GROUP BY bucket, verdict, reason ORDER BY bucket, verdict, reason"
    );
    let bucket_ms = to_i64(bucket_ms.max(1));
    store.read(|tx| {
        let mut stmt = tx.prepare_cached(&sql).map_err(sql_error)?;
        stmt.query_map(params![key_id, to_i64(since_ms), bucket_ms], |r| {
            Ok(VerdictCount {
                bucket_start_ms: get_u64(r, "bucket")?,
                verdict: verdict_from(r, "verdict")?,
                reason: r.get("reason")?,
                count: get_u64(r, "count")?,
            })
        })
        .and_then(Iterator::collect)
        .map_err(sql_error)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::receipt::DecisionId;
    use crate::store::{DecisionRow, Event, Store, UsageRow};
    use tokensaver_core::gate::Usage;
    use tokensaver_core::request::{Hash, WireForm};

    /// The decision id named `tag` in these tests.
    fn id(tag: &str) -> DecisionId {
        crate::receipt::decision_id(tag.as_bytes())
    }

    fn row(tag: &str, key: &str, verdict: Verdict, reason: &str, at: u64) -> DecisionRow {
        DecisionRow {
            decision_id: id(tag),
            key_id: key.into(),
            fingerprint: Some(Hash(
                *blake3::hash(format!("fp-{tag}").as_bytes()).as_bytes(),
            )),
            verdict,
            reason: reason.into(),
            score: 0.5,
            model_requested: "gpt-4o".into(),
            model_served: None,
            wire: WireForm::Json,
            decided_at_ms: at,
            reserved_nano: 0,
            worst_case_tokens: None,
            tokens_not_bought: 0,
            worst_case_tokens_avoided: 0,
            findings_tokens: 0,
            hold_id: None,
            step_fingerprint: None,
            recorded_by: Default::default(),
            session: None,
            paced_ms: 0,
            cache_edits: Default::default(),
        }
    }

    #[test]
    fn latest_decisions_and_verdicts_over_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), 1).unwrap();
        let rows = [
            row("d1", "a", Verdict::Allow, "allow", 1_000),
            row("d2", "a", Verdict::Block, "runaway_loop", 1_500),
            row("d3", "b", Verdict::Block, "runaway_loop", 2_100),
            row("d4", "a", Verdict::Block, "runaway_loop", 2_200),
            row("d5", "a", Verdict::Serve, "serve", 3_000),
        ];
        for r in rows {
            store.submit(Event::Decision(r));
        }
        store.submit(Event::Usage(UsageRow {
            decision_id: id("d1"),
            key_id: "a".into(),
            at_ms: 1_100,
            served_model: "gpt-4o".into(),
            wire: WireForm::Json,
            complete: true,
            usage: Usage::default(),
            cache_write_1h: 0,
            web_search_requests: 0,
            ending: Some(crate::store::Ending::Complete),
            basis: crate::store::SpendBasis::Reported,
            spend_nano: 4_200,
            cache_saving_nano: None,
            cache: Default::default(),
        }));
        store.flush().unwrap();

        let all = store.latest_decisions(None, None, 10).unwrap();
        let ids: Vec<DecisionId> = all.iter().map(|d| d.row.decision_id).collect();
        let expected = ["d5", "d4", "d3", "d2", "d1"].map(id);
        assert_eq!(ids, expected, "newest first");
        assert_eq!(all[4].spend_nano, Some(4_200));
        assert_eq!(all[0].spend_nano, None);
        let a_blocks = store
            .latest_decisions(Some("a"), Some(Verdict::Block), 1)
            .unwrap();
        assert_eq!(a_blocks.len(), 1);
        assert_eq!(a_blocks[0].row.decision_id, id("d4"));
        assert!(store
            .latest_decisions(Some("c"), None, 10)
            .unwrap()
            .is_empty());

        let counts = store.verdicts_over_time(Some("a"), 1_200, 1_000).unwrap();
        let got: Vec<(u64, Verdict, &str, u64)> = counts
            .iter()
            .map(|c| (c.bucket_start_ms, c.verdict, c.reason.as_str(), c.count))
            .collect();
        assert_eq!(
            got,
            [
                (1_000, Verdict::Block, "runaway_loop", 1),
                (2_000, Verdict::Block, "runaway_loop", 1),
                (3_000, Verdict::Serve, "serve", 1),
            ]
        );
        let fleet = store.verdicts_over_time(None, 0, 1_000).unwrap();
        assert_eq!(fleet.iter().map(|c| c.count).sum::<u64>(), 5);
        assert_eq!(
            fleet
                .iter()
                .find(|c| c.bucket_start_ms == 2_000)
                .map(|c| c.count),
            Some(2),
            "two keys' blocks in one bucket"
        );
    }
}
