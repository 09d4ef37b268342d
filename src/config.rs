//! Raw TOML → validated runtime config. Unknown keys are refused and every mistake names its
//! key (`serde_path_to_error`), so a typo fails at start instead of silently using a default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use tokensaver_core::gate::{GateConfig, Policy, Saturation};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("config error at `{field}`: {reason}")]
    Field { field: String, reason: String },
}

fn field(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    listen: RawListen,
    #[serde(default)]
    data: RawData,
    #[serde(default)]
    upstreams: RawUpstreams,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    keys: Vec<RawKey>,
    #[serde(default)]
    prices: BTreeMap<String, Prices>,
    #[serde(default)]
    downgrade: BTreeMap<String, String>,
    #[serde(default)]
    gate: GateConfig,
    /// Named scoring profiles a key may use (`[profiles.agent]`).
    #[serde(default)]
    profiles: BTreeMap<String, RawProfile>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    client: Option<RawClient>,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    log: RawLog,
    /// Where the ledger lives: embedded SQLite (default) or a fleet's PostgreSQL.
    #[serde(default)]
    store: RawStore,
}

/// `[store]`: `kind = "sqlite"` (default) or `kind = "postgres"` with `url` or `url_env`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    #[serde(default)]
    kind: StoreKind,
    url: Option<String>,
    /// The name of the environment variable holding the URL (keeps a password out of the file).
    url_env: Option<String>,
    /// Connections this instance keeps to PostgreSQL.
    max_connections: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    #[default]
    Sqlite,
    Postgres,
}

/// A fleet's PostgreSQL (`[store] kind = "postgres"`). Its `Debug` never shows the URL, which
/// may carry a password.
#[derive(Clone)]
pub struct FleetConfig {
    pub url: String,
    pub max_connections: usize,
}

impl std::fmt::Debug for FleetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetConfig")
            .field("url", &"<redacted>")
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

const DEFAULT_FLEET_CONNECTIONS: usize = 16;

impl RawStore {
    fn validate(self) -> Result<Option<FleetConfig>, ConfigError> {
        if self.kind == StoreKind::Sqlite {
            if self.url.is_some() || self.url_env.is_some() {
                return Err(field("store.url", "only a postgres store takes a URL"));
            }
            return Ok(None);
        }
        let url = match (self.url, self.url_env) {
            (Some(url), None) => url,
            (None, Some(var)) => std::env::var(&var).map_err(|_| {
                field(
                    "store.url_env",
                    "names an environment variable that is not set",
                )
            })?,
            _ => {
                return Err(field(
                    "store",
                    "a postgres store needs exactly one of `url` and `url_env`",
                ))
            }
        };
        let parsed: tokio_postgres::Config = url
            .parse()
            .map_err(|_| field("store.url", "not a PostgreSQL connection URL"))?;
        if parsed.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(field(
                "store.url",
                "sslmode=require needs TLS, which this build does not include: use \
                 sslmode=disable on a trusted network, or a local TLS tunnel",
            ));
        }
        let max_connections = self.max_connections.unwrap_or(DEFAULT_FLEET_CONNECTIONS);
        if max_connections == 0 {
            return Err(field("store.max_connections", "must be at least 1"));
        }
        Ok(Some(FleetConfig {
            url,
            max_connections,
        }))
    }
}

/// How the process stops: `tokensaver serve` drains on SIGTERM.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    /// How long in-flight requests and streams may take to finish after SIGTERM (or after a
    /// graceful upgrade's hand-over) before the streams still running are cut.
    #[serde(default = "default_grace_period")]
    grace_period_secs: u64,
}

impl Default for RawServer {
    fn default() -> Self {
        Self {
            grace_period_secs: default_grace_period(),
        }
    }
}

fn default_grace_period() -> u64 {
    60
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    /// `text` (default) or `json`; `--log-format` overrides it.
    #[serde(default)]
    format: LogFormat,
    /// One access-log line per proxy request (target `tokensaver::access`); default on.
    #[serde(default = "default_true")]
    access: bool,
}

fn default_true() -> bool {
    true
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            format: Default::default(),
            access: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListen {
    #[serde(default = "default_proxy_addr")]
    proxy: String,
    #[serde(default = "default_api_addr")]
    api: String,
    #[serde(default = "default_admin_addr")]
    admin: String,
}

impl Default for RawListen {
    fn default() -> Self {
        Self {
            proxy: default_proxy_addr(),
            api: default_api_addr(),
            admin: default_admin_addr(),
        }
    }
}

fn default_proxy_addr() -> String {
    "127.0.0.1:8787".into()
}
fn default_api_addr() -> String {
    "127.0.0.1:8788".into()
}
fn default_admin_addr() -> String {
    "127.0.0.1:8789".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawData {
    #[serde(default = "default_data_dir")]
    dir: PathBuf,
    /// The economics evidence (methodology, sessions, recorded runs) `GET /economics` reads.
    #[serde(default = "default_economics_dir")]
    economics: PathBuf,
}

impl Default for RawData {
    fn default() -> Self {
        Self {
            dir: default_data_dir(),
            economics: default_economics_dir(),
        }
    }
}

fn default_economics_dir() -> PathBuf {
    PathBuf::from("../corpus/economics")
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("./data")
}

/// `[upstreams.NAME]`, by name.
type RawUpstreams = BTreeMap<String, RawUpstream>;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    /// `"openai"` or `"anthropic"`: the API shape it speaks. May be left out for the
    /// upstreams named `openai` and `anthropic`.
    api: Option<String>,
    base_url: String,
    /// Name of the environment variable holding the provider credential.
    credential_env: Option<String>,
    /// The header the credential goes in: `authorization` (as `Bearer …`), `x-api-key` or
    /// `api-key` (Azure). Default: the API shape's (`authorization` for OpenAI, `x-api-key`
    /// for Anthropic).
    credential_header: Option<String>,
    /// The models it takes: exact names and `prefix*` patterns. Absent: every model of its
    /// API shape that no other upstream names.
    models: Option<Vec<String>>,
    /// Azure OpenAI: the `api-version` query; with it, chat completions go to
    /// `/openai/deployments/{deployment}/chat/completions`.
    api_version: Option<String>,
    /// Azure OpenAI: model → deployment name (absent: the deployment is named as the model).
    #[serde(default)]
    deployments: BTreeMap<String, String>,
    /// How often the host is resolved again (seconds): provider front ends move.
    #[serde(default = "default_dns_refresh")]
    dns_refresh_secs: u64,
}

fn default_dns_refresh() -> u64 {
    30
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    key_hash: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    id: String,
    secret_hash: String,
    #[serde(default)]
    budget: Option<RawBudget>,
    #[serde(default)]
    human: bool,
    owner_secret_hash: Option<String>,
    /// A `[profiles.NAME]` this key is scored with; absent: the `[gate.saturation]` defaults.
    profile: Option<String>,
    /// Prompt caching placed by the gate (SPEC §2.11b): `"auto"` (default) or `"off"`.
    #[serde(default)]
    cache: CachePolicy,
    /// The lifetime of the call's breakpoints (Anthropic): `"auto"` (one hour where the
    /// session's pauses say it pays), `"5m"` (never changed) or `"1h"`.
    #[serde(default)]
    cache_ttl: tokensaver_core::gate::cache::LifetimePolicy,
    /// The gate's mechanisms this key goes without (`serve`, `downgrade`, `stop`,
    /// `breakpoints`, `lifetimes`, `routing`): an operator's choice, and the evidence's
    /// ablation arms (one off at a time). Default: none, the gate as built.
    #[serde(default)]
    without: tokensaver_core::gate::Mechanisms,
    /// The key's own provider credentials, by upstream name: the environment variable that
    /// holds each. Its calls to that upstream carry it instead of the upstream's: a provider's
    /// prompt cache is shared by everything behind one credential, so a key (or the keys of a
    /// team, naming one variable) with its own is out of every other key's cache.
    #[serde(default)]
    credential_env: BTreeMap<String, String>,
}

/// Whether the gate adds prompt-cache breakpoints to a key's unmarked requests. `auto` is the
/// default: a breakpoint goes only where the key has sent the prefix before within the cache's
/// lifetime, so a request the key never repeats pays no write premium, and a repeat pays a tenth
/// of the input price for what it repeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    #[default]
    Auto,
    Off,
}

/// A scoring profile: where the spend signals saturate for a kind of traffic. Weights, bands,
/// the waste signals (loop, burst, grind) and every hard rule stay the seed's: a profile says
/// what a normal request of this kind looks like, never how much a runaway may do.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    saturation: SpendSaturation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpendSaturation {
    pub size: u64,
    pub ask: u64,
    pub depth: u64,
    pub tools: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    ceiling_micro_usd: u64,
    #[serde(default)]
    period: BudgetPeriod,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(default = "default_body_cap")]
    max_body_bytes: usize,
    #[serde(default = "default_answer_store_bytes")]
    answer_store_bytes: usize,
    #[serde(default = "default_hold_ttl")]
    hold_ttl_secs: u64,
    #[serde(default = "default_reservation_ttl")]
    reservation_ttl_secs: u64,
    #[serde(default = "default_upstream_timeout")]
    upstream_timeout_secs: u64,
    #[serde(default = "default_commit_interval")]
    commit_interval_ms: u64,
    /// Repeated steps one key may have held in the gate at once (SPEC §2.3); past it a step
    /// is refused as a loop, as a gate that cannot hold it would.
    #[serde(default = "default_max_paced_per_key")]
    max_paced_per_key: usize,
    /// Bytes of held requests' bodies in all, every key together.
    #[serde(default = "default_max_paced_bytes")]
    max_paced_bytes: usize,
    /// Entries of each 24-hour table (fingerprints, step fingerprints, recorded usage), every
    /// key together.
    #[serde(default = "default_remembered_entries")]
    remembered_entries: usize,
}

impl Default for RawLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: default_body_cap(),
            answer_store_bytes: default_answer_store_bytes(),
            hold_ttl_secs: default_hold_ttl(),
            reservation_ttl_secs: default_reservation_ttl(),
            upstream_timeout_secs: default_upstream_timeout(),
            commit_interval_ms: default_commit_interval(),
            max_paced_per_key: default_max_paced_per_key(),
            max_paced_bytes: default_max_paced_bytes(),
            remembered_entries: default_remembered_entries(),
        }
    }
}

/// A key's agents each repeat one step at a time: sixteen sessions stuck at once is far past
/// what one key runs, and bounds what a key that can never spend parks.
fn default_max_paced_per_key() -> usize {
    16
}
fn default_max_paced_bytes() -> usize {
    256 * 1024 * 1024
}
fn default_remembered_entries() -> usize {
    tokensaver_core::gate::windows::REMEMBERED_TOTAL
}

fn default_body_cap() -> usize {
    8 * 1024 * 1024
}
fn default_answer_store_bytes() -> usize {
    256 * 1024 * 1024
}
fn default_hold_ttl() -> u64 {
    15 * 60
}
fn default_reservation_ttl() -> u64 {
    10 * 60
}
fn default_upstream_timeout() -> u64 {
    120
}
fn default_commit_interval() -> u64 {
    20
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    gate_url: String,
    /// The client's tokensaver key, or the name of the environment variable holding it.
    gate_key_env: Option<String>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
}

pub use tokensaver_core::prices::Prices;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    #[default]
    Lifetime,
    Day,
    Month,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Lifetime => "lifetime",
            BudgetPeriod::Day => "day",
            BudgetPeriod::Month => "month",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Ceiling in nano-USD (the config states micro-USD; spend is kept in nano-USD).
    pub ceiling_nano: u64,
    pub period: BudgetPeriod,
}

#[derive(Debug, Clone)]
pub struct KeyConfig {
    /// Shared, not copied: the request path hands it on several times per request.
    pub id: Arc<str>,
    pub secret_hash: [u8; 32],
    pub budget: Option<Budget>,
    pub human_default: bool,
    pub owner_secret_hash: Option<[u8; 32]>,
    /// The scoring profile's name and its spend saturation points.
    pub profile: Option<(String, SpendSaturation)>,
    pub cache: CachePolicy,
    /// `cache_ttl`: the lifetime of its Anthropic breakpoints ([`CachePolicy::Off`] overrides).
    pub cache_ttl: tokensaver_core::gate::cache::LifetimePolicy,
    /// The gate's mechanisms this key goes without (`[[keys]] without`).
    pub without: tokensaver_core::gate::Mechanisms,
    /// Upstream name → the environment variable of this key's own credential for it.
    pub credential_env: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct Upstream {
    /// The table's name (`[upstreams.NAME]`): in logs, metrics and `/readyz`.
    pub name: String,
    pub api: tokensaver_core::request::Provider,
    pub base_url: String,
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The `Host` header the provider is sent (see [`Origin::authority`]).
    pub authority: String,
    /// The base URL's path (`https://openrouter.ai/api/v1` → `/api/v1`), which replaces the
    /// request path's `/v1`; empty when the URL names a server only (the path goes as sent).
    pub path_prefix: String,
    pub credential_env: Option<String>,
    pub credential_header: CredentialHeader,
    /// `None`: the default upstream of its API shape (takes what no other names).
    pub models: Option<Vec<ModelPattern>>,
    pub azure: Option<Azure>,
    pub dns_refresh_secs: u64,
}

/// Where an upstream's credential goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialHeader {
    /// `Authorization: Bearer …` (OpenAI and most OpenAI-compatible providers).
    Bearer,
    /// `x-api-key` (Anthropic).
    XApiKey,
    /// `api-key` (Azure OpenAI).
    ApiKey,
}

impl CredentialHeader {
    pub fn name(self) -> &'static str {
        match self {
            CredentialHeader::Bearer => "authorization",
            CredentialHeader::XApiKey => "x-api-key",
            CredentialHeader::ApiKey => "api-key",
        }
    }
}

/// An upstream's model names: `gpt-4o` (exact) or `llama-*` (a prefix).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModelPattern {
    Exact(String),
    Prefix(String),
}

impl ModelPattern {
    fn parse(text: &str) -> ModelPattern {
        match text.strip_suffix('*') {
            Some(prefix) => ModelPattern::Prefix(prefix.to_string()),
            None => ModelPattern::Exact(text.to_string()),
        }
    }

    /// How well it takes `model`: `None` when it does not, else a rank (an exact name beats
    /// every prefix, a longer prefix a shorter one).
    pub fn rank(&self, model: &str) -> Option<usize> {
        match self {
            ModelPattern::Exact(m) => (m == model).then_some(usize::MAX),
            ModelPattern::Prefix(p) => model.starts_with(p.as_str()).then_some(p.len()),
        }
    }
}

/// Azure OpenAI's deployment paths.
#[derive(Debug, Clone)]
pub struct Azure {
    pub api_version: String,
    pub deployments: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub gate_url: String,
    pub gate_key_env: Option<String>,
    pub data_dir: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub proxy_addr: SocketAddr,
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub economics_dir: PathBuf,
    /// Every `[upstreams.NAME]`, by name.
    pub upstreams: Vec<Upstream>,
    pub admin_key_hash: Option<[u8; 32]>,
    pub keys: Vec<KeyConfig>,
    /// Key id → position in `keys`: the lookup every request makes.
    key_index: std::collections::HashMap<String, usize>,
    pub prices: BTreeMap<String, Prices>,
    pub downgrade: BTreeMap<String, String>,
    pub gate: GateConfig,
    /// The scoring profiles by name (keys name them; the economics harness's keys too).
    pub profiles: BTreeMap<String, SpendSaturation>,
    pub max_body_bytes: usize,
    pub answer_store_bytes: usize,
    pub hold_ttl_ms: u64,
    pub reservation_ttl_ms: u64,
    pub upstream_timeout_secs: u64,
    pub commit_interval_ms: u64,
    /// `[limits] max_paced_per_key`, `max_paced_bytes`: what the gate holds at once.
    pub max_paced_per_key: usize,
    pub max_paced_bytes: usize,
    /// `[limits] remembered_entries`: each 24-hour table's entries, all keys together.
    pub remembered_entries: usize,
    pub client: Option<ClientConfig>,
    /// `[server] grace_period_secs`: the drain's grace period.
    pub grace_period_secs: u64,
    pub log_format: LogFormat,
    /// `[log] access`: one access-log line per proxy request.
    pub access_log: bool,
    /// `Some`: this instance is one of a fleet sharing this PostgreSQL.
    pub fleet: Option<FleetConfig>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.kind().to_string(),
        })?;
        let mut config = Self::parse(&text)?;
        // A relative data dir is relative to the config file, so `serve` works from anywhere.
        if let Some(parent) = path.parent() {
            for dir in [&mut config.data_dir, &mut config.economics_dir] {
                if dir.is_relative() {
                    *dir = parent.join(&*dir);
                }
            }
        }
        Ok(config)
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let deserializer = toml::Deserializer::new(text);
        let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            field(
                if path.is_empty() {
                    "(top level)".into()
                } else {
                    path
                },
                e.into_inner().message().trim().to_string(),
            )
        })?;
        Self::validate(raw)
    }

    fn validate(mut raw: RawConfig) -> Result<Self, ConfigError> {
        let addr = |name: &str, value: &str| {
            value.parse::<SocketAddr>().map_err(|_| {
                field(
                    format!("listen.{name}"),
                    "not a socket address like 127.0.0.1:8787",
                )
            })
        };
        let proxy_addr = addr("proxy", &raw.listen.proxy)?;
        let api_addr = addr("api", &raw.listen.api)?;
        let admin_addr = addr("admin", &raw.listen.admin)?;
        // Two listeners on one address would share its connections (the listeners set
        // SO_REUSEPORT): admin routes answered on the API port, and the other way round.
        if api_addr == proxy_addr || admin_addr == proxy_addr || admin_addr == api_addr {
            return Err(field(
                "listen".to_string(),
                "proxy, api and admin must listen on three different addresses",
            ));
        }

        let upstreams = parse_upstreams(raw.upstreams)?;

        let admin_key_hash = raw
            .admin
            .key_hash
            .as_deref()
            .map(|h| parse_hash("admin.key_hash", h))
            .transpose()?;

        let mut keys = Vec::with_capacity(raw.keys.len());
        for (i, key) in raw.keys.into_iter().enumerate() {
            if !valid_key_id(&key.id) {
                return Err(field(
                    format!("keys[{i}].id"),
                    "must be 1-64 characters of a-z, A-Z, 0-9 or '-'",
                ));
            }
            if keys.iter().any(|k: &KeyConfig| *k.id == *key.id) {
                return Err(field(format!("keys[{i}].id"), "duplicate key id"));
            }
            let profile = match key.profile {
                None => None,
                Some(name) => {
                    let Some(p) = raw.profiles.get(&name) else {
                        return Err(field(
                            format!("keys[{i}].profile"),
                            "names no [profiles.NAME] section",
                        ));
                    };
                    Some((name, p.saturation))
                }
            };
            let budget = key.budget.map(|b| Budget {
                ceiling_nano: b.ceiling_micro_usd.saturating_mul(1000),
                period: b.period,
            });
            keys.push(KeyConfig {
                secret_hash: parse_hash(&format!("keys[{i}].secret_hash"), &key.secret_hash)?,
                owner_secret_hash: key
                    .owner_secret_hash
                    .as_deref()
                    .map(|h| parse_hash(&format!("keys[{i}].owner_secret_hash"), h))
                    .transpose()?,
                id: Arc::from(key.id),
                budget,
                human_default: key.human,
                profile,
                cache: key.cache,
                cache_ttl: key.cache_ttl,
                without: key.without,
                credential_env: key.credential_env,
            });
        }
        for (i, key) in keys.iter().enumerate() {
            for (upstream, var) in &key.credential_env {
                if !upstreams.iter().any(|u| &u.name == upstream) {
                    return Err(field(
                        format!("keys[{i}].credential_env.{upstream}"),
                        "names no [upstreams.NAME] table",
                    ));
                }
                if var.is_empty() {
                    return Err(field(
                        format!("keys[{i}].credential_env.{upstream}"),
                        "must name an environment variable",
                    ));
                }
            }
        }

        // The built-in table first; the config's entries replace it model by model.
        let mut prices = builtin_prices()?;
        prices.extend(std::mem::take(&mut raw.prices));
        raw.prices = prices;
        for (model, p) in &raw.prices {
            if p.max_output == 0 {
                return Err(field(
                    format!("prices.{model}.max_output"),
                    "must be at least 1",
                ));
            }
        }
        for (from, to) in &raw.downgrade {
            if from == to {
                return Err(field(format!("downgrade.{from}"), "maps a model to itself"));
            }
        }
        raw.gate
            .validate()
            .map_err(|(f, why)| field(format!("gate.{f}"), why))?;
        for (name, p) in &raw.profiles {
            let s = &p.saturation;
            if [s.size, s.ask, s.depth, s.tools].contains(&0) {
                return Err(field(
                    format!("profiles.{name}.saturation"),
                    "every saturation point must be at least 1",
                ));
            }
        }

        if raw.limits.max_body_bytes == 0 {
            return Err(field("limits.max_body_bytes", "must be at least 1"));
        }
        if let Some(c) = &raw.client {
            parse_origin(&c.gate_url).map_err(|why| field("client.gate_url", why))?;
        }
        let fleet = raw.store.validate()?;
        let client = raw.client.map(|c| ClientConfig {
            gate_url: c.gate_url,
            gate_key_env: c.gate_key_env,
            data_dir: c.data_dir,
        });

        let key_index = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.id.to_string(), i))
            .collect();
        Ok(Config {
            key_index,
            proxy_addr,
            api_addr,
            admin_addr,
            data_dir: raw.data.dir,
            economics_dir: raw.data.economics,
            upstreams,
            admin_key_hash,
            keys,
            prices: raw.prices,
            downgrade: raw.downgrade,
            gate: raw.gate,
            profiles: raw
                .profiles
                .iter()
                .map(|(name, p)| (name.clone(), p.saturation))
                .collect(),
            max_body_bytes: raw.limits.max_body_bytes,
            answer_store_bytes: raw.limits.answer_store_bytes,
            hold_ttl_ms: raw.limits.hold_ttl_secs.saturating_mul(1000),
            reservation_ttl_ms: raw.limits.reservation_ttl_secs.saturating_mul(1000),
            upstream_timeout_secs: raw.limits.upstream_timeout_secs.max(1),
            commit_interval_ms: raw.limits.commit_interval_ms.max(1),
            max_paced_per_key: raw.limits.max_paced_per_key,
            max_paced_bytes: raw.limits.max_paced_bytes,
            remembered_entries: raw.limits.remembered_entries.max(1),
            client,
            grace_period_secs: raw.server.grace_period_secs,
            log_format: raw.log.format,
            access_log: raw.log.access,
            fleet,
        })
    }

    pub fn key(&self, id: &str) -> Option<&KeyConfig> {
        self.key_index.get(id).and_then(|&i| self.keys.get(i))
    }
}

/// The dated price table compiled into the binary (`config/prices-builtin.toml`).
pub const BUILTIN_PRICES: &str = include_str!("../config/prices-builtin.toml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceTable {
    prices: BTreeMap<String, Prices>,
}

pub fn builtin_prices() -> Result<BTreeMap<String, Prices>, ConfigError> {
    toml::from_str::<PriceTable>(BUILTIN_PRICES)
        .map(|t| t.prices)
        .map_err(|_| field("prices (built-in table)", "does not parse"))
}

fn parse_upstreams(raw: RawUpstreams) -> Result<Vec<Upstream>, ConfigError> {
    use tokensaver_core::request::Provider;
    let upstreams = raw
        .into_iter()
        .map(|(name, u)| parse_upstream(name, u))
        .collect::<Result<Vec<_>, _>>()?;
    for api in [Provider::OpenAi, Provider::Anthropic] {
        let defaults = upstreams
            .iter()
            .filter(|u| u.api == api && u.models.is_none())
            .count();
        if defaults > 1 {
            return Err(field(
                "upstreams",
                "at most one upstream of each API shape may leave out `models`",
            ));
        }
        // One name in two upstreams would route by table order: refused.
        let mut named = std::collections::HashSet::new();
        for pattern in upstreams
            .iter()
            .filter(|u| u.api == api)
            .flat_map(|u| u.models.iter().flatten())
        {
            if !named.insert(pattern.clone()) {
                return Err(field(
                    "upstreams",
                    "two upstreams of one API shape name the same model or pattern",
                ));
            }
        }
    }
    Ok(upstreams)
}

fn parse_upstream(name: String, raw: RawUpstream) -> Result<Upstream, ConfigError> {
    use tokensaver_core::request::Provider;
    let at = |f: &str| format!("upstreams.{name}.{f}");
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(field(
            "upstreams",
            "an upstream's name is 1-64 of a-z, 0-9, - and _",
        ));
    }
    let api = match (raw.api.as_deref(), name.as_str()) {
        (Some("openai"), _) | (None, "openai") => Provider::OpenAi,
        (Some("anthropic"), _) | (None, "anthropic") => Provider::Anthropic,
        (Some(_), _) => return Err(field(at("api"), "must be \"openai\" or \"anthropic\"")),
        (None, _) => {
            return Err(field(
                at("api"),
                "is required (\"openai\" or \"anthropic\") for an upstream not named after one",
            ))
        }
    };
    let base_url = raw.base_url.trim_end_matches('/');
    // `scheme://authority` then the path, if any.
    let path_at = base_url
        .find("://")
        .and_then(|s| base_url[s + 3..].find('/').map(|p| s + 3 + p))
        .unwrap_or(base_url.len());
    let (server, path_prefix) = base_url.split_at(path_at);
    if path_prefix.contains(['?', '#']) {
        return Err(field(
            at("base_url"),
            "must not carry a query or a fragment",
        ));
    }
    let origin = parse_origin(server).map_err(|why| field(at("base_url"), why))?;
    let credential_header = match raw
        .credential_header
        .as_deref()
        .map(str::to_ascii_lowercase)
    {
        None => match api {
            Provider::OpenAi => CredentialHeader::Bearer,
            Provider::Anthropic => CredentialHeader::XApiKey,
        },
        Some(h) => match h.as_str() {
            "authorization" => CredentialHeader::Bearer,
            "x-api-key" => CredentialHeader::XApiKey,
            "api-key" => CredentialHeader::ApiKey,
            _ => {
                return Err(field(
                    at("credential_header"),
                    "must be \"authorization\", \"x-api-key\" or \"api-key\"",
                ))
            }
        },
    };
    let models = match raw.models {
        None => None,
        Some(list) if list.is_empty() || list.iter().any(|m| m.is_empty() || m == "*") => {
            return Err(field(
                at("models"),
                "lists model names or `prefix*` patterns (leave it out to take every model)",
            ))
        }
        Some(list) => Some(list.iter().map(|m| ModelPattern::parse(m)).collect()),
    };
    let azure = match raw.api_version {
        Some(_) if api != Provider::OpenAi => {
            return Err(field(
                at("api_version"),
                "is for Azure OpenAI (api = \"openai\")",
            ))
        }
        Some(v) if v.is_empty() || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') => {
            return Err(field(
                at("api_version"),
                "must be a version such as 2024-10-21",
            ))
        }
        Some(api_version) => Some(Azure {
            api_version,
            deployments: raw.deployments,
        }),
        None if !raw.deployments.is_empty() => {
            return Err(field(at("deployments"), "needs api_version (Azure OpenAI)"))
        }
        None => None,
    };
    if let Some(a) = &azure {
        let safe = |d: &str| {
            !d.is_empty()
                && d.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        if !a.deployments.values().all(|d| safe(d)) {
            return Err(field(
                at("deployments"),
                "deployment names are letters, digits, -, _ and .",
            ));
        }
    }
    Ok(Upstream {
        name,
        api,
        base_url: base_url.to_string(),
        tls: origin.tls,
        host: origin.host,
        port: origin.port,
        authority: origin.authority,
        path_prefix: path_prefix.to_string(),
        credential_env: raw.credential_env,
        credential_header,
        models,
        azure,
        dns_refresh_secs: raw.dns_refresh_secs.max(1),
    })
}

/// A URL that names a server and nothing else: `http(s)://host[:port]`, the host a name, an
/// IPv4 address or a bracketed IPv6 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub tls: bool,
    /// The host as it is resolved and sent as TLS SNI (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// The `Host` header: the host (IPv6 in brackets), with the port when it is not the
    /// scheme's default.
    pub authority: String,
}

/// Parse an origin URL (`http::Uri` does the grammar). The reasons are closed-form: they never
/// echo the URL.
pub fn parse_origin(url: &str) -> Result<Origin, &'static str> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| "is not a URL (expected http://host[:port] or https://host[:port])")?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("must start with http:// or https://"),
    };
    let authority = uri
        .authority()
        .ok_or("must name a host: http(s)://host[:port]")?;
    if authority.as_str().contains('@') {
        return Err("must not carry credentials in the URL (use credential_env)");
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(
            "must be scheme://host[:port] with no path (the SDK's path is forwarded as is)",
        );
    }
    let bracketed = authority.host();
    if bracketed.is_empty() {
        return Err("must name a host: http(s)://host[:port]");
    }
    let default_port = if tls { 443 } else { 80 };
    // No userinfo (refused above), so the authority is the host and then `:port` or nothing.
    let port = match authority.as_str().get(bracketed.len()..) {
        Some("") => default_port,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|&p| p != 0)
            .ok_or("port is not a number 1-65535")?,
        None => return Err("must name a host: http(s)://host[:port]"),
    };
    let host = bracketed
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(bracketed)
        .to_string();
    let authority = if port == default_port {
        bracketed.to_string()
    } else {
        format!("{bracketed}:{port}")
    };
    Ok(Origin {
        tls,
        host,
        port,
        authority,
    })
}

fn parse_hash(name: &str, hex: &str) -> Result<[u8; 32], ConfigError> {
    tokensaver_core::receipt::parse_hex32(hex)
        .ok_or_else(|| field(name, "must be 64 hex digits (see `tokensaver key new`)"))
}

impl Config {
    /// What the gate decides with, from this config: tunables, prices, the downgrade map and
    /// each profiled key's saturation points.
    pub fn policy(&self) -> Policy {
        let key_saturation = self
            .keys
            .iter()
            .filter_map(|key| {
                let (_, spend) = key.profile.as_ref()?;
                let saturation = Saturation {
                    size: spend.size,
                    ask: spend.ask,
                    depth: spend.depth,
                    tools: spend.tools,
                    ..self.gate.saturation.clone()
                };
                Some((key.id.to_string(), saturation))
            })
            .collect();
        let key_without = self
            .keys
            .iter()
            .filter(|key| !key.without.is_empty())
            .map(|key| (key.id.to_string(), key.without))
            .collect();
        Policy {
            gate: self.gate.clone(),
            prices: self.prices.clone(),
            downgrade: self.downgrade.clone(),
            key_saturation,
            key_without,
        }
    }
}

/// A key id as `tsk_<id>_<secret>` carries it (SPEC §2.11): 1–64 ASCII letters, digits or
/// `-`. Config validation and key parsing (`auth.rs`) share it.
pub fn valid_key_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// How log lines are written (`[log] format`, `--log-format`; `logging.rs` installs it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`), for machines.
    Json,
}

impl LogFormat {
    /// Its name on the command line and in the config.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_error(toml: &str) -> String {
        match Config::parse(toml) {
            Err(e) => e.to_string(),
            Ok(_) => String::from("accepted"),
        }
    }

    #[test]
    fn the_store_section_chooses_sqlite_or_a_validated_postgres() {
        assert!(
            Config::parse("").unwrap().fleet.is_none(),
            "SQLite by default"
        );
        let fleet = Config::parse(
            "[store]\nkind = \"postgres\"\nurl = \"postgres://u:secret@db:5432/ts?sslmode=disable\"\n",
        )
        .unwrap()
        .fleet
        .unwrap();
        assert_eq!(fleet.max_connections, 16);
        assert!(
            !format!("{fleet:?}").contains("secret"),
            "Debug never shows the URL"
        );
        assert!(store_error("[store]\nkind = \"postgres\"\n").contains("exactly one of"));
        assert!(store_error(
            "[store]\nkind = \"postgres\"\nurl = \"postgres://db/ts?sslmode=require\"\n"
        )
        .contains("needs TLS"));
        assert!(
            store_error("[store]\nkind = \"postgres\"\nurl = \"not a url\"\n")
                .contains("store.url")
        );
        assert!(store_error(
            "[store]\nkind = \"postgres\"\nurl_env = \"TOKENSAVER_TEST_SURELY_UNSET_VAR\"\n"
        )
        .contains("store.url_env"));
        assert!(store_error("[store]\nurl = \"postgres://db/ts\"\n").contains("only a postgres"));
        assert!(store_error("[store]\nkind = \"redis\"\n").contains("store.kind"));
    }

    #[test]
    fn the_builtin_price_table_parses_and_covers_the_clients_default_models() {
        let table = builtin_prices().unwrap();
        // Claude Code's main and background models, Codex's and the Agents SDK's defaults.
        for model in [
            "claude-opus-5-5",
            "claude-haiku-5-5",
            "gpt-6.2-sol",
            "gpt-5.6-luna",
        ] {
            assert!(table.contains_key(model), "{model}");
        }
        assert!(table.values().all(|p| p.max_output > 0 && p.output > 0));
    }

    #[test]
    fn a_config_price_replaces_the_builtin_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[prices.\"gpt-6.2-sol\"]\ninput = 1\ncache_write = 1\ncache_read = 1\noutput = 1\nmax_output = 7\n",
        )
        .unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config.prices["gpt-6.2-sol"].max_output, 7);
        assert!(config.prices.contains_key("claude-opus-5-5"));
    }

    #[test]
    fn a_key_profile_must_name_a_profile_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let key = "[[keys]]\nid = \"a\"\nsecret_hash = \"f9cc4b2f3d7a9f1f1d7c7338443dcd576d66d74c1f928b3dc50997719044bb91\"\nprofile = \"agent\"\n";
        std::fs::write(&path, key).unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("keys[0].profile"), "{err}");
        let with_profile = format!(
            "{key}[profiles.agent.saturation]\nsize = 1000000\nask = 128000\ndepth = 400\ntools = 128\n"
        );
        std::fs::write(&path, with_profile).unwrap();
        let config = Config::load(&path).unwrap();
        let (name, spend) = config.keys[0].profile.clone().unwrap();
        assert_eq!((name.as_str(), spend.tools), ("agent", 128));
    }

    #[test]
    fn a_key_names_the_mechanisms_it_goes_without_and_only_known_ones() {
        use tokensaver_core::gate::Mechanism;
        let key = |without: &str| {
            format!(
                "[[keys]]\nid = \"a\"\nsecret_hash = \"{}\"\nwithout = {without}\n",
                "0".repeat(64)
            )
        };
        let config = Config::parse(&key(r#"["serve", "routing"]"#)).unwrap();
        let without = config.keys[0].without;
        assert!(without.has(Mechanism::Serve) && without.has(Mechanism::Routing));
        assert!(!without.has(Mechanism::Stop));
        assert_eq!(config.policy().without_for("a"), without);
        assert!(config.policy().without_for("b").is_empty());
        assert!(Config::parse(&key("[]"))
            .unwrap()
            .policy()
            .key_without
            .is_empty());
        let err = Config::parse(&key(r#"["cache"]"#)).unwrap_err().to_string();
        assert!(
            err.contains("unknown variant") && err.contains("breakpoints"),
            "{err}"
        );
    }

    #[test]
    fn origins_parse_names_ipv4_and_bracketed_ipv6() {
        let o = parse_origin("http://[::1]:8080").unwrap();
        assert_eq!(
            (o.host.as_str(), o.port, o.authority.as_str()),
            ("::1", 8080, "[::1]:8080")
        );
        let o = parse_origin("https://[2001:db8::7]/").unwrap();
        assert_eq!(
            (o.host.as_str(), o.port, o.authority.as_str()),
            ("2001:db8::7", 443, "[2001:db8::7]")
        );
        let o = parse_origin("http://127.0.0.1:9").unwrap();
        assert_eq!((o.tls, o.host.as_str(), o.port), (false, "127.0.0.1", 9));
        let o = parse_origin("https://api.anthropic.com").unwrap();
        assert_eq!(
            (o.tls, o.port, o.authority.as_str()),
            (true, 443, "api.anthropic.com")
        );
        let o = parse_origin("http://gate.example:80").unwrap();
        assert_eq!(o.authority, "gate.example");
    }

    #[test]
    fn origins_refuse_what_is_not_a_bare_server_url() {
        for bad in [
            "not a url",
            "",
            "ftp://host",
            "gate.example:8788",
            "http://host/v1",
            "http://host?x=1",
            "http://user:pw@host",
            "http://host:0",
            "http://host:99999",
            "http://[::1",
            "http://host:",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn check_config_refuses_a_client_gate_url_that_is_not_a_url() {
        let err = Config::parse("[client]\ngate_url = \"not a url\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("client.gate_url"), "{err}");
        assert!(
            !err.contains("not a url"),
            "the reason must not echo the value: {err}"
        );
        let ok = Config::parse("[client]\ngate_url = \"http://[::1]:8788\"\n").unwrap();
        assert_eq!(ok.client.unwrap().gate_url, "http://[::1]:8788");
        let up = Config::parse("[upstreams.openai]\nbase_url = \"http://[::1]:9\"\n").unwrap();
        let up = up.upstreams.into_iter().next().unwrap();
        assert_eq!(
            (up.host.as_str(), up.port, up.authority.as_str()),
            ("::1", 9, "[::1]:9")
        );
    }
}
