//! `tokensaver ledger`: the ledger as a terminal table, by tier, never merged.

use crate::config::Config;
use crate::gate::Verdict;
use crate::store::sqlite::SqliteStore;
use crate::store::{LedgerTotals, Store};

fn usd(nano: u64) -> String {
    format!(
        "${}.{:06}",
        nano / 1_000_000_000,
        (nano % 1_000_000_000) / 1_000
    )
}

pub fn render(days: &[crate::store::LedgerDay], total: &LedgerTotals) -> String {
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
    let rows = days
        .iter()
        .map(|d| (d.day.as_str(), &d.totals))
        .chain([("total", total)]);
    for (day, t) in rows {
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
