//! Shared harness for the end-to-end tests: a temp config, the in-process mock provider, and the
//! real `tokensaver serve` binary started against it (killed on drop).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod cache_bodies;
pub mod client;
pub mod page;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tokensaver::processes::{free_ports, wait_for_port};
pub use tokensaver_mock_provider::UsageCounting;
use tokensaver_mock_provider::{MockProvider, ProviderOptions};

pub const PROVIDER_CREDENTIAL: &str = "sk-test-provider-credential";
pub const ADMIN_KEY: &str = "tsa_demo-admin-key-not-for-production";
pub const ADMIN_HASH: &str = "ca9b790a34f739223b65bdd9124d2c340ee7ff59bc0140af9576813fb4cf82a8";
pub const SECRET_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const SECRET_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
pub const KEY_A: &str = "tsk_alpha_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
/// Key alpha's owner: the person who may approve its holds on the API listener.
pub const OWNER_SECRET_A: &str = "owner-of-alpha-0123456789";
pub const KEY_B: &str = "tsk_beta_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
pub const CHAT: &str = "/v1/chat/completions";
pub const MESSAGES: &str = "/v1/messages";

/// Models priced in every test config.
pub const MODELS: &[&str] = &[
    "gpt-4o",
    "gpt-4o-mini",
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
    "gpt-fault-500",
    "gpt-fault-429",
    "gpt-fault-reset",
    "gpt-fault-slow",
    "gpt-fault-truncated",
    "claude-fault-reset",
    "claude-fault-truncated",
];

#[derive(Clone, Debug)]
pub struct Opts {
    /// Budget ceilings in micro-USD (`None`: no ceiling).
    pub budget_a: Option<u64>,
    pub budget_b: Option<u64>,
    pub upstream_timeout_secs: u64,
    pub max_body_bytes: Option<usize>,
    pub answer_store_bytes: Option<usize>,
    pub slow_ms: u64,
    /// Point both upstreams here instead of the mock provider (e.g. a replay server).
    pub upstream: Option<String>,
    /// TOML appended to the config (extra `[prices."MODEL"]` tables).
    pub extra_config: String,
    /// The mock's pause between SSE events (0: a stream is written at once).
    pub stream_delay_ms: u64,
    /// `[server] grace_period_secs` (absent: the default, 60 s).
    pub grace_period_secs: Option<u64>,
    /// `RUST_LOG` of the server (its log is kept: [`Harness::log`]).
    pub rust_log: &'static str,
    /// Extra arguments to `tokensaver serve`.
    pub serve_args: Vec<String>,
    /// How the mock counts the usage it reports (cl100k: every token of the body, as a
    /// provider's tokenizer would).
    pub usage: UsageCounting,
    /// `[upstreams.*]` tables written instead of the two default ones (both at the mock);
    /// `{mock}` in them stands for the harness's mock provider's base URL.
    pub upstreams_toml: Option<String>,
    /// Lines added to key beta's `[[keys]]` table.
    pub key_b_extra: String,
    /// Extra environment of the server.
    pub env: Vec<(String, String)>,
    /// The provider's `--time-scale`: its cache lifetimes and rates divided by this.
    pub time_scale: u64,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            budget_a: Some(100_000_000),
            budget_b: Some(100_000_000),
            upstream_timeout_secs: 30,
            max_body_bytes: None,
            answer_store_bytes: None,
            slow_ms: 3000,
            upstream: None,
            extra_config: String::new(),
            stream_delay_ms: 0,
            grace_period_secs: None,
            rust_log: "error",
            serve_args: Vec::new(),
            usage: UsageCounting::Chars,
            upstreams_toml: None,
            key_b_extra: String::new(),
            env: Vec::new(),
            time_scale: 1,
        }
    }
}

pub struct Harness {
    pub mock: MockProvider,
    pub dir: tempfile::TempDir,
    pub opts: Opts,
    pub proxy: SocketAddr,
    pub api: SocketAddr,
    pub admin: SocketAddr,
    child: Option<Child>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn key_block(id: &str, secret: &str, budget: Option<u64>) -> String {
    let mut s = format!(
        "[[keys]]\nid = \"{id}\"\nsecret_hash = \"{}\"\nhuman = false\n",
        hex(&tokensaver::auth::secret_hash(secret))
    );
    if let Some(b) = budget {
        s.push_str(&format!(
            "budget = {{ ceiling_micro_usd = {b}, period = \"day\" }}\n"
        ));
    }
    s.push('\n');
    s
}

impl Harness {
    pub fn start(opts: Opts) -> Harness {
        let mock = MockProvider::start_background(ProviderOptions {
            expected_credential: Some(PROVIDER_CREDENTIAL.into()),
            slow_ms: opts.slow_ms,
            stream_delay_ms: opts.stream_delay_ms,
            usage: opts.usage,
            time_scale: opts.time_scale,
            ..Default::default()
        })
        .expect("mock provider");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = Harness {
            mock,
            dir,
            opts,
            proxy: ([127, 0, 0, 1], 0).into(),
            api: ([127, 0, 0, 1], 0).into(),
            admin: ([127, 0, 0, 1], 0).into(),
            child: None,
        };
        h.launch();
        h
    }

    pub fn default() -> Harness {
        Harness::start(Opts::default())
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("tokensaver.toml")
    }

    fn write_config(&self) {
        let o = &self.opts;
        let mut c = format!(
            "[listen]\nproxy = \"{}\"\napi = \"{}\"\nadmin = \"{}\"\n\n[data]\ndir = \"{}\"\n\n",
            self.proxy,
            self.api,
            self.admin,
            self.dir.path().join("data").display()
        );
        for up in ["openai", "anthropic"]
            .iter()
            .filter(|_| o.upstreams_toml.is_none())
        {
            let env = if *up == "openai" {
                "OPENAI_API_KEY"
            } else {
                "ANTHROPIC_API_KEY"
            };
            let base_url = o.upstream.clone().unwrap_or_else(|| self.mock.base_url());
            c.push_str(&format!(
                "[upstreams.{up}]\nbase_url = \"{base_url}\"\ncredential_env = \"{env}\"\n\n"
            ));
        }
        if let Some(tables) = &o.upstreams_toml {
            c.push_str(&tables.replace("{mock}", &self.mock.base_url()));
            c.push('\n');
        }
        c.push_str(&format!("[admin]\nkey_hash = \"{ADMIN_HASH}\"\n\n"));
        c.push_str(&key_block("alpha", SECRET_A, o.budget_a));
        // Key tables run until the next header: the owner line belongs to alpha.
        let c_len = c.len() - 1;
        c.insert_str(
            c_len,
            &format!(
                "owner_secret_hash = \"{}\"\n",
                hex(&tokensaver::auth::owner_hash(OWNER_SECRET_A))
            ),
        );
        c.push_str(&key_block("beta", SECRET_B, o.budget_b));
        // Key tables run until the next header: these lines belong to beta.
        let c_len = c.len() - 1;
        c.insert_str(c_len, &o.key_b_extra);
        for m in MODELS {
            c.push_str(&format!(
                "[prices.\"{m}\"]\ninput = 2_500_000\ncache_write = 2_500_000\ncache_read = 1_250_000\noutput = 10_000_000\nmax_output = 16_384\n\n"
            ));
        }
        c.push_str("[downgrade]\n\"gpt-4o\" = \"gpt-4o-mini\"\n\"claude-sonnet-4-5\" = \"claude-haiku-4-5\"\n\n");
        c.push_str(&format!(
            "[limits]\nmax_body_bytes = {}\nupstream_timeout_secs = {}\ncommit_interval_ms = 5\nanswer_store_bytes = {}\n",
            o.max_body_bytes.unwrap_or(8_388_608),
            o.upstream_timeout_secs,
            o.answer_store_bytes.unwrap_or(268_435_456)
        ));
        c.push_str(&o.extra_config);
        if let Some(grace) = o.grace_period_secs {
            c.push_str(&format!("\n[server]\ngrace_period_secs = {grace}\n"));
        }
        std::fs::write(self.config_path(), c).expect("write config");
    }

    /// Start `tokensaver serve` on free ports. A port picked free can be taken before the
    /// server binds it (another test's server or mock, in parallel): the server then exits,
    /// while something else answers on the port. So the server counts as up only when it is
    /// still running and its own admin listener answers `/healthz`; otherwise it is started
    /// again on other ports.
    fn launch(&mut self) {
        for _ in 0..5 {
            if self.try_launch() {
                return;
            }
            self.stop();
        }
        panic!("tokensaver serve did not come up on free ports in 5 tries");
    }

    fn try_launch(&mut self) -> bool {
        let [proxy, api, admin] = free_ports::<3>().unwrap();
        self.proxy = ([127, 0, 0, 1], proxy).into();
        self.api = ([127, 0, 0, 1], api).into();
        self.admin = ([127, 0, 0, 1], admin).into();
        self.write_config();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("server log");
        let child = Command::new(env!("CARGO_BIN_EXE_tokensaver"))
            .arg("serve")
            .arg("--config")
            .arg(self.config_path())
            .args(&self.opts.serve_args)
            .env("OPENAI_API_KEY", PROVIDER_CREDENTIAL)
            .env("ANTHROPIC_API_KEY", PROVIDER_CREDENTIAL)
            .env("RUST_LOG", self.opts.rust_log)
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn tokensaver serve");
        self.child = Some(child);
        for addr in [self.proxy, self.api, self.admin] {
            assert!(
                wait_for_port(addr, Duration::from_secs(20)),
                "tokensaver serve did not listen on {addr}"
            );
        }
        let healthy = client::get(&self.admin_url("/healthz"))
            .timeout(Duration::from_secs(5))
            .call()
            .status
            == 200;
        let running = self
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        // A running, healthy server may still have lost one port to another test: the port
        // then answers, but for someone else (a 404 from another gate's admin listener).
        let pid = self.child.as_ref().map_or(0, Child::id);
        healthy && running && [proxy, api, admin].iter().all(|&p| listens_on(pid, p))
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The server's standard error (its log), all runs appended.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("serve.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The ledger database of the data dir.
    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("data").join("tokensaver.db")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Send a signal (`TERM`, `QUIT`, `INT`, `KILL`) to the server.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("server running");
        send_signal(pid, sig);
    }

    /// Wait for the server to exit; `None` if it still runs after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = std::time::Instant::now();
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop the binary and start it again on the same data dir (new ports).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    pub fn proxy_url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy, path)
    }
    pub fn api_url(&self, path: &str) -> String {
        format!("http://{}{}", self.api, path)
    }
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// POST a JSON body to the proxy with a key (bearer) and extra headers.
    pub fn post(&self, path: &str, key: &str, body: &Value, headers: &[(&str, &str)]) -> Resp {
        self.post_raw(path, Some(key), body.to_string().as_bytes(), headers)
    }

    pub fn post_raw(
        &self,
        path: &str,
        key: Option<&str>,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Resp {
        let mut req = client::post(&self.proxy_url(path))
            .timeout(Duration::from_secs(30))
            .set("content-type", "application/json");
        if let Some(k) = key {
            req = req.set("authorization", &format!("Bearer {k}"));
        }
        for (k, v) in headers {
            req = req.set(k, v);
        }
        req.send(body)
    }

    /// An Anthropic Messages call straight to the provider with its own credential (the
    /// control arm of a cost comparison): its answer.
    pub fn straight_anthropic(&self, body: &[u8]) -> Value {
        let r = call(
            client::post(&format!("{}{MESSAGES}", self.mock.base_url()))
                .set("content-type", "application/json")
                .set("x-api-key", PROVIDER_CREDENTIAL)
                .set("anthropic-version", "2023-06-01"),
            Some(body),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// The key's ledger (`GET /ledger`).
    pub fn ledger(&self, key: &str) -> Value {
        let r = call(
            client::get(&self.api_url("/ledger")).set("authorization", &format!("Bearer {key}")),
            None,
        );
        assert_eq!(r.status, 200, "ledger: {}", r.text());
        r.json()
    }

    pub fn approve(&self, hold_id: &str) -> Resp {
        call(
            client::post(&self.admin_url(&format!("/holds/{hold_id}/approve")))
                .set("authorization", &format!("Bearer {ADMIN_KEY}")),
            Some(b""),
        )
    }

    pub fn calls(&self, path: &str) -> usize {
        self.mock.calls(path)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A response read whole (or the transport error, for broken answers).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Set when the transport failed (connection error, or the body broke off).
    pub transport_error: Option<String>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn verdict(&self) -> Option<&str> {
        self.header("x-tokensaver-verdict")
    }

    /// The decoded signed receipt body.
    pub fn receipt(&self) -> Value {
        let h = self.header("x-tokensaver-receipt").expect("receipt header");
        let env = tokensaver::receipt::Envelope::from_header_value(h).expect("envelope");
        serde_json::from_slice(&env.body_bytes().expect("body")).expect("receipt json")
    }

    /// The envelope as JSON (for `POST /verify`).
    pub fn envelope_json(&self) -> String {
        let h = self.header("x-tokensaver-receipt").expect("receipt header");
        tokensaver::receipt::Envelope::from_header_value(h)
            .expect("envelope")
            .to_json()
    }
}

/// Send a signal to a process with `kill(1)`.
pub fn send_signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Send a request with an optional body.
/// `GET url` with a tokensaver or admin key as a bearer token (or none).
pub fn keyed_get(url: &str, key: Option<&str>) -> Resp {
    let mut r = client::get(url);
    if let Some(k) = key {
        r = r.set("authorization", &format!("Bearer {k}"));
    }
    call(r, None)
}

/// A JSON request to `url` with a tokensaver or admin key as a bearer token (or none).
pub fn keyed_send(method: &str, url: &str, key: Option<&str>, body: &[u8]) -> Resp {
    let mut r = client::request(method, url).set("content-type", "application/json");
    if let Some(k) = key {
        r = r.set("authorization", &format!("Bearer {k}"));
    }
    call(r, Some(body))
}

pub fn call(req: client::Req, body: Option<&[u8]>) -> Resp {
    let req = req.timeout(Duration::from_secs(30));
    match body {
        Some(b) => req.send(b),
        None => req.call(),
    }
}

pub fn chat(model: &str, text: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": text}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

pub fn anthropic(model: &str, text: &str, extra: Value) -> Value {
    let mut body =
        json!({"model": model, "max_tokens": 200, "messages": [{"role": "user", "content": text}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

/// Give the engine a moment to record usage and store an answer after the response ended.
/// A chat request after `steps` identical tool steps that poll one job (the same call and
/// result, the history grown): a stuck agent's, or a patient poller's. `ask`: the user's
/// request, which names the session's task.
pub fn polling(ask: &str, steps: usize, max_tokens: u64) -> Value {
    polling_with_strays(ask, steps, max_tokens, |_| false)
}

/// [`polling`] where the results at the steps `stray` picks print an attempt id that reads as a
/// number (all digits): one other result of the same call, as a stuck agent's noisy tool gives
/// one call in about 43.
pub fn polling_with_strays(
    ask: &str,
    steps: usize,
    max_tokens: u64,
    stray: impl Fn(usize) -> bool,
) -> Value {
    let mut messages = vec![json!({"role": "user", "content": ask})];
    for i in 0..steps {
        let id = format!("call_{i}");
        let result = if stray(i) {
            format!("running (attempt {})", 31_415_926 + i)
        } else {
            "running".to_string()
        };
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "job_status",
             "arguments": "{\"job\":7}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
    }
    json!({"model": "gpt-4o", "max_tokens": max_tokens, "messages": messages})
}

pub fn settle() {
    std::thread::sleep(Duration::from_millis(150));
}

pub const HUMAN: (&str, &str) = ("x-tokensaver-human", "1");

/// A local instance in digest mode (`[client]`), killed on drop; `.1` is its proxy.
pub struct Client(pub Child, pub SocketAddr);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start a local instance in digest mode against the central gate at `gate`, calling the
/// harness's mock provider, with `key` (a key of the central gate).
pub fn start_client(h: &Harness, gate: SocketAddr, key: &str) -> Client {
    let dir = h.dir.path().join("client");
    std::fs::create_dir_all(&dir).unwrap();
    for _ in 0..5 {
        if let Some(client) = try_start_client(h, &dir, gate, key) {
            return client;
        }
    }
    panic!("the digest-mode client did not come up on free ports in 5 tries");
}

fn try_start_client(h: &Harness, dir: &Path, gate: SocketAddr, key: &str) -> Option<Client> {
    let [proxy_port, api_port, admin_port] = free_ports::<3>().unwrap();
    let proxy: SocketAddr = ([127, 0, 0, 1], proxy_port).into();
    let config = format!(
        "[listen]\nproxy = \"{proxy}\"\napi = \"127.0.0.1:{}\"\nadmin = \"127.0.0.1:{}\"\n\n[data]\ndir = \"{}\"\n\n\
         [upstreams.openai]\nbase_url = \"{url}\"\ncredential_env = \"OPENAI_API_KEY\"\n\n\
         [upstreams.anthropic]\nbase_url = \"{url}\"\ncredential_env = \"ANTHROPIC_API_KEY\"\n\n\
         [client]\ngate_url = \"http://{gate}\"\ngate_key_env = \"TOKENSAVER_CLIENT_KEY\"\n",
        api_port,
        admin_port,
        dir.join("data").display(),
        url = h.mock.base_url(),
    );
    let path = dir.join("client.toml");
    std::fs::write(&path, config).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tokensaver"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("OPENAI_API_KEY", PROVIDER_CREDENTIAL)
        .env("ANTHROPIC_API_KEY", PROVIDER_CREDENTIAL)
        .env("TOKENSAVER_CLIENT_KEY", key)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = Client(child, proxy);
    // A digest-mode client listens on its proxy port only.
    let up = wait_for_port(proxy, Duration::from_secs(20)) && listens_on(client.0.id(), proxy_port);
    up.then_some(client)
}

/// Whether process `pid` holds the listening TCP socket on 127.0.0.1:`port` — read from
/// `/proc` (the listening sockets' inodes in `/proc/net/tcp`, the process's descriptors), so a
/// port that answers for another process does not count.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let wanted = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local address, state 0A = LISTEN, inode
            (f.len() > 9 && f[1] == wanted && f[3] == "0A").then(|| format!("socket:[{}]", f[9]))
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}
