//! The proxy listener: provider-shaped traffic in, every verdict enforced.
//!
//! Gated routes (`POST /v1/chat/completions`, `POST /v1/messages`) are answered entirely in
//! `request_filter`: the whole body is read (bounded), the gate decides, and the verdict is
//! enforced there — SERVE, CHALLENGE and BLOCK answer at once and never reach upstream; ALLOW
//! and DOWNGRADE are forwarded by [`forward`] through pingora's pooled upstream connector. The
//! body is buffered before the decision, and pingora 0.9 only replays 64 KiB of a body read in
//! `request_filter`, so the gate writes the upstream request itself rather than hand the body
//! back to the proxy pipeline. `GET /v1/models` passes through pingora's normal proxy path.

mod access;
mod forward;
mod models;
pub mod responses;
pub mod usage;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use pingora::{Error, ErrorType, Result};

use crate::auth;
use crate::config::{Config, KeyConfig};
use crate::error::GateError;
use crate::gatekeeper::{AdmitError, GateRequest, Gatekeeper, RecordSource};
use crate::now_ms;
use crate::receipt::DecisionId;
use crate::store::answers::{AnswerKey, StoredAnswer};
use tokensaver_core::gate::Verdict;
use tokensaver_core::request::{self, Provider, Route};

/// Provider paths that are billable but not gated by this build: refused, so spend never
/// bypasses the gate.
const UNGATED_BILLABLE: &[&str] = &[
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages/batches",
    "/v1/batches",
    "/v1/images/generations",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/moderations",
];

pub use crate::upstreams::ProviderPeer;
use crate::upstreams::Upstreams;

pub struct GateProxy {
    pub gatekeeper: Arc<Gatekeeper>,
    connector: Connector,
    upstreams: Arc<Upstreams>,
    /// Which key created each stored Responses object (`responses.rs`).
    registry: responses::Registry,
}

impl GateProxy {
    pub fn new(gatekeeper: Arc<Gatekeeper>) -> std::io::Result<Self> {
        let config = gatekeeper.core.config.clone();
        let timeout = Duration::from_secs(config.upstream_timeout_secs);
        let upstreams = Arc::new(Upstreams::start(&config.upstreams, &config.keys, timeout)?);
        Ok(Self {
            gatekeeper,
            connector: Connector::new(None),
            upstreams,
            registry: responses::Registry::default(),
        })
    }

    fn config(&self) -> &Config {
        &self.gatekeeper.core.config
    }

    /// The key a pass-through request comes with: one of this gate's keys, or in digest mode
    /// the key this instance was given (the one its bindings are made for).
    fn passthrough_key(&self, presented: Option<&str>) -> Option<Arc<str>> {
        self.gatekeeper
            .authenticate(presented)
            .ok()
            .map(|(_, caller)| caller.key_id)
    }

    /// The configured upstreams, as they resolve now (`/readyz`); an upstream that does not
    /// resolve at start stops `serve` before it listens.
    pub fn upstreams(&self) -> Arc<Upstreams> {
        self.upstreams.clone()
    }
}

/// Per-request state: which provider a pass-through request goes to. It lives from the
/// request's header to the end of `logging`, and counts the request in flight for the drain.
pub struct Ctx {
    passthrough: Option<ProviderPeer>,
    /// Which of the pass-through's addresses is tried now (the next after a failed connect).
    attempt: usize,
    /// The facts of its access-log line.
    access: access::Access,
    /// A pass-through read of a stored Responses object (`GET /v1/responses/{id}`, `POST
    /// …/cancel`): its answer is read for the context figure the registry lacks.
    stored_read: Option<StoredRead>,
    _in_flight: crate::lifecycle::InFlight,
}

/// A pass-through answer that shows a stored Responses object, kept (bounded) until it ends.
struct StoredRead {
    id: String,
    key_id: String,
    status: u16,
    body: Vec<u8>,
    /// The answer was larger than [`STORED_READ_CAP`]: not read.
    overflow: bool,
}

/// How much of a pass-through Responses object is kept to read its usage.
const STORED_READ_CAP: usize = 8 * 1024 * 1024;

/// Write a complete response the gate produced itself.
pub(crate) async fn respond(
    session: &mut Session,
    status: u16,
    content_type: &str,
    body: Bytes,
    headers: &[(&'static str, String)],
) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(4 + headers.len()))?;
    resp.insert_header("content-type", content_type)?;
    resp.insert_header("content-length", body.len().to_string())?;
    for (name, value) in headers {
        resp.insert_header(*name, value.as_str())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

pub(crate) async fn respond_error(
    session: &mut Session,
    route: Option<Route>,
    err: &GateError,
    extra: &[(&'static str, String)],
) -> Result<()> {
    err.log();
    let mut headers: Vec<(&'static str, String)> = extra.to_vec();
    if err.no_retry() {
        headers.push(("x-should-retry", "false".into()));
    }
    if let Some(id) = err.hold_id() {
        headers.push(("x-tokensaver-hold", id.to_string()));
    }
    if let Some(secs) = err.retry_after_secs() {
        headers.push(("retry-after", secs.to_string()));
    }
    respond(
        session,
        err.status(),
        "application/json",
        err.body(route),
        &headers,
    )
    .await
}

/// A pass-through request, admitted: the gate answers its `Expect` (one `100 Continue`),
/// the expectation goes no further, and interim answers from upstream are not relayed
/// (pingora relays a `100` only to a request that still asks for one).
async fn answer_expect_passthrough(session: &mut Session) -> Result<()> {
    if crate::body::expects_continue(session.as_downstream_mut()) {
        crate::body::write_continue(session.as_downstream_mut()).await?;
    }
    session.req_header_mut().remove_header("expect");
    session.as_downstream_mut().set_ignore_info_resp(true);
    Ok(())
}

/// Read the whole request body, refusing more than `cap` bytes.
async fn read_body(session: &mut Session, cap: usize) -> std::result::Result<Bytes, GateError> {
    crate::body::read_capped(session.as_downstream_mut(), cap)
        .await
        .map_err(GateError::from)
}

/// A path the gate neither decides nor relays: a billable one it does not gate (never
/// forwarded, so spend never bypasses the gate), or no route at all.
fn unserved(path: &str) -> GateError {
    if UNGATED_BILLABLE.iter().any(|p| path.starts_with(p)) {
        GateError::NotGated
    } else {
        GateError::UnknownRoute
    }
}

/// Where a request the gate does not decide goes, when it goes anywhere.
enum PassRoute {
    /// `GET /v1/models` of a shape with several upstreams: answered here, as their union.
    ModelsUnion(Provider),
    /// Relayed to this upstream (`None`: the shape has none configured).
    Upstream(Option<ProviderPeer>),
}

impl GateProxy {
    /// The pass-through a path names: `GET /v1/models` (a model of one upstream, the union of
    /// several, or the shape's default) or a route that is not billable.
    fn pass_route(
        &self,
        method: &http::Method,
        path: &str,
        header: &pingora::http::RequestHeader,
    ) -> Option<PassRoute> {
        if !(path.starts_with("/v1/models") && method == http::Method::GET) {
            return not_billable(method, path)
                .map(|provider| PassRoute::Upstream(self.upstreams.default_of(provider)));
        }
        // Anthropic SDKs send x-api-key; OpenAI SDKs a bearer token.
        let (first, second) = if header.headers.contains_key("x-api-key") {
            (Provider::Anthropic, Provider::OpenAi)
        } else {
            (Provider::OpenAi, Provider::Anthropic)
        };
        let api = match self.upstreams.count_of(first) {
            0 => second,
            _ => first,
        };
        Some(match path.strip_prefix("/v1/models/") {
            Some(id) if !id.is_empty() => PassRoute::Upstream(self.upstreams.for_model(api, id)),
            _ if self.upstreams.count_of(api) > 1 => PassRoute::ModelsUnion(api),
            _ => PassRoute::Upstream(self.upstreams.default_of(api)),
        })
    }

    /// A pass-through, in order: the caller's key; a stored Responses object only for the key
    /// that created it, read back on its own upstream; the models union answered here; else
    /// relayed (`Ok(false)`: pingora goes on upstream).
    async fn pass(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        pass: PassRoute,
        method: &http::Method,
        path: &str,
    ) -> Result<bool> {
        let presented = auth::presented_key(&session.req_header().headers);
        let Some(key_id) = self.passthrough_key(presented) else {
            let err = GateError::InvalidKey(auth::AuthError::Invalid);
            respond_error(session, None, &err, &[]).await?;
            return Ok(true);
        };
        let mut upstream = match pass {
            PassRoute::ModelsUnion(api) => {
                ctx.access.route = "models_union";
                ctx.access.upstream = Some("*".into());
                models::answer_union(&self.connector, &self.upstreams, session, api).await?;
                return Ok(true);
            }
            PassRoute::Upstream(upstream) => upstream,
        };
        if let Some((id, tail)) = stored_response(path) {
            match self.registry.owner(&self.gatekeeper, id).await {
                Ok(Some(owned)) if *owned.key_id == *key_id => {
                    // Read back where it was created, with that upstream's credential.
                    if let Some(created_on) = owned.upstream.as_deref() {
                        upstream = self.upstreams.by_name(Provider::OpenAi, created_on);
                    }
                    if matches!((method.as_str(), tail), ("GET", "") | ("POST", "cancel")) {
                        ctx.stored_read = Some(StoredRead {
                            id: id.to_string(),
                            key_id: key_id.to_string(),
                            status: 0,
                            body: Vec::new(),
                            overflow: false,
                        });
                    }
                }
                Ok(_) => {
                    respond_error(session, None, &responses::not_found(), &[]).await?;
                    return Ok(true);
                }
                Err(responses::Unavailable) => {
                    respond_error(session, None, &GateError::fleet_unavailable(), &[]).await?;
                    return Ok(true);
                }
            }
        }
        ctx.access.key_id = Some(key_id.clone());
        let Some(p) = upstream else {
            respond_error(session, None, &unserved(path), &[]).await?;
            return Ok(true);
        };
        answer_expect_passthrough(session).await?;
        ctx.access.route = "passthrough";
        ctx.access.upstream = Some(p.name().to_string());
        ctx.passthrough = Some(p);
        Ok(false)
    }
}

/// Ends when the client has closed its connection (its request body is read whole, so any
/// end of the stream now is the client going; bytes of a pipelined request are kept).
use crate::gatekeeper::CallerGone as Gone;

fn caller_gone(session: &mut Session) -> Gone<'_> {
    Box::pin(async move {
        // `Ok` only for body bytes, which a request read whole no longer has; pingora pends
        // on pipelined bytes and errs on a close.
        while let Ok(Some(_)) = session.as_downstream_mut().read_body_or_idle(true).await {}
    })
}

/// Why a gated request got no decision to enforce.
enum Refusal {
    /// The caller left while the request was held: nothing to answer.
    CallerGone,
    Error(GateError),
}

impl From<GateError> for Refusal {
    fn from(e: GateError) -> Self {
        Refusal::Error(e)
    }
}

/// A decision as the proxy enforces it, whichever gate made it (local, or central in digest
/// mode): what to do, and the receipt that goes with it.
struct Decided {
    action: Action,
    receipt: Issued,
}

/// A decision's receipt as it goes out: the id its usage is recorded against, and the headers
/// every answer to the request carries.
struct Issued {
    decision_id: DecisionId,
    headers: Vec<(&'static str, String)>,
}

/// What a decision has the proxy do. The rule or band it came from is read into it at the
/// decision (the refusal's status and reason id), so enforcing it asks nothing again.
enum Action {
    /// SERVE: the answer the decision was made with, looked up once, before it.
    Serve(Arc<StoredAnswer>),
    /// ALLOW, or DOWNGRADE to `model_served`; with the prompt-cache breakpoints the gate
    /// placed (indices into the shape's `cache_points`).
    Forward {
        downgrade: bool,
        model_served: Option<String>,
        cache: CacheTermsPlaced,
    },
    /// CHALLENGE (the error names the hold) and BLOCK: a closed-form refusal.
    Refuse(GateError),
}

/// What a forwarded call's decision changes in the body: the model (DOWNGRADE) and the
/// prompt-cache breakpoints the gate placed.
struct Placed {
    downgrade: bool,
    model_served: Option<String>,
    cache: CacheTermsPlaced,
}

/// The cache edits a decision names (SPEC §2.11b), whichever gate made it: the breakpoints it
/// placed (indices into the shape's `cache_points`), one-hour lifetimes, the routing key and
/// the retention it adds.
#[derive(Debug, Clone, Default)]
struct CacheTermsPlaced {
    breakpoints: Vec<u16>,
    one_hour: bool,
    routing_key: Option<String>,
    retention: bool,
}

/// A decision's terms as either gate states them.
struct Terms {
    verdict: Verdict,
    status: u16,
    /// The rule, band or reason id, from the closed vocabulary.
    reason: &'static str,
    /// A budget refusal because the model has no price (known to the local gate only).
    unpriced: bool,
    hold_id: Option<String>,
    model_served: Option<String>,
    /// The cache edits the gate makes to the forwarded body (SPEC §2.11b).
    cache: CacheTermsPlaced,
}

/// A gated request as read, before the decision.
struct Gated<'c> {
    route: Route,
    /// Who calls: a key of this gate's config, or, in digest mode, the key this instance was
    /// given, which the central gate holds (its budget and profile are the central gate's).
    key: &'c KeyConfig,
    key_id: Arc<str>,
    /// The caller's fingerprint key (a stored response's answer identity is keyed with it).
    fingerprint_key: [u8; 32],
    body: Bytes,
    parsed: request::ParsedRequest,
    human: Option<bool>,
    hold_id: Option<String>,
    answer_key: AnswerKey,
    /// The answer held for this request, looked up once, before the decision that may
    /// serve it.
    stored: Option<Arc<StoredAnswer>>,
}

impl GateProxy {
    /// A gated provider call, in order: read it, decide it, enforce the decision.
    async fn handle_gated(
        &self,
        session: &mut Session,
        route: Route,
        access: &mut access::Access,
    ) -> Result<()> {
        let gated = match self.read_gated(session, route, access).await? {
            Ok(gated) => gated,
            Err(err) => {
                access.rule = Some(err.code());
                return respond_error(session, Some(route), &err, &[]).await;
            }
        };
        // While the gate holds the request (a paced step, or the central gate's answer), a
        // client that closes its connection is watched for: its request is then never decided.
        let decided = {
            let gone = caller_gone(session);
            self.decide(&gated, access, gone).await
        };
        match decided {
            Ok(decided) => self.enforce(session, gated, decided, access).await,
            Err(Refusal::CallerGone) => {
                access.rule = Some("caller_gone");
                // Nobody is there to answer: the connection is closed, nothing was decided.
                Error::e_explain(ErrorType::ConnectionClosed, "the caller left while held")
            }
            Err(Refusal::Error(err)) => {
                access.rule = Some(err.code());
                respond_error(session, Some(route), &err, &[]).await
            }
        }
    }

    /// Authenticate, answer `Expect: 100-continue`, read and parse the body, find the answer
    /// held for it.
    async fn read_gated(
        &self,
        session: &mut Session,
        route: Route,
        access: &mut access::Access,
    ) -> Result<std::result::Result<Gated<'_>, GateError>> {
        let config = self.config();
        let presented = auth::presented_key(&session.req_header().headers);
        let (key, caller) = match self.gatekeeper.authenticate(presented) {
            Ok(found) => {
                access.key_id = Some(found.1.key_id.clone());
                found
            }
            Err(e) => return Ok(Err(GateError::InvalidKey(e))),
        };
        // The gate prices the bytes it reads, so it reads what the provider would: a body in
        // a coding it does not decode is refused, never priced as plain and forwarded labelled.
        let coded = session
            .req_header()
            .headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        if coded {
            session.set_keepalive(None);
            return Ok(Err(GateError::UnsupportedEncoding));
        }
        if crate::body::expects_continue(session.as_downstream_mut()) {
            // The gate reads the body before anything goes upstream, so it answers the
            // client's `Expect` itself, once (curl otherwise waits a second before sending);
            // `expect` never goes upstream (`forward.rs`). A body declared over the cap is
            // refused first: the client is not asked for bytes the gate would refuse.
            if crate::body::declared_length(session.as_downstream_mut())
                .is_some_and(|len| len > config.max_body_bytes)
            {
                return Ok(Err(GateError::BodyTooLarge));
            }
            crate::body::write_continue(session.as_downstream_mut()).await?;
        }
        let body = match read_body(session, config.max_body_bytes).await {
            Ok(body) => body,
            Err(err) => return Ok(Err(err)),
        };
        // A digest carries every turn hash; this gate's own decision needs only some.
        let parse = if self.gatekeeper.sends_digest() {
            request::parse
        } else {
            request::parse_for_decision
        };
        let mut parsed = match parse(route, &body, &caller.fingerprint_key) {
            Ok(parsed) => parsed,
            Err(e) => return Ok(Err(GateError::from(e))),
        };
        access.model_requested = access::Access::model(&parsed.shape.model);
        // A model no upstream takes is refused before it is decided: nothing to book.
        if !self.upstreams.takes(route.provider(), &parsed.shape.model) {
            return Ok(Err(GateError::unknown_model(&parsed.shape.model)));
        }
        // A conversation is provider-side state the gate cannot bind to a key (it creates none:
        // `/v1/conversations` is not gated), so a call that names one is refused.
        if route == Route::OpenAiResponses && parsed.names_conversation {
            return Ok(Err(responses::conversation_not_gated()));
        }
        // A chained Responses call continues only a response this key created, and reserves
        // the context the provider bills again (`RequestShape::chained_input_tokens`). Its step
        // names the answer it continues (SPEC §2.1), never the response id.
        if let Some(previous) = parsed.previous_response_id.as_deref() {
            match self.registry.owner(&self.gatekeeper, previous).await {
                Ok(Some(owned)) if *owned.key_id == *caller.key_id => {
                    let Some(context) = owned.context_tokens else {
                        return Ok(Err(responses::context_unknown()));
                    };
                    parsed.shape.chained_input_tokens = context;
                    if let Some(answer) = owned.answer {
                        if let Some(step) =
                            request::chained_step(&body, &caller.fingerprint_key, &answer)
                        {
                            parsed.shape.step_fingerprint = step;
                            parsed.shape.step_action = None;
                        }
                    }
                }
                Ok(_) => return Ok(Err(responses::not_found())),
                Err(responses::Unavailable) => return Ok(Err(GateError::fleet_unavailable())),
            }
        }
        let headers = &session.req_header().headers;
        // A client that names its session (Claude Code, Codex) is grouped by that name.
        if let Some(named) = crate::body::session_header(headers) {
            parsed.shape.session =
                request::session::session_of_header(named, &caller.fingerprint_key);
        }
        let (human, hold_id) = crate::body::caller_headers(headers);
        let answer_key = AnswerKey {
            key_id: caller.key_id.clone(),
            fingerprint: parsed.shape.fingerprint,
            wire: parsed.shape.wire_form(),
        };
        let stored = self.gatekeeper.stored_answer(&answer_key).await;
        Ok(Ok(Gated {
            route,
            key,
            key_id: caller.key_id,
            fingerprint_key: caller.fingerprint_key,
            body,
            parsed,
            human,
            hold_id,
            answer_key,
            stored,
        }))
    }

    /// The decision, from the gate's home: this process (SQLite), a fleet's PostgreSQL, or in
    /// digest mode the central gate. Each fails closed: no decision, nothing upstream.
    async fn decide(
        &self,
        g: &Gated<'_>,
        access: &mut access::Access,
        gone: Gone<'_>,
    ) -> std::result::Result<Decided, Refusal> {
        let request = GateRequest {
            key: g.key,
            shape: &g.parsed.shape,
            human: g.human,
            held: g.stored.is_some(),
            hold_id: g.hold_id.as_deref(),
            now_ms: now_ms(),
            recorded_by: RecordSource::Proxy,
        };
        // A repeated step may be held here until its window admits it (SPEC §2.3), or at the
        // central gate.
        let holding = crate::gatekeeper::Holding {
            bytes: g.body.len(),
            gone,
        };
        let outcome = match self.gatekeeper.admit(&request, holding).await {
            Ok(outcome) => outcome,
            Err(AdmitError::CallerGone) => return Err(Refusal::CallerGone),
            Err(AdmitError::Unavailable(_)) => return Err(GateError::fleet_unavailable().into()),
            Err(AdmitError::GateUnreachable) => return Err(GateError::GateUnreachable.into()),
        };
        let d = &outcome.decision;
        let terms = Terms {
            verdict: d.verdict,
            status: d.status(),
            reason: d.reason(),
            // A worst case without a cost is one without a price (`rules::worst_case`).
            unpriced: d.rule == Some(tokensaver_core::gate::Rule::ExceedsRemainingBudget)
                && d.worst_case.cost_nano.is_none(),
            hold_id: d.hold_id.clone(),
            model_served: d.model_served.clone(),
            cache: CacheTermsPlaced {
                breakpoints: d.cache_breakpoints.clone(),
                one_hour: d.cache_ttl_1h,
                routing_key: d.cache_routing_key.clone(),
                retention: d.cache_retention,
            },
        };
        access.decided(
            &terms.verdict,
            terms.reason,
            outcome.decision_id,
            &terms.model_served,
        );
        Ok(self.decided(g, terms, &outcome.envelope, outcome.decision_id))
    }

    /// A decision's terms and receipt, as the proxy enforces them.
    fn decided(
        &self,
        g: &Gated<'_>,
        terms: Terms,
        envelope: &crate::receipt::Envelope,
        decision_id: DecisionId,
    ) -> Decided {
        let headers = receipt_headers(terms.verdict, envelope);
        Decided {
            action: self.action(g, terms),
            receipt: Issued {
                decision_id,
                headers,
            },
        }
    }

    /// What the proxy does with a verdict: serve the answer held for it, forward, or refuse.
    fn action(&self, g: &Gated<'_>, t: Terms) -> Action {
        // A refusal for want of a price says so, whatever the verdict.
        // A CHALLENGE stays a CHALLENGE (SPEC §2.11, §2.12): its hold id in the body and the
        // `x-tokensaver-hold` header, like every hold.
        if t.unpriced {
            let model = &g.parsed.shape.model;
            let held = t.verdict == Verdict::Challenge;
            let hold_id = t.hold_id.filter(|_| held);
            return Action::Refuse(GateError::unpriced_model(t.status, model, held, hold_id));
        }
        match t.verdict {
            // The local gate serves only what `stored` holds; a central gate that says SERVE
            // for an answer this instance does not hold breaks the protocol.
            Verdict::Serve => match &g.stored {
                Some(answer) => Action::Serve(answer.clone()),
                None => Action::Refuse(GateError::AnswerMissing),
            },
            Verdict::Challenge => {
                let ttl = self.gatekeeper.hold_ttl_ms();
                Action::Refuse(GateError::held(t.reason, t.hold_id, ttl))
            }
            Verdict::Block => Action::Refuse(GateError::Blocked {
                status: t.status,
                reason: t.reason,
            }),
            Verdict::Allow | Verdict::Downgrade => Action::Forward {
                downgrade: t.verdict == Verdict::Downgrade,
                model_served: t.model_served,
                cache: t.cache,
            },
        }
    }

    /// Do what the decision says: serve the held answer, refuse, or forward.
    async fn enforce(
        &self,
        session: &mut Session,
        g: Gated<'_>,
        decided: Decided,
        access: &mut access::Access,
    ) -> Result<()> {
        let route = g.route;
        let Decided { action, receipt } = decided;
        let headers = &receipt.headers;
        match action {
            Action::Serve(answer) => {
                let shape = &g.parsed.shape;
                let body = if route == Route::OpenAiChat && shape.stream && !g.parsed.include_usage
                {
                    match &answer.without_usage {
                        Some(cut) => cut.clone(),
                        // The fleet's answers are read per request: cut on the way out.
                        None => Bytes::from(usage::strip_openai_usage_chunk(&answer.body)),
                    }
                } else {
                    answer.body.clone()
                };
                respond(session, 200, &answer.content_type, body, headers).await
            }
            Action::Refuse(err) => respond_error(session, Some(route), &err, headers).await,
            Action::Forward {
                downgrade,
                model_served,
                cache,
            } => {
                let placed = Placed {
                    downgrade,
                    model_served,
                    cache,
                };
                self.forward(session, g, receipt, placed, access).await
            }
        }
    }

    /// ALLOW and DOWNGRADE: send the request upstream and relay the answer (`forward.rs`).
    async fn forward(
        &self,
        session: &mut Session,
        g: Gated<'_>,
        receipt: Issued,
        placed: Placed,
        access: &mut access::Access,
    ) -> Result<()> {
        let Placed {
            downgrade,
            model_served,
            cache,
        } = placed;
        let shape = &g.parsed.shape;
        let served_model = model_served.unwrap_or_else(|| shape.model.clone());
        // The served model routes: a DOWNGRADE may go to another upstream of the shape.
        let Some(provider) = self.upstreams.for_model(g.route.provider(), &served_model) else {
            let err = GateError::unknown_model(&served_model);
            forward::record(
                &self.gatekeeper,
                crate::gatekeeper::UsageReport {
                    key_id: g.key_id.to_string(),
                    decision_id: receipt.decision_id,
                    usage: None,
                    served_model,
                    wire: shape.wire_form(),
                    ending: crate::store::Ending::NotSent,
                },
            )
            .await;
            return respond_error(session, Some(g.route), &err, &receipt.headers).await;
        };
        access.upstream = Some(provider.name().to_string());
        let job = forward::Forward {
            route: g.route,
            provider: &provider,
            connector: &self.connector,
            gatekeeper: &self.gatekeeper,
            registry: &self.registry,
            key_id: &g.key_id,
            fingerprint_key: &g.fingerprint_key,
            decision_id: receipt.decision_id,
            served_model: &served_model,
            original: g.body,
            downgrade,
            stream: shape.stream,
            wants_usage: g.parsed.include_usage,
            has_stream_options: g.parsed.has_stream_options,
            model_span: g.parsed.model_span.clone(),
            cache: forward::CacheEditPlan {
                sites: cache
                    .breakpoints
                    .iter()
                    .filter_map(|&i| g.parsed.cache_sites.get(usize::from(i)).cloned())
                    .collect(),
                one_hour: cache.one_hour,
                mark_sites: g.parsed.cache_mark_sites.clone(),
                routing_key: cache.routing_key,
                retention: cache.retention,
                body_close: g.parsed.body_close,
            },
            reusable: shape.reproducible(),
            answer_key: g.answer_key,
            receipt_headers: receipt.headers,
            access,
        };
        job.run(session).await
    }
}

fn receipt_headers(
    verdict: Verdict,
    envelope: &crate::receipt::Envelope,
) -> Vec<(&'static str, String)> {
    vec![
        ("x-tokensaver-verdict", verdict.as_str().to_string()),
        ("x-tokensaver-receipt", envelope.to_header_value()),
    ]
}

/// What every request on the proxy listener must be before it is routed:
/// - HTTP/1.1 carries `Host` (RFC 9112 §3.2: a server answers 400 without it);
/// - its path reads the same to the gate as to any server behind it: no `.` or `..` segment,
///   no percent-encoded dot, slash or backslash, no backslash. A front or an origin that
///   normalises paths would otherwise read `/v1/models/x/../../responses/{id}` — a model read the
///   gate passes — as another key's stored response.
fn well_formed(header: &RequestHeader) -> std::result::Result<(), GateError> {
    if header.version == http::Version::HTTP_11 && !header.headers.contains_key(http::header::HOST)
    {
        return Err(GateError::MissingHost);
    }
    let path = header.uri.path();
    let dot_segment = path
        .split('/')
        .any(|segment| segment == "." || segment == "..");
    let lower = path.to_ascii_lowercase();
    let encoded = ["%2e", "%2f", "%5c"].iter().any(|e| lower.contains(e));
    if dot_segment || encoded || path.contains('\\') {
        return Err(GateError::InvalidPath);
    }
    Ok(())
}

/// `/v1/responses/{id}` and `/v1/responses/{id}/{tail}`: the stored object's id and the tail.
fn stored_response(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v1/responses/")?;
    Some(rest.split_once('/').unwrap_or((rest, "")))
}

/// Provider routes that cost nothing and are passed through after the key check: reading,
/// deleting or cancelling a stored response, and counting a prompt's tokens.
fn not_billable(method: &http::Method, path: &str) -> Option<Provider> {
    if method == http::Method::POST && path == "/v1/messages/count_tokens" {
        return Some(Provider::Anthropic);
    }
    let rest = path.strip_prefix("/v1/responses/")?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if id.is_empty() || tail.contains('/') {
        return None;
    }
    let allowed = matches!(
        (method.as_str(), tail),
        ("GET" | "DELETE", "") | ("GET", "input_items") | ("POST", "cancel")
    );
    allowed.then_some(Provider::OpenAi)
}

#[async_trait]
impl ProxyHttp for GateProxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            passthrough: None,
            attempt: 0,
            access: access::Access::new(),
            stored_read: None,
            _in_flight: crate::lifecycle::enter(),
        }
    }

    async fn early_request_filter(&self, session: &mut Session, _ctx: &mut Ctx) -> Result<()> {
        // Requests pipelined behind this one (sent before its answer) are answered in order,
        // one after the other (RFC 9112 §9.3.2); pingora's default drops them and closes.
        session.as_downstream_mut().set_pipelining_enabled(true);
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        if let Err(err) = well_formed(session.req_header()) {
            ctx.access.rule = Some(err.code());
            session.set_keepalive(None);
            respond_error(session, None, &err, &[]).await?;
            return Ok(true);
        }
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        if let Some(route) = Route::from_path(&path) {
            ctx.access.route = route.path();
            if method == http::Method::POST {
                self.handle_gated(session, route, &mut ctx.access).await?;
            } else {
                let err = GateError::MethodNotAllowed;
                respond_error(session, Some(route), &err, &[]).await?;
            }
            return Ok(true);
        }
        match self.pass_route(&method, &path, session.req_header()) {
            Some(pass) => self.pass(session, ctx, pass, &method, &path).await,
            None => {
                respond_error(session, None, &unserved(&path), &[]).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(read) = ctx.stored_read.as_mut() {
            read.status = upstream_response.status.as_u16();
        }
        ctx.access.upstream_status = Some(upstream_response.status.as_u16());
        ctx.access.ttfb_ms = Some(ctx.access.started.elapsed().as_secs_f64() * 1000.0);
        Ok(())
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<Option<Duration>> {
        if let (Some(read), Some(chunk)) = (ctx.stored_read.as_mut(), body.as_ref()) {
            if read.body.len() + chunk.len() > STORED_READ_CAP {
                read.overflow = true;
                read.body = Vec::new();
            } else if !read.overflow {
                read.body.extend_from_slice(chunk);
            }
        }
        Ok(None)
    }

    /// A pass-through read of a stored Responses object that shows its usage fills in the
    /// context figure the registry lacked (a background response, read back complete).
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let status = session.response_written().map(|h| h.status.as_u16());
        let down = session.as_downstream();
        ctx.access.finish(
            &self.gatekeeper.core.metrics,
            status,
            down.body_bytes_read(),
            down.body_bytes_sent(),
            self.config().access_log,
        );
        let Some(read) = ctx.stored_read.take() else {
            return;
        };
        if e.is_some() || read.overflow || !(200..300).contains(&read.status) {
            return;
        }
        let Some(seen) = usage::response_seen(&read.body) else {
            return;
        };
        if seen.id == read.id && seen.context_tokens.is_some() {
            let known = responses::Owned {
                key_id: read.key_id,
                context_tokens: seen.context_tokens,
                upstream: ctx.passthrough.as_ref().map(|p| p.name().to_string()),
                answer: None,
            };
            self.registry
                .bind(&self.gatekeeper, &read.id, known, now_ms())
                .await;
        }
    }

    /// What an error line says of the request: its method and the route it took, never its
    /// target or headers (pingora's default quotes the whole request-target, which is the
    /// caller's to fill: a keyless caller could write the log at will).
    fn request_summary(&self, session: &Session, ctx: &Ctx) -> String {
        format!("{} {}", session.req_header().method, ctx.access.route)
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        match ctx
            .passthrough
            .as_ref()
            .and_then(|p| p.candidates().nth(ctx.attempt))
        {
            Some(peer) => Ok(Box::new(peer.clone())),
            None => Error::e_explain(ErrorType::InternalError, "no upstream for this request"),
        }
    }

    /// A pass-through whose connect failed is tried on the upstream's next address, once each.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let Some(p) = &ctx.passthrough {
            if ctx.attempt < p.fallbacks() {
                ctx.attempt += 1;
                e.set_retry(true);
            }
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(p) = &ctx.passthrough {
            forward::strip_passthrough_headers(upstream)?;
            upstream.insert_header("host", p.host_header.as_str())?;
            p.set_credential(upstream, ctx.access.key_id.as_deref())?;
            let sent = upstream.uri.path_and_query().map_or("/", |p| p.as_str());
            let path = p.path(None, sent, "");
            if path != sent {
                let uri = path.parse::<http::Uri>().or_else(|_| {
                    Error::e_explain(ErrorType::InternalError, "upstream path rewrite")
                })?;
                upstream.set_uri(uri);
            }
        }
        Ok(())
    }
}
