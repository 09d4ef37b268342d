//! Browser sessions of the ledger page: who signed in (the admin, or one key), on which
//! listener, until when, and the CSRF token its forms carry.
//!
//! - The cookie holds a random 256-bit token, `HttpOnly; SameSite=Strict; Path=/page`, with
//!   `Max-Age` = [`SESSION_TTL_MS`]; the server keeps only the token's BLAKE3 hash, so a
//!   lookup is no timing oracle on the token and a memory dump holds no usable cookie.
//! - The key or admin key typed into the form is checked once and never kept.
//! - A session is bound to the listener it was opened on: each listener has its own cookie
//!   name (cookies do not tell ports apart), and an admin session is never opened on the API
//!   listener.
//! - Every state-changing form (approve, deny, sign out) carries the session's CSRF token; it
//!   is compared in constant time, and a request whose `Origin` is another origin, or that
//!   the browser marks `Sec-Fetch-Site: cross-site`/`same-site`, is refused whatever it carries.
//! - Sessions live in memory: a restart signs everyone out.

use std::collections::HashMap;

use http::HeaderMap;
use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::api::Listener;

/// How long a sign-in lasts (absolute, not renewed by activity): a working day.
pub const SESSION_TTL_MS: u64 = 8 * 3_600_000;
/// At most this many sessions per principal (the admin, or one key) and listener; opening one
/// more drops that principal's session that ends first. One principal's sign-ins never evict
/// another's, and memory stays bounded by the configured keys: (keys + 1) × 2 listeners × this.
pub const MAX_SESSIONS_PER_PRINCIPAL: usize = 16;

/// Whose data a session shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Signed in with the admin key (admin listener only): every key.
    Admin,
    /// Signed in with a tokensaver key: that key only.
    Key(String),
}

impl Scope {
    /// The key filter this scope puts on every read (`None`: every key).
    pub fn key_id(&self) -> Option<&str> {
        match self {
            Scope::Admin => None,
            Scope::Key(id) => Some(id),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub scope: Scope,
    pub listener: Listener,
    /// Put in every form of the page; state-changing requests must carry it.
    pub csrf: String,
    pub expires_ms: u64,
}

#[derive(Default)]
pub struct Sessions {
    by_token_hash: HashMap<[u8; 32], Session>,
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn token_hash(token: &str) -> [u8; 32] {
    blake3::derive_key("tokensaver page session v1", token.as_bytes())
}

impl Sessions {
    /// Open a session; returns its cookie token.
    pub fn open(&mut self, scope: Scope, listener: Listener, now_ms: u64) -> (String, Session) {
        self.by_token_hash.retain(|_, s| now_ms < s.expires_ms);
        loop {
            let theirs = self
                .by_token_hash
                .iter()
                .filter(|(_, s)| s.scope == scope && s.listener == listener);
            if theirs.clone().count() < MAX_SESSIONS_PER_PRINCIPAL {
                break;
            }
            let first_to_end = theirs.min_by_key(|(_, s)| s.expires_ms).map(|(h, _)| *h);
            match first_to_end {
                Some(h) => self.by_token_hash.remove(&h),
                None => break,
            };
        }
        let token = random_hex();
        let session = Session {
            scope,
            listener,
            csrf: random_hex(),
            expires_ms: now_ms.saturating_add(SESSION_TTL_MS),
        };
        self.by_token_hash
            .insert(token_hash(&token), session.clone());
        (token, session)
    }

    /// The live session of `token` on `listener`, if any.
    pub fn get(&self, token: &str, listener: Listener, now_ms: u64) -> Option<Session> {
        self.by_token_hash
            .get(&token_hash(token))
            .filter(|s| s.listener == listener && now_ms < s.expires_ms)
            .cloned()
    }

    pub fn close(&mut self, token: &str) {
        self.by_token_hash.remove(&token_hash(token));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_token_hash.len()
    }
}

/// Each listener's cookie (one host, two ports: cookies would otherwise collide).
pub fn cookie_name(listener: Listener) -> &'static str {
    match listener {
        Listener::Admin => "tokensaver_page_admin",
        Listener::Api => "tokensaver_page_key",
    }
}

/// The `Set-Cookie` value that opens a session.
pub fn session_cookie(listener: Listener, token: &str) -> String {
    format!(
        "{}={token}; Path=/page; HttpOnly; SameSite=Strict; Max-Age={}",
        cookie_name(listener),
        SESSION_TTL_MS / 1000
    )
}

/// The `Set-Cookie` value that ends it in the browser.
pub fn clear_cookie(listener: Listener) -> String {
    format!(
        "{}=; Path=/page; HttpOnly; SameSite=Strict; Max-Age=0",
        cookie_name(listener)
    )
}

/// This listener's session token from the request's `Cookie` headers.
pub fn token_from_cookies(headers: &HeaderMap, listener: Listener) -> Option<&str> {
    let name = cookie_name(listener);
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, v)| *k == name && !v.is_empty())
        .map(|(_, v)| v)
}

/// Whether a state-changing request comes from this origin: `Origin`, when sent, names the
/// request's own `Host`; `Sec-Fetch-Site`, when sent, is `same-origin` (or `none`, a person
/// acting in the browser's own UI).
pub fn same_origin(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        if !matches!(site, "same-origin" | "none") {
            return false;
        }
    }
    match (header("origin"), header("host")) {
        (None, _) => true,
        (Some(origin), Some(host)) => {
            origin.strip_prefix("http://") == Some(host)
                || origin.strip_prefix("https://") == Some(host)
        }
        (Some(_), None) => false,
    }
}

/// The CSRF check of a state-changing request: same origin, and the form's token equals the
/// session's (constant time).
pub fn csrf_ok(session: &Session, presented: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(presented) = presented else {
        return false;
    };
    let equal: bool = presented.as_bytes().ct_eq(session.csrf.as_bytes()).into();
    equal && same_origin(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_cookie_is_http_only_same_site_strict_and_expires() {
        let c = session_cookie(Listener::Admin, "abc");
        assert!(c.starts_with("tokensaver_page_admin=abc;"));
        for part in ["HttpOnly", "SameSite=Strict", "Path=/page", "Max-Age=28800"] {
            assert!(c.contains(part), "{c} lacks {part}");
        }
        let cleared = clear_cookie(Listener::Api);
        assert!(cleared.starts_with("tokensaver_page_key=;") && cleared.contains("Max-Age=0"));
        assert_ne!(cookie_name(Listener::Admin), cookie_name(Listener::Api));
    }

    #[test]
    fn a_session_is_found_by_its_token_on_its_listener_until_it_expires() {
        let mut s = Sessions::default();
        let (token, opened) = s.open(Scope::Key("alpha".into()), Listener::Api, 1_000);
        assert_eq!(token.len(), 64);
        assert_eq!(opened.csrf.len(), 64);
        assert_ne!(token, opened.csrf);
        assert_eq!(opened.expires_ms, 1_000 + SESSION_TTL_MS);
        assert_eq!(s.get(&token, Listener::Api, 2_000), Some(opened.clone()));
        assert_eq!(
            s.get(&token, Listener::Admin, 2_000),
            None,
            "other listener"
        );
        assert_eq!(
            s.get(&token, Listener::Api, opened.expires_ms),
            None,
            "expired"
        );
        assert_eq!(s.get("not-a-token", Listener::Api, 2_000), None);
        let (other, _) = s.open(Scope::Admin, Listener::Admin, 1_000);
        assert_ne!(token, other);
        s.close(&token);
        assert_eq!(s.get(&token, Listener::Api, 2_000), None, "signed out");
        assert!(s.get(&other, Listener::Admin, 2_000).is_some());
    }

    /// Issue "hostile" (9): 1,100 sign-ins with a plain key used to evict the admin's session.
    #[test]
    fn one_principal_never_evicts_another() {
        let mut s = Sessions::default();
        let (admin, _) = s.open(Scope::Admin, Listener::Admin, 0);
        let (alpha_admin_listener, _) = s.open(Scope::Key("alpha".into()), Listener::Admin, 0);
        for i in 1..1_100 {
            s.open(Scope::Key("beta".into()), Listener::Api, i);
        }
        assert!(
            s.get(&admin, Listener::Admin, 2_000).is_some(),
            "admin kept"
        );
        assert!(s
            .get(&alpha_admin_listener, Listener::Admin, 2_000)
            .is_some());
        assert_eq!(s.len(), 2 + MAX_SESSIONS_PER_PRINCIPAL);
    }

    #[test]
    fn sessions_are_bounded_and_expired_ones_leave() {
        let mut s = Sessions::default();
        let (first, _) = s.open(Scope::Admin, Listener::Admin, 0);
        for i in 1..MAX_SESSIONS_PER_PRINCIPAL as u64 + 10 {
            s.open(Scope::Admin, Listener::Admin, i);
        }
        assert_eq!(s.len(), MAX_SESSIONS_PER_PRINCIPAL);
        assert_eq!(
            s.get(&first, Listener::Admin, 5),
            None,
            "the first to end left"
        );
        s.open(Scope::Admin, Listener::Admin, SESSION_TTL_MS + 10_000);
        assert_eq!(
            s.len(),
            1,
            "expired sessions are dropped on the next sign-in"
        );
    }

    #[test]
    fn the_token_is_read_from_this_listeners_cookie_only() {
        let h = headers(&[
            ("cookie", "a=b; tokensaver_page_admin=ADMIN"),
            ("cookie", "tokensaver_page_key=KEY"),
        ]);
        assert_eq!(token_from_cookies(&h, Listener::Admin), Some("ADMIN"));
        assert_eq!(token_from_cookies(&h, Listener::Api), Some("KEY"));
        let h = headers(&[("cookie", "tokensaver_page_admin=; x=y")]);
        assert_eq!(token_from_cookies(&h, Listener::Admin), None);
        assert_eq!(token_from_cookies(&HeaderMap::new(), Listener::Admin), None);
    }

    #[test]
    fn csrf_needs_the_sessions_token_and_the_same_origin() {
        let mut s = Sessions::default();
        let (_, session) = s.open(Scope::Admin, Listener::Admin, 0);
        let csrf = session.csrf.as_str();
        let same = headers(&[
            ("host", "127.0.0.1:8789"),
            ("origin", "http://127.0.0.1:8789"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert!(csrf_ok(&session, Some(csrf), &same));
        assert!(!csrf_ok(&session, None, &same), "no token");
        assert!(!csrf_ok(&session, Some(""), &same), "empty token");
        assert!(!csrf_ok(&session, Some(&csrf[1..]), &same), "shorter token");
        let mut wrong = csrf.to_string();
        wrong.replace_range(0..1, if csrf.starts_with('0') { "1" } else { "0" });
        assert!(!csrf_ok(&session, Some(&wrong), &same), "another token");
        // Without Origin or Fetch metadata (an old client, curl): the token decides.
        assert!(csrf_ok(&session, Some(csrf), &headers(&[("host", "h")])));
        for bad in [
            headers(&[
                ("host", "127.0.0.1:8789"),
                ("origin", "http://evil.example"),
            ]),
            headers(&[
                ("host", "127.0.0.1:8789"),
                ("origin", "http://127.0.0.1:8788"),
            ]),
            headers(&[("host", "127.0.0.1:8789"), ("origin", "null")]),
            headers(&[("origin", "http://127.0.0.1:8789")]),
            headers(&[("host", "127.0.0.1:8789"), ("sec-fetch-site", "cross-site")]),
            headers(&[("host", "127.0.0.1:8789"), ("sec-fetch-site", "same-site")]),
        ] {
            assert!(!csrf_ok(&session, Some(csrf), &bad), "{bad:?}");
        }
    }

    #[test]
    fn scopes_filter_by_key() {
        assert_eq!(Scope::Admin.key_id(), None);
        assert_eq!(Scope::Key("a".into()).key_id(), Some("a"));
    }
}
