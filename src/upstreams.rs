//! The configured upstreams (`[upstreams.NAME]`): which one takes a model, the addresses its
//! host resolves to now, and how a request is addressed to it.
//!
//! Routing: a request goes to the upstream of its API shape whose `models` take its model (an
//! exact name before any `prefix*`, a longer prefix before a shorter one); else to the one of
//! that shape that lists no `models`; else nowhere (a 404 naming the model). The served model
//! routes, so a DOWNGRADE may cross upstreams of one API shape.
//!
//! Addresses: each host is resolved at start (a host without an address stops `serve`), then
//! again every `dns_refresh_secs` on a thread of its own. Requests take the addresses in
//! turn, and a connect that fails is tried on the next one. A failed re-resolution keeps the
//! last addresses (a stale answer beats none) and says so in `/readyz`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use pingora::Result;

use crate::config::{CredentialHeader, KeyConfig, Upstream};
use std::collections::HashMap;
use tokensaver_core::request::{Provider, Route};

/// Read on every resolution before the system's resolver: lines of `host address…` (as a hosts
/// file, host first). For pinning a provider's addresses, and the tests' resolver seam.
pub const HOSTS_FILE_ENV: &str = "TOKENSAVER_HOSTS_FILE";

/// One configured upstream and the addresses its host has now.
pub struct UpstreamPeer {
    pub config: Upstream,
    credential: Option<String>,
    /// Key id → that key's own credential for this upstream (`[[keys]] credential_env`).
    key_credentials: HashMap<String, String>,
    timeout: Duration,
    resolved: RwLock<Resolved>,
    next: AtomicUsize,
}

struct Resolved {
    addresses: Vec<SocketAddr>,
    /// A peer per address, built once per resolution: a request takes them by reference.
    peers: Arc<[HttpPeer]>,
    at_ms: u64,
    /// The latest resolution failed: `addresses` are the last good ones.
    stale: bool,
}

/// What one request is sent to: an upstream, and its addresses in the order to try them.
#[derive(Clone)]
pub struct ProviderPeer {
    pub upstream: Arc<UpstreamPeer>,
    peers: Arc<[HttpPeer]>,
    /// The address tried first (the next in turn); the others follow in order.
    start: usize,
    pub host_header: String,
}

impl ProviderPeer {
    pub fn name(&self) -> &str {
        &self.upstream.config.name
    }

    /// Every address, the first choice first.
    pub fn candidates(&self) -> impl Iterator<Item = &HttpPeer> {
        let (before, from) = self.peers.split_at(self.start);
        from.iter().chain(before)
    }

    /// How many addresses follow the first, for a connect that fails.
    pub fn fallbacks(&self) -> usize {
        self.peers.len().saturating_sub(1)
    }

    /// Put the provider credential where this provider expects it: the calling key's own, if
    /// it has one for this upstream, else the upstream's (`None`: a call made for no key, such
    /// as the model list).
    pub fn set_credential(&self, header: &mut RequestHeader, key_id: Option<&str>) -> Result<()> {
        for name in ["authorization", "x-api-key", "api-key"] {
            header.remove_header(name);
        }
        let own = key_id.and_then(|k| self.upstream.key_credentials.get(k));
        if let Some(cred) = own.or(self.upstream.credential.as_ref()) {
            match self.upstream.config.credential_header {
                CredentialHeader::Bearer => {
                    header.insert_header("authorization", format!("Bearer {cred}"))?
                }
                h => header.insert_header(h.name(), cred.as_str())?,
            }
        }
        Ok(())
    }

    /// The upstream path of a request the caller sent to `path_and_query` (an SDK's `/v1/…`):
    /// as sent; under the base URL's path in place of `/v1`; or, for Azure OpenAI, the
    /// deployment's chat completions, or the `/openai/…` path with its `api-version`.
    pub fn path(&self, route: Option<Route>, path_and_query: &str, model: &str) -> String {
        let config = &self.upstream.config;
        let rest = path_and_query
            .strip_prefix("/v1")
            .filter(|r| r.is_empty() || r.starts_with(['/', '?']))
            .unwrap_or(path_and_query);
        let Some(azure) = &config.azure else {
            return match config.path_prefix.is_empty() {
                true => path_and_query.to_string(),
                false => format!("{}{rest}", config.path_prefix),
            };
        };
        let (rest_path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let tail = match route {
            Some(Route::OpenAiChat) => {
                // A caller's model names the deployment only as one path segment.
                let deployment = match azure.deployments.get(model) {
                    Some(d) => d.clone(),
                    None => percent_encode_segment(model),
                };
                format!("/deployments/{deployment}/chat/completions")
            }
            _ => rest_path.to_string(),
        };
        let query = match query {
            "" => String::new(),
            q => format!("&{q}"),
        };
        format!(
            "{}/openai{tail}?api-version={}{query}",
            config.path_prefix, azure.api_version
        )
    }
}

impl UpstreamPeer {
    fn start(
        config: &Upstream,
        keys: &[KeyConfig],
        timeout: Duration,
    ) -> std::io::Result<UpstreamPeer> {
        let addresses = resolve(&config.host, config.port)?;
        let credential = config
            .credential_env
            .as_deref()
            .and_then(|name| std::env::var(name).ok())
            .filter(|v| !v.is_empty());
        // A key bound to its own credential never falls back to the shared one: an unset
        // variable stops the start.
        let mut key_credentials = HashMap::new();
        for key in keys {
            if let Some(var) = key.credential_env.get(&config.name) {
                let value = std::env::var(var).ok().filter(|v| !v.is_empty());
                let Some(value) = value else {
                    return Err(std::io::Error::other(format!(
                        "key {} names {var} for upstream {}, and it is not set",
                        key.id, config.name
                    )));
                };
                key_credentials.insert(key.id.to_string(), value);
            }
        }
        let peers = http_peers(config, timeout, &addresses);
        Ok(UpstreamPeer {
            config: config.clone(),
            credential,
            key_credentials,
            timeout,
            resolved: RwLock::new(Resolved {
                addresses,
                peers,
                at_ms: crate::now_ms(),
                stale: false,
            }),
            next: AtomicUsize::new(0),
        })
    }

    fn resolved(&self) -> std::sync::RwLockReadGuard<'_, Resolved> {
        self.resolved.read().unwrap_or_else(|p| p.into_inner())
    }

    fn refresh(&self) {
        let found = resolve(&self.config.host, self.config.port);
        let mut r = self.resolved.write().unwrap_or_else(|p| p.into_inner());
        match found {
            Ok(addresses) => {
                if addresses != r.addresses {
                    tracing::info!(
                        upstream = %self.config.name,
                        addresses = addresses.len(),
                        "upstream addresses changed"
                    );
                }
                *r = Resolved {
                    peers: http_peers(&self.config, self.timeout, &addresses),
                    addresses,
                    at_ms: crate::now_ms(),
                    stale: false,
                };
            }
            Err(_) => {
                if !r.stale {
                    tracing::warn!(upstream = %self.config.name, "upstream host did not resolve; keeping its last addresses");
                }
                r.stale = true;
            }
        }
    }

    /// This request's addresses: every one, starting at the next in turn.
    fn choose(self: &Arc<Self>) -> Option<ProviderPeer> {
        let peers = self.resolved().peers.clone();
        if peers.is_empty() {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % peers.len();
        Some(ProviderPeer {
            upstream: self.clone(),
            peers,
            start,
            host_header: self.config.authority.clone(),
        })
    }

    /// How well this upstream takes `model`: `None` if it names other models only.
    fn rank(&self, model: &str) -> Option<usize> {
        match &self.config.models {
            None => Some(0),
            Some(patterns) => patterns.iter().filter_map(|p| p.rank(model)).max(),
        }
    }
}

/// An upstream as it resolves now (`/readyz`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ResolvedUpstream {
    pub name: String,
    pub api: &'static str,
    pub addresses: Vec<String>,
    pub resolved_at_ms: u64,
    /// The latest resolution failed: the addresses are the last ones that resolved.
    pub stale: bool,
}

/// Every configured upstream.
pub struct Upstreams {
    all: Vec<Arc<UpstreamPeer>>,
}

impl Upstreams {
    /// Resolve every upstream (an error names none of them: the caller says which config
    /// failed) and start re-resolving them in the background.
    pub fn start(
        configs: &[Upstream],
        keys: &[KeyConfig],
        timeout: Duration,
    ) -> std::io::Result<Upstreams> {
        let all = configs
            .iter()
            .map(|c| UpstreamPeer::start(c, keys, timeout).map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        for upstream in &all {
            refresh_in_background(Arc::downgrade(upstream));
        }
        Ok(Upstreams { all })
    }

    /// The upstream that takes `model` on `api` (the routing rule in the module docs).
    fn route(&self, api: Provider, model: &str) -> Option<&Arc<UpstreamPeer>> {
        self.all
            .iter()
            .filter(|u| u.config.api == api)
            .filter_map(|u| u.rank(model).map(|rank| (rank, u)))
            .max_by_key(|(rank, _)| *rank)
            .map(|(_, u)| u)
    }

    /// The upstream that takes `model` on `api`, with its addresses for this request.
    pub fn for_model(&self, api: Provider, model: &str) -> Option<ProviderPeer> {
        self.route(api, model).and_then(|u| u.choose())
    }

    /// Whether any upstream takes `model` on `api` (before a decision is made for it).
    pub fn takes(&self, api: Provider, model: &str) -> bool {
        self.route(api, model).is_some()
    }

    /// How many upstreams speak `api`.
    pub fn count_of(&self, api: Provider) -> usize {
        self.all.iter().filter(|u| u.config.api == api).count()
    }

    /// For a call that names no model (a stored response, a token count): the upstream of
    /// `api` that lists no models, else the first of `api`.
    pub fn default_of(&self, api: Provider) -> Option<ProviderPeer> {
        let of_api = || self.all.iter().filter(|u| u.config.api == api);
        of_api()
            .find(|u| u.config.models.is_none())
            .or_else(|| of_api().next())
            .and_then(|u| u.choose())
    }

    /// The upstream named `name` on `api` (where a stored response was created).
    pub fn by_name(&self, api: Provider, name: &str) -> Option<ProviderPeer> {
        self.all
            .iter()
            .find(|u| u.config.api == api && u.config.name == name)
            .and_then(|u| u.choose())
    }

    /// Every upstream of `api`, each with its addresses for this request.
    pub fn of_api(&self, api: Provider) -> Vec<ProviderPeer> {
        self.all
            .iter()
            .filter(|u| u.config.api == api)
            .filter_map(|u| u.choose())
            .collect()
    }

    /// Whether `upstream` is the one that takes `model` on its API shape.
    pub fn routes_to(&self, upstream: &UpstreamPeer, model: &str) -> bool {
        self.route(upstream.config.api, model)
            .is_some_and(|u| std::ptr::eq(Arc::as_ptr(u), upstream))
    }

    /// What `/readyz` shows of each.
    pub fn status(&self) -> Vec<ResolvedUpstream> {
        self.all
            .iter()
            .map(|u| {
                let r = u.resolved();
                ResolvedUpstream {
                    name: u.config.name.clone(),
                    api: match u.config.api {
                        Provider::OpenAi => "openai",
                        Provider::Anthropic => "anthropic",
                    },
                    addresses: r.addresses.iter().map(ToString::to_string).collect(),
                    resolved_at_ms: r.at_ms,
                    stale: r.stale,
                }
            })
            .collect()
    }
}

/// `text` as one URL path segment: unreserved bytes as they are, every other byte `%XX`.
fn percent_encode_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A peer per address, with the upstream's TLS, SNI and timeouts.
fn http_peers(config: &Upstream, timeout: Duration, addresses: &[SocketAddr]) -> Arc<[HttpPeer]> {
    addresses
        .iter()
        .map(|&address| {
            let mut peer = HttpPeer::new(address, config.tls, config.host.clone());
            peer.options.connection_timeout = Some(Duration::from_secs(10));
            peer.options.read_timeout = Some(timeout);
            peer.options.write_timeout = Some(timeout);
            peer.options.idle_timeout = Some(Duration::from_secs(60));
            peer
        })
        .collect()
}

/// Re-resolve the upstream every `dns_refresh_secs` until it is dropped.
fn refresh_in_background(upstream: Weak<UpstreamPeer>) {
    let spawned = std::thread::Builder::new()
        .name("tokensaver-dns".into())
        .spawn(move || loop {
            let Some(every) = upstream.upgrade().map(|u| u.config.dns_refresh_secs) else {
                return;
            };
            std::thread::sleep(Duration::from_secs(every));
            match upstream.upgrade() {
                Some(u) => u.refresh(),
                None => return,
            }
        });
    if spawned.is_err() {
        tracing::error!(
            "could not start the upstream resolver thread: addresses stay as resolved at start"
        );
    }
}

/// The host's addresses: from [`HOSTS_FILE_ENV`]'s file if it names the host, else the
/// system's resolver (every address, in its order).
fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    let addresses: Vec<SocketAddr> = match from_hosts_file(host, port) {
        Some(found) => found,
        None => (host, port).to_socket_addrs()?.collect(),
    };
    if addresses.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "upstream host has no address",
        ));
    }
    Ok(addresses)
}

fn from_hosts_file(host: &str, port: u16) -> Option<Vec<SocketAddr>> {
    let path = std::env::var_os(HOSTS_FILE_ENV)?;
    let text = std::fs::read_to_string(path).ok()?;
    parse_hosts(&text, host, port)
}

/// `host address…` lines; `#` starts a comment. `None` when the host is not named.
fn parse_hosts(text: &str, host: &str, port: u16) -> Option<Vec<SocketAddr>> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == host).then(|| {
                words
                    .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect()
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lines_name_a_host_and_its_addresses() {
        let text = "# pinned\nprovider.test 127.0.0.2 127.0.0.3 # two\nother 10.0.0.1\n";
        assert_eq!(
            parse_hosts(text, "provider.test", 443),
            Some(vec![
                "127.0.0.2:443".parse().unwrap(),
                "127.0.0.3:443".parse().unwrap()
            ])
        );
        assert_eq!(parse_hosts(text, "missing", 443), None);
    }
}
