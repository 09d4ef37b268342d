//! `tokensaver ledger`: the ledger as a terminal table, by tier, never merged, read from the
//! data dir's SQLite or the fleet's PostgreSQL (whichever the config names).

use crate::config::Config;
use crate::report::{render, sessions_of, sessions_table};
use crate::store::sqlite::SqliteStore;
use crate::store::Store;

pub fn print(config: &Config, key: Option<&str>, sessions: bool) -> anyhow::Result<()> {
    if let Some(k) = key {
        if config.key(k).is_none() {
            return Err(anyhow::anyhow!("no key with this id in the config"));
        }
    }
    if sessions {
        let lines = all_decisions(config, key)?;
        println!("sessions of {}", key.unwrap_or("every key"));
        print!("{}", sessions_table(&sessions_of(&lines)));
        return Ok(());
    }
    let (days, total) = match &config.fleet {
        // A fleet's ledger is its database's, whichever instance's config this is.
        Some(fleet) => {
            let (runtime, fleet) = connect_fleet(config, fleet)?;
            runtime
                .block_on(fleet.ledger(key, i64::MIN, i64::MAX))
                .map_err(anyhow::Error::from)?
        }
        None => {
            let store = SqliteStore::open(&config.data_dir, config.commit_interval_ms)
                .map_err(anyhow::Error::from)?;
            store.ledger(key, None, None).map_err(anyhow::Error::from)?
        }
    };
    println!("ledger for {}", key.unwrap_or("the fleet"));
    print!("{}", render(&days, &total));
    Ok(())
}

/// The fleet's database, with a runtime to wait on it from this synchronous command.
fn connect_fleet(
    config: &Config,
    fleet: &crate::config::FleetConfig,
) -> anyhow::Result<(tokio::runtime::Runtime, crate::store::postgres::Fleet)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)?;
    let fleet = runtime.block_on(crate::store::postgres::Fleet::connect(
        fleet,
        crate::store::postgres::FleetLimits::from_config(config),
    ))?;
    Ok((runtime, fleet))
}

/// Every decision of `key` (or every key's), oldest first, from the fleet's database or the
/// data dir's SQLite.
fn all_decisions(
    config: &Config,
    key: Option<&str>,
) -> anyhow::Result<Vec<crate::store::DecisionLine>> {
    let query = crate::store::DecisionQuery {
        key_id: key.map(str::to_string),
        limit: crate::store::ledger::MAX_DECISIONS_PAGE,
        ..Default::default()
    };
    let (lines, _) = match &config.fleet {
        Some(fleet) => {
            let (runtime, fleet) = connect_fleet(config, fleet)?;
            runtime.block_on(crate::store::read_pages(query, usize::MAX, |q| {
                let fleet = &fleet;
                async move { fleet.decisions(&q).await }
            }))
        }
        None => {
            let store = SqliteStore::open(&config.data_dir, config.commit_interval_ms)
                .map_err(anyhow::Error::from)?;
            // SQLite reads are synchronous: the future is ready at its first poll.
            let runtime = tokio::runtime::Builder::new_current_thread().build()?;
            runtime.block_on(crate::store::read_pages(query, usize::MAX, |q| {
                std::future::ready(store.decisions(&q))
            }))
        }
    }
    .map_err(anyhow::Error::from)?;
    Ok(lines)
}
