//! Requests the gate does not decide: `GET /v1/models` (one upstream's, or the union of
//! several), a stored Responses object read back by the key that created it, and routes that
//! cost nothing; every billable path it does not gate is refused.

use pingora::proxy::Session;
use pingora::Result;

use super::{models, respond_error, responses, Ctx, GateProxy, ProviderPeer};
use crate::auth;
use crate::error::GateError;
use tokensaver_core::request::Provider;

/// Provider paths that are billable but not gated by this build: refused, so spend never
/// bypasses the gate.
pub(super) const UNGATED_BILLABLE: &[&str] = &[
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages/batches",
    "/v1/batches",
    "/v1/images/generations",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/moderations",
];

/// A pass-through answer that shows a stored Responses object, kept (bounded) until it ends.
pub(super) struct StoredRead {
    pub(super) id: String,
    pub(super) key_id: String,
    pub(super) status: u16,
    pub(super) body: Vec<u8>,
    /// The answer was larger than [`STORED_READ_CAP`]: not read.
    pub(super) overflow: bool,
}

/// How much of a pass-through Responses object is kept to read its usage.
pub(super) const STORED_READ_CAP: usize = 8 * 1024 * 1024;

/// A pass-through request, admitted: the gate answers its `Expect` (one `100 Continue`),
/// the expectation goes no further, and interim answers from upstream are not relayed
/// (pingora relays a `100` only to a request that still asks for one).
pub(super) async fn answer_expect_passthrough(session: &mut Session) -> Result<()> {
    if crate::body::expects_continue(session.as_downstream_mut()) {
        crate::body::write_continue(session.as_downstream_mut()).await?;
    }
    session.req_header_mut().remove_header("expect");
    session.as_downstream_mut().set_ignore_info_resp(true);
    Ok(())
}

/// A path the gate neither decides nor relays: a billable one it does not gate (never
/// forwarded, so spend never bypasses the gate), or no route at all.
pub(super) fn unserved(path: &str) -> GateError {
    if UNGATED_BILLABLE.iter().any(|p| path.starts_with(p)) {
        GateError::NotGated
    } else {
        GateError::UnknownRoute
    }
}

/// Where a request the gate does not decide goes, when it goes anywhere.
pub(super) enum PassRoute {
    /// `GET /v1/models` of a shape with several upstreams: answered here, as their union.
    ModelsUnion(Provider),
    /// Relayed to this upstream (`None`: the shape has none configured).
    Upstream(Option<ProviderPeer>),
}

impl GateProxy {
    /// The pass-through a path names: `GET /v1/models` (a model of one upstream, the union of
    /// several, or the shape's default) or a route that is not billable.
    pub(super) fn pass_route(
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
    pub(super) async fn pass(
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
