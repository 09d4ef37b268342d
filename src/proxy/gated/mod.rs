//! A gated provider call, in order: [`read`] it (authenticate, read the body whole, parse
//! it, find the answer held for it), [`decide`] it (the gate's home: this process, a fleet,
//! or a central gate), [`enforce`] the decision (serve, refuse, or forward).

mod decide;
mod enforce;
mod read;

use std::sync::Arc;

use bytes::Bytes;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};

use super::{access, respond_error, GateProxy};
use crate::config::KeyConfig;
use crate::error::GateError;
use crate::receipt::DecisionId;
use crate::store::answers::{AnswerKey, StoredAnswer};
use tokensaver_core::gate::Verdict;
use tokensaver_core::request::{self, Route};

use crate::gatekeeper::CallerGone as Gone;

/// Ends when the client has closed its connection (its request body is read whole, so any
/// end of the stream now is the client going; bytes of a pipelined request are kept).
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
    pub(super) async fn handle_gated(
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
}
