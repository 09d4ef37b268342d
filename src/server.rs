//! `tokensaver serve`: three pingora services on one server — the proxy, the API listener and
//! the admin listener — around one [`Gatekeeper`], and the expiry sweep as a background
//! service. How it stops, drains and hands over to a new binary: [`crate::lifecycle`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;

use crate::api::ops::Ops;
use crate::api::server::ApiApp;
use crate::api::{Api, Listener};
use crate::config::Config;
use crate::gatekeeper::Gatekeeper;
use crate::lifecycle;
use crate::now_ms;
use crate::proxy::GateProxy;
use crate::store::sqlite::SqliteStore;

/// The proxy listener's write buffer (see `run`).
const PROXY_WRITE_BUFFER: usize = 16 * 1024;

/// Open the data dir, the signing key and the ledger, and rebuild the gate's memory; its home
/// is this process (SQLite), the fleet's PostgreSQL (`[store] kind = "postgres"`), or a
/// central gate (digest mode, `client`).
pub fn open_gatekeeper(
    config: Config,
    client: Option<ClientMode>,
) -> anyhow::Result<Arc<Gatekeeper>> {
    let signer = crate::receipt::load_or_create(&config.data_dir).map_err(anyhow::Error::from)?;
    let store = SqliteStore::open(&config.data_dir, config.commit_interval_ms)
        .map_err(anyhow::Error::from)?;
    let fleet = match &config.fleet {
        Some(fleet) => Some(connect_fleet(
            fleet,
            crate::store::postgres::FleetLimits::from_config(&config),
        )?),
        None => None,
    };
    let gatekeeper =
        Gatekeeper::new(config, signer, Arc::new(store), now_ms()).map_err(anyhow::Error::from)?;
    Ok(Arc::new(match (fleet, client) {
        (Some(fleet), _) => gatekeeper.with_fleet(fleet),
        (None, Some(client)) => gatekeeper.with_remote(
            crate::gatekeeper::remote::client::RemoteGate::new(&client.gate_url, client.key)?,
        )?,
        (None, None) => gatekeeper,
    }))
}

/// Migrate the fleet's database (on a runtime of its own: the server's do not run yet) and
/// build the pool, which connects on first use.
fn connect_fleet(
    fleet: &crate::config::FleetConfig,
    limits: crate::store::postgres::FleetLimits,
) -> anyhow::Result<crate::store::postgres::Fleet> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("fleet: cannot start a runtime: {e}"))?
        .block_on(crate::store::postgres::Fleet::connect(fleet, limits))
}

/// Digest mode's settings: the central gate and the tokensaver key used with it.
pub struct ClientMode {
    pub gate_url: String,
    pub key: String,
}

/// Digest mode from the CLI, else from the config's `[client]` section (the key from the
/// environment variable it names). When a gate URL is set, digest mode is the default.
pub fn client_mode(
    config: &Config,
    gate_url: Option<String>,
    gate_key: Option<String>,
) -> anyhow::Result<Option<ClientMode>> {
    let section = config.client.as_ref();
    let Some(gate_url) = gate_url.or_else(|| section.map(|c| c.gate_url.clone())) else {
        return Ok(None);
    };
    crate::config::parse_origin(&gate_url).map_err(|why| anyhow::anyhow!("the gate URL {why}"))?;
    let key = gate_key
        .or_else(|| {
            section
                .and_then(|c| c.gate_key_env.as_deref())
                .and_then(|name| std::env::var(name).ok())
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "digest mode needs the tokensaver key: --gate-key or [client] gate_key_env"
            )
        })?;
    if crate::auth::parse_key(&key).is_none() {
        return Err(anyhow::anyhow!(
            "the gate key is not of the form tsk_<id>_<secret>"
        ));
    }
    Ok(Some(ClientMode { gate_url, key }))
}

/// How `serve` was asked to run.
pub struct ServeOptions {
    pub config: PathBuf,
    pub threads: usize,
    pub gate_url: Option<String>,
    pub gate_key: Option<String>,
    /// Take the listening sockets over from the running server (graceful upgrade).
    pub upgrade: bool,
    /// Where the old and new process meet during an upgrade (default: in the data dir).
    pub upgrade_sock: Option<PathBuf>,
    /// Written with this process's pid once it serves; removed when it drains, unless a newer
    /// process has replaced it.
    pub pid_file: Option<PathBuf>,
}

/// The upgrade socket: as given, else `upgrade.sock` in the data dir (old and new process
/// read the same config, so they agree on it).
pub fn upgrade_sock(config: &Config, given: Option<&Path>) -> PathBuf {
    given.map_or_else(|| config.data_dir.join("upgrade.sock"), Path::to_path_buf)
}

/// The expiry of reservations and holds (`Gatekeeper::tick_all`): every second, off the request path.
struct ExpirySweep(Arc<Gatekeeper>);

#[async_trait]
impl BackgroundService for ExpirySweep {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {
                    self.0.tick_all(now_ms()).await;
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// `serve --detach`: the same server started in the background (its gate key in the
/// environment, never in its arguments); returns its pid once it serves.
pub fn serve_detached(
    serve: ServeOptions,
    log_format: Option<crate::logging::LogFormat>,
) -> anyhow::Result<u32> {
    let config = Config::load(&serve.config).map_err(anyhow::Error::from)?;
    let pid_file = serve
        .pid_file
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--detach needs --pid-file"))?;
    let sock = upgrade_sock(&config, serve.upgrade_sock.as_deref());
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--config".into(),
        serve.config.display().to_string(),
        "--threads".into(),
        serve.threads.to_string(),
        "--pid-file".into(),
        pid_file.display().to_string(),
        "--upgrade-sock".into(),
        sock.display().to_string(),
    ];
    if let Some(url) = &serve.gate_url {
        args.extend(["--gate-url".into(), url.clone()]);
    }
    if serve.upgrade {
        args.push("--upgrade".into());
    }
    if let Some(format) = log_format {
        args.extend(["--log-format".into(), format.name().into()]);
    }
    lifecycle::detach(lifecycle::Detach {
        args,
        envs: serve
            .gate_key
            .map(|k| vec![("TOKENSAVER_GATE_KEY".to_string(), k)])
            .unwrap_or_default(),
        pid_file: &pid_file,
        upgrade: serve.upgrade,
        upgrade_sock: &sock,
    })
}

pub fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    let mut config = Config::load(&opts.config).map_err(anyhow::Error::from)?;
    let client = client_mode(&config, opts.gate_url, opts.gate_key)?;
    if client.is_some() && config.fleet.is_some() {
        // SPEC §1.2: a digest client keeps its answers in its own local store.
        anyhow::bail!("a digest client keeps its state in its own local store: [store] kind = \"postgres\" is for gates, not for a client with a gate URL");
    }
    if let Some(dir) = config
        .client
        .as_ref()
        .and_then(|c| c.data_dir.clone())
        .filter(|_| client.is_some())
    {
        config.data_dir = dir;
    }
    let (proxy_addr, api_addr, admin_addr) =
        (config.proxy_addr, config.api_addr, config.admin_addr);
    let grace = Duration::from_secs(config.grace_period_secs);
    let sock = upgrade_sock(&config, opts.upgrade_sock.as_deref());

    let conf = ServerConf {
        threads: opts.threads.max(1),
        // The drain decides when the process exits (`lifecycle`); pingora's blind sleep only
        // backs it up, so it is longer than the grace period and the cut together.
        grace_period_seconds: Some(config.grace_period_secs + lifecycle::CUT_WAIT.as_secs() + 10),
        graceful_shutdown_timeout_seconds: Some(2),
        upgrade_sock: sock.to_string_lossy().into_owned(),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: opts.upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    let phases = server.watch_execution_phase();
    // An upgrade receives the listening sockets here, before the ledger is read: the old
    // process keeps serving meanwhile, and what it writes until then is in our snapshot.
    server.bootstrap();

    let digest_mode = client.is_some();
    let gatekeeper = open_gatekeeper(config, client)?;

    let proxy =
        GateProxy::new(gatekeeper.clone()).map_err(|e| anyhow::anyhow!("upstream address: {e}"))?;
    let ops = Arc::new(Ops {
        gatekeeper: gatekeeper.clone(),
        upstreams: proxy.upstreams(),
    });
    let mut proxy_service = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        proxy,
        "tokensaver proxy",
    );
    // A write buffer that holds a response's header with its receipt (about 2 KiB) and a
    // typical answer: pingora flushes a body of known length once it is complete, so header
    // and body leave in one send instead of two (pingora's default buffer is one MSS, 1460
    // bytes, smaller than the header alone). Streams are flushed chunk by chunk whatever the
    // buffer, so SSE is not delayed.
    let buffers = L4BufferSettings::default().write(PROXY_WRITE_BUFFER);
    proxy_service.add_listener(ListenerConfig::tcp(proxy_addr.to_string()).l4_buffer(buffers));

    let api = Arc::new(Api::new(gatekeeper.clone()));
    let mut api_service = Service::new(
        "tokensaver api".into(),
        ApiApp::new(api.clone(), Listener::Api, None),
    );
    api_service.add_tcp(&api_addr.to_string());
    let mut admin_service = Service::new(
        "tokensaver admin".into(),
        ApiApp::new(api, Listener::Admin, Some(ops)),
    );
    admin_service.add_tcp(&admin_addr.to_string());

    server.add_service(proxy_service);
    server.add_service(background_service(
        "expiry sweep",
        ExpirySweep(gatekeeper.clone()),
    ));
    if digest_mode {
        // A digest-mode client keeps answers only; the ledger and routes live at the gate.
        tracing::info!(%proxy_addr, "tokensaver digest-mode client listening");
    } else {
        server.add_service(api_service);
        server.add_service(admin_service);
        tracing::info!(%proxy_addr, %api_addr, %admin_addr, "tokensaver listening");
    }
    lifecycle::watch(
        phases,
        lifecycle::Drain {
            grace,
            commit: {
                let gatekeeper = gatekeeper.clone();
                Box::new(move || gatekeeper.close_store())
            },
            pid_file: opts.pid_file,
        },
    )
    .map_err(|e| anyhow::anyhow!("cannot start the lifecycle thread: {e}"))?;
    server.run(RunArgs::default());
    // Reached after a fast shutdown (SIGINT): the drain did not run; commit what is queued.
    gatekeeper
        .close_store()
        .map_err(|e| anyhow::anyhow!("ledger: the last commit failed: {e}"))
}
