//! `tokensaver holds list|approve|deny`: the operator at the terminal, talking to the running
//! server's admin listener (the config's `[listen] admin`) with the admin key.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use serde_json::{json, Value};

use crate::config::Config;

use crate::http_client::{Answer, BlockingClient, ClientError, Request};

/// Talks to one admin listener.
pub struct AdminClient {
    addr: SocketAddr,
    admin_key: String,
    client: BlockingClient,
}

impl AdminClient {
    /// `addr`: the configured admin listener; an unspecified address (`0.0.0.0`, `::`) is
    /// reached on loopback.
    pub fn new(addr: SocketAddr, admin_key: String) -> anyhow::Result<Self> {
        let addr = match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
            IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
            _ => addr,
        };
        let client = BlockingClient::new(&format!("http://{addr}"), Duration::from_secs(10))?;
        Ok(Self {
            addr,
            admin_key,
            client,
        })
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.admin_key)
    }

    /// Every key's pending and approved holds (or `key`'s), with the running leases.
    pub fn list(&self, key: Option<&str>) -> anyhow::Result<Value> {
        let path = match key {
            Some(k) => format!(
                "/holds?{}",
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("key", k)
                    .finish()
            ),
            None => "/holds".to_string(),
        };
        let request = Request::get(path).header("authorization", self.bearer());
        self.answer(self.client.send(&request), None)
    }

    pub fn approve(&self, hold_id: &str, attend_minutes: Option<u64>) -> anyhow::Result<Value> {
        let body = match attend_minutes {
            Some(m) => json!({"attend_minutes": m}).to_string(),
            None => String::new(),
        };
        let path = format!("/holds/{}/approve", path_segment(hold_id)?);
        let request = Request::post(path, body)
            .header("authorization", self.bearer())
            .header("content-type", "application/json");
        self.answer(self.client.send(&request), Some(hold_id))
    }

    pub fn deny(&self, hold_id: &str) -> anyhow::Result<Value> {
        let path = format!("/holds/{}/deny", path_segment(hold_id)?);
        let request = Request::post(path, "").header("authorization", self.bearer());
        self.answer(self.client.send(&request), Some(hold_id))
    }

    fn answer(
        &self,
        sent: Result<Answer, ClientError>,
        hold_id: Option<&str>,
    ) -> anyhow::Result<Value> {
        let addr = self.addr;
        match sent {
            Ok(answer) if answer.is_error() => {
                let code = serde_json::from_slice::<Value>(&answer.body)
                    .ok()
                    .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
                    .unwrap_or_default();
                Err(anyhow::Error::msg(status_error(
                    answer.status,
                    &code,
                    hold_id,
                    addr,
                )))
            }
            Ok(answer) => serde_json::from_slice(&answer.body).map_err(|_| {
                anyhow::anyhow!("the admin listener at {addr} sent an answer that is not JSON")
            }),
            Err(ClientError::TooLarge(_)) => Err(anyhow::anyhow!(
                "the admin listener at {addr} sent an unreadable answer"
            )),
            Err(_) => Err(anyhow::anyhow!(
                "no tokensaver answers on the admin listener {addr} (the config's [listen] \
                 admin): is `tokensaver serve` running with this config? (A digest-mode client \
                 has no admin listener: holds are approved at the central gate.)"
            )),
        }
    }
}

/// A hold id goes into the path as it is: refuse anything that is not one path segment.
fn path_segment(hold_id: &str) -> anyhow::Result<&str> {
    let ok = !hold_id.is_empty()
        && hold_id.len() <= 128
        && hold_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(hold_id)
    } else {
        Err(anyhow::anyhow!(
            "a hold id is letters, digits, '_' and '-' (as in hold_0123abcd…)"
        ))
    }
}

fn status_error(status: u16, code: &str, hold_id: Option<&str>, addr: SocketAddr) -> String {
    let hold = hold_id.unwrap_or("the hold");
    match (status, code) {
        (401, _) => format!(
            "the admin listener at {addr} refused the admin key: give the admin key of this \
             server with --admin-key or TOKENSAVER_ADMIN_KEY"
        ),
        (404, "unknown_hold") => format!("no open hold {hold} (check `tokensaver holds list`)"),
        (404, _) => format!(
            "the listener at {addr} does not serve the hold routes: is [listen] admin the \
             admin listener of a tokensaver that has them?"
        ),
        (410, _) => {
            format!("hold {hold} has expired: the request is decided afresh when it is sent again")
        }
        (409, _) => format!("hold {hold} is not pending (already approved, used or denied)"),
        (400, "invalid_attend_minutes") => {
            "--attend-minutes must be a whole number from 1 to 1440".into()
        }
        _ => format!("the admin listener at {addr} answered HTTP {status} ({code})"),
    }
}

/// `YYYY-MM-DD HH:MM:SSZ` for a unix-milliseconds time.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let day = crate::store::utc_day(ms);
    let s = secs % 86_400;
    format!("{day} {:02}:{:02}:{:02}Z", s / 3600, s % 3600 / 60, s % 60)
}

/// `14m 03s`, `2h 05m`, or `ended` for a time at or before `now`.
fn left(until_ms: u64, now_ms: u64) -> String {
    if until_ms <= now_ms {
        return "ended".into();
    }
    let s = (until_ms - now_ms).div_ceil(1000);
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, s % 3600 / 60)
    } else {
        format!("{}m {:02}s", s / 60, s % 60)
    }
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

/// The `GET /holds` answer as a table.
pub fn render_list(answer: &Value) -> String {
    let now = num(&answer["now_ms"]);
    let empty = Vec::new();
    let holds = answer["holds"].as_array().unwrap_or(&empty);
    let leases = answer["leases"].as_array().unwrap_or(&empty);
    let mut out = String::new();
    if holds.is_empty() {
        out.push_str("no pending or approved holds\n");
    } else {
        out.push_str(&format!(
            "{:<39} {:<16} {:<9} {:<25} {:<21} {:<10} {:>10}  {}\n",
            "HOLD", "KEY", "STATE", "REASON", "CREATED", "EXPIRES IN", "WORST CASE", "FINGERPRINT"
        ));
        for h in holds {
            out.push_str(&format!(
                "{:<39} {:<16} {:<9} {:<25} {:<21} {:<10} {:>10}  {}…\n",
                text(&h["hold_id"]),
                text(&h["key_id"]),
                text(&h["state"]),
                text(&h["reason"]),
                utc(num(&h["created_ms"])),
                left(num(&h["expires_ms"]), now),
                num(&h["worst_case_tokens"]),
                text(&h["fingerprint_prefix"]),
            ));
        }
        out.push_str(
            "\napprove: tokensaver holds approve HOLD [--attend-minutes N]   deny: tokensaver holds deny HOLD\n",
        );
    }
    for l in leases {
        out.push_str(&format!(
            "attending: key {} until {} ({} left; granted with {})\n",
            text(&l["key_id"]),
            utc(num(&l["until_ms"])),
            left(num(&l["until_ms"]), now),
            text(&l["hold_id"]),
        ));
    }
    out
}

/// What an approval or denial did, in one or two lines.
pub fn render_decided(answer: &Value, now_ms: u64) -> String {
    let (id, key) = (text(&answer["hold_id"]), text(&answer["key_id"]));
    if answer["denied"] == json!(true) {
        return format!(
            "denied {id} (key {key}): its worst case counts as avoided; an identical request \
             is decided afresh\n"
        );
    }
    let expires = num(&answer["expires_ms"]);
    let mut out = format!(
        "approved {id} (key {key}): the key's next identical request passes once, with no \
         header needed, until {} ({} left)\n",
        utc(expires),
        left(expires, now_ms)
    );
    if let Some(until) = answer["attending_until_ms"].as_u64() {
        out.push_str(&format!(
            "attending: key {key}'s requests that declare no x-tokensaver-human are scored as \
             attended until {} ({} left); hard rules still apply\n",
            utc(until),
            left(until, now_ms)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_tables() {
        assert_eq!(utc(1_795_991_949_000), "2026-11-29 22:39:09Z");
        assert_eq!(left(10_000, 10_000), "ended");
        assert_eq!(left(10_000 + 61_500, 10_000), "1m 02s");
        assert_eq!(left(3_600_000 * 2 + 300_000, 0), "2h 05m");
        let answer = json!({
            "now_ms": 1_000,
            "holds": [{"hold_id": "hold_ab", "key_id": "alpha", "state": "pending",
                       "reason": "score_challenge", "created_ms": 1_000, "expires_ms": 901_000,
                       "worst_case_tokens": 16_400, "fingerprint_prefix": "0123456789abcdef"}],
            "leases": [{"key_id": "alpha", "hold_id": "hold_cd", "granted_ms": 0, "until_ms": 301_000}]
        });
        let t = render_list(&answer);
        assert!(t.contains("hold_ab"), "{t}");
        assert!(t.contains("15m 00s"), "{t}");
        assert!(t.contains("attending: key alpha"), "{t}");
        assert!(path_segment("hold_ab").is_ok());
        assert!(path_segment("../x").is_err());
        assert!(
            status_error(401, "admin_key_required", None, ([127, 0, 0, 1], 1).into())
                .contains("TOKENSAVER_ADMIN_KEY")
        );
    }
}

/// Where the running server is and how to authenticate with it.
#[derive(clap::Args)]
pub(super) struct AdminArgs {
    #[arg(long, default_value = "config/tokensaver.toml")]
    config: PathBuf,
    /// The server's admin key (else $TOKENSAVER_ADMIN_KEY).
    #[arg(long, env = "TOKENSAVER_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
}

#[derive(Subcommand)]
pub(super) enum HoldsCommand {
    /// Pending and approved (not yet used) holds, and the attending leases that run.
    List {
        #[command(flatten)]
        admin: AdminArgs,
        /// Only this key's holds.
        #[arg(long)]
        key: Option<String>,
        /// Print the server's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Approve a hold: the key's next identical request passes once, no header needed.
    Approve {
        /// The hold id (from the 409, or `tokensaver holds list`).
        id: String,
        #[command(flatten)]
        admin: AdminArgs,
        /// Also attend the key for N minutes (1-1440): its requests that declare no
        /// x-tokensaver-human are scored as attended meanwhile.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1440))]
        attend_minutes: Option<u64>,
    },
    /// Deny a pending hold: its worst case counts as avoided.
    Deny {
        id: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

impl AdminArgs {
    fn client(self) -> anyhow::Result<AdminClient> {
        let config = Config::load(&self.config)?;
        let key = self
            .admin_key
            .filter(|k| !k.trim().is_empty())
            .context("the admin key is needed: --admin-key KEY or TOKENSAVER_ADMIN_KEY")?;
        AdminClient::new(config.admin_addr, key.trim().to_string())
    }
}

/// `tokensaver holds ...`: ask the running server's admin listener, print its answer.
pub(super) fn run(command: HoldsCommand) -> anyhow::Result<()> {
    match command {
        HoldsCommand::List { admin, key, json } => {
            let answer = admin.client()?.list(key.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&answer)?);
            } else {
                print!("{}", render_list(&answer));
            }
        }
        HoldsCommand::Approve {
            id,
            admin,
            attend_minutes,
        } => {
            let answer = admin.client()?.approve(&id, attend_minutes)?;
            print!("{}", render_decided(&answer, crate::now_ms()));
        }
        HoldsCommand::Deny { id, admin } => {
            let answer = admin.client()?.deny(&id)?;
            print!("{}", render_decided(&answer, crate::now_ms()));
        }
    }
    Ok(())
}
