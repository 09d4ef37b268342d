//! The ledger page (SPEC §7): spend against budget, savings by tier, verdicts over time, the
//! latest decisions with their receipts, open holds with an approve button, and the economics
//! verdict — served by tokensaver itself, every asset embedded in the binary.
//!
//! Served on both listeners, under `/page`:
//! - `GET  /page/`                        the sign-in form, or the page (`?range=1h|24h|30d`, `?verdict=BLOCK`, …)
//! - `GET  /page/panel`                   the page's live part, fetched again every 5 s by `page.js`
//! - `GET  /page/receipt/{decision_id}`   a listed decision's receipt, verified with the gate's key
//! - `GET  /page/assets/{page.css,page.js,icon.svg}`
//! - `POST /page/login`                   form `key`: opens a session (cookie), then back to the page
//! - `POST /page/logout`                  CSRF-checked
//! - `POST /page/holds/{id}/approve`      CSRF-checked; form `attend_minutes` optional
//! - `POST /page/holds/{id}/deny`         CSRF-checked
//!
//! Who sees what: on the admin listener the admin key signs in to every key's data (and the
//! economics verdict); on either listener a tokensaver key signs in to that key's data only.
//! Deciding a hold follows the hold routes: an admin session decides any hold; a key session
//! needs the key owner's secret, typed into the form — the automation holding the key cannot
//! release its own holds. Sessions and CSRF: [`session`]. No content, ever: what the page
//! reads holds no prompt or answer text, and fingerprints are cut to 12 hex digits.
//!
//! The handlers read the ledger synchronously, as `GET /ledger` does (a store flush, then
//! indexed reads).

mod html;
mod model;
mod session;
mod svg;

use std::sync::{Mutex, MutexGuard};

use maud::Markup;

use super::holds::HoldRoute;
use super::http::{ApiRequest, ApiResponse};
use super::router::PageEndpoint;
use super::Listener;
use crate::auth;
use crate::gatekeeper::{Gatekeeper, HoldAction, HoldError};
use crate::now_ms;
use crate::receipt::DecisionId;
use model::{EconomicsBrief, Range};
use session::{Scope, Session, Sessions};
use tokensaver_core::gate::Verdict;

const PAGE_CSS: &str = include_str!("assets/page.css");
const PAGE_JS: &str = include_str!("assets/page.js");
const ICON_SVG: &str = include_str!("assets/icon.svg");

/// The page's scripts and styles come from this origin only; no inline script or style, no
/// framing, forms post back here only. The referrer policy is `same-origin`: with `no-referrer`,
/// browsers send `Origin: null` on form posts and the CSRF origin check could not tell.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The economics summary is recomputed at most this often (the panel refreshes every 5 s).
const ECONOMICS_TTL_MS: u64 = 60_000;

/// Whether a path belongs to the page.
pub fn owns(path: &str) -> bool {
    path == "/page" || path.starts_with("/page/")
}

/// The page's state: open sessions and the economics brief last computed.
#[derive(Default)]
pub struct Page {
    sessions: Mutex<Sessions>,
    economics: Mutex<Option<(u64, EconomicsBrief)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn secure(resp: ApiResponse) -> ApiResponse {
    resp.with_header("content-security-policy", CSP)
        .with_header("x-frame-options", "DENY")
        .with_header("x-content-type-options", "nosniff")
        .with_header("referrer-policy", "same-origin")
}

/// An HTML answer: markup built by the templates of `html.rs` (escaped by construction).
fn html(status: u16, body: Markup) -> ApiResponse {
    secure(ApiResponse::text(
        status,
        "text/html; charset=utf-8",
        body.into_string(),
    ))
    .with_header("cache-control", "no-store")
}

fn asset(content_type: &'static str, body: &'static str) -> ApiResponse {
    secure(ApiResponse::text(200, content_type, body)).with_header("cache-control", "no-cache")
}

pub(crate) fn redirect(location: &str) -> ApiResponse {
    secure(ApiResponse::text(
        303,
        "text/plain; charset=utf-8",
        "see other",
    ))
    .with_header("location", location)
    .with_header("cache-control", "no-store")
}

/// A urlencoded form's first value for `name`.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn verdict_param(req: &ApiRequest) -> Option<Verdict> {
    let v = req.query_param("verdict")?;
    Verdict::ALL.into_iter().find(|x| x.as_str() == v)
}

impl Page {
    pub fn new() -> Page {
        Page::default()
    }

    /// A `/page` request of either listener, as the route table named it (`id`: the receipt's
    /// or the hold's).
    pub async fn handle(
        &self,
        listener: Listener,
        gk: &Gatekeeper,
        req: &ApiRequest,
        page: PageEndpoint,
        id: &str,
    ) -> ApiResponse {
        let now = now_ms();
        match page {
            PageEndpoint::Css => asset("text/css; charset=utf-8", PAGE_CSS),
            PageEndpoint::Js => asset("text/javascript; charset=utf-8", PAGE_JS),
            PageEndpoint::Icon => asset("image/svg+xml", ICON_SVG),
            PageEndpoint::Dashboard => match self.session(listener, req, now) {
                Some(s) => self.dashboard(listener, gk, req, &s, now).await,
                None => html(200, html::login(listener, None)),
            },
            PageEndpoint::Panel => match self.session(listener, req, now) {
                Some(s) => self.panel(gk, req, &s, now).await,
                None => html(401, html::signed_out()),
            },
            PageEndpoint::Login => self.login(listener, gk, req, now),
            PageEndpoint::Logout => self.logout(listener, req, now),
            PageEndpoint::Receipt => match self.session(listener, req, now) {
                Some(s) => receipt(listener, gk, &s, id),
                None => redirect("/page/"),
            },
            PageEndpoint::HoldApprove => {
                let route = HoldRoute::Approve(id);
                self.decide_hold(listener, gk, req, route, now).await
            }
            PageEndpoint::HoldDeny => {
                let route = HoldRoute::Deny(id);
                self.decide_hold(listener, gk, req, route, now).await
            }
        }
    }

    fn session(&self, listener: Listener, req: &ApiRequest, now: u64) -> Option<Session> {
        let token = session::token_from_cookies(&req.headers, listener)?;
        lock(&self.sessions).get(token, listener, now)
    }

    fn login(
        &self,
        listener: Listener,
        gk: &Gatekeeper,
        req: &ApiRequest,
        now: u64,
    ) -> ApiResponse {
        if !session::same_origin(&req.headers) {
            return html(403, html::login(listener, Some("Sign in from this page.")));
        }
        let key = form_field(&req.body, "key").unwrap_or_default();
        let key = key.trim();
        let scope = if auth::is_admin(&gk.core.config, Some(key)) {
            if listener == Listener::Api {
                let error = "The admin key signs in on the admin listener only.";
                return html(401, html::login(listener, Some(error)));
            }
            Scope::Admin
        } else {
            match auth::authenticate(&gk.core.config, Some(key)) {
                Ok((k, _)) => Scope::Key(k.id.to_string()),
                Err(_) => return html(401, html::login(listener, Some("Invalid key."))),
            }
        };
        let (token, _) = lock(&self.sessions).open(scope, listener, now);
        redirect("/page/").with_header("set-cookie", session::session_cookie(listener, &token))
    }

    fn logout(&self, listener: Listener, req: &ApiRequest, now: u64) -> ApiResponse {
        let Some(token) = session::token_from_cookies(&req.headers, listener) else {
            return redirect("/page/");
        };
        let mut sessions = lock(&self.sessions);
        if let Some(s) = sessions.get(token, listener, now) {
            let presented = form_field(&req.body, "csrf");
            if !session::csrf_ok(&s, presented.as_deref(), &req.headers) {
                return csrf_refused(listener);
            }
            sessions.close(token);
        }
        redirect("/page/").with_header("set-cookie", session::clear_cookie(listener))
    }

    async fn economics(&self, gk: &Gatekeeper, now: u64) -> EconomicsBrief {
        if let Some((at, brief)) = lock(&self.economics).as_ref() {
            if now < at.saturating_add(ECONOMICS_TTL_MS) {
                return brief.clone();
            }
        }
        // The same summary as GET /economics, judged against this build and config: files
        // and 10 000 bootstrap resamples, the blocking pool's work, not a worker's.
        let config = std::sync::Arc::clone(&gk.core.config);
        let summary = tokio::task::spawn_blocking(move || {
            let summary = crate::economics::summary_for(
                &config,
                None,
                &crate::economics::model::EconomicsQuery::default(),
                now,
            );
            serde_json::to_value(&summary).unwrap_or_default()
        })
        .await;
        match summary {
            Ok(summary) => {
                let brief = EconomicsBrief::from_summary(&summary);
                *lock(&self.economics) = Some((now, brief.clone()));
                brief
            }
            // Not kept: the next view tries again.
            Err(_) => EconomicsBrief::from_summary(&serde_json::Value::Null),
        }
    }

    async fn view(
        &self,
        gk: &Gatekeeper,
        req: &ApiRequest,
        s: &Session,
        now: u64,
    ) -> Result<model::View, ApiResponse> {
        // The economics evidence is the fleet's, served on the admin listener with the admin key.
        let economics = match s.scope {
            Scope::Admin => Some(self.economics(gk, now).await),
            Scope::Key(_) => None,
        };
        model::read(
            gk,
            model::Request {
                scope: &s.scope,
                range: Range::parse(req.query_param("range").as_deref()),
                verdict_filter: verdict_param(req),
                now_ms: now,
                economics,
            },
        )
        .await
        .map_err(ApiResponse::from)
    }

    async fn dashboard(
        &self,
        listener: Listener,
        gk: &Gatekeeper,
        req: &ApiRequest,
        s: &Session,
        now: u64,
    ) -> ApiResponse {
        match self.view(gk, req, s, now).await {
            Ok(view) => html(
                200,
                html::dashboard(
                    listener,
                    &view,
                    &s.csrf,
                    html::notice(req.query_param("done").as_deref()),
                ),
            ),
            Err(resp) => resp,
        }
    }

    async fn panel(&self, gk: &Gatekeeper, req: &ApiRequest, s: &Session, now: u64) -> ApiResponse {
        match self.view(gk, req, s, now).await {
            Ok(view) => html(200, html::panel(&view, &s.csrf)),
            Err(resp) => resp,
        }
    }

    /// Approve or deny from the page: the CSRF check, then who may decide (the admin any
    /// hold; a key's session its own holds with the owner secret), then the same
    /// `Gatekeeper::decide` as the hold routes (on a fleet, the fleet's hold).
    async fn decide_hold(
        &self,
        listener: Listener,
        gk: &Gatekeeper,
        req: &ApiRequest,
        route: HoldRoute<'_>,
        now: u64,
    ) -> ApiResponse {
        let Some(s) = self.session(listener, req, now) else {
            return redirect("/page/");
        };
        let csrf = form_field(&req.body, "csrf");
        if !session::csrf_ok(&s, csrf.as_deref(), &req.headers) {
            return csrf_refused(listener);
        }
        let owner = match &s.scope {
            Scope::Admin => None,
            Scope::Key(id) => {
                let secret = form_field(&req.body, "owner_secret");
                match gk.core.config.key(id) {
                    Some(key) if auth::is_owner(key, secret.as_deref()) => Some(id.as_str()),
                    _ => return redirect("/page/?done=owner_secret"),
                }
            }
        };
        let (hold_id, action) = match route {
            HoldRoute::Approve(id) => {
                let attend = form_field(&req.body, "attend_minutes").unwrap_or_default();
                let attend_minutes = match attend.trim() {
                    "" => None,
                    m => match m.parse::<u64>() {
                        Ok(m) => Some(m),
                        Err(_) => return redirect("/page/?done=attend_minutes"),
                    },
                };
                (id, HoldAction::Approve { attend_minutes })
            }
            HoldRoute::Deny(id) => (id, HoldAction::Deny),
            HoldRoute::List => return redirect("/page/"),
        };
        let done = match gk.decide(hold_id, owner, action, now).await {
            Ok(d) if d.attending_until_ms.is_some() => "attending",
            Ok(_) if action == HoldAction::Deny => "denied",
            Ok(_) => "approved",
            Err(HoldError::Unknown) => "unknown",
            Err(HoldError::Expired) => "expired",
            Err(HoldError::NotPending) => "not_pending",
            Err(HoldError::AttendMinutes) => "attend_minutes",
            Err(HoldError::Unavailable) => "unavailable",
            Err(HoldError::Unpriced) => "unpriced",
        };
        redirect(&format!("/page/?done={done}"))
    }
}

fn csrf_refused(listener: Listener) -> ApiResponse {
    html(
        403,
        html::message(
            listener,
            "Refused",
            "This form was not sent from this page (CSRF check). Reload the page and try again.",
        ),
    )
}

/// A listed decision's receipt, verified with the gate's own key. The id comes from the URL:
/// one that is not a decision id is a receipt the page does not keep.
fn receipt(listener: Listener, gk: &Gatekeeper, s: &Session, decision_id: &str) -> ApiResponse {
    let envelope = decision_id
        .parse::<DecisionId>()
        .ok()
        .and_then(|id| Some((id, gk.recent_receipt(&id, s.scope.key_id())?)));
    let Some((decision_id, envelope)) = envelope else {
        return html(
            404,
            html::message(
                listener,
                "Receipt not kept",
                "The page keeps the receipts of the latest 1024 decisions since the gate started, each for its own key only.",
            ),
        );
    };
    match gk.core.signer.verify(&envelope) {
        Ok(body) => {
            let id_matches = crate::receipt::decision_id(&body) == decision_id;
            let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            html(
                200,
                html::receipt(
                    listener,
                    &s.scope,
                    &decision_id,
                    &envelope.kid,
                    &parsed,
                    id_matches,
                ),
            )
        }
        Err(_) => html(
            500,
            html::message(
                listener,
                "Receipt invalid",
                "The receipt's signature does not verify.",
            ),
        ),
    }
}
