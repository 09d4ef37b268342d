//! `tokensaver ledger`: the ledger as a terminal table, by tier, never merged.

use crate::config::Config;
use crate::gate::Verdict;
use crate::store::sqlite::SqliteStore;
use crate::store::{LedgerDay, LedgerTotals, Store};

fn usd(nano: u64) -> String {
    format!(
        "${}.{:06}",
        nano / 1_000_000_000,
        (nano % 1_000_000_000) / 1_000
    )
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

/// `GET /ledger?format=csv`: the same rows, every tier and usage part in its own column.
pub fn csv(days: &[LedgerDay], total: &LedgerTotals) -> String {
    let mut out = String::from(
        "day,requests,serve,allow,downgrade,challenge,block,spend_nano,input,cache_write,\
         cache_read,output,tokens_not_bought,worst_case_tokens_avoided,findings_tokens_estimated\n",
    );
    for (day, t) in rows(days, total) {
        out.push_str(&format!(
            "{day},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            t.requests,
            t.count(Verdict::Serve),
            t.count(Verdict::Allow),
            t.count(Verdict::Downgrade),
            t.count(Verdict::Challenge),
            t.count(Verdict::Block),
            t.spend_nano,
            t.usage.input,
            t.usage.cache_write,
            t.usage.cache_read,
            t.usage.output,
            t.tokens_not_bought,
            t.worst_case_tokens_avoided,
            t.findings_tokens_estimated
        ));
    }
    out
}

pub fn render(days: &[LedgerDay], total: &LedgerTotals) -> String {
    let mut out = format!(
        "{:<12} {:>8} {:>6} {:>6} {:>9} {:>9} {:>6} {:>14} {:>18} {:>26} {:>18}\n",
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
        "findings (est.)"
    );
    for (day, t) in rows(days, total) {
        out.push_str(&format!(
            "{:<12} {:>8} {:>6} {:>6} {:>9} {:>9} {:>6} {:>14} {:>18} {:>26} {:>18}\n",
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
            t.findings_tokens_estimated
        ));
    }
    out.push_str("\ntokens_not_bought is the only savings total (provider-reported usage of answers served from store).\nworst_case_tokens_avoided is a ceiling on refused calls, reported apart; findings figures are estimates.\n");
    out
}

pub fn print(config: &Config, key: Option<&str>) -> Result<(), String> {
    if let Some(k) = key {
        if config.key(k).is_none() {
            return Err("no key with this id in the config".into());
        }
    }
    let store = SqliteStore::open(&config.data_dir, config.commit_interval_ms)
        .map_err(|e| e.to_string())?;
    let (days, total) = store.ledger(key, None, None).map_err(|e| e.to_string())?;
    println!("ledger for {}", key.unwrap_or("the fleet"));
    print!("{}", render(&days, &total));
    Ok(())
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
            "day,requests,serve,allow,downgrade,challenge,block,spend_nano,input,cache_write,cache_read,output,tokens_not_bought,worst_case_tokens_avoided,findings_tokens_estimated"
        );
        assert_eq!(lines[1], "2026-11-30,3,1,2,0,0,0,1500,0,0,0,0,40,0,0");
        assert_eq!(lines[2], "total,3,1,2,0,0,0,1500,0,0,0,0,40,0,0");
        assert_eq!(lines.len(), 3);
    }
}
