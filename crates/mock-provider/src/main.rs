//! `tokensaver-mock-provider`: the deterministic mock provider as a process, for
//! `tokensaver demo`, the Python SDK and agent tests, the economics harness, the soak and the
//! load benchmark (`tokensaver mock-provider` runs this binary). Serves until killed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokensaver_mock_provider::{serve_listener, OptionsError, ProviderOptions};

/// Run the deterministic local provider (tests, demo and benchmarks).
#[derive(Parser)]
#[command(name = "tokensaver-mock-provider", version)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9999")]
    listen: SocketAddr,
    /// `/v1/*` answers 401 unless `Authorization: Bearer <it>` or `x-api-key: <it>`.
    #[arg(long)]
    expected_credential: Option<String>,
    /// `cl100k`: count usage with cl100k_base over the whole request body.
    #[arg(long, default_value = "chars")]
    usage: String,
    /// Task scripts (`<dir>/<id>/task.json`) for `tokensaver-mock:task=` markers.
    #[arg(long)]
    tasks: Option<PathBuf>,
    /// Bill no prompt caching (the earlier behaviour: only the `cached` models' fixed rule).
    /// The environment takes `1`/`true`/`yes`/`on` (or `0`/`false`/`no`/`off`).
    #[arg(long, env = "TOKENSAVER_MOCK_NO_PROMPT_CACHE",
          value_parser = clap::builder::BoolishValueParser::new())]
    no_prompt_cache: bool,
    /// Run the prompt cache's clock N times faster (its lifetimes and OpenAI's routing window
    /// divided by N), as `[gate.windows]` shortens the gate's windows for a compressed run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=3600))]
    time_scale: u64,
    /// Pause between a stream's events, in milliseconds (0: the whole stream at once), as a
    /// provider paces its tokens: the load benchmark's streams measure a gateway's frame gaps.
    #[arg(long, default_value_t = 0)]
    stream_delay_ms: u64,
}

/// Why the mock provider stopped, as its one line on stderr says.
#[derive(Debug, thiserror::Error)]
enum Stopped {
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::ErrorKind),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::ErrorKind),
    #[error("serving: {0}")]
    Serving(std::io::ErrorKind),
}

fn run(args: Args) -> Result<(), Stopped> {
    let opts = ProviderOptions {
        expected_credential: args.expected_credential,
        prompt_cache: !args.no_prompt_cache,
        time_scale: args.time_scale,
        stream_delay_ms: args.stream_delay_ms,
        ..ProviderOptions::scripted(&args.usage, args.tasks.as_deref())?
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Stopped::Runtime(e.kind()))?;
    runtime.block_on(async {
        let listener = tokensaver_mock_provider::bind(args.listen)
            .map_err(|e| Stopped::Listen(args.listen, e.kind()))?;
        let bound = listener.local_addr().unwrap_or(args.listen);
        eprintln!("mock provider listening on http://{bound}");
        serve_listener(listener, opts)
            .await
            .map_err(|e| Stopped::Serving(e.kind()))
    })
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tokensaver-mock-provider: {message}");
            ExitCode::FAILURE
        }
    }
}
