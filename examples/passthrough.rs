//! A plain pingora pass-through proxy: the reference the load test compares tokensaver with.
//!
//! `passthrough LISTEN UPSTREAM [THREADS]`, e.g.
//! `cargo run --release --example passthrough -- 127.0.0.1:18802 127.0.0.1:18801 2`
//!
//! Every request goes to UPSTREAM (plain HTTP, pooled connections) with the same peer options
//! the gate uses for its providers; nothing is read, parsed or rewritten beyond pingora's own
//! header handling.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use async_trait::async_trait;
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::Result;

struct Passthrough {
    peer: HttpPeer,
}

#[async_trait]
impl ProxyHttp for Passthrough {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let usage = || {
        eprintln!("usage: passthrough LISTEN_ADDR UPSTREAM_ADDR [THREADS]");
        ExitCode::from(2)
    };
    let (Some(listen), Some(upstream)) = (args.get(1), args.get(2)) else {
        return usage();
    };
    let Ok(upstream_addr) = upstream.parse::<SocketAddr>() else {
        return usage();
    };
    let threads = args
        .get(3)
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or(2)
        .max(1);

    let mut peer = HttpPeer::new(upstream_addr, false, upstream_addr.ip().to_string());
    peer.options.connection_timeout = Some(Duration::from_secs(10));
    peer.options.read_timeout = Some(Duration::from_secs(120));
    peer.options.write_timeout = Some(Duration::from_secs(120));
    peer.options.idle_timeout = Some(Duration::from_secs(60));

    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service =
        pingora::proxy::http_proxy_service(&server.configuration, Passthrough { peer });
    service.add_tcp(listen);
    server.add_service(service);
    eprintln!("passthrough listening on {listen} → {upstream_addr} ({threads} threads)");
    server.run_forever()
}
