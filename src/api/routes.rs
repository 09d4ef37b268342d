//! Route logic for the API and admin listeners, over plain [`ApiRequest`]s.
//!
//! Handlers run on the listener's async workers, so none of them waits on a thread: a route
//! that needs a commit awaits the store's acknowledgement over a channel, and one that reads
//! SQLite or the economics evidence does so on the blocking pool.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;

use super::holds::{self, HoldRoute};
use super::http::{ApiRequest, ApiResponse};
use super::router::{AdminEndpoint, ApiEndpoint, PageEndpoint, Table};
use crate::auth;
use crate::config::{BudgetPeriod, KeyConfig, Prices};
use crate::error::{ApiError, GateError};
use crate::gatekeeper::settlement::{RecordBody, RecordBodyError};
use crate::gatekeeper::{
    AdmitError, GateOutcome, GateRequest, Gatekeeper, RecordError, RecordSource, SetBudgetError,
    Settled,
};
use crate::now_ms;
use crate::receipt::DecisionId;
use tokensaver_core::request::{self, Digest, Route};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Api,
    Admin,
}

pub struct Api {
    pub gatekeeper: Arc<Gatekeeper>,
    routes: Routes,
    pub split_profile: crate::split_profile::SplitProfileService,
    pub page: Arc<super::page::Page>,
}

/// Each listener's route table.
struct Routes {
    api: Table<ApiEndpoint>,
    admin: Table<AdminEndpoint>,
}

/// The most decisions `GET /ledger/sessions` groups in one answer.
const MAX_SESSION_DECISIONS: usize = 20_000;
/// Decisions per page of `GET /ledger/decisions` when `limit` is absent.
const DEFAULT_DECISIONS_PAGE: usize = 100;

/// Bodies of the API's own routes are small; provider bodies (estimate) follow the proxy's cap.
const SMALL_BODY_CAP: usize = 1024 * 1024;
/// The split-profile criteria cap submissions at 262,144 bytes; a little room for the refusal.
/// Also `/verify`'s: a receipt's envelope is a few KiB, a signed split-profile report less than
/// its submission.
const ADMIN_BODY_CAP: usize = 512 * 1024;
/// The page's forms and the routes that take no body.
const FORM_BODY_CAP: usize = 64 * 1024;

/// What the listener does with a request before reading its body ([`Api::admission`]).
pub enum Admission {
    /// Read up to `cap` bytes; `public`: no credential was checked for it (its read counts
    /// against the listener's public reads at once).
    Read { cap: usize, public: bool },
    /// Answer now, the body unread.
    Answer(ApiResponse),
}

fn method_not_allowed() -> ApiResponse {
    ApiError::MethodNotAllowed.into()
}

/// `POST /gate`'s body: a digest, or a closed-form 400 naming what is wrong with it.
fn parse_digest(req: &ApiRequest) -> Result<Digest, ApiResponse> {
    Digest::parse(&req.body).map_err(|e| invalid_digest(&e))
}

fn invalid_digest(e: &request::DigestError) -> ApiResponse {
    GateError::from(e).into()
}

/// What a digest asks the gate to decide, for `key`, now.
fn digest_request<'a>(digest: &'a Digest, key: &'a KeyConfig) -> GateRequest<'a> {
    GateRequest {
        key,
        shape: &digest.request,
        human: digest.human,
        held: digest.holds(digest.request.wire_form()),
        hold_id: digest.hold_id.as_deref(),
        now_ms: now_ms(),
        recorded_by: RecordSource::Digest,
    }
}

/// `GET /`: a person who types the listener's address lands on the page (303: the next
/// request is a GET whatever this one was, and nothing caches the hop).
fn home() -> ApiResponse {
    super::page::redirect("/page/")
}

fn not_found() -> ApiResponse {
    ApiError::NotFound.into()
}

/// The fleet's database cannot be reached: closed-form, retry shortly.
pub(crate) fn fleet_unavailable() -> ApiResponse {
    GateError::fleet_unavailable().into()
}

fn bad_json() -> ApiResponse {
    ApiError::InvalidJson.into()
}

impl Api {
    pub fn new(gatekeeper: Arc<Gatekeeper>) -> Self {
        Self {
            gatekeeper,
            routes: Routes {
                api: Table::api(),
                admin: Table::admin(),
            },
            split_profile: crate::split_profile::SplitProfileService::new(),
            page: Arc::new(super::page::Page::new()),
        }
    }

    /// What a request may send before anything of its body is read, from its line and headers
    /// alone: a route that needs a key (or the admin key) refuses one without it at once, so a
    /// keyless caller can make the listener hold no more than a public route's small body; an
    /// unknown route is answered unread.
    pub fn admission(
        &self,
        listener: Listener,
        method: &http::Method,
        path: &str,
        headers: &http::HeaderMap,
    ) -> Admission {
        let presented = auth::presented_key(headers);
        let keyed = |cap: usize| match auth::authenticate(&self.gatekeeper.core.config, presented) {
            Ok(_) => Admission::Read { cap, public: false },
            Err(e) => Admission::Answer(GateError::from(e).into()),
        };
        match listener {
            Listener::Api => {
                let Some(found) = self.routes.api.find(path) else {
                    return Admission::Answer(not_found());
                };
                if !found.route.allows(method) {
                    return Admission::Answer(method_not_allowed());
                }
                match found.route.endpoint {
                    ApiEndpoint::Estimate | ApiEndpoint::Gate => keyed(
                        self.gatekeeper
                            .core
                            .config
                            .max_body_bytes
                            .max(SMALL_BODY_CAP),
                    ),
                    ApiEndpoint::Record
                    | ApiEndpoint::Renew
                    | ApiEndpoint::Ledger
                    | ApiEndpoint::Decisions
                    | ApiEndpoint::Sessions
                    | ApiEndpoint::Budget
                    | ApiEndpoint::Prices
                    | ApiEndpoint::Forget => keyed(SMALL_BODY_CAP),
                    // The key or its owner's secret (`owner_holds` checks which).
                    ApiEndpoint::Holds | ApiEndpoint::HoldApprove | ApiEndpoint::HoldDeny => {
                        if presented.is_none() && !headers.contains_key("x-tokensaver-owner") {
                            Admission::Answer(GateError::from(auth::AuthError::Missing).into())
                        } else {
                            Admission::Read {
                                cap: FORM_BODY_CAP,
                                public: true,
                            }
                        }
                    }
                    ApiEndpoint::Verify => Admission::Read {
                        cap: ADMIN_BODY_CAP,
                        public: true,
                    },
                    ApiEndpoint::Page(_)
                    | ApiEndpoint::Home
                    | ApiEndpoint::Spec
                    | ApiEndpoint::Stats => Admission::Read {
                        cap: FORM_BODY_CAP,
                        public: true,
                    },
                }
            }
            Listener::Admin => {
                let found = self.routes.admin.find(path);
                let open = found.as_ref().is_some_and(|f| f.route.endpoint.is_open());
                if !open && !auth::is_admin(&self.gatekeeper.core.config, presented) {
                    return Admission::Answer(ApiError::AdminKeyRequired.into());
                }
                match found.map(|f| f.route.endpoint) {
                    Some(AdminEndpoint::SplitProfile) => Admission::Read {
                        cap: ADMIN_BODY_CAP,
                        public: true,
                    },
                    Some(AdminEndpoint::Page(_) | AdminEndpoint::Home | AdminEndpoint::Metrics) => {
                        Admission::Read {
                            cap: FORM_BODY_CAP,
                            public: true,
                        }
                    }
                    _ => Admission::Read {
                        cap: ADMIN_BODY_CAP,
                        public: false,
                    },
                }
            }
        }
    }

    /// Answer a request. `gone` ends when its caller has closed the connection: `POST /gate`
    /// does not decide a digest whose caller left while it was held (SPEC §2.3).
    pub async fn handle(
        &self,
        listener: Listener,
        req: &ApiRequest,
        gone: crate::gatekeeper::CallerGone<'_>,
    ) -> ApiResponse {
        match listener {
            Listener::Api => self.api(req, gone).await,
            Listener::Admin => self.admin(req).await,
        }
    }

    /// The ledger page reads through the gate's home (SQLite on the blocking pool, or the
    /// fleet's database) and summarises the economics evidence on the blocking pool.
    async fn page(
        &self,
        listener: Listener,
        req: &ApiRequest,
        page: PageEndpoint,
        id: &str,
    ) -> ApiResponse {
        self.page
            .handle(listener, &self.gatekeeper, req, page, id)
            .await
    }

    fn caller<'a>(
        &'a self,
        req: &ApiRequest,
    ) -> Result<(&'a KeyConfig, auth::Caller), ApiResponse> {
        auth::authenticate(
            &self.gatekeeper.core.config,
            auth::presented_key(&req.headers),
        )
        .map_err(|e| GateError::from(e).into())
    }

    async fn api(&self, req: &ApiRequest, gone: crate::gatekeeper::CallerGone<'_>) -> ApiResponse {
        let Some(found) = self.routes.api.find(&req.path) else {
            return not_found();
        };
        if !found.route.allows(&req.method) {
            return method_not_allowed();
        }
        let id = found.params.get("id").unwrap_or_default();
        match found.route.endpoint {
            ApiEndpoint::Page(page) => self.page(Listener::Api, req, page, id).await,
            ApiEndpoint::Home => home(),
            ApiEndpoint::Spec => self.spec(),
            ApiEndpoint::Stats => self.stats().await,
            ApiEndpoint::Verify => self.verify(req),
            ApiEndpoint::Estimate => self.keyed(req, |k, c| self.estimate(req, k, c)).await,
            ApiEndpoint::Gate => self.keyed(req, |k, _| self.gate(req, k, gone)).await,
            ApiEndpoint::Record => self.keyed(req, |k, _| self.record(req, k)).await,
            ApiEndpoint::Renew => self.keyed(req, |k, _| self.renew(req, k)).await,
            ApiEndpoint::Ledger => self.keyed(req, |k, _| self.ledger(req, k)).await,
            ApiEndpoint::Decisions => {
                self.keyed(req, |k, _| self.decisions(req, Some(&k.id)))
                    .await
            }
            ApiEndpoint::Sessions => {
                self.keyed(req, |k, _| self.sessions(req, Some(&k.id)))
                    .await
            }
            ApiEndpoint::Budget => self.keyed(req, |k, _| self.budget(k)).await,
            ApiEndpoint::Prices => {
                let prices = self.gatekeeper.policy();
                self.keyed(
                    req,
                    |_, _| async move { ApiResponse::json(200, &prices.prices) },
                )
                .await
            }
            ApiEndpoint::Forget => self.keyed(req, |k, _| self.forget(k)).await,
            ApiEndpoint::Holds => self.owner_holds(req, HoldRoute::List).await,
            ApiEndpoint::HoldApprove => self.owner_holds(req, HoldRoute::Approve(id)).await,
            ApiEndpoint::HoldDeny => self.owner_holds(req, HoldRoute::Deny(id)).await,
        }
    }

    /// The admin listener: the page, `/`, `/metrics` and split-profile (which checks the key
    /// itself) are open; every other route, known or not, needs the admin key first.
    async fn admin(&self, req: &ApiRequest) -> ApiResponse {
        let found = self.routes.admin.find(&req.path);
        let admin = auth::is_admin(
            &self.gatekeeper.core.config,
            auth::presented_key(&req.headers),
        );
        let open = found.as_ref().is_some_and(|f| f.route.endpoint.is_open());
        if !open && !admin {
            return ApiError::AdminKeyRequired.into();
        }
        let Some(found) = found else {
            return not_found();
        };
        if !found.route.allows(&req.method) {
            return method_not_allowed();
        }
        let param = |name| found.params.get(name).unwrap_or_default();
        // The admin sees every key's, or one key's with `?key=ID`.
        let key_param = req.query_param("key").filter(|k| !k.is_empty());
        let key = || key_param.as_deref();
        match found.route.endpoint {
            AdminEndpoint::Page(page) => self.page(Listener::Admin, req, page, param("id")).await,
            AdminEndpoint::Home => home(),
            AdminEndpoint::Metrics => ApiResponse::text(
                200,
                "text/plain; version=0.0.4",
                self.gatekeeper.core.metrics.render(),
            ),
            AdminEndpoint::SplitProfile => self
                .split_profile
                .handle(req, admin, &self.gatekeeper.core.signer, now_ms())
                .unwrap_or_else(not_found),
            AdminEndpoint::PutPrices => self.put_prices(req).await,
            AdminEndpoint::PutBudget => self.put_budget(req, param("key_id")).await,
            AdminEndpoint::Holds => {
                holds::decide(&self.gatekeeper, req, HoldRoute::List, key(), now_ms()).await
            }
            AdminEndpoint::HoldApprove => {
                let route = HoldRoute::Approve(param("id"));
                holds::decide(&self.gatekeeper, req, route, None, now_ms()).await
            }
            AdminEndpoint::HoldDeny => {
                let route = HoldRoute::Deny(param("id"));
                holds::decide(&self.gatekeeper, req, route, None, now_ms()).await
            }
            AdminEndpoint::Economics => self.economics(req).await,
            AdminEndpoint::Decisions => self.decisions(req, key()).await,
            AdminEndpoint::Sessions => self.sessions(req, key()).await,
        }
    }

    /// A keyed route: its handler with the caller's key, or the closed-form 401.
    async fn keyed<'a, F, Fut>(&'a self, req: &ApiRequest, f: F) -> ApiResponse
    where
        F: FnOnce(&'a KeyConfig, auth::Caller) -> Fut,
        Fut: std::future::Future<Output = ApiResponse>,
    {
        match self.caller(req) {
            Ok((key, caller)) => f(key, caller).await,
            Err(resp) => resp,
        }
    }

    fn spec(&self) -> ApiResponse {
        let card = crate::spec_card::render(
            &self.gatekeeper.core.config,
            &self.gatekeeper.policy(),
            &self.gatekeeper.core.signer.public_keys(),
        );
        ApiResponse::json(200, &card)
    }

    async fn stats(&self) -> ApiResponse {
        match self.gatekeeper.ledger_report(None, None, None).await {
            Ok((_, totals)) => ApiResponse::json(
                200,
                &json!({"fleet": totals, "tiers_are_never_merged": true}),
            ),
            Err(e) => e.into(),
        }
    }

    fn verify(&self, req: &ApiRequest) -> ApiResponse {
        let checked = serde_json::from_slice::<crate::receipt::Envelope>(&req.body)
            .map_err(|_| crate::receipt::VerifyError::Malformed)
            .and_then(|envelope| self.gatekeeper.core.signer.verify_document(&envelope));
        match checked {
            // Each kind of document is signed under its own domain: the answer says which kind
            // the signature proves ("unscoped": signed before the domains, kind unproven).
            Ok((kind, body)) => {
                let parsed: serde_json::Value =
                    serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                let kind = kind.map_or("unscoped", |k| k.as_str());
                let mut answer = json!({"valid": true, "kind": kind});
                let field = if kind == "receipt" || kind == "unscoped" {
                    "receipt"
                } else {
                    "document"
                };
                answer[field] = parsed;
                ApiResponse::json(200, &answer)
            }
            Err(e) => ApiResponse::json(200, &json!({"valid": false, "error": e.to_string()})),
        }
    }

    /// A request body (`?route=openai_chat|anthropic_messages`, default OpenAI) or a digest.
    async fn estimate(
        &self,
        req: &ApiRequest,
        key: &KeyConfig,
        caller: auth::Caller,
    ) -> ApiResponse {
        // One parse: a digest (`v` and `request`) or a provider request body.
        let object = match request::parse_object(&req.body) {
            Ok(object) => object,
            Err(e) => return GateError::from(e).into(),
        };
        let (shape, human, held, hold_id) =
            if object.contains_key("v") && object.contains_key("request") {
                match Digest::parse(&req.body) {
                    Ok(d) => {
                        let held = d.holds(d.request.wire_form());
                        (d.request, d.human, held, d.hold_id)
                    }
                    Err(e) => return invalid_digest(&e),
                }
            } else {
                let route = match req.query_param("route").as_deref() {
                    None | Some("openai_chat") => Route::OpenAiChat,
                    Some("anthropic_messages") => Route::AnthropicMessages,
                    Some(_) => return ApiError::UnknownDigestRoute.into(),
                };
                let hashes = request::TurnHashes::WhereTheyCanRepeat;
                match request::shape_of(
                    route,
                    &object,
                    &caller.fingerprint_key,
                    req.body.len(),
                    hashes,
                ) {
                    Ok(shape) => {
                        let answer_key = crate::store::answers::AnswerKey {
                            key_id: key.id.clone(),
                            fingerprint: shape.fingerprint,
                            wire: shape.wire_form(),
                        };
                        let held = self.gatekeeper.stored_answer(&answer_key).await.is_some();
                        let (human, hold_id) = crate::body::caller_headers(&req.headers);
                        (shape, human, held, hold_id)
                    }
                    Err(e) => return GateError::from(e).into(),
                }
            };
        let request = GateRequest {
            key,
            shape: &shape,
            human,
            held,
            hold_id: hold_id.as_deref(),
            now_ms: now_ms(),
            // An estimate books nothing: no reservation is made.
            recorded_by: RecordSource::Proxy,
        };
        let Ok(outcome) = self.gatekeeper.estimate(&request).await else {
            return fleet_unavailable();
        };
        ApiResponse::json(
            200,
            &json!({"estimate": true, "decision": outcome.decision}),
        )
    }

    /// `POST /gate`: decided by this gate (a repeated step may be held until its window
    /// admits it, as in the proxy: SPEC §2.3), or against the fleet's database, with a 503 and
    /// `Retry-After` when it cannot be reached (the client forwards nothing).
    async fn gate(
        &self,
        req: &ApiRequest,
        key: &KeyConfig,
        gone: crate::gatekeeper::CallerGone<'_>,
    ) -> ApiResponse {
        let digest = match parse_digest(req) {
            Ok(digest) => digest,
            Err(resp) => return resp,
        };
        let holding = crate::gatekeeper::Holding {
            bytes: req.body.len(),
            gone,
        };
        match self
            .gatekeeper
            .admit(&digest_request(&digest, key), holding)
            .await
        {
            Ok(outcome) => self.gate_response(&outcome),
            // Nobody reads this answer: nothing was decided for the digest client that left.
            Err(AdmitError::CallerGone) => ApiError::CallerGone.into(),
            Err(AdmitError::Unavailable(_) | AdmitError::GateUnreachable) => fleet_unavailable(),
        }
    }

    /// `GET /budget`: the key's figures (a fleet's from its database).
    async fn budget(&self, key: &KeyConfig) -> ApiResponse {
        match self.gatekeeper.budget(&key.id, now_ms()).await {
            Ok(view) => ApiResponse::json(200, &view),
            Err(_) => fleet_unavailable(),
        }
    }

    fn gate_response(&self, outcome: &GateOutcome) -> ApiResponse {
        let mut answer = gate_answer(outcome);
        if outcome.decision.verdict.forwards() {
            // How long its reservation lives unrenewed: the client renews it a third of that
            // apart while it relays the answer (`POST /renew`).
            answer["reservation_ttl_ms"] = json!(self.gatekeeper.core.config.reservation_ttl_ms);
        }
        if outcome.decision.hold_id.is_some() {
            // What the client's 409 says: the same closed-form text as the proxy's.
            let ttl = self.gatekeeper.core.config.hold_ttl_ms;
            answer["hold_ttl_ms"] = json!(ttl);
            answer["message"] = json!(crate::error::hold_message(
                outcome.decision.hold_id.as_deref(),
                Some(ttl)
            ));
        }
        ApiResponse::json(200, &answer)
    }

    /// `POST /renew` `{"decision_id"}`: the key's own open reservation of a digest decision,
    /// kept live another TTL while the client relays its answer (SPEC §4).
    async fn renew(&self, req: &ApiRequest, key: &KeyConfig) -> ApiResponse {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RenewBody {
            decision_id: String,
        }
        let Ok(body) = serde_json::from_slice::<RenewBody>(&req.body) else {
            return bad_json();
        };
        let Ok(id) = body.decision_id.parse::<DecisionId>() else {
            return unknown_decision();
        };
        match self
            .gatekeeper
            .renew_for_digest(&key.id, &id, now_ms())
            .await
        {
            Ok(true) => ApiResponse::json(200, &json!({"renewed": true})),
            Ok(false) => unknown_decision(),
            Err(_) => fleet_unavailable(),
        }
    }

    async fn record(&self, req: &ApiRequest, key: &KeyConfig) -> ApiResponse {
        let Ok(rec) = serde_json::from_slice::<RecordBody>(&req.body) else {
            return bad_json();
        };
        let report = match rec.into_report(&key.id) {
            Ok(report) => report,
            Err(RecordBodyError::InconsistentEnding) => return ApiError::InconsistentEnding.into(),
            Err(RecordBodyError::UnknownDecision) => return unknown_decision(),
        };
        let recorded = self
            .gatekeeper
            .settle(&report, RecordSource::Digest, now_ms())
            .await;
        match recorded {
            Ok(Settled::Here(row)) => ApiResponse::json(
                200,
                &json!({"recorded": true, "spend_nano": row.spend_nano}),
            ),
            // A digest client serves no API: its settles go to its central gate.
            Ok(Settled::Sent) => ApiError::RecordNotCommitted.into(),
            Err(RecordError::AlreadyRecorded) => ApiError::AlreadyRecorded.into(),
            Err(RecordError::UnknownDecision) => unknown_decision(),
            Err(RecordError::ModelMismatch) => ApiError::ModelMismatch.into(),
            Err(RecordError::ExceedsDecision) => ApiError::UsageExceedsDecision.into(),
            Err(RecordError::Storage) => ApiError::RecordNotCommitted.into(),
        }
    }

    async fn ledger(&self, req: &ApiRequest, key: &KeyConfig) -> ApiResponse {
        let (from, to) = (req.query_param("from"), req.query_param("to"));
        let (from, to) = (from.as_deref(), to.as_deref());
        if [from, to].iter().flatten().any(|d| !valid_day(d)) {
            return ApiError::InvalidDay.into();
        }
        let (days, total) = match self.gatekeeper.ledger_report(Some(&key.id), from, to).await {
            Ok(x) => x,
            Err(e) => return e.into(),
        };
        let Ok(budget) = self.gatekeeper.budget(&key.id, now_ms()).await else {
            return fleet_unavailable();
        };
        if req.query_param("format").as_deref() == Some("csv") {
            let csv = crate::report::csv(&days, &total);
            return ApiResponse::text(200, "text/csv", csv);
        }
        ApiResponse::json(
            200,
            &json!({
                "key_id": &*key.id,
                "budget": budget,
                "days": days,
                "total": total,
                "cache_read_share": total.cache_read_share(),
                "tiers": {
                    "tokens_not_bought": "provider-reported usage of answers served from store: the only savings total",
                    "worst_case_tokens_avoided": "ceilings on refused calls, reported apart, never added",
                    "findings_tokens_estimated": "character-based estimates, never in any total",
                    "cache_saving": "derived and counterfactual, nano-USD: where the gate placed the prompt-cache breakpoints, what the cached tokens would have cost uncached minus what they did cost (read price plus write premium); never in spend, tokens_not_bought or any total",
                    "cache_saving_lifetimes": "derived and counterfactual, nano-USD: one-hour entries and 24-hour retention placed by the gate, what the rebuilds they avoided would have cost less the one-hour premium; in no total",
                    "cache_saving_routing": "derived and counterfactual, nano-USD: routing keys placed by the gate, what the reads on a spread route saved against the uncached price; in no total",
                    "cache_rebuilds": "provider-reported: calls that wrote the cache after a pause of their session, and (cache_rebuild, nano-USD) what those writes cost",
                    "cache_premium_1h": "provider-reported, nano-USD: what one-hour cache writes cost above five-minute ones",
                    "cache_read_share": "provider-reported: cache reads over all prompt tokens billed (input, cache writes, cache reads)"
                }
            }),
        )
    }

    /// `GET /ledger/decisions?from=&to=&limit=&after=&session=&format=csv`: one key's decisions
    /// (or every key's, admin) with their settlements, oldest first, a page at a time. `from`
    /// and `to` are UTC days (`YYYY-MM-DD`, both inclusive) or unix milliseconds (`to`
    /// exclusive); `after` is the `next_after` of the previous page; `session` one session's.
    async fn decisions(&self, req: &ApiRequest, key_id: Option<&str>) -> ApiResponse {
        let query = match decision_query(req, key_id) {
            Ok(query) => query,
            Err(resp) => return resp,
        };
        match self.gatekeeper.decision_page(&query).await {
            Ok(page) if req.query_param("format").as_deref() == Some("csv") => {
                let csv = crate::report::decisions_csv(&page);
                let resp = ApiResponse::text(200, "text/csv", csv);
                match page.next_after {
                    Some(next) => resp.with_header("x-tokensaver-next-after", next.to_string()),
                    None => resp,
                }
            }
            Ok(page) => ApiResponse::json(200, &page),
            Err(e) => e.into(),
        }
    }

    /// `GET /ledger/sessions?from=&to=&session=`: the decisions of the range grouped into
    /// agent sessions (SPEC §2.11a), the most recently active first. At most
    /// [`MAX_SESSION_DECISIONS`] decisions are read (the newest range first is the caller's to
    /// choose with `from`); `truncated` says when the range held more.
    async fn sessions(&self, req: &ApiRequest, key_id: Option<&str>) -> ApiResponse {
        let mut query = match decision_query(req, key_id) {
            Ok(query) => query,
            Err(resp) => return resp,
        };
        query.limit = crate::store::ledger::MAX_DECISIONS_PAGE;
        let mut lines = Vec::new();
        let truncated = loop {
            let page = match self.gatekeeper.decision_page(&query).await {
                Ok(page) => page,
                Err(e) => return e.into(),
            };
            lines.extend(page.decisions);
            match page.next_after {
                None => break false,
                Some(_) if lines.len() >= MAX_SESSION_DECISIONS => break true,
                Some(next) => query.after = Some(next),
            }
        };
        let sessions = crate::report::sessions_of(&lines);
        ApiResponse::json(200, &json!({"sessions": sessions, "truncated": truncated}))
    }

    async fn forget(&self, key: &KeyConfig) -> ApiResponse {
        match self.gatekeeper.forget_key(&key.id).await {
            Ok(()) => ApiResponse::json(200, &json!({"forgotten": true})),
            Err(e) => e.into(),
        }
    }

    /// The key's owner (`x-tokensaver-owner: <key_id>:<owner secret>`) lists, approves or
    /// denies its own holds; the key itself may list them (it already holds their ids).
    async fn owner_holds(&self, req: &ApiRequest, route: HoldRoute<'_>) -> ApiResponse {
        let owner = req.header("x-tokensaver-owner");
        if route == HoldRoute::List && owner.is_none() {
            return self
                .keyed(req, |k, _| {
                    holds::list(&self.gatekeeper, Some(&k.id), now_ms())
                })
                .await;
        }
        let Some((key_id, secret)) = owner.and_then(|v| v.split_once(':')) else {
            return ApiError::OwnerSecretRequired.into();
        };
        match self.gatekeeper.core.config.key(key_id) {
            Some(key) if auth::is_owner(key, Some(secret)) => {
                holds::decide(&self.gatekeeper, req, route, Some(&key.id), now_ms()).await
            }
            _ => ApiError::InvalidOwnerSecret.into(),
        }
    }

    /// `GET /economics?suite=&category=&model=&task=`: unknown parameters are refused.
    async fn economics(&self, req: &ApiRequest) -> ApiResponse {
        let Ok(query) = serde_urlencoded::from_str::<crate::economics::model::EconomicsQuery>(
            req.query.as_deref().unwrap_or(""),
        ) else {
            return ApiError::UnknownFilter.into();
        };
        // Files and 10 000 bootstrap resamples: the blocking pool's work, not a worker's.
        let config = self.gatekeeper.core.config.clone();
        let summary = tokio::task::spawn_blocking(move || {
            crate::economics::summary_for(&config, None, &query, now_ms())
        })
        .await;
        match summary {
            Ok(summary) => ApiResponse::json(200, &summary),
            Err(_) => ApiError::EconomicsUnavailable.into(),
        }
    }

    async fn put_budget(&self, req: &ApiRequest, key_id: &str) -> ApiResponse {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct BudgetBody {
            ceiling_micro_usd: Option<u64>,
            #[serde(default)]
            period: BudgetPeriod,
        }
        if self.gatekeeper.core.config.key(key_id).is_none() {
            return ApiError::UnknownKey.into();
        }
        let Ok(b) = serde_json::from_slice::<BudgetBody>(&req.body) else {
            return bad_json();
        };
        let ceiling_nano = b.ceiling_micro_usd.map(|c| c.saturating_mul(1000));
        match self
            .gatekeeper
            .put_budget(key_id, ceiling_nano, b.period, now_ms())
            .await
        {
            Ok(view) => ApiResponse::json(200, &view),
            Err(SetBudgetError::Shared(_)) => fleet_unavailable(),
            Err(SetBudgetError::Store(e)) => e.into(),
        }
    }

    async fn put_prices(&self, req: &ApiRequest) -> ApiResponse {
        let Ok(prices) = serde_json::from_slice::<BTreeMap<String, Prices>>(&req.body) else {
            return bad_json();
        };
        if prices.values().any(|p| p.max_output == 0) {
            return ApiError::InvalidPrices.into();
        }
        match self.gatekeeper.set_prices(&prices).await {
            Ok(()) => ApiResponse::json(200, &self.gatekeeper.policy().prices),
            Err(e) => e.into(),
        }
    }
}

fn unknown_decision() -> ApiResponse {
    ApiError::UnknownDecision.into()
}

pub fn gate_answer(outcome: &GateOutcome) -> serde_json::Value {
    json!({
        "verdict": outcome.decision.verdict,
        "decision_id": outcome.decision_id,
        "status": outcome.decision.status(),
        "reason": outcome.decision.reason(),
        "hold_id": outcome.decision.hold_id,
        "model_served": outcome.decision.model_served,
        // Where the local instance puts prompt-cache breakpoints before it calls the
        // provider (SPEC §2.11b): indices into the digest's `cache_points`.
        "cache_breakpoints": outcome.decision.cache_breakpoints,
        // Lifetimes, routing and retention, which the local instance writes into the body.
        "cache_ttl_1h": outcome.decision.cache_ttl_1h,
        "cache_routing_key": outcome.decision.cache_routing_key,
        "cache_retention": outcome.decision.cache_retention,
        "decision": outcome.decision,
        "receipt": *outcome.envelope,
    })
}

fn valid_day(d: &str) -> bool {
    d.len() == 10
        && d.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        })
}

/// The query of `GET /ledger/decisions` and `GET /ledger/sessions` (see [`Api::decisions`]).
fn decision_query(
    req: &ApiRequest,
    key_id: Option<&str>,
) -> Result<crate::store::DecisionQuery, ApiResponse> {
    let bound = |name: &str, end: bool| -> Result<Option<u64>, ()> {
        match req.query_param(name).as_deref() {
            None | Some("") => Ok(None),
            Some(v) if valid_day(v) => crate::store::day_start_ms(v)
                .and_then(|ms| u64::try_from(ms).ok())
                .map(|ms| Some(if end { ms + 86_400_000 } else { ms }))
                .ok_or(()),
            Some(v) => v.parse::<u64>().map(Some).map_err(drop),
        }
    };
    let (Ok(from_ms), Ok(to_ms)) = (bound("from", false), bound("to", true)) else {
        return Err(ApiError::InvalidTime.into());
    };
    let limit = match req.query_param("limit").map(|l| l.parse::<usize>()) {
        None => DEFAULT_DECISIONS_PAGE,
        Some(Ok(n)) if (1..=crate::store::ledger::MAX_DECISIONS_PAGE).contains(&n) => n,
        Some(_) => return Err(ApiError::InvalidLimit.into()),
    };
    // A cursor that is not a decision id names no decision: the store's own answer.
    let after = match req.query_param("after").filter(|a| !a.is_empty()) {
        None => None,
        Some(a) => match a.parse::<DecisionId>() {
            Ok(id) => Some(id),
            Err(_) => return Err(crate::store::StoreError::UnknownCursor.into()),
        },
    };
    let session = match req.query_param("session").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match tokensaver_core::request::Hash::from_hex(&s) {
            Some(h) => Some(h),
            None => return Err(ApiError::InvalidSession.into()),
        },
    };
    Ok(crate::store::DecisionQuery {
        key_id: key_id.map(str::to_string),
        from_ms,
        to_ms,
        after,
        limit,
        session,
    })
}
