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
use crate::proxy::{now_ms, GateProxy};
use crate::receipt::ReceiptSigner;
use crate::store::sqlite::SqliteStore;

/// Open the data dir, the signing key and the ledger, and rebuild the gate's memory.
pub fn open_gatekeeper(config: Config) -> Result<Arc<Gatekeeper>, String> {
    let signer = ReceiptSigner::load_or_create(&config.data_dir).map_err(|e| e.to_string())?;
    let store = SqliteStore::open(&config.data_dir, config.commit_interval_ms).map_err(|e| e.to_string())?;
    let gatekeeper = Gatekeeper::new(config, signer, Arc::new(store), now_ms()).map_err(|e| e.to_string())?;
    Ok(Arc::new(gatekeeper))
}

pub fn serve(config_path: &Path, threads: usize) -> Result<(), String> {
    let config = Config::load(config_path).map_err(|e| e.to_string())?;
    let (proxy_addr, api_addr, admin_addr) = (config.proxy_addr, config.api_addr, config.admin_addr);
    let gatekeeper = open_gatekeeper(config)?;

    let conf = ServerConf {
        threads: threads.max(1),
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let proxy = GateProxy::new(gatekeeper.clone()).map_err(|e| format!("upstream address: {e}"))?;
    let mut proxy_service = pingora::proxy::http_proxy_service_with_name(&server.configuration, proxy, "tokensaver proxy");
    proxy_service.add_tcp(&proxy_addr.to_string());

    let api = Arc::new(Api::new(gatekeeper.clone()));
    let mut api_service = Service::new("tokensaver api".into(), ApiApp { api: api.clone(), listener: Listener::Api });
    api_service.add_tcp(&api_addr.to_string());
    let mut admin_service = Service::new("tokensaver admin".into(), ApiApp { api, listener: Listener::Admin });
    admin_service.add_tcp(&admin_addr.to_string());

    // Expiry of reservations and holds runs on requests too; this tick covers idle keys.
    let ticker = gatekeeper.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        ticker.tick(now_ms());
    });

    server.add_service(proxy_service);
    server.add_service(api_service);
    server.add_service(admin_service);
    tracing::info!(%proxy_addr, %api_addr, %admin_addr, "tokensaver listening");
    server.run_forever()
}
