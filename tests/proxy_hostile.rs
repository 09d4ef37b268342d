//! The proxy (and API) listener against a hostile or unusual caller, issue 20: what reaches the
//! provider, `Expect: 100-continue`, pipelined requests, and stored Responses objects and
//! chains that belong to another key. Framing cases go over raw sockets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

/// One response as read off a raw connection.
#[derive(Debug)]
struct RawResp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// A raw HTTP/1.1 connection: write bytes, read responses one at a time.
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
    closed: bool,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        Raw {
            s,
            buf: Vec::new(),
            closed: false,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// Read more bytes until `deadline`; false when nothing more will come.
    fn fill(&mut self, deadline: Instant) -> bool {
        if self.closed {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        self.s.set_read_timeout(Some(left)).unwrap();
        let mut chunk = [0u8; 16384];
        match self.s.read(&mut chunk) {
            Ok(0) => {
                self.closed = true;
                false
            }
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                false
            }
            Err(_) => {
                self.closed = true;
                false
            }
        }
    }

    /// The next response (a 1xx included) within `wait`; `None` if none came.
    fn response(&mut self, wait: Duration) -> Option<RawResp> {
        let deadline = Instant::now() + wait;
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            if !self.fill(deadline) {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.buf.drain(..head_end + 4);
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {head:?}"));
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut resp = RawResp {
            status,
            headers,
            body: Vec::new(),
        };
        if (100..200).contains(&status) {
            return Some(resp);
        }
        if let Some(len) = resp.header("content-length") {
            let len: usize = len.parse().unwrap();
            while self.buf.len() < len {
                assert!(self.fill(deadline), "body of {status} cut short");
            }
            resp.body = self.buf.drain(..len).collect();
        } else if resp
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let line_end = loop {
                    if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    assert!(self.fill(deadline), "chunked body of {status} cut short");
                };
                let size_line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
                let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16)
                    .unwrap_or_else(|_| panic!("bad chunk size {size_line:?}"));
                while self.buf.len() < line_end + 2 + size + 2 {
                    assert!(self.fill(deadline), "chunk of {status} cut short");
                }
                resp.body
                    .extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
                self.buf.drain(..line_end + 2 + size + 2);
                if size == 0 {
                    break;
                }
            }
        } else {
            while self.fill(deadline) {}
            resp.body = std::mem::take(&mut self.buf);
        }
        Some(resp)
    }
}

fn request_head(path: &str, key: &str, len: usize, extra: &[(&str, &str)]) -> String {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         authorization: Bearer {key}\r\ncontent-length: {len}\r\n"
    );
    for (n, v) in extra {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head
}

fn upstream_header_names(h: &Harness) -> Vec<String> {
    h.mock
        .last_request()
        .unwrap()
        .headers
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// Issue 20.8: nothing that names the caller to tokensaver (an owner secret, the page's
/// session cookie, any `x-tokensaver-*` header) nor the downstream hop reaches the provider,
/// on a gated call or on a pass-through route; the provider headers an SDK sends do.
#[test]
fn secrets_and_hop_headers_never_reach_the_provider() {
    let h = Harness::default();
    let hostile = [
        ("x-tokensaver-owner", OWNER_SECRET_A),
        ("x-tokensaver-anything", "1"),
        ("cookie", "ts_session=0123456789abcdef"),
        ("proxy-authorization", "Basic dXNlcjpwYXNz"),
        ("openai-beta", "assistants=v2"),
        ("x-stainless-lang", "python"),
        HUMAN,
    ];
    let never = [
        "x-tokensaver-owner",
        "x-tokensaver-anything",
        "x-tokensaver-human",
        "cookie",
        "proxy-authorization",
        "expect",
    ];
    let check = |what: &str| {
        let names = upstream_header_names(&h);
        for n in never {
            assert!(!names.iter().any(|s| s == n), "{what}: {n} went upstream");
        }
        for n in ["openai-beta", "x-stainless-lang"] {
            assert!(names.iter().any(|s| s == n), "{what}: {n} was dropped");
        }
    };
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o", "Hello there.", json!({})),
        &hostile,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    check("gated chat call");

    let created = h.post(
        "/v1/responses",
        KEY_A,
        &json!({"model": "gpt-4o", "input": "Keep me.", "max_output_tokens": 50}),
        &hostile,
    );
    assert_eq!(created.status, 200, "{}", created.text());
    check("gated Responses call");
    let id = created.json()["id"].as_str().unwrap().to_string();
    let mut get = client::get(&h.proxy_url(&format!("/v1/responses/{id}")))
        .set("authorization", &format!("Bearer {KEY_A}"));
    for (n, v) in hostile {
        get = get.set(n, v);
    }
    let read = call(get, None);
    assert_eq!(read.status, 200, "{}", read.text());
    check("pass-through read");
}

/// Issue 20.3: `Expect: 100-continue` on a forwarded call gets one `100 Continue`, then the
/// provider's answer; `expect` never goes upstream, and the decision is settled.
#[test]
fn expect_continue_gets_one_interim_answer_then_the_final_one() {
    let h = Harness::default();
    let body = chat("gpt-4o", "Hello with an expectation.", json!({})).to_string();
    let mut c = Raw::connect(h.proxy);
    c.send(
        request_head(
            CHAT,
            KEY_A,
            body.len(),
            &[("expect", "100-continue"), HUMAN],
        )
        .as_bytes(),
    );
    let interim = c
        .response(Duration::from_secs(5))
        .expect("an interim answer");
    assert_eq!(interim.status, 100, "{interim:?}");
    c.send(body.as_bytes());
    let last = c.response(Duration::from_secs(20)).expect("a final answer");
    assert_eq!(last.status, 200, "{last:?}");
    assert_eq!(last.header("x-tokensaver-verdict"), Some("ALLOW"));
    assert_eq!(last.json()["object"], "chat.completion");
    assert!(
        c.response(Duration::from_millis(500)).is_none(),
        "nothing after the final answer"
    );
    // The connection stays usable: the 100 went out before the body, the answer after it.
    assert_eq!(last.header("connection"), Some("keep-alive"));
    let again = chat("gpt-4o", "And a plain one after it.", json!({})).to_string();
    c.send(request_head(CHAT, KEY_A, again.len(), &[HUMAN]).as_bytes());
    c.send(again.as_bytes());
    let next = c
        .response(Duration::from_secs(20))
        .expect("the next answer");
    assert_eq!(next.status, 200, "{next:?}");
    assert!(
        !upstream_header_names(&h).iter().any(|n| n == "expect"),
        "expect went upstream"
    );
    settle();
    let usage = &h.ledger(KEY_A)["total"]["usage"];
    assert!(
        usage["output"].as_u64().unwrap() > 0,
        "not settled: {usage}"
    );
    assert!(!h.log().contains("panicked"), "{}", h.log());

    // Refused before the body is read (no key): the final answer comes at once, with no 100,
    // and says the connection closes, since the body was never read.
    let mut c = Raw::connect(h.proxy);
    c.send(
        request_head(
            CHAT,
            "tsk_alpha_wrong",
            body.len(),
            &[("expect", "100-continue")],
        )
        .as_bytes(),
    );
    let refused = c.response(Duration::from_secs(5)).expect("a refusal");
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(refused.header("connection"), Some("close"));

    // A body over the cap is refused before the client is invited to send it.
    let mut c = Raw::connect(h.proxy);
    c.send(request_head(CHAT, KEY_A, 64 << 20, &[("expect", "100-continue")]).as_bytes());
    let too_large = c.response(Duration::from_secs(5)).expect("a refusal");
    assert_eq!(too_large.status, 413, "{too_large:?}");
}

/// Issue 20.12: requests pipelined on one connection (sent before the first answer) are
/// answered in order, each decided on its own, gated calls and pass-through routes alike,
/// however the bytes are split on the wire. A request refused before its body is read ends
/// the connection (`connection: close`), so the client resends what follows it.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let h = Harness::default();
    let models = format!(
        "GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY_A}\r\n\r\n"
    );
    for (round, split) in [0usize, 40, 300].into_iter().enumerate() {
        let first = chat("gpt-4o", &format!("The first, round {round}."), json!({})).to_string();
        let second = chat(
            "gpt-4o",
            &format!("The second, round {round}."),
            json!({"stream": true}),
        )
        .to_string();
        let mut wire = Vec::new();
        wire.extend_from_slice(request_head(CHAT, KEY_A, first.len(), &[HUMAN]).as_bytes());
        wire.extend_from_slice(first.as_bytes());
        wire.extend_from_slice(models.as_bytes());
        wire.extend_from_slice(request_head(CHAT, KEY_A, second.len(), &[HUMAN]).as_bytes());
        wire.extend_from_slice(second.as_bytes());
        wire.extend_from_slice(request_head(CHAT, "tsk_alpha_wrong", 2, &[]).as_bytes());
        wire.extend_from_slice(b"{}");
        wire.extend_from_slice(models.as_bytes());
        let mut c = Raw::connect(h.proxy);
        if split == 0 {
            c.send(&wire);
        } else {
            c.send(&wire[..split]);
            std::thread::sleep(Duration::from_millis(100));
            c.send(&wire[split..]);
        }
        let wait = Duration::from_secs(20);
        let a = c.response(wait).expect("the first answer");
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.json()["object"], "chat.completion");
        let m = c.response(wait).expect("the pass-through answer");
        assert_eq!(m.status, 200, "{m:?}");
        assert_eq!(m.json()["object"], "list");
        let b = c.response(wait).expect("the streamed answer");
        assert_eq!(b.status, 200, "{b:?}");
        assert!(
            String::from_utf8_lossy(&b.body).contains("data: [DONE]"),
            "the third answer is the streamed one"
        );
        let refused = c.response(wait).expect("the refusal");
        assert_eq!(refused.status, 401, "{refused:?}");
        assert_eq!(refused.header("connection"), Some("close"));
        assert!(c.response(Duration::from_millis(500)).is_none());
    }
    assert_eq!(h.calls(CHAT), 6);
    settle();
    assert_eq!(h.ledger(KEY_A)["total"]["requests"], 6);
}

/// Issue 20.3 and 20.12 on the API listener: one `100 Continue` before a body, and pipelined
/// requests answered in order on the same connection.
#[test]
fn the_api_listener_answers_expect_once_and_pipelined_requests_in_order() {
    let h = Harness::default();
    let body = chat("gpt-4o-mini", "Estimate me.", json!({})).to_string();
    let mut c = Raw::connect(h.api);
    c.send(
        request_head(
            "/estimate",
            KEY_A,
            body.len(),
            &[("expect", "100-continue")],
        )
        .as_bytes(),
    );
    let interim = c
        .response(Duration::from_secs(5))
        .expect("an interim answer");
    assert_eq!(interim.status, 100, "{interim:?}");
    c.send(body.as_bytes());
    let r = c.response(Duration::from_secs(10)).expect("the estimate");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["estimate"], true);
    assert!(c.response(Duration::from_millis(300)).is_none());

    let mut wire = Vec::new();
    for _ in 0..2 {
        wire.extend_from_slice(request_head("/estimate", KEY_A, body.len(), &[]).as_bytes());
        wire.extend_from_slice(body.as_bytes());
    }
    wire.extend_from_slice(b"GET /stats HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    c.send(&wire);
    for want in ["estimate", "estimate", "stats"] {
        let r = c.response(Duration::from_secs(10)).expect(want);
        assert_eq!(r.status, 200, "{want}: {r:?}");
        if want == "estimate" {
            assert_eq!(r.json()["estimate"], true);
        }
    }
}
