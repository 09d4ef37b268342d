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

async fn read_within(session: &mut ServerSession, cap: usize) -> Result<Bytes, BodyError> {
    let declared = session
        .req_header()
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
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
