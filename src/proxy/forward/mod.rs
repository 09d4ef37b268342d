//! Forwarding an ALLOW or DOWNGRADE: write the upstream request through pingora's pooled
//! connector (once more on a new connection if a pooled one was found closed), relay the
//! answer as it arrives while keeping the decision's reservation live, capture the usage the
//! provider reports, and store the answer when it is complete, successful and reusable.

pub mod usage;

use std::ops::Range;

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::client::HttpSession;
use pingora::proxy::Session;
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType, Result};
use serde_json::{Map, Value};

use super::responses::Registry;
use super::{respond_error, ProviderPeer};
use crate::error::GateError;
use crate::gatekeeper::{Gatekeeper, RecordSource, UsageReport};
use crate::now_ms;
use crate::receipt::DecisionId;
use crate::store::answers::{AnswerKey, StoredAnswer};
use crate::store::Ending;
use tokensaver_core::gate::Billed;
use tokensaver_core::request::edit::{self, Edit};
use tokensaver_core::request::{self, CacheSite, Hash, Route, WireForm};
use usage::{json_usage, AnswerEnd, SseTap};

/// The one list of request headers that never go to the provider, on a gated call and on a
/// pass-through route alike (docs/routes-and-security.md, "Security"), beside every `x-tokensaver-*` header
/// ([`DROPPED_REQUEST_PREFIX`]) and any header the caller's `connection` names:
/// - the caller's credentials for this hop: its tokensaver key (`authorization`, `x-api-key`;
///   the provider's credential is set in their place), `proxy-authorization`, and `cookie`
///   (the ledger page's session);
/// - the downstream hop's own: connection management, `expect` (the gate answers it itself),
///   and the framing and host, which the gate writes for the upstream hop;
/// - `accept-encoding`: the gate asks for `identity`, since it reads the answers it relays.
const DROPPED_REQUEST_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "proxy-authorization",
    "cookie",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "host",
    "content-length",
    "transfer-encoding",
    "accept-encoding",
];

/// Every header of tokensaver's own (`x-tokensaver-human`, `-hold`, `-owner`, ...) is for the
/// gate, never for the provider.
const DROPPED_REQUEST_PREFIX: &str = "x-tokensaver-";

/// Of the dropped headers, those a pass-through request keeps: pingora's proxy path frames
/// the body it relays by them.
const PASSTHROUGH_FRAMING: &[&str] = &["content-length", "transfer-encoding"];

/// The header names the request's `connection` lists: hop-by-hop by the caller's word.
fn connection_listed(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Whether a request header stays on the gate's side (names are lowercase in `http`).
fn dropped(name: &str, listed: &[String]) -> bool {
    DROPPED_REQUEST_HEADERS.contains(&name)
        || name.starts_with(DROPPED_REQUEST_PREFIX)
        || listed.iter().any(|l| l == name)
}

/// A pass-through request (pingora's proxy path copies the caller's header): remove what
/// never goes upstream, keeping the framing; the caller then sets host and credential.
pub(super) fn strip_passthrough_headers(upstream: &mut RequestHeader) -> Result<()> {
    let listed = connection_listed(&upstream.headers);
    let names: Vec<http::HeaderName> = upstream
        .headers
        .keys()
        .filter(|n| dropped(n.as_str(), &listed) && !PASSTHROUGH_FRAMING.contains(&n.as_str()))
        .cloned()
        .collect();
    for name in names {
        upstream.remove_header(&name);
    }
    upstream.insert_header("accept-encoding", "identity")?;
    Ok(())
}

const DROPPED_RESPONSE_HEADERS: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
];

pub(super) struct Forward<'a> {
    pub route: Route,
    pub provider: &'a ProviderPeer,
    pub connector: &'a Connector,
    pub gatekeeper: &'a Gatekeeper,
    /// Where a Responses answer's id is bound to the caller's key (`responses.rs`).
    pub registry: &'a Registry,
    pub key_id: &'a str,
    /// The caller's fingerprint key: a stored response's answer identity is keyed with it.
    pub fingerprint_key: &'a [u8; 32],
    pub decision_id: DecisionId,
    pub served_model: &'a str,
    pub original: Bytes,
    pub downgrade: bool,
    pub stream: bool,
    pub wants_usage: bool,
    pub has_stream_options: bool,
    /// The model's string in `original` (`ParsedRequest::model_span`).
    pub model_span: Option<Range<usize>>,
    /// The gate's cache edits of the body (SPEC §2.11b): breakpoints, lifetimes, routing.
    pub cache: CacheEditPlan,
    pub reusable: bool,
    pub answer_key: AnswerKey,
    pub receipt_headers: Vec<(&'static str, String)>,
    /// The request's access-log facts: upstream status and timings are filled in here.
    pub access: &'a mut super::access::Access,
}

/// Interim (1xx) answers read past before the provider's answer; more is a broken provider.
const MAX_INTERIM: usize = 8;

/// The member that asks an OpenAI stream for its usage chunk.
const USAGE_OPTION: &[u8] = b",\"stream_options\":{\"include_usage\":true}";

/// How the upstream exchange ended.
struct Outcome {
    status: u16,
    /// What the provider reported (final only when `ending` is `Complete`).
    usage: Option<Billed>,
    ending: Ending,
    answer: Option<(String, Vec<u8>)>,
    /// The last bytes for the client, written once the answer is recorded and stored, so a
    /// client that repeats at once finds it.
    tail: Option<Bytes>,
    /// How the exchange failed, if it did.
    failure: Option<Failure>,
    /// When the provider's response header was read.
    answered_at: Option<std::time::Instant>,
}

impl Outcome {
    /// Until the request is written, nothing reached the provider.
    fn not_sent() -> Self {
        Outcome {
            status: 0,
            usage: None,
            ending: Ending::NotSent,
            answer: None,
            tail: None,
            failure: None,
            answered_at: None,
        }
    }

    /// Nothing went to the client yet: it gets a closed-form error.
    fn refused(mut self, err: GateError) -> Self {
        self.failure = Some(Failure::BeforeHeader(err));
        self
    }

    /// The answer to store, taken out: one kept whole that ended complete, successful and with
    /// its usage reported (a SERVE needs that usage).
    fn storable_answer(&mut self) -> Option<(String, Vec<u8>)> {
        let storable = self.ending == Ending::Complete
            && (200..300).contains(&self.status)
            && self.usage.is_some();
        self.answer.take().filter(|_| storable)
    }

    /// The answer was under way and ended for `cause` (an error status stays a refusal).
    fn broke_off(mut self, cause: Ending) -> Self {
        if self.ending != Ending::ProviderError {
            self.ending = cause;
        }
        self.failure = Some(Failure::MidStream);
        self
    }
}

impl Forward<'_> {
    /// What the registry keeps of a response this call created: its key, the upstream it
    /// lives on, and what is known of it so far.
    fn created(
        &self,
        context_tokens: Option<u64>,
        answer: Option<Hash>,
    ) -> super::responses::Owned {
        super::responses::Owned {
            key_id: self.key_id.to_string(),
            context_tokens,
            upstream: Some(self.provider.name().to_string()),
            answer,
        }
    }

    /// The body to send upstream: the caller's exact bytes unless the gate must change it
    /// (DOWNGRADE's model; the usage chunk asked for on the caller's behalf; the prompt-cache
    /// breakpoints the gate placed, SPEC §2.11b).
    fn upstream_body(&self) -> Result<(Bytes, bool)> {
        // Ask for usage on the caller's behalf; the extra chunk is stripped before it reaches a
        // client that did not ask for it.
        let strip = self.route == Route::OpenAiChat && self.stream && !self.wants_usage;
        if !self.downgrade && !strip && self.cache.is_empty() {
            return Ok((self.original.clone(), false));
        }
        // The usual cases edit the caller's bytes where the gate's reading found them: the
        // model's string replaced (DOWNGRADE), one member added before the closing `}` (the
        // streamed SDK call), the breakpoints at the offsets the reading recorded
        // (`ParsedRequest::cache_sites`).
        let model = match (self.downgrade, &self.model_span) {
            (false, _) => Some(None),
            (true, Some(span)) => Some(Some((span.clone(), self.served_model))),
            (true, None) => None,
        };
        if let (Some(model), false) = (model, strip && self.has_stream_options) {
            return match edited_body(&self.original, model, strip, &self.cache) {
                Some(bytes) => Ok((Bytes::from(bytes), strip)),
                None => Error::e_explain(ErrorType::InternalError, "request body edits"),
            };
        }
        // Rarer: options to merge into, or a model written under a repeated key: edit a map of
        // the body (the breakpoints already in it), which the gate has read as a JSON object
        // (serde_json accepts the same language, and writes each key once).
        let Some(marked) = edited_body(&self.original, None, false, &self.cache) else {
            return Error::e_explain(ErrorType::InternalError, "request body edits");
        };
        let Ok(mut body) = serde_json::from_slice::<Map<String, Value>>(&marked) else {
            return Error::e_explain(ErrorType::InternalError, "request body re-parse failed");
        };
        // The top-level members `edited_body` added are in `marked` already.
        if self.downgrade {
            body.insert("model".into(), Value::String(self.served_model.to_string()));
        }
        if strip {
            let mut options = match body.get("stream_options") {
                Some(Value::Object(o)) => o.clone(),
                _ => Map::new(),
            };
            options.insert("include_usage".into(), Value::Bool(true));
            body.insert("stream_options".into(), Value::Object(options));
        }
        let bytes = serde_json::to_vec(&body)
            .or_else(|_| Error::e_explain(ErrorType::InternalError, "request body rewrite"))?;
        Ok((Bytes::from(bytes), strip))
    }

    fn upstream_header(&self, session: &Session, len: usize) -> Result<RequestHeader> {
        let req = session.req_header();
        let sent = req
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or(self.route.path());
        let path = self
            .provider
            .path(Some(self.route), sent, self.served_model);
        let mut header =
            RequestHeader::build("POST", path.as_bytes(), Some(req.headers.len() + 4))?;
        let listed = connection_listed(&req.headers);
        for (name, value) in req.headers.iter() {
            if !dropped(name.as_str(), &listed) {
                header.append_header(name.clone(), value.clone())?;
            }
        }
        header.insert_header("host", self.provider.host_header.as_str())?;
        header.insert_header("content-length", len.to_string())?;
        header.insert_header("accept-encoding", "identity")?;
        self.provider
            .set_credential(&mut header, Some(self.key_id))?;
        Ok(header)
    }

    fn report(&self, usage: Option<Billed>, ending: Ending) -> UsageReport {
        UsageReport {
            key_id: self.key_id.to_string(),
            decision_id: self.decision_id,
            usage,
            served_model: self.served_model.to_string(),
            wire: if self.stream {
                WireForm::Sse
            } else {
                WireForm::Json
            },
            ending,
        }
    }

    pub(super) async fn run(self, session: &mut Session) -> Result<()> {
        self.access.model_served = super::access::Access::model(self.served_model);
        let prepared = self.upstream_body().and_then(|(body, strip)| {
            Ok((self.upstream_header(session, body.len())?, body, strip))
        });
        let (header, body, strip) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                // Nothing went upstream: the decision's reservation is released.
                record(self.gatekeeper, self.report(None, Ending::NotSent)).await;
                return Err(e);
            }
        };
        let sent_at = std::time::Instant::now();
        // While the answer is relayed (a silent wait for the provider's header, a pause in a
        // stream), this gate's tick keeps its reservation live in its home: here, the fleet's
        // database, or — a digest client's — the central gate (`POST /renew`).
        let relaying = self.gatekeeper.relaying(self.decision_id, now_ms());
        let mut outcome = self.exchange(session, header, body, strip).await;
        drop(relaying);
        self.access.upstream_ms = Some(sent_at.elapsed().as_secs_f64() * 1000.0);
        self.access.upstream_status = (outcome.status != 0).then_some(outcome.status);
        self.access.ttfb_ms = outcome
            .answered_at
            .map(|t| t.duration_since(self.access.started).as_secs_f64() * 1000.0);
        // Recorded, then stored, then the last bytes written: a client that repeats at once
        // finds the answer, and a SERVE never precedes its usage.
        record(self.gatekeeper, self.report(outcome.usage, outcome.ending)).await;
        if let Some(answer) = outcome.storable_answer().filter(|_| self.reusable) {
            self.keep(answer).await;
        }
        self.finish(session, outcome).await
    }

    /// Store a complete answer, cut once here, not at every SERVE to a client that did not
    /// ask for usage (a fleet keeps only the provider's bytes, and cuts on the way out).
    async fn keep(&self, (content_type, bytes): (String, Vec<u8>)) {
        let without_usage =
            (!self.gatekeeper.shared() && self.route == Route::OpenAiChat && self.stream)
                .then(|| Bytes::from(usage::strip_openai_usage_chunk(&bytes)));
        let answer = StoredAnswer {
            content_type,
            body: Bytes::from(bytes),
            without_usage,
        };
        self.gatekeeper
            .keep_answer(self.answer_key.clone(), answer)
            .await;
    }

    /// End the client's response: the last bytes, a closed-form error when nothing went out
    /// yet, or an abnormal end when the answer broke off mid-way.
    async fn finish(&self, session: &mut Session, mut outcome: Outcome) -> Result<()> {
        match outcome.failure.take() {
            None => {
                if session
                    .write_response_body(outcome.tail, true)
                    .await
                    .is_err()
                {
                    return pingora::Error::e_explain(ErrorType::WriteError, "client went away");
                }
                Ok(())
            }
            Some(Failure::BeforeHeader(err)) => {
                self.gatekeeper
                    .core
                    .metrics
                    .upstream_errors
                    .with_label_values(&[err.code()])
                    .inc();
                respond_error(session, Some(self.route), &err, &self.receipt_headers).await
            }
            Some(Failure::MidStream) => {
                self.gatekeeper
                    .core
                    .metrics
                    .upstream_errors
                    .with_label_values(&["mid_stream"])
                    .inc();
                // The header is out: end the downstream response abnormally so the client sees
                // a broken answer, never a complete-looking one.
                pingora::Error::e_explain(ErrorType::ReadError, "upstream answer broke off")
            }
        }
    }

    /// Send the request upstream, relay the header, then the body, and read how the answer
    /// ended and what the provider reported.
    async fn exchange(
        &self,
        session: &mut Session,
        header: RequestHeader,
        body: Bytes,
        strip: bool,
    ) -> Outcome {
        let mut outcome = Outcome::not_sent();
        let sent = self.send_until_answered(session, header, body, &mut outcome);
        let (mut upstream, peer) = match sent.await {
            Ok(answered) => answered,
            Err(err) => return outcome.refused(err),
        };
        outcome.answered_at = Some(std::time::Instant::now());
        let content_type = match self
            .relay_header(session, &mut upstream, &mut outcome)
            .await
        {
            Ok(Some(content_type)) => content_type,
            Ok(None) => {
                upstream.shutdown().await;
                return outcome.broke_off(Ending::ClientGone);
            }
            Err(err) => return outcome.refused(err),
        };
        self.relay_body(session, upstream, peer, content_type, strip, outcome)
            .await
    }

    /// Send the request and read the provider's header. A pooled connection the provider had
    /// already closed fails before any byte of an answer: the request cannot have been
    /// answered, so it is sent once more on a new connection, and that attempt's outcome alone
    /// counts (its connect failing is `NotSent`, never the worst case). As the digest client
    /// does (`gatekeeper/remote/client.rs`); nothing else is retried.
    async fn send_until_answered(
        &self,
        session: &Session,
        header: RequestHeader,
        body: Bytes,
        outcome: &mut Outcome,
    ) -> std::result::Result<(HttpSession, &HttpPeer), GateError> {
        // The header built for the request goes with the first attempt; a later one (rare: a
        // stale pooled connection, the upstream's next address) gets a header built afresh,
        // so the usual request pays for no copy of a header it sends once.
        let mut built = Some(header);
        let mut header_for_attempt = || match built.take() {
            Some(header) => Ok(header),
            None => self.upstream_header(session, body.len()).map_err(|_| {
                bad_gateway(
                    "upstream_write",
                    "could not send the request to the provider",
                )
            }),
        };
        let mut unreachable = None;
        // A connect that fails reached nobody: the upstream's next address is tried.
        for peer in self.provider.candidates() {
            let tried = match self
                .attempt(peer, header_for_attempt()?, body.clone(), outcome)
                .await
            {
                Err(Attempt::StaleConnection) => {
                    outcome.ending = Ending::NotSent;
                    let fresh = fresh_connection_peer(peer);
                    self.attempt(&fresh, header_for_attempt()?, body.clone(), outcome)
                        .await
                }
                other => other,
            };
            match tried {
                Err(Attempt::Unreachable(err)) => {
                    outcome.ending = Ending::NotSent;
                    unreachable = Some(err);
                }
                // The session goes back to the pool of the address it reached.
                other => return other.map(|s| (s, peer)).map_err(Attempt::into_error),
            }
        }
        Err(unreachable.unwrap_or_else(|| {
            bad_gateway("upstream_connect", "could not connect to the provider")
        }))
    }

    /// Connect, write the request and read up to the provider's final header. From the first
    /// byte written the provider may have received the request and billed it: every later
    /// failure settles at the worst case, unless it is a [`Attempt::StaleConnection`].
    async fn attempt(
        &self,
        peer: &HttpPeer,
        header: RequestHeader,
        body: Bytes,
        outcome: &mut Outcome,
    ) -> std::result::Result<HttpSession, Attempt> {
        let (mut upstream, reused) = self.connector.get_http_session(peer).await.map_err(|_| {
            Attempt::Unreachable(bad_gateway(
                "upstream_connect",
                "could not connect to the provider",
            ))
        })?;
        // pingora's connector does not carry the peer's timeouts into a session it hands out.
        upstream.set_read_timeout(peer.options.read_timeout);
        upstream.set_write_timeout(peer.options.write_timeout);
        outcome.ending = Ending::Unanswered;
        let sent = async {
            upstream.write_request_header(Box::new(header)).await?;
            upstream.write_request_body(body, true).await?;
            upstream.finish_request_body().await
        }
        .await;
        if sent.is_err() {
            // A write that fails on a pooled connection found it closed: a request the
            // provider never read whole is one it cannot answer or bill.
            return Err(if reused {
                Attempt::StaleConnection
            } else {
                Attempt::Failed(bad_gateway(
                    "upstream_write",
                    "could not send the request to the provider",
                ))
            });
        }
        self.read_final_header(&mut upstream, reused).await?;
        Ok(upstream)
    }

    /// Read past interim (1xx) answers to the provider's final header. The gate never sends
    /// `expect`, but a server may send interim answers anyway (RFC 9110 §15.2): they are read
    /// past, never relayed as the answer (the client had its one `100 Continue` from the
    /// gate). `101` is refused: no upgrade was asked for.
    async fn read_final_header(
        &self,
        upstream: &mut HttpSession,
        reused: bool,
    ) -> std::result::Result<(), Attempt> {
        let mut interim = 0;
        loop {
            if let Err(mut e) = crate::lifecycle::unless_cut(upstream.read_response_header()).await
            {
                e.retry.decide_reuse(reused);
                return Err(if interim == 0 && closed_before_answering(&e) {
                    Attempt::StaleConnection
                } else if is_timeout(&e) {
                    Attempt::Failed(GateError::UpstreamTimeout)
                } else {
                    Attempt::Failed(bad_gateway(
                        "upstream_reset",
                        "the provider closed the connection without answering",
                    ))
                });
            }
            let resp = upstream.response_header().ok_or_else(|| {
                Attempt::Failed(bad_gateway(
                    "upstream_header",
                    "the provider sent no response header",
                ))
            })?;
            if !resp.status.is_informational() {
                return Ok(());
            }
            interim += 1;
            if resp.status == http::StatusCode::SWITCHING_PROTOCOLS || interim > MAX_INTERIM {
                return Err(Attempt::Failed(bad_gateway(
                    "upstream_header",
                    "the provider sent an unexpected interim answer",
                )));
            }
        }
    }

    /// Relay the provider's header (read by [`Self::read_final_header`]) to the client, without
    /// hop headers, with the receipt. `Ok(None)`: the client went away.
    async fn relay_header(
        &self,
        session: &mut Session,
        upstream: &mut HttpSession,
        outcome: &mut Outcome,
    ) -> std::result::Result<Option<String>, GateError> {
        let resp = upstream.response_header().ok_or_else(|| {
            bad_gateway("upstream_header", "the provider sent no response header")
        })?;
        outcome.status = resp.status.as_u16();
        // An error status is the provider refusing the request: not billed, whatever follows.
        if !(200..300).contains(&outcome.status) {
            outcome.ending = Ending::ProviderError;
        }
        let content_type = resp
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        let is_sse = content_type.starts_with("text/event-stream");
        let mut down = ResponseHeader::build(resp.status, Some(resp.headers.len() + 3))
            .map_err(|_| bad_gateway("upstream_header", "the provider sent an invalid header"))?;
        for (name, value) in resp.headers.iter() {
            if !DROPPED_RESPONSE_HEADERS.contains(&name.as_str()) {
                let _ = down.append_header(name.clone(), value.clone());
            }
        }
        // A JSON answer passes with its length; a stream is chunked downstream, since it may be
        // re-framed (a stripped usage chunk) — except to an HTTP/1.0 client, which knows no
        // chunked coding (RFC 9112 §6.1): its answer ends when the connection closes.
        let http10 = session.req_header().version == http::Version::HTTP_10;
        match resp.headers.get("content-length").filter(|_| !is_sse) {
            Some(len) => {
                let _ = down.insert_header("content-length", len.clone());
            }
            None if http10 => session.set_keepalive(None),
            None => {
                let _ = down.insert_header("transfer-encoding", "chunked");
            }
        }
        for (name, value) in &self.receipt_headers {
            let _ = down.insert_header(*name, value.as_str());
        }
        let written = session.write_response_header(Box::new(down), false).await;
        Ok(written.is_ok().then_some(content_type))
    }

    /// Relay the answer as it arrives, keeping it for the store when it may be reused and
    /// reading the usage the provider reports.
    async fn relay_body(
        &self,
        session: &mut Session,
        mut upstream: HttpSession,
        peer: &HttpPeer,
        content_type: String,
        strip: bool,
        mut outcome: Outcome,
    ) -> Outcome {
        let success = (200..300).contains(&outcome.status);
        let is_sse = content_type.starts_with("text/event-stream");
        let mut reading = Reading::new(
            self.route,
            is_sse,
            strip,
            self.reusable && success,
            self.gatekeeper.core.config.answer_store_bytes,
        );
        // A stored Responses object is bound to the caller's key before its id reaches the
        // client: a stream's id before the event that carries it is written; a JSON answer's
        // last chunk is held back until the whole answer is read and its id bound.
        let binds = self.route == Route::OpenAiResponses && success;
        let mut bound_id = false;
        let mut held_back: Option<Bytes> = None;
        loop {
            match crate::lifecycle::unless_cut(upstream.read_response_body()).await {
                Ok(Some(chunk)) => {
                    let mut out = reading.take(chunk);
                    if binds && !is_sse {
                        out = held_back.replace(out).unwrap_or_default();
                    }
                    if let (true, false, Some(id)) = (binds, bound_id, reading.response_id()) {
                        bound_id = true;
                        self.registry
                            .bind(self.gatekeeper, id, self.created(None, None), now_ms())
                            .await;
                    }
                    if !out.is_empty()
                        && session.write_response_body(Some(out), false).await.is_err()
                    {
                        upstream.shutdown().await;
                        outcome.usage = reading.usage().0;
                        return outcome.broke_off(Ending::ClientGone);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let cause = if is_timeout(&e) {
                        Ending::Timeout
                    } else {
                        Ending::Reset
                    };
                    let rest = reading.finish();
                    if !rest.is_empty() {
                        let _ = session
                            .write_response_body(Some(Bytes::from(rest)), false)
                            .await;
                    }
                    upstream.shutdown().await;
                    outcome.usage = reading.usage().0;
                    return outcome.broke_off(cause);
                }
            }
        }
        let rest = reading.finish();
        let body_done = upstream.response_done();
        let (usage, end) = reading.usage();
        outcome.usage = usage;
        outcome.ending = ending_of(success, body_done, end, usage);
        if binds {
            let seen =
                super::responses::seen_in_answer(reading.tap.as_ref(), &reading.json_body, end);
            if let Some(id) = &seen.id {
                let answer = seen.output.as_deref().and_then(|output| {
                    request::answer_identity_of(output.as_bytes(), self.fingerprint_key)
                });
                let created = self.created(seen.context_tokens, answer);
                self.registry
                    .bind(self.gatekeeper, id, created, now_ms())
                    .await;
            }
        }
        if outcome.ending == Ending::Complete {
            outcome.answer = reading.into_answer().map(|answer| (content_type, answer));
        }
        outcome.tail = match held_back {
            Some(last) => Some(last),
            None => (!rest.is_empty()).then(|| Bytes::from(rest)),
        };
        if body_done {
            self.connector
                .release_http_session(upstream, peer, peer.options.idle_timeout)
                .await;
        }
        outcome
    }
}

/// How an answer that was read to its end ended.
fn ending_of(success: bool, body_done: bool, end: AnswerEnd, usage: Option<Billed>) -> Ending {
    match (success, body_done, end, usage) {
        (false, ..) => Ending::ProviderError,
        (true, false, ..) => Ending::Truncated,
        (true, true, AnswerEnd::Finished, Some(_)) => Ending::Complete,
        (true, true, AnswerEnd::Finished, None) => Ending::NoUsage,
        (true, true, AnswerEnd::ErrorEvent, _) => Ending::ErrorEvent,
        (true, true, AnswerEnd::Failed, _) => Ending::Failed,
        (true, true, AnswerEnd::Open, _) => Ending::Truncated,
    }
}

/// What the relay reads of an answer as it passes: a stream through the [`SseTap`] (usage,
/// end, the client's copy with the usage chunk cut when asked), a JSON answer whole (its usage
/// is read at the end), and for the store a copy of the answer while it fits the store's cap.
/// An answer larger than the store is relayed but never kept: no partial answer.
struct Reading {
    route: Route,
    tap: Option<SseTap>,
    json_body: Vec<u8>,
    /// The stream as received (a JSON answer's copy is `json_body`).
    stream_copy: Vec<u8>,
    /// Still whole and still wanted by the store.
    keeping: bool,
    cap: usize,
}

impl Reading {
    fn new(route: Route, is_sse: bool, strip: bool, keep: bool, cap: usize) -> Reading {
        Reading {
            route,
            tap: is_sse.then(|| SseTap::new(route, strip)),
            json_body: Vec::new(),
            stream_copy: Vec::new(),
            keeping: keep,
            cap,
        }
    }

    /// Read one chunk; the bytes for the client.
    fn take(&mut self, chunk: Bytes) -> Bytes {
        let held = match self.tap {
            Some(_) => self.stream_copy.len(),
            None => self.json_body.len(),
        };
        if self.keeping && held + chunk.len() > self.cap {
            self.keeping = false;
            self.stream_copy = Vec::new();
        }
        match self.tap.as_mut() {
            Some(tap) => {
                if self.keeping {
                    self.stream_copy.extend_from_slice(&chunk);
                }
                Bytes::from(tap.feed(&chunk))
            }
            None => {
                self.json_body.extend_from_slice(&chunk);
                chunk
            }
        }
    }

    /// A stream's response id, once an event carried it.
    fn response_id(&self) -> Option<&str> {
        self.tap.as_ref().and_then(SseTap::response_id)
    }

    /// What the tap still holds for the client when the answer ends.
    fn finish(&mut self) -> Vec<u8> {
        self.tap.as_mut().map(SseTap::finish).unwrap_or_default()
    }

    /// What the provider reported so far, and how its answer reads.
    fn usage(&self) -> (Option<Billed>, AnswerEnd) {
        match &self.tap {
            Some(t) => (t.usage(), t.end()),
            None => json_usage(self.route, &self.json_body),
        }
    }

    /// The whole answer as received, if the store still wants it.
    fn into_answer(self) -> Option<Vec<u8>> {
        let answer = match self.tap {
            Some(_) => self.stream_copy,
            None => self.json_body,
        };
        self.keeping.then_some(answer)
    }
}

/// The gate's cache edits of a forwarded body (SPEC §2.11b), at the offsets the reading
/// recorded: each billing only.
#[derive(Debug, Clone, Default)]
pub(super) struct CacheEditPlan {
    /// Where the breakpoints the gate placed go.
    pub sites: Vec<CacheSite>,
    /// One-hour entries: the placed breakpoints, and the caller's own markers without a `ttl`
    /// (which close at `mark_sites`), get `"ttl":"1h"`.
    pub one_hour: bool,
    pub mark_sites: Vec<usize>,
    /// OpenAI: the top-level members the gate adds before the body's closing brace
    /// (`body_close`): `prompt_cache_key`, `prompt_cache_retention`.
    pub routing_key: Option<String>,
    pub retention: bool,
    pub body_close: usize,
}

impl CacheEditPlan {
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty() && !self.one_hour && self.routing_key.is_none() && !self.retention
    }

    /// The top-level members it adds, as bytes (`,"name":value` each).
    fn members(&self) -> Vec<u8> {
        let mut with = Vec::new();
        if let Some(key) = &self.routing_key {
            with.extend_from_slice(b",\"prompt_cache_key\":");
            with.extend_from_slice(&serde_json::to_vec(key).unwrap_or_default());
        }
        if self.retention {
            with.extend_from_slice(br#","prompt_cache_retention":"24h""#);
        }
        with
    }
}

/// The caller's bytes with the gate's edits, applied in one pass in offset order, every other
/// byte as sent: `model`'s span replaced by the served model's JSON string (DOWNGRADE),
/// [`USAGE_OPTION`] before the closing `}` when `add_usage_option`, and the cache edits of
/// `cache`. `None` when an edit does not fit the bytes.
fn edited_body(
    original: &[u8],
    model: Option<(Range<usize>, &str)>,
    add_usage_option: bool,
    cache: &CacheEditPlan,
) -> Option<Vec<u8>> {
    let mut edits = Vec::with_capacity(cache.sites.len() + cache.mark_sites.len() + 3);
    for site in &cache.sites {
        edits.push(site.edit_with(original, cache.one_hour)?);
    }
    if cache.one_hour {
        for &close in &cache.mark_sites {
            (original.get(close) == Some(&b'}')).then_some(())?;
            edits.push(Edit {
                range: close..close,
                with: request::TTL_1H.to_vec(),
            });
        }
    }
    let members = cache.members();
    if !members.is_empty() {
        (original.get(cache.body_close) == Some(&b'}')).then_some(())?;
        edits.push(Edit {
            range: cache.body_close..cache.body_close,
            with: members,
        });
    }
    if let Some((range, served)) = model {
        let with = serde_json::to_vec(served).ok()?;
        edits.push(Edit { range, with });
    }
    if add_usage_option {
        let close = original.iter().rposition(|&b| b == b'}')?;
        edits.push(Edit {
            range: close..close,
            with: USAGE_OPTION.to_vec(),
        });
    }
    edit::apply(original, edits)
}

/// How one attempt at the provider failed.
enum Attempt {
    /// A pooled connection the provider had closed before any byte of an answer: the request
    /// may be sent once more on a new connection.
    StaleConnection,
    /// The connect failed: nothing was sent, another address may be tried.
    Unreachable(GateError),
    Failed(GateError),
}

impl Attempt {
    fn into_error(self) -> GateError {
        match self {
            Attempt::StaleConnection => bad_gateway(
                "upstream_reset",
                "the provider closed the connection without answering",
            ),
            Attempt::Unreachable(err) | Attempt::Failed(err) => err,
        }
    }
}

/// The pool group no connection is ever released into (sessions go back under the
/// provider's own peer): asking for it always opens a new connection.
const FRESH_CONNECTION_GROUP: u64 = u64::MAX;

/// The provider's peer under [`FRESH_CONNECTION_GROUP`]: pingora's connector takes a pooled
/// connection whenever the peer's pool has one, and the pool is chosen by the peer's hash.
fn fresh_connection_peer(peer: &HttpPeer) -> HttpPeer {
    let mut fresh = peer.clone();
    fresh.group_key = FRESH_CONNECTION_GROUP;
    fresh
}

/// pingora's verdict on a failed header read of a reused connection (`RetryType::ReusedOnly`,
/// decided by reuse: the connection closed or failed at the socket), narrowed to the case
/// where not one byte of the header had arrived. pingora 0.9.1 states that count only in the
/// error's context ("bytes already read: N"); were the wording to change, nothing would be
/// retried (the safe side), and `tests/proxy_upstream_reuse.rs` would fail.
fn closed_before_answering(e: &pingora::Error) -> bool {
    e.retry()
        && e.context
            .as_ref()
            .is_some_and(|c| c.as_str().ends_with("bytes already read: 0"))
}

fn bad_gateway(code: &'static str, message: &'static str) -> GateError {
    GateError::BadGateway { code, message }
}

/// The provider's usage to the gate's home: settled before the answer is stored or finished,
/// so a SERVE never precedes its usage; what a fleet cannot write is spooled; a digest client's
/// goes to its central gate in the background (the client has its answer; a drain waits).
pub(super) async fn record(gatekeeper: &Gatekeeper, report: UsageReport) {
    let _ = gatekeeper
        .settle(&report, RecordSource::Proxy, now_ms())
        .await;
}

enum Failure {
    /// Nothing was sent to the client yet: answer with a closed-form error.
    BeforeHeader(GateError),
    /// The answer was under way: cut it off.
    MidStream,
}

fn is_timeout(e: &pingora::Error) -> bool {
    matches!(
        e.etype(),
        ErrorType::ReadTimedout | ErrorType::WriteTimedout | ErrorType::ConnectTimedout
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokensaver_core::request::{parse_for_decision, Route};

    /// DOWNGRADE's model and the gate's breakpoints in one pass: the expected bytes are the
    /// caller's, written out by hand with the new model and the markers where they go.
    #[test]
    fn the_model_and_the_breakpoints_are_edited_in_one_pass() {
        let body = br#"{ "system": "be brief", "model" : "claude-sonnet-4-5", "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}], "max_tokens": 9 }"#;
        let parsed = parse_for_decision(Route::AnthropicMessages, body, &[3; 32]).unwrap();
        let span = parsed.model_span.clone().unwrap();
        let plan = CacheEditPlan {
            sites: parsed.cache_sites.clone(),
            ..CacheEditPlan::default()
        };
        let edited = edited_body(body, Some((span, "claude-haiku-4-5")), false, &plan).unwrap();
        let m = r#""cache_control":{"type":"ephemeral"}"#;
        let expected = format!(
            r#"{{ "system": [{{"type":"text","text":"be brief",{m}}}], "model" : "claude-haiku-4-5", "messages":[{{"role":"user","content":[{{"type":"text","text":"hi",{m}}}]}}], "max_tokens": 9 }}"#
        );
        assert_eq!(String::from_utf8(edited).unwrap(), expected);
        // No edit: the caller's bytes.
        let none = CacheEditPlan::default();
        assert_eq!(edited_body(body, None, false, &none).unwrap(), body);
    }

    #[test]
    fn the_usage_option_goes_before_the_closing_brace() {
        let body = br#"{"model":"gpt-4o","stream":true,"messages":[]} "#;
        let edited = edited_body(
            body,
            Some((9..17, "gpt-4o-mini")),
            true,
            &CacheEditPlan::default(),
        )
        .unwrap();
        assert_eq!(
            edited,
            br#"{"model":"gpt-4o-mini","stream":true,"messages":[],"stream_options":{"include_usage":true}} "#
        );
    }
}
