//! Logs: `tracing` to standard error, text or JSON. Colour only when standard error is a
//! terminal (and `NO_COLOR` is unset), so a file or the journal never gets escape codes. The
//! level comes from `RUST_LOG` (default `info`). No log line carries request content: events
//! name rules, verdicts, counts and error kinds, and pingora's own lines go through the same
//! subscriber (`log` bridge).

use std::io::IsTerminal;

pub use crate::config::LogFormat;

/// Install the process's subscriber; a second call is a no-op.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour()).try_init(),
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
    };
}

/// Colour only for a person at a terminal.
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
