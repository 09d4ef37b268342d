//! Reading a gated call: who calls, its body (bounded, never a coding the gate does not
//! decode), its request shape, its session, and the answer held for it.

use bytes::Bytes;
use pingora::proxy::Session;
use pingora::Result;

use super::Gated;
use crate::auth;
use crate::error::GateError;
use crate::proxy::responses;
use crate::proxy::{access, GateProxy};
use crate::store::answers::AnswerKey;
use tokensaver_core::request::{self, Route};

impl GateProxy {
    /// Authenticate, answer `Expect: 100-continue`, read and parse the body, find the answer
    /// held for it.
    pub(super) async fn read_gated(
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
}

/// Read the whole request body, refusing more than `cap` bytes.
pub(super) async fn read_body(
    session: &mut Session,
    cap: usize,
) -> std::result::Result<Bytes, GateError> {
    crate::body::read_capped(session.as_downstream_mut(), cap)
        .await
        .map_err(GateError::from)
}
