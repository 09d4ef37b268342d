//! Usage that could not be written to the fleet database, kept on local disk until it can.
//!
//! One JSON line per usage report (figures, ids and the served model: never content), appended
//! and fsynced before the caller moves on. Replay settles each line through the same
//! idempotent settle as a live report: a line settled before a crash that kept it in the file
//! is found settled on the next replay and dropped, so each report is booked exactly once.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use crate::gatekeeper::settlement::UsageReport;

pub const SPOOL_FILE: &str = "fleet-usage-spool.jsonl";

pub struct Spool {
    path: PathBuf,
    /// Appends and a replay's rewrite never interleave.
    lock: tokio::sync::Mutex<()>,
}

/// What replaying one line came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// Booked now, or found already booked: the line goes.
    Done,
    /// The database is still unreachable: this line and the rest stay.
    Later,
}

impl Spool {
    pub fn new(dir: &Path) -> Spool {
        Spool {
            path: dir.join(SPOOL_FILE),
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// Append one report and fsync it.
    pub async fn append(&self, report: &UsageReport) -> std::io::Result<()> {
        let _guard = self.lock.lock().await;
        let mut line = serde_json::to_vec(report).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(&line)?;
        file.sync_data()
    }

    /// Whether anything waits to be replayed.
    pub fn pending(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| m.len() > 0)
    }

    /// Replay every line in order through `settle`; stop at the first that must wait, and keep
    /// it and the rest (written to a new file, fsynced, renamed over the old). Returns how
    /// many lines were done.
    pub async fn replay<F, Fut>(&self, mut settle: F) -> std::io::Result<usize>
    where
        F: FnMut(UsageReport) -> Fut,
        Fut: std::future::Future<Output = Replayed>,
    {
        let _guard = self.lock.lock().await;
        let file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let lines: Vec<String> = std::io::BufReader::new(file)
            .lines()
            .collect::<Result<_, _>>()?;
        let mut done = 0;
        for line in &lines {
            // A line cut short by a crash during its append was never acknowledged: skip it.
            let Ok(report) = serde_json::from_str::<UsageReport>(line) else {
                done += 1;
                continue;
            };
            if settle(report).await == Replayed::Later {
                break;
            }
            done += 1;
        }
        let rest = &lines[done..];
        let tmp = self.path.with_extension("jsonl.tmp");
        {
            let mut out = std::fs::File::create(&tmp)?;
            for line in rest {
                out.write_all(line.as_bytes())?;
                out.write_all(b"\n")?;
            }
            out.sync_data()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        Ok(done)
    }
}
