//! The command line: its arguments and what each command does (`src/main.rs` only calls
//! [`main`]). Errors carry their context with `anyhow`; `main` prints the chain.

mod demo;
mod holds;
mod ledger;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::economics::model::EconomicsQuery;
use crate::logging::LogFormat;

use crate::request::{self, Digest, Route};

use holds::HoldsCommand;

#[derive(Parser)]
#[command(
    name = "tokensaver",
    version,
    about = "A deterministic cost gate for language-model traffic"
)]
struct Cli {
    /// Log format: `text` (colour only on a terminal) or `json`; else the config's
    /// `[log] format` for `serve`, else text.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy, API and admin listeners.
    Serve {
        #[arg(long, default_value = "config/tokensaver.toml")]
        config: PathBuf,
        /// Worker threads per listener.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Digest mode: the central gate's API URL (prompts never leave this machine).
        #[arg(long)]
        gate_url: Option<String>,
        /// Digest mode: the tokensaver key used with the central gate.
        #[arg(long, env = "TOKENSAVER_GATE_KEY", hide_env_values = true)]
        gate_key: Option<String>,
        /// Write this process's pid here once it serves (removed when it drains, unless a
        /// newer process replaced it).
        #[arg(long)]
        pid_file: Option<PathBuf>,
        /// Start the server in the background and return once it serves (a service
        /// manager's `Type=forking`); needs --pid-file.
        #[arg(long, requires = "pid_file")]
        detach: bool,
        /// Graceful upgrade: take the listening sockets over from the running server. With
        /// --detach, the server named by --pid-file gets SIGQUIT at the right moment;
        /// without, send it SIGQUIT yourself once this process has started.
        #[arg(long)]
        upgrade: bool,
        /// The socket the old and new process meet on during an upgrade (default:
        /// upgrade.sock in the data dir).
        #[arg(long)]
        upgrade_sock: Option<PathBuf>,
    },
    /// Ask the running server's admin listener whether it is alive (`/healthz`) or ready for
    /// traffic (`/readyz`); exits non-zero when it is not.
    Health {
        #[arg(long, default_value = "config/tokensaver.toml")]
        config: PathBuf,
        /// Readiness (store writable, signing key, upstreams resolved, not draining) rather
        /// than liveness.
        #[arg(long)]
        ready: bool,
        /// Keep asking for up to this many seconds.
        #[arg(long, default_value_t = 0)]
        wait: u64,
    },
    /// The quick start: the proxy with the example config, in front of a built-in local
    /// provider, driven by a scripted agent session.
    Demo {
        #[arg(long, default_value = "config/tokensaver.toml")]
        config: PathBuf,
    },
    /// Print the digest (counts and keyed hashes, no text) of a request body.
    Digest {
        /// A request body file, or `-` for standard input.
        file: String,
        /// The tokensaver key whose secret keys the hashes (else $TOKENSAVER_KEY).
        #[arg(long, env = "TOKENSAVER_KEY", hide_env_values = true)]
        key: String,
        #[arg(long, value_enum, default_value = "openai")]
        route: RouteArg,
    },
    /// Verify a signed receipt envelope (a receipt, a split-profile report, an economics
    /// evidence file's `.sig`) against the data dir's receipt keys.
    Verify {
        file: String,
        /// The document the envelope signs (an evidence file): VALID only if its bytes are
        /// exactly the signed ones.
        #[arg(long)]
        document: Option<PathBuf>,
        #[arg(long, default_value = "config/tokensaver.toml")]
        config: PathBuf,
    },
    /// Key management.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Print a key's (or the fleet's) spend and savings by tier.
    Ledger {
        #[arg(long, default_value = "config/tokensaver.toml")]
        config: PathBuf,
        #[arg(long)]
        key: Option<String>,
        /// One line per agent session (calls, spend, verdicts, steps repeated, time paced,
        /// what ended it) instead of the totals by tier.
        #[arg(long)]
        sessions: bool,
    },
    /// Profile an MCP tool catalogue (split-profile, criteria 1.2.0).
    SplitProfile {
        file: String,
        /// Print the signed JSON report instead of text.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "config/tokensaver.toml")]
        config: PathBuf,
    },
    /// The evidence-grade savings report (paired runs, bootstrap intervals, publication rule).
    Economics {
        #[command(subcommand)]
        command: EconomicsCommand,
    },
    /// CHALLENGE holds: list them, approve one (optionally attending the key), deny one.
    /// Talks to the running server's admin listener (the config's `[listen] admin`).
    Holds {
        #[command(subcommand)]
        command: HoldsCommand,
    },
    /// Validate a config file.
    CheckConfig { file: PathBuf },
    /// Run the deterministic local provider (tests and benchmarks): replaces this process with
    /// the `tokensaver-mock-provider` binary beside it, passing every argument on. The
    /// provider is a crate of its own, not linked into this binary.
    #[command(hide = true, disable_help_flag = true)]
    MockProvider {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Print a new key and the config lines that hold its hash.
    New {
        #[arg(long)]
        id: String,
        /// The scoring profile the key uses (`none` for the gate's defaults). Agent traffic
        /// — Claude Code, Codex, the Agents SDK — is what the gate governs, so new keys get
        /// the `agent` profile the example config ships.
        #[arg(long, default_value = "agent")]
        profile: String,
    },
    /// Print a new admin key and the config lines that hold its hash.
    Admin,
    /// Print a new owner secret (approves the key's holds) and the line for its `[[keys]]` table.
    Owner,
    /// Read keys (`tsk_<id>_<secret>`, one per line) on stdin and print `<id> <secret_hash>`
    /// for each: the hash a `[[keys]]` table holds, for scripts that make keys in bulk.
    Hash,
}

#[derive(Subcommand)]
enum EconomicsCommand {
    /// Every metric with its class, interval and status, and the one statement the evidence allows.
    Summary {
        /// The evidence directory (default: the config's `[data] economics`).
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long, default_value = "config/tokensaver.toml")]
        config: PathBuf,
        #[arg(long)]
        suite: Option<String>,
        #[arg(long)]
        category: Option<String>,
        #[arg(long)]
        model: Option<String>,
        #[arg(long)]
        task: Option<String>,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        /// Also write a plot of each task run's mean cost, control against treatment (SVG).
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
    /// Record new evidence: real agent clients on the fixture tasks, straight to a provider
    /// and through the gate (the built-in scripted provider unless --upstream is given).
    Run(crate::economics::run::RunArgs),
    /// Where each of the gate's mechanisms acted in the latest evidence of each recorded
    /// suite: its treatment calls replayed through this build's gate with and without the
    /// mechanism, the calls decided or edited otherwise counted by pair.
    Acted {
        /// The evidence directory (default: the config's `[data] economics`).
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long, default_value = "config/tokensaver.toml")]
        config: PathBuf,
        #[arg(long)]
        suite: Option<String>,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RouteArg {
    Openai,
    Anthropic,
}

fn read_input(file: &str) -> anyhow::Result<Vec<u8>> {
    if file == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("cannot read standard input")?;
        Ok(buf)
    } else {
        std::fs::read(file).with_context(|| format!("cannot read {file}"))
    }
}

/// Parse the arguments, start logging, run the command; an error is printed with its context
/// chain on one line.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let format = cli.log_format.unwrap_or_else(|| match &cli.command {
        // `serve` takes the config's `[log] format` (a config that does not load fails later,
        // with its message).
        Command::Serve { config, .. } => Config::load(config)
            .map(|c| c.log_format)
            .unwrap_or_default(),
        _ => LogFormat::Text,
    });
    crate::logging::init(format);
    match run(cli.command, cli.log_format) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tokensaver: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command, log_format: Option<LogFormat>) -> anyhow::Result<()> {
    match command {
        Command::Serve {
            config,
            threads,
            gate_url,
            gate_key,
            pid_file,
            detach,
            upgrade,
            upgrade_sock,
        } => serve(
            crate::server::ServeOptions {
                config,
                threads,
                gate_url,
                gate_key,
                upgrade,
                upgrade_sock,
                pid_file,
            },
            detach,
            log_format,
        ),
        Command::Health {
            config,
            ready,
            wait,
        } => {
            let config = Config::load(&config)?;
            let answer = crate::api::ops::ask(config.admin_addr, ready, wait)?;
            println!("{answer}");
            Ok(())
        }
        Command::Demo { config } => demo::run(&config),
        Command::Digest { file, key, route } => digest(&file, &key, route),
        Command::Verify {
            file,
            document,
            config,
        } => verify(&file, document, &config),
        Command::Key { command } => key(command),
        Command::Ledger {
            config,
            key,
            sessions,
        } => {
            let config = Config::load(&config)?;
            ledger::print(&config, key.as_deref(), sessions)
        }
        Command::SplitProfile { file, json, config } => split_profile(&file, json, &config),
        Command::Economics {
            command:
                EconomicsCommand::Summary {
                    dir,
                    config,
                    suite,
                    category,
                    model,
                    task,
                    json,
                    svg,
                },
        } => {
            let query = EconomicsQuery {
                suite,
                category,
                model,
                task,
            };
            economics_summary(dir, &config, &query, json, svg)
        }
        Command::Economics {
            command: EconomicsCommand::Run(args),
        } => crate::economics::run::run(&args),
        Command::Economics {
            command:
                EconomicsCommand::Acted {
                    dir,
                    config,
                    suite,
                    json,
                },
        } => {
            let config = Config::load(&config)?;
            let dir = dir.unwrap_or_else(|| config.economics_dir.clone());
            let acted = crate::economics::acted(&config, &dir, suite.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&acted)?);
            } else {
                print!("{}", crate::economics::render_acted(&acted));
            }
            Ok(())
        }
        Command::Holds { command } => holds::run(command),
        Command::CheckConfig { file } => check_config(&file),
        Command::MockProvider { args } => {
            use std::os::unix::process::CommandExt;
            let bin = crate::processes::mock_provider_binary()?;
            // exec: the caller's pid is the provider's, so stopping it by pid stops the provider.
            let err = std::process::Command::new(&bin).args(args).exec();
            Err(anyhow!(err).context(format!("cannot run {}", bin.display())))
        }
    }
}

/// `tokensaver serve`: in the foreground, or detached once it serves.
fn serve(
    opts: crate::server::ServeOptions,
    detach: bool,
    log_format: Option<LogFormat>,
) -> anyhow::Result<()> {
    if detach {
        let pid = crate::server::serve_detached(opts, log_format)?;
        println!("tokensaver serving (pid {pid})");
        Ok(())
    } else {
        crate::server::serve(opts)
    }
}

/// `tokensaver digest`: the digest a digest-mode client would send for this body.
fn digest(file: &str, key: &str, route: RouteArg) -> anyhow::Result<()> {
    let body = read_input(file)?;
    let parsed =
        crate::auth::parse_key(key).context("the key is not of the form tsk_<id>_<secret>")?;
    let fp_key = crate::auth::fingerprint_key(parsed.secret);
    let route = match route {
        RouteArg::Openai => Route::OpenAiChat,
        RouteArg::Anthropic => Route::AnthropicMessages,
    };
    let parsed = request::parse(route, &body, &fp_key)?;
    let digest = Digest::new(parsed.shape);
    println!("{}", serde_json::to_string_pretty(&digest)?);
    Ok(())
}

/// `tokensaver verify`: a receipt envelope against the data dir's keys, and with `document`
/// the exact bytes it signs.
fn verify(file: &str, document: Option<PathBuf>, config: &Path) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let signer = crate::receipt::load(&config.data_dir)?;
    let input = read_input(file)?;
    let text = String::from_utf8_lossy(&input);
    let envelope = match serde_json::from_str::<crate::receipt::Envelope>(text.trim()) {
        Ok(e) => e,
        Err(_) => crate::receipt::Envelope::from_header_value(text.trim())?,
    };
    let (kind, body) = signer
        .verify_document(&envelope)
        .map_err(|e| anyhow!("INVALID: {e}"))?;
    let kind = kind.map_or("unscoped (signed before document kinds)", |k| k.as_str());
    if let Some(path) = document {
        let on_disk =
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        if on_disk != body {
            bail!(
                "INVALID: {} is not the document the signature covers",
                path.display()
            );
        }
        println!("VALID {kind} (kid {}): {}", envelope.kid, path.display());
        return Ok(());
    }
    println!("VALID {kind} (kid {})", envelope.kid);
    println!("{}", String::from_utf8_lossy(&body));
    Ok(())
}

/// `tokensaver key ...`: new secrets and the config lines that hold their hashes.
fn key(command: KeyCommand) -> anyhow::Result<()> {
    match command {
        KeyCommand::New { id, profile } => {
            let profile = (profile != "none").then_some(profile.as_str());
            let (key, line) = crate::auth::new_key(&id, profile)
                .context("key ids and profile names are 1-64 characters of a-z, A-Z, 0-9 or '-'")?;
            println!(
                "key (give it to the caller; it is not stored): {key}\n\nconfig lines:\n{line}"
            );
        }
        KeyCommand::Owner => {
            let (secret, line) = crate::auth::new_owner_secret();
            println!(
                "owner secret (for the person who approves holds; send it as \
                 x-tokensaver-owner: <key_id>:<secret>): {secret}\n\nadd to the key's [[keys]] table:\n{line}"
            );
        }
        KeyCommand::Admin => {
            let (key, line) = crate::auth::new_admin_key();
            println!("admin key (keep it off shared machines): {key}\n\nconfig lines:\n{line}");
        }
        KeyCommand::Hash => {
            use std::io::BufRead;
            let mut out = String::new();
            for (n, line) in std::io::stdin().lock().lines().enumerate() {
                let line = line.context("could not read stdin")?;
                let parsed = crate::auth::parse_key(line.trim()).with_context(|| {
                    format!("line {}: not a key of the form tsk_<id>_<secret>", n + 1)
                })?;
                let hash = hex::encode(crate::auth::secret_hash(parsed.secret));
                out.push_str(&format!("{} {hash}\n", parsed.id));
            }
            print!("{out}");
        }
    }
    Ok(())
}

/// `tokensaver split-profile`: a tool catalogue's profile as text, or signed JSON.
fn split_profile(file: &str, json: bool, config: &Path) -> anyhow::Result<()> {
    use crate::split_profile as sp;
    let input = read_input(file)?;
    match sp::profile(&input, crate::now_ms()) {
        Ok(report) if json => {
            // The signed report is signed with the server's key, from the config's data dir:
            // no config, no signature (never a key made up in ./data).
            let config = Config::load(config)?;
            let signer = crate::receipt::load_or_create(&config.data_dir)?;
            println!(
                "{}",
                String::from_utf8_lossy(&sp::signed_report(&report, &signer))
            )
        }
        Ok(report) => print!("{}", sp::render_text(&report)),
        Err(refusal) => bail!("{}", sp::render_refusal_text(refusal).trim_end()),
    }
    Ok(())
}

/// `tokensaver economics summary`: the evidence's summary as text or JSON, and its plot.
fn economics_summary(
    dir: Option<PathBuf>,
    config: &Path,
    query: &EconomicsQuery,
    json: bool,
    svg: Option<PathBuf>,
) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let summary = crate::economics::summary_for(&config, dir.as_deref(), query, crate::now_ms());
    if let Some(path) = svg {
        let plot = crate::economics::plot::cost_per_task_svg(&summary)
            .ok_or_else(|| anyhow!("no pair has a priced cost in both arms: nothing to plot"))?;
        std::fs::write(&path, plot)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", crate::economics::render_text(&summary));
    }
    Ok(())
}

/// `tokensaver check-config`: load the file as `serve` would, and say what it holds.
fn check_config(file: &Path) -> anyhow::Result<()> {
    let config = Config::load(file)?;
    println!(
        "config ok: {} keys, {} priced models, {} downgrade mappings; proxy {}, api {}, admin {}; store {}",
        config.keys.len(),
        config.prices.len(),
        config.downgrade.len(),
        config.proxy_addr,
        config.api_addr,
        config.admin_addr,
        if config.fleet.is_some() {
            "postgres (fleet)"
        } else {
            "sqlite"
        }
    );
    Ok(())
}
