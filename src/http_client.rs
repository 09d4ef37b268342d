//! The one HTTP client: pingora's pooled connector, the stack the proxy already forwards with,
//! for every exchange whose answer is read whole — the digest-mode client of a central gate
//! (`gatekeeper/remote/client.rs`), the upstreams' model lists (`proxy/models.rs`), and the command line
//! talking to a running server (`tokensaver holds`, `tokensaver health`, `tokensaver demo`).
//! The proxy's forwarding streams its answers as they arrive and stays in `proxy/forward/`.
//!
//! [`exchange`] is the one place a request is written and its answer read, bounded;
//! [`HttpClient`] is one origin's client on it, and [`BlockingClient`] the same for the
//! command line, which runs no runtime of its own.

use std::net::ToSocketAddrs;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method};
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;

use crate::config::parse_origin;

/// Why no answer was read.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection could be made (refused, unreachable, timed out, TLS refused).
    #[error("could not connect: {}", trimmed(.0))]
    Connect(Box<pingora::Error>),
    /// Connected, but writing the request or reading the answer failed or timed out.
    #[error("the exchange failed: {}", trimmed(.0))]
    Exchange(Box<pingora::Error>),
    /// A method, path or header value HTTP does not allow.
    #[error("the request is not valid HTTP: {}", trimmed(.0))]
    InvalidRequest(Box<pingora::Error>),
    /// The answer is longer than the caller reads.
    #[error("the answer is longer than {0} bytes")]
    TooLarge(usize),
    /// The whole exchange took longer than the caller waits ([`BlockingClient`]).
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// pingora's error text (its type, context and cause) starts with a space where it names no
/// side of the proxy.
fn trimmed(e: &pingora::Error) -> String {
    e.to_string().trim().to_string()
}

/// Why a client for an origin could not be made.
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    /// [`parse_origin`]'s closed-form reason.
    #[error("the URL {0}")]
    NotAnOrigin(&'static str),
    #[error("the URL's host has no address")]
    NoAddress,
}

/// An answer read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// A header's value, if it is present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// An error status (4xx, 5xx).
    pub fn is_error(&self) -> bool {
        self.status >= 400
    }
}

/// One request to an [`HttpClient`]'s origin.
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    /// The path and query.
    path: String,
    headers: Vec<(String, String)>,
    /// `None`: no body and no `content-length` (a GET); `Some`, even empty: a body of that
    /// length.
    body: Option<Bytes>,
}

impl Request {
    pub fn get(path: impl Into<String>) -> Self {
        Self {
            method: Method::GET,
            path: path.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn post(path: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self {
            method: Method::POST,
            path: path.into(),
            headers: Vec::new(),
            body: Some(body.into()),
        }
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }
}

/// One exchange with `peer`: the request written (with its body's `content-length`), the
/// answer read whole, at most `max_answer_bytes` of it, and the connection put back in the
/// connector's pool. How long each step may take is the peer's options (connect, read and
/// write timeouts; idle time in the pool).
///
/// A pooled connection the server had already closed is retried once on a new one, by
/// pingora's own rule (`RetryType::ReusedOnly`: the request cannot have reached the server);
/// nothing else is retried.
pub async fn exchange(
    connector: &Connector,
    peer: &HttpPeer,
    request: &RequestHeader,
    body: Option<&Bytes>,
    max_answer_bytes: usize,
) -> Result<Answer, ClientError> {
    match attempt(connector, peer, request, body, max_answer_bytes).await {
        Err(Attempt::Retry(_)) => attempt(connector, peer, request, body, max_answer_bytes)
            .await
            .map_err(Attempt::into_error),
        other => other.map_err(Attempt::into_error),
    }
}

/// One attempt's failure: retry it on a new connection, or give up.
enum Attempt {
    Retry(Box<pingora::Error>),
    Failed(ClientError),
}

impl Attempt {
    fn into_error(self) -> ClientError {
        match self {
            Attempt::Retry(e) => ClientError::Exchange(e),
            Attempt::Failed(e) => e,
        }
    }
}

async fn attempt(
    connector: &Connector,
    peer: &HttpPeer,
    request: &RequestHeader,
    body: Option<&Bytes>,
    max_answer_bytes: usize,
) -> Result<Answer, Attempt> {
    let (mut session, reused) = connector
        .get_http_session(peer)
        .await
        .map_err(|e| Attempt::Failed(ClientError::Connect(e)))?;
    let failed = |mut e: Box<pingora::Error>| {
        e.retry.decide_reuse(reused);
        if e.retry() {
            Attempt::Retry(e)
        } else {
            Attempt::Failed(ClientError::Exchange(e))
        }
    };
    let mut header = request.clone();
    if let Some(body) = body {
        header
            .insert_header("content-length", body.len().to_string())
            .map_err(|e| Attempt::Failed(ClientError::InvalidRequest(e)))?;
    }
    session
        .write_request_header(Box::new(header))
        .await
        .map_err(failed)?;
    if let Some(body) = body.filter(|b| !b.is_empty()) {
        session
            .write_request_body(body.clone(), true)
            .await
            .map_err(failed)?;
    }
    session.finish_request_body().await.map_err(failed)?;
    session.read_response_header().await.map_err(failed)?;
    let (status, headers) = match session.response_header() {
        Some(h) => (h.status.as_u16(), h.headers.clone()),
        None => {
            let e = pingora::Error::explain(pingora::ErrorType::InvalidHTTPHeader, "no answer");
            return Err(Attempt::Failed(ClientError::Exchange(e)));
        }
    };
    let mut answer = BytesMut::new();
    while let Some(chunk) = session
        .read_response_body()
        .await
        .map_err(|e| Attempt::Failed(ClientError::Exchange(e)))?
    {
        if answer.len() + chunk.len() > max_answer_bytes {
            return Err(Attempt::Failed(ClientError::TooLarge(max_answer_bytes)));
        }
        answer.extend_from_slice(&chunk);
    }
    connector
        .release_http_session(session, peer, peer.options.idle_timeout)
        .await;
    Ok(Answer {
        status,
        headers,
        body: answer.freeze(),
    })
}

/// How long one origin's exchanges may take, and how much of an answer is read.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Making the TCP connection.
    pub connect: Duration,
    /// The longest the server may stay silent: each write of the request, each read of the
    /// answer.
    pub silence: Duration,
    /// A longer answer is refused ([`ClientError::TooLarge`]).
    pub max_answer_bytes: usize,
}

/// Pooled connections are dropped after this long idle.
const IDLE: Duration = Duration::from_secs(60);

/// One origin's client (`http://host[:port]` or `https://host[:port]`): its address resolved
/// once, when it is made, and its own connection pool.
pub struct HttpClient {
    peer: HttpPeer,
    /// The `Host` header.
    authority: String,
    connector: Connector,
    max_answer_bytes: usize,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    pub fn new(origin: &str, bounds: Bounds) -> Result<Self, OriginError> {
        let origin = parse_origin(origin).map_err(OriginError::NotAnOrigin)?;
        let addr = (origin.host.as_str(), origin.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or(OriginError::NoAddress)?;
        let mut peer = HttpPeer::new(addr, origin.tls, origin.host.clone());
        peer.options.connection_timeout = Some(bounds.connect);
        peer.options.read_timeout = Some(bounds.silence);
        peer.options.write_timeout = Some(bounds.silence);
        peer.options.idle_timeout = Some(IDLE);
        Ok(Self {
            peer,
            authority: origin.authority,
            connector: Connector::new(None),
            max_answer_bytes: bounds.max_answer_bytes,
        })
    }

    /// The request sent to this origin (with its `Host`), the answer read whole, whatever
    /// its status.
    pub async fn send(&self, request: &Request) -> Result<Answer, ClientError> {
        let mut header =
            RequestHeader::build(request.method.clone(), request.path.as_bytes(), None)
                .map_err(ClientError::InvalidRequest)?;
        header
            .insert_header("host", self.authority.as_str())
            .map_err(ClientError::InvalidRequest)?;
        for (name, value) in &request.headers {
            header
                .insert_header(name.clone(), value.as_str())
                .map_err(ClientError::InvalidRequest)?;
        }
        exchange(
            &self.connector,
            &self.peer,
            &header,
            request.body.as_ref(),
            self.max_answer_bytes,
        )
        .await
    }
}

/// The command line's client: one origin, for a synchronous caller. It owns a current-thread
/// runtime for its lifetime (its pooled connections live on that runtime), and bounds each
/// exchange as a whole, connecting included, by one timeout.
pub struct BlockingClient {
    runtime: tokio::runtime::Runtime,
    client: HttpClient,
    timeout: Duration,
}

/// What the command line reads is a table or a ledger in JSON, far below this; the bound is
/// what a wrong listener can make it buffer.
const CLI_MAX_ANSWER_BYTES: usize = 10 * 1024 * 1024;

impl BlockingClient {
    /// Must not be called on a thread that already runs a tokio runtime (the command line
    /// runs none).
    pub fn new(origin: &str, timeout: Duration) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| anyhow::anyhow!("cannot start the HTTP client: {e}"))?;
        let bounds = Bounds {
            connect: timeout,
            silence: timeout,
            max_answer_bytes: CLI_MAX_ANSWER_BYTES,
        };
        Ok(Self {
            runtime,
            client: HttpClient::new(origin, bounds)?,
            timeout,
        })
    }

    pub fn send(&self, request: &Request) -> Result<Answer, ClientError> {
        self.runtime.block_on(async {
            tokio::time::timeout(self.timeout, self.client.send(request))
                .await
                .map_err(|_| ClientError::TimedOut(self.timeout))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A server that answers each connection's first request with `answer` and records what
    /// it read.
    fn serve_once(answer: &'static [u8]) -> (String, std::thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
            conn.write_all(answer).unwrap();
            seen
        });
        (origin, server)
    }

    #[test]
    fn a_get_carries_host_and_headers_and_reads_status_headers_and_body() {
        let (origin, server) =
            serve_once(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nx-seen: yes\r\n\r\n{}");
        let client = BlockingClient::new(&origin, Duration::from_secs(5)).unwrap();
        let answer = client
            .send(&Request::get("/holds?key=a%20b").header("authorization", "Bearer k"))
            .unwrap();
        assert_eq!(answer.status, 404);
        assert!(answer.is_error());
        assert_eq!(answer.header("x-seen"), Some("yes"));
        assert_eq!(&answer.body[..], b"{}");
        let seen = String::from_utf8(server.join().unwrap()).unwrap();
        assert!(
            seen.starts_with("GET /holds?key=a%20b HTTP/1.1\r\n"),
            "{seen}"
        );
        let authority = origin.trim_start_matches("http://");
        assert!(seen.contains(&format!("host: {authority}\r\n")), "{seen}");
        assert!(seen.contains("authorization: Bearer k\r\n"), "{seen}");
        assert!(!seen.contains("content-length"), "{seen}");
    }

    #[test]
    fn an_empty_post_says_its_length() {
        let (origin, server) = serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
        let client = BlockingClient::new(&origin, Duration::from_secs(5)).unwrap();
        let answer = client.send(&Request::post("/holds/h/deny", "")).unwrap();
        assert_eq!(answer.status, 200);
        let seen = String::from_utf8(server.join().unwrap()).unwrap();
        assert!(seen.contains("content-length: 0\r\n"), "{seen}");
    }

    #[test]
    fn an_answer_over_the_bound_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let len = CLI_MAX_ANSWER_BYTES + 1;
            let _ = conn
                .write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n").as_bytes());
            let _ = conn.write_all(&vec![b'x'; len]);
        });
        let client = BlockingClient::new(&origin, Duration::from_secs(5)).unwrap();
        let err = client.send(&Request::get("/")).unwrap_err();
        assert!(
            matches!(err, ClientError::TooLarge(CLI_MAX_ANSWER_BYTES)),
            "{err}"
        );
    }

    #[test]
    fn a_silent_server_times_out_and_a_closed_port_does_not_connect() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let client = BlockingClient::new(&origin, Duration::from_millis(300)).unwrap();
        let err = client.send(&Request::get("/")).unwrap_err();
        assert!(
            matches!(err, ClientError::TimedOut(_) | ClientError::Exchange(_)),
            "{err}"
        );
        drop(listener);
        let err = client.send(&Request::get("/")).unwrap_err();
        assert!(matches!(err, ClientError::Connect(_)), "{err}");
    }

    #[test]
    fn only_origins_are_clients() {
        let refused = HttpClient::new(
            "ftp://example.com",
            Bounds {
                connect: Duration::from_secs(1),
                silence: Duration::from_secs(1),
                max_answer_bytes: 1,
            },
        );
        assert!(matches!(refused, Err(OriginError::NotAnOrigin(_))));
    }
}
