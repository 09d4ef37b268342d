//! `tokensaver serve`: three pingora services on one server — the proxy, the API listener and
//! the admin listener — around one [`Gatekeeper`].

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::listening::Service;

use crate::api::server::ApiApp;
use crate::api::{Api, Listener};
use crate::config::Config;
use crate::ledger::Gatekeeper;
use crate::now_ms;
use crate::proxy::GateProxy;
use crate::receipt::ReceiptSigner;
use crate::store::sqlite::SqliteStore;

/// Open the data dir, the signing key and the ledger, and rebuild the gate's memory.
pub fn open_gatekeeper(config: Config) -> Result<Arc<Gatekeeper>, String> {
    let signer = ReceiptSigner::load_or_create(&config.data_dir).map_err(|e| e.to_string())?;
    let store = SqliteStore::open(&config.data_dir, config.commit_interval_ms)
        .map_err(|e| e.to_string())?;
    let gatekeeper =
        Gatekeeper::new(config, signer, Arc::new(store), now_ms()).map_err(|e| e.to_string())?;
    Ok(Arc::new(gatekeeper))
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
) -> Result<Option<ClientMode>, String> {
    let section = config.client.as_ref();
    let Some(gate_url) = gate_url.or_else(|| section.map(|c| c.gate_url.clone())) else {
        return Ok(None);
    };
    let key = gate_key
        .or_else(|| {
            section
                .and_then(|c| c.gate_key_env.as_deref())
                .and_then(|name| std::env::var(name).ok())
        })
        .ok_or("digest mode needs the tokensaver key: --gate-key or [client] gate_key_env")?;
    if crate::auth::parse_key(&key).is_none() {
        return Err("the gate key is not of the form tsk_<id>_<secret>".into());
    }
    Ok(Some(ClientMode { gate_url, key }))
}

pub fn serve(
    config_path: &Path,
    threads: usize,
    gate_url: Option<String>,
    gate_key: Option<String>,
) -> Result<(), String> {
    let mut config = Config::load(config_path).map_err(|e| e.to_string())?;
    let client = client_mode(&config, gate_url, gate_key)?;
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
    let gatekeeper = open_gatekeeper(config)?;
    let remote = client.map(|c| crate::proxy::remote::RemoteGate::new(&c.gate_url, c.key));
    let digest_mode = remote.is_some();

    let conf = ServerConf {
        threads: threads.max(1),
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let proxy =
        GateProxy::new(gatekeeper.clone(), remote).map_err(|e| format!("upstream address: {e}"))?;
    let mut proxy_service = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        proxy,
        "tokensaver proxy",
    );
    proxy_service.add_tcp(&proxy_addr.to_string());

    let api = Arc::new(Api::new(gatekeeper.clone()));
    let mut api_service = Service::new(
        "tokensaver api".into(),
        ApiApp {
            api: api.clone(),
            listener: Listener::Api,
        },
    );
    api_service.add_tcp(&api_addr.to_string());
    let mut admin_service = Service::new(
        "tokensaver admin".into(),
        ApiApp {
            api,
            listener: Listener::Admin,
        },
    );
    admin_service.add_tcp(&admin_addr.to_string());

    // Expiry of reservations and holds runs on requests too; this tick covers idle keys.
    let ticker = gatekeeper.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        ticker.tick(now_ms());
    });

    server.add_service(proxy_service);
    if digest_mode {
        // A digest-mode client keeps answers only; the ledger and routes live at the gate.
        tracing::info!(%proxy_addr, "tokensaver digest-mode client listening");
    } else {
        server.add_service(api_service);
        server.add_service(admin_service);
        tracing::info!(%proxy_addr, %api_addr, %admin_addr, "tokensaver listening");
    }
    server.run_forever()
}
