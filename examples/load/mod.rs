//! What the load generators (`paced_load`, `field_load`) share: a connection to the server
//! under test and the load's request (`gen.py`'s body, a tokensaver key, attended).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub type Sender = http1::SendRequest<Full<Bytes>>;

/// A connect that takes longer (a full accept queue drops SYNs; the kernel retries for up to
/// two minutes) counts as an error instead of parking a connection's worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// An HTTP/1.1 connection with Nagle off; None if it cannot be opened in time.
pub async fn connect(authority: &str) -> Option<Sender> {
    let open = async {
        let stream = TcpStream::connect(authority).await.ok()?;
        stream.set_nodelay(true).ok()?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
        tokio::spawn(conn);
        Some(sender)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, open)
        .await
        .ok()
        .flatten()
}

/// `sender` ready for a request: hyper refuses one on a connection that is not ready yet, or
/// closed; a closed one is replaced. True when a new connection was opened.
pub async fn make_ready(sender: &mut Option<Sender>, authority: &str) -> bool {
    if let Some(s) = sender.as_mut() {
        if s.ready().await.is_err() {
            *sender = None;
        }
    }
    if sender.is_none() {
        *sender = connect(authority).await;
        return sender.is_some();
    }
    false
}

/// The load's chat request: POST `path` with the key (`Bearer …`) and the body.
pub fn chat_request(
    authority: &str,
    path: &str,
    key: &str,
    body: String,
) -> hyper::Request<Full<Bytes>> {
    hyper::Request::post(path)
        .header("host", authority)
        .header("authorization", key)
        .header("content-type", "application/json")
        .header("x-tokensaver-human", "true")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request")
}
