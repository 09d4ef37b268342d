//! Health and readiness on the admin listener, open (no key) so that a supervisor or a load
//! balancer can probe them:
//! - `GET /healthz` — the process is alive and answers (also while it drains).
//! - `GET /readyz`  — it should be sent traffic: the store's writer commits and the data dir
//!   accepts a write, the signing key signs and verifies, every configured upstream has an
//!   address, and it is not draining. 503 with the same body otherwise. Each upstream's
//!   addresses are shown as resolved now, with `stale` when the latest resolution failed.
//!
//! Both name the answering `pid`: during a graceful upgrade two processes share the
//! listening sockets, and a probe can tell which one answered. Never any request content.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde::Serialize;
use serde_json::json;

use super::http::{ApiRequest, ApiResponse};
use crate::error::ApiError;
use crate::gatekeeper::Gatekeeper;
use crate::http_client::{BlockingClient, Request};
use crate::lifecycle;

/// How long the store's writer may take to acknowledge a readiness probe.
const STORE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Ops {
    pub gatekeeper: Arc<Gatekeeper>,
    pub upstreams: Arc<crate::upstreams::Upstreams>,
}

#[derive(Debug, Serialize)]
struct Checks {
    store_writable: bool,
    signing_key: bool,
    upstreams_resolved: bool,
    draining: bool,
}

impl Ops {
    /// The answer for `/healthz` or `/readyz`, or `None` for any other path.
    /// The paths answered here, before the route table (open: they report on the process).
    pub fn serves(path: &str) -> bool {
        matches!(path, "/healthz" | "/readyz")
    }

    pub async fn route(&self, req: &ApiRequest) -> Option<ApiResponse> {
        let ready = match req.path.as_str() {
            "/healthz" => false,
            "/readyz" => true,
            _ => return None,
        };
        if req.method != Method::GET {
            return Some(ApiError::MethodNotAllowed.into());
        }
        Some(if ready {
            self.readiness().await
        } else {
            ApiResponse::json(
                200,
                &json!({
                    "status": "alive",
                    "pid": std::process::id(),
                    "draining": lifecycle::draining(),
                    "in_flight": lifecycle::in_flight(),
                }),
            )
        })
    }

    async fn readiness(&self) -> ApiResponse {
        let upstreams = self.upstreams.status();
        let checks = Checks {
            store_writable: self.store_writable().await,
            signing_key: {
                let signer = &self.gatekeeper.core.signer;
                let probe = signer.sign_as(crate::receipt::DocumentKind::Probe, b"readyz");
                signer
                    .verify_as(crate::receipt::DocumentKind::Probe, &probe)
                    .is_ok()
            },
            upstreams_resolved: upstreams.iter().all(|u| !u.addresses.is_empty()),
            draining: lifecycle::draining(),
        };
        let ready = checks.store_writable
            && checks.signing_key
            && checks.upstreams_resolved
            && !checks.draining;
        ApiResponse::json(
            if ready { 200 } else { 503 },
            &json!({
                "ready": ready,
                "pid": std::process::id(),
                "checks": checks,
                "upstreams": upstreams,
            }),
        )
    }

    /// The writer acknowledges a flush in time, and the data dir takes a synced write.
    async fn store_writable(&self) -> bool {
        let flushed = tokio::time::timeout(STORE_PROBE_TIMEOUT, self.gatekeeper.flush())
            .await
            .is_ok_and(|r| r.is_ok());
        if !flushed {
            return false;
        }
        let dir = self.gatekeeper.core.config.data_dir.clone();
        tokio::task::spawn_blocking(move || probe_write(dir))
            .await
            .unwrap_or(false)
    }
}

/// `tokensaver health`: ask the admin listener at `admin` for `/healthz` (or `/readyz`), for up
/// to `wait_secs`; the answer's body, or why there is none.
pub fn ask(admin: std::net::SocketAddr, ready: bool, wait_secs: u64) -> anyhow::Result<String> {
    let path = if ready { "/readyz" } else { "/healthz" };
    let url = format!("http://{admin}{path}");
    let client = BlockingClient::new(&format!("http://{admin}"), Duration::from_secs(5))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(wait_secs);
    loop {
        let answer = match client.send(&Request::get(path)) {
            Ok(a) if a.is_error() => Err(anyhow::anyhow!("{}: {}", a.status, text(&a.body))),
            Ok(a) => Ok(text(&a.body)),
            Err(e) => Err(anyhow::anyhow!("no answer from {url}: {e}")),
        };
        match answer {
            Ok(body) => return Ok(body.trim().to_string()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// A body as text; nothing if it is not UTF-8 (the probes answer JSON).
fn text(body: &[u8]) -> String {
    String::from_utf8(body.to_vec()).unwrap_or_default()
}

fn probe_write(dir: PathBuf) -> bool {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    // One file per probe: probes run concurrently.
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let n = PROBES.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!(".readyz-{}-{n}", std::process::id()));
    let written = std::fs::File::create(&path)
        .and_then(|mut f| {
            f.write_all(b"readyz\n")?;
            f.sync_all()
        })
        .is_ok();
    let removed = std::fs::remove_file(&path).is_ok();
    written && removed
}
