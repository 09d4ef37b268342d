//! pingora's hooks: every request on the proxy listener enters here ([`ProxyHttp`]): a
//! gated route goes to [`super::gated`], anything else to [`super::passthrough`].

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use pingora::{Error, ErrorType, Result};

use super::passthrough::{unserved, STORED_READ_CAP};
use super::{access, forward, respond_error, responses, usage, Ctx, GateProxy};
use crate::error::GateError;
use crate::now_ms;
use tokensaver_core::request::Route;

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
