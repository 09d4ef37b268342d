//! Reading a whole request body, bounded, and what the caller says beside it: shared by the
//! proxy and the API listeners.

use bytes::{Bytes, BytesMut};
use pingora::protocols::http::ServerSession;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Over the cap (by `Content-Length`, or by the bytes actually sent).
    TooLarge,
    /// The client's body could not be read (reset, bad framing).
    Unreadable,
}

/// How much of an oversized body is read and discarded before the 413 goes out: a client that
/// sends its whole body before reading (most SDKs) then sees the 413, not a reset connection.
/// Beyond this the connection is simply closed.
const DRAIN_LIMIT: usize = 16 * 1024 * 1024;

pub async fn read_capped(session: &mut ServerSession, cap: usize) -> Result<Bytes, BodyError> {
    let result = read_within(session, cap).await;
    if result == Err(BodyError::TooLarge) {
        drain(session).await;
    }
    result
}

async fn drain(session: &mut ServerSession) {
    let mut drained = 0usize;
    while drained < DRAIN_LIMIT {
        match session.read_request_body().await {
            Ok(Some(chunk)) => drained += chunk.len(),
            _ => break,
        }
    }
}

/// The body length the request declares (`content-length`), if it declares one.
pub fn declared_length(session: &ServerSession) -> Option<usize> {
    session
        .req_header()
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
}

/// The caller waits for `100 Continue` before it sends its body (RFC 9110 §10.1.1): an
/// HTTP/1.1 request with `expect: 100-continue` and a body to come. An HTTP/1.0 request's
/// expectation is ignored, as the RFC requires, and so is one on a request without a body.
pub fn expects_continue(session: &mut ServerSession) -> bool {
    let req = session.req_header();
    let asked = req.version == http::Version::HTTP_11
        && req
            .headers
            .get_all("expect")
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    asked && !session.is_body_empty()
}

/// One `100 Continue`, written before the body is read (pingora writes it once per request).
/// pingora closes a connection whose answer goes out before its body is read; that holds for
/// a final answer, not for this interim one, so the connection stays reusable once the body
/// is read and answered.
pub async fn write_continue(session: &mut ServerSession) -> pingora::Result<()> {
    session.set_close_on_response_before_downstream_finish(false);
    let written = session.write_continue_response().await;
    session.set_close_on_response_before_downstream_finish(true);
    written
}

async fn read_within(session: &mut ServerSession, cap: usize) -> Result<Bytes, BodyError> {
    let declared = declared_length(session);
    if declared.is_some_and(|len| len > cap) {
        return Err(BodyError::TooLarge);
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0));
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > cap {
                    return Err(BodyError::TooLarge);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body.freeze()),
            Err(_) => return Err(BodyError::Unreadable),
        }
    }
}

/// The session the client names in a header, the first of
/// [`SESSION_HEADERS`](tokensaver_core::request::session::SESSION_HEADERS) present and not empty.
pub fn session_header(headers: &http::HeaderMap) -> Option<&[u8]> {
    tokensaver_core::request::session::SESSION_HEADERS
        .iter()
        .filter_map(|name| headers.get(*name))
        .map(http::HeaderValue::as_bytes)
        .find(|value| !value.is_empty())
}

/// What the caller says beside the body: `x-tokensaver-human` (`1` a person attends, `0` none,
/// absent: the key's default) and `x-tokensaver-hold` (retrying an approved hold).
pub fn caller_headers(headers: &http::HeaderMap) -> (Option<bool>, Option<String>) {
    let header = |name| {
        headers
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
    };
    let human = match header("x-tokensaver-human") {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    };
    (human, header("x-tokensaver-hold").map(str::to_string))
}
