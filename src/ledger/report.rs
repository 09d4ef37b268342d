//! `tokensaver ledger`: the ledger as a terminal table, by tier, never merged.

use crate::config::Config;
use crate::gate::Verdict;
use crate::store::sqlite::SqliteStore;
use crate::store::{utc_day, DecisionPage, LedgerDay, LedgerTotals, Store};

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

/// `GET /ledger?format=csv`: the same rows, every tier and usage part in its own column.
pub fn csv(days: &[LedgerDay], total: &LedgerTotals) -> String {
    let mut out = String::from(
        "day,requests,serve,allow,downgrade,challenge,block,spend_nano,input,cache_write,\
         cache_read,output,tokens_not_bought,worst_case_tokens_avoided,findings_tokens_estimated,\
         cache_saving_nano\n",
    );
    for (day, t) in rows(days, total) {
        out.push_str(&format!(
            "{day},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
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
            t.findings_tokens_estimated,
            t.cache_saving_nano
        ));
    }
    out
}

/// A nano-USD amount as a decimal dollar figure with all nine places (exact).
pub fn usd_exact(nano: u64) -> String {
    format!("{}.{:09}", nano / 1_000_000_000, nano % 1_000_000_000)
}

/// A CSV field: quoted when it holds a separator, a quote or a line break; a leading `=`,
/// `+`, `-`, `@` (a formula to a spreadsheet) is defused with a `'`.
fn csv_field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// `GET /ledger/decisions?format=csv`: one line per decision, every usage part and billed
/// item in its own column, spend in nano-USD and as an exact dollar figure. Never content.
pub fn decisions_csv(page: &DecisionPage) -> String {
    let mut out = String::from(
        "decision_id,key_id,decided_at_ms,decided_at,verdict,reason,model_requested,\
         model_served,wire,status,ending,basis,settled_at_ms,input,cache_write,cache_write_1h,\
         cache_read,output,web_search_requests,reserved_nano,spend_nano,spend_usd,\
         tokens_not_bought,worst_case_tokens_avoided,hold_id,cache_saving_nano\n",
    );
    for d in &page.decisions {
        let fields = [
            d.decision_id.to_string(),
            csv_field(&d.key_id),
            d.decided_at_ms.to_string(),
            utc_time(d.decided_at_ms),
            d.verdict.as_str().to_string(),
            csv_field(&d.reason),
            csv_field(&d.model_requested),
            csv_field(d.model_served.as_deref().unwrap_or("")),
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
            csv_field(d.hold_id.as_deref().unwrap_or("")),
            d.cache_saving_nano
                .map(|n| n.to_string())
                .unwrap_or_default(),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
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

pub fn print(config: &Config, key: Option<&str>) -> Result<(), String> {
    if let Some(k) = key {
        if config.key(k).is_none() {
            return Err("no key with this id in the config".into());
        }
    }
    let (days, total) = match &config.fleet {
        // A fleet's ledger is its database's, whichever instance's config this is.
        Some(fleet) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(async {
                let fleet = crate::fleet::Fleet::connect(
                    fleet,
                    crate::fleet::FleetLimits::from_config(config),
                )
                .await?;
                fleet
                    .ledger(key, i64::MIN, i64::MAX)
                    .await
                    .map_err(|e| e.to_string())
            })?,
        None => {
            let store = SqliteStore::open(&config.data_dir, config.commit_interval_ms)
                .map_err(|e| e.to_string())?;
            store.ledger(key, None, None).map_err(|e| e.to_string())?
        }
    };
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
