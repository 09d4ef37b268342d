//! The tests' HTTP client: blocking calls, one new connection each (nothing pooled between
//! calls), on hyper — the client of the load generator, independent of the gate's own
//! (`tokensaver::http_client`), so the black-box tests do not share a bug with the code they
//! test. What arrived of a body that broke off is kept, with the error: the tests of cut
//! streams read both. Redirects are followed as browsers and curl do, unless told not to.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::Resp;

/// A request being built: `get(url).set(name, value).call()`, `post(url).send(body)`.
#[derive(Clone, Debug)]
pub struct Req {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    timeout: Option<Duration>,
    follow_redirects: bool,
}

pub fn request(method: &str, url: &str) -> Req {
    Req {
        method: method.to_string(),
        url: url.to_string(),
        headers: Vec::new(),
        timeout: None,
        follow_redirects: true,
    }
}

pub fn get(url: &str) -> Req {
    request("GET", url)
}

pub fn post(url: &str) -> Req {
    request("POST", url)
}

pub fn put(url: &str) -> Req {
    request("PUT", url)
}

/// Redirects followed before the call fails.
const MAX_REDIRECTS: usize = 4;

impl Req {
    /// Set a header, replacing one of the same name.
    pub fn set(mut self, name: &str, value: &str) -> Req {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The whole call, redirects and body included (none: no limit).
    pub fn timeout(mut self, timeout: Duration) -> Req {
        self.timeout = Some(timeout);
        self
    }

    /// Answer a redirect with the redirect itself.
    pub fn no_redirects(mut self) -> Req {
        self.follow_redirects = false;
        self
    }

    /// No body (and no `content-length`).
    pub fn call(self) -> Resp {
        self.run(None)
    }

    /// A body, with its `content-length` (also when empty).
    pub fn send(self, body: &[u8]) -> Resp {
        self.run(Some(Bytes::copy_from_slice(body)))
    }

    fn run(self, body: Option<Bytes>) -> Resp {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the call");
        runtime.block_on(self.follow(body))
    }

    async fn follow(mut self, mut body: Option<Bytes>) -> Resp {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let mut redirects = 0;
        loop {
            let resp = self.once(body.clone(), deadline).await;
            if !self.follow_redirects || !(300..400).contains(&resp.status) {
                return resp;
            }
            let Some(next) = resp.header("location").and_then(|l| self.resolve(l)) else {
                return resp;
            };
            // As curl: a 301/302/303 is followed with GET; a 307/308 only by a request that
            // has no body. Neither the body nor the credentials go to the new place.
            let method = match (resp.status, self.method.as_str()) {
                (301..=303, "GET" | "HEAD") => self.method.clone(),
                (301..=303, _) => "GET".to_string(),
                (307 | 308, "GET" | "HEAD" | "OPTIONS" | "TRACE") => self.method.clone(),
                _ => return resp,
            };
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return failed(format!("more than {MAX_REDIRECTS} redirects"));
            }
            self.method = method;
            self.url = next;
            self.headers.retain(|(n, _)| {
                !["content-length", "cookie", "authorization"]
                    .iter()
                    .any(|dropped| n.eq_ignore_ascii_case(dropped))
            });
            body = None;
        }
    }

    /// A `Location` as a URL: absolute, or a path on this request's origin.
    fn resolve(&self, location: &str) -> Option<String> {
        if location.starts_with("http://") {
            return Some(location.to_string());
        }
        let uri: hyper::Uri = self.url.parse().ok()?;
        let origin = format!("http://{}", uri.authority()?);
        location
            .starts_with('/')
            .then(|| format!("{origin}{location}"))
    }

    async fn once(&self, body: Option<Bytes>, deadline: Option<Instant>) -> Resp {
        let answer = within(deadline, self.answer_header(body)).await;
        let response = match answer {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return failed(e),
            Err(elapsed) => return failed(elapsed),
        };
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let mut incoming = response.into_body();
        let mut body = Vec::new();
        let transport_error = loop {
            match within(deadline, incoming.frame()).await {
                Err(elapsed) => break Some(elapsed),
                Ok(None) => break None,
                Ok(Some(Err(e))) => break Some(e.to_string()),
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        body.extend_from_slice(data);
                    }
                }
            }
        };
        Resp {
            status,
            headers,
            body,
            transport_error,
        }
    }

    /// Connect, send the request, read the answer's header.
    async fn answer_header(
        &self,
        body: Option<Bytes>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let uri: hyper::Uri = self.url.parse().map_err(|e| format!("{}: {e}", self.url))?;
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{}: no host", self.url))?
            .clone();
        let address = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        let stream = tokio::net::TcpStream::connect(&address)
            .await
            .map_err(|e| format!("connect to {address}: {e}"))?;
        let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = hyper::Request::builder()
            .method(self.method.as_str())
            .uri(path)
            .header("host", authority.as_str());
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(body) = &body {
            request = request.header("content-length", body.len());
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| e.to_string())?;
        sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())
    }
}

/// `future`, unless the deadline passes first.
async fn within<F: std::future::Future>(
    deadline: Option<Instant>,
    future: F,
) -> Result<F::Output, String> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, future)
            .await
            .map_err(|_| "timed out".to_string()),
        None => Ok(future.await),
    }
}

/// No answer at all: status 0 and why.
fn failed(why: String) -> Resp {
    Resp {
        status: 0,
        headers: vec![],
        body: vec![],
        transport_error: Some(why),
    }
}
