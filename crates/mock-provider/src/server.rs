//! The HTTP side of the mock: hyper's HTTP/1.1 server (keep-alive, pipelining, chunked bodies,
//! `Expect: 100-continue`, HTTP/1.0) around [`handle`], which decides every answer.
//!
//! The fault modes need what a well-behaved server never does: a TCP reset, or a FIN in the
//! middle of a body. Each connection therefore keeps a second handle on its socket; a reply
//! that cuts the connection sends a [`Cut`] to its connection task, which drops hyper's side
//! and then resets (`SO_LINGER` 0) or shuts down the socket through that handle. The bytes
//! hyper wrote before are already on the wire: hyper flushes a body's frames before it polls
//! the body again, and the cut is only sent from that next poll.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE,
};
use http::{Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Sleep;

use crate::{error_body, handle, Flavor, Reply, RequestHead, Shared, RESET_PAUSE_MS};

/// Largest request head (request line and header fields); above it hyper answers 431.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields in a request; above it hyper answers 431.
const MAX_HEADERS: usize = 256;

/// How a fault mode ends a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// TCP reset: `SO_LINGER` 0, then close.
    Reset,
    /// A normal close (FIN), whatever hyper was still expecting to write.
    Close,
}

pub(crate) fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

pub(crate) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let shared = Arc::clone(&shared);
                    let mut rx = shutdown.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            res = serve_connection(stream, shared) => {
                                if let Err(e) = res {
                                    tracing::debug!(error = %e, "mock provider connection ended");
                                }
                            }
                            _ = wait_shutdown(&mut rx) => {}
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "mock provider accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = wait_shutdown(&mut shutdown) => break,
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    // The second handle on the socket that a fault mode cuts the connection with.
    let socket = stream.into_std()?;
    let spare = socket.try_clone()?;
    let stream = TcpStream::from_std(socket)?;
    let (cut_tx, mut cut_rx) = mpsc::unbounded_channel::<Cut>();
    let service = service_fn(move |req| respond(Arc::clone(&shared), cut_tx.clone(), req));
    let mut conn = Box::pin(
        http1::Builder::new()
            .keep_alive(true)
            // A client that half-closes after its request still gets the answer.
            .half_close(true)
            .max_header_size(MAX_HEAD_BYTES)
            .max_headers(MAX_HEADERS)
            // Idle keep-alive connections stay open as long as the client wants (agents pause).
            .header_read_timeout(None)
            .auto_date_header(false)
            .serve_connection(TokioIo::new(stream), service),
    );
    let cut = tokio::select! {
        biased;
        res = conn.as_mut() => return res.map_err(io::Error::other),
        Some(cut) = cut_rx.recv() => cut,
    };
    // hyper's handle closes first; the socket itself ends with the spare handle.
    drop(conn);
    let mut spare = TcpStream::from_std(spare)?;
    match cut {
        Cut::Reset => spare.set_zero_linger()?,
        Cut::Close => {
            let _ = spare.shutdown().await;
        }
    }
    Ok(())
}

/// One request: read the body (bounded), let [`handle`] decide, turn its [`Reply`] into a
/// response.
async fn respond(
    shared: Arc<Shared>,
    cut: mpsc::UnboundedSender<Cut>,
    req: Request<Incoming>,
) -> Result<Response<ReplyBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let max_body = shared.opts.max_body_bytes;
    // A declared length above the limit is refused before a byte of it is read (and before
    // hyper sends `100 Continue`).
    if body.size_hint().lower() > max_body as u64 {
        return Ok(protocol_error(413, "request body too large"));
    }
    let body = match Limited::new(body, max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return Ok(protocol_error(413, "request body too large"))
        }
        Err(_) => return Ok(protocol_error(400, "malformed request body")),
    };
    // HTTP/1.0 without keep-alive: hyper closes after the answer; say so, as for HTTP/1.1.
    let http10_close = parts.version == Version::HTTP_10
        && !parts
            .headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("keep-alive"));
    let head = RequestHead {
        method: parts.method.as_str().to_owned(),
        target: parts.uri.to_string(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    };
    let outcome = handle(&shared, head, body);
    if let Some(d) = outcome.delay {
        tokio::time::sleep(d).await;
    }
    let pause = Duration::from_millis(shared.opts.stream_delay_ms);
    let mut resp = match outcome.reply {
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let mut resp = json_response(status, ReplyBody::whole(body));
            for (name, value) in headers {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    resp.headers_mut().insert(HeaderName::from_static(name), v);
                }
            }
            resp
        }
        Reply::Sse(events) => sse_response(ReplyBody::events(events, pause, End::Finish)),
        Reply::ResetNow => {
            // Nothing is sent: the connection task resets the socket and drops this future.
            let _ = cut.send(Cut::Reset);
            return std::future::pending().await;
        }
        Reply::ResetAfter(events) => sse_response(ReplyBody::events(
            events,
            Duration::ZERO,
            End::Cut {
                after: Duration::from_millis(RESET_PAUSE_MS),
                cut: Cut::Reset,
                tx: cut,
            },
        )),
        Reply::TruncatedFull(body) => {
            let full_len = body.len();
            let half = Bytes::from(body).slice(..full_len / 2);
            let mut resp = json_response(
                200,
                ReplyBody::events(
                    vec![half],
                    Duration::ZERO,
                    End::Cut {
                        after: Duration::ZERO,
                        cut: Cut::Close,
                        tx: cut,
                    },
                ),
            );
            resp.headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(full_len));
            resp
        }
        Reply::TruncatedSse(events) => sse_response(ReplyBody::events(
            events,
            Duration::ZERO,
            End::Cut {
                after: Duration::ZERO,
                cut: Cut::Close,
                tx: cut,
            },
        )),
    };
    if http10_close {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    // It says what it is on every answer, so evidence recorded against it is labelled a
    // simulation whatever the harness was told (`economics run --upstream`).
    resp.headers_mut().insert(
        HeaderName::from_static(crate::IDENTITY_HEADER),
        HeaderValue::from_static(crate::IDENTITY),
    );
    Ok(resp)
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn json_response(status: u16, body: ReplyBody) -> Response<ReplyBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status_code(status);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn sse_response(body: ReplyBody) -> Response<ReplyBody> {
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// A request the mock will not answer normally (body over the limit, broken chunked framing):
/// an OpenAI-shaped error, then the connection closes. Not counted, not recorded.
fn protocol_error(status: u16, message: &'static str) -> Response<ReplyBody> {
    let mut resp = json_response(
        status,
        ReplyBody::whole(error_body(Flavor::OpenAi, status, message)),
    );
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// What happens after a body's last part.
enum End {
    /// The body ends normally (last chunk, or the full length sent).
    Finish,
    /// After `after`, the connection is cut; the body never ends.
    Cut {
        after: Duration,
        cut: Cut,
        tx: mpsc::UnboundedSender<Cut>,
    },
    /// The cut is sent; waiting to be dropped.
    Cutting,
}

/// A response body: parts sent in order (one HTTP chunk each when chunked), `pause` apart,
/// then [`End`].
pub(crate) struct ReplyBody {
    parts: VecDeque<Bytes>,
    pause: Duration,
    sent_any: bool,
    paused: bool,
    sleep: Option<Pin<Box<Sleep>>>,
    end: End,
    exact_len: Option<u64>,
}

impl ReplyBody {
    fn whole(body: Vec<u8>) -> ReplyBody {
        let len = body.len() as u64;
        ReplyBody {
            parts: VecDeque::from([Bytes::from(body)]),
            pause: Duration::ZERO,
            sent_any: false,
            paused: false,
            sleep: None,
            end: End::Finish,
            exact_len: Some(len),
        }
    }

    fn events<T: Into<Bytes>>(parts: Vec<T>, pause: Duration, end: End) -> ReplyBody {
        ReplyBody {
            parts: parts.into_iter().map(Into::into).collect(),
            pause,
            sent_any: false,
            paused: false,
            sleep: None,
            end,
            exact_len: None,
        }
    }
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(sleep) = this.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.sleep = None;
                this.paused = true;
            }
            if !this.parts.is_empty() {
                if this.sent_any && !this.pause.is_zero() && !this.paused {
                    this.sleep = Some(Box::pin(tokio::time::sleep(this.pause)));
                    continue;
                }
                this.sent_any = true;
                this.paused = false;
                return Poll::Ready(this.parts.pop_front().map(|b| Ok(Frame::data(b))));
            }
            match std::mem::replace(&mut this.end, End::Cutting) {
                End::Finish => {
                    this.end = End::Finish;
                    return Poll::Ready(None);
                }
                End::Cut { after, cut, tx } if !after.is_zero() => {
                    this.sleep = Some(Box::pin(tokio::time::sleep(after)));
                    this.end = End::Cut {
                        after: Duration::ZERO,
                        cut,
                        tx,
                    };
                }
                End::Cut { cut, tx, .. } => {
                    // Everything before was flushed by hyper before it polled again; the
                    // connection task now ends the connection, and this body with it.
                    let _ = tx.send(cut);
                    return Poll::Pending;
                }
                End::Cutting => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty() && matches!(self.end, End::Finish)
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact_len {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
