//! Enforcing a decision: serve the held answer, refuse, or forward (`forward.rs`).

use bytes::Bytes;
use pingora::proxy::Session;
use pingora::Result;

use super::{Action, Decided, Gated, Issued, Placed};
use crate::error::GateError;
use crate::proxy::usage;
use crate::proxy::{access, forward, respond, respond_error, GateProxy};
use tokensaver_core::request::Route;

impl GateProxy {
    /// Do what the decision says: serve the held answer, refuse, or forward.
    pub(super) async fn enforce(
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
    pub(super) async fn forward(
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
