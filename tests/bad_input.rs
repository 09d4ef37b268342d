//! The bad-input battery: hostile and malformed requests on all three listeners — broken and
//! hostile JSON, wrong types, huge numbers, deep nesting, invalid UTF-8, lying
//! `Content-Length`, chunked bodies, huge headers, every route with every wrong method and a
//! missing or invalid key. Every input carries a marker; for every case:
//! - the server answers (or closes) and does not crash;
//! - a refusal is closed-form JSON: the provider's error shape on provider paths (OpenAI
//!   `{"error":{message,type,param,code}}`, Anthropic `{"type":"error","error":{type,message}}`),
//!   `{"error":{code,message}}` on the API and admin listeners;
//! - the marker never appears in any response (status line, headers, body) nor in the
//!   server's log;
//! - and afterwards the server is healthy (`/healthz`, `/readyz`, a normal request).
//!
//! Requests go over raw sockets, so that framing can lie. One server serves the whole battery.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

/// Planted in every bad input; no response may repeat it.
const MARK: &str = "Qz7MarkerXv31";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// OpenAI's error object (proxy: chat, Responses, and routes outside the providers').
    OpenAi,
    /// Anthropic's (proxy: `/v1/messages`).
    Anthropic,
    /// `{"error":{"code","message"}}` (API and admin listeners).
    Api,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// A 4xx with a closed-form JSON error of this shape.
    Refused(Shape),
    /// Exactly this status, and if it is an error, this shape.
    Status(u16, Shape),
    /// The HTTP layer may refuse or close; whatever comes back is checked for echoes, and a
    /// JSON error body for its shape.
    Framing(Shape),
}

struct Case {
    name: String,
    addr: SocketAddr,
    request: Vec<u8>,
    /// Close our sending side after the request (a body that never comes).
    half_close: bool,
    expect: Expect,
}

#[derive(Debug)]
struct Answer {
    status: Option<u16>,
    head: String,
    body: Vec<u8>,
    raw: Vec<u8>,
}

/// Send raw bytes, read until the server closes (every request says `Connection: close`) or
/// a deadline.
fn exchange(case: &Case) -> Answer {
    let mut s = TcpStream::connect_timeout(&case.addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{}: connect: {e}", case.name));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    // The server may answer (413, 400) and close before it has read everything.
    let _ = s.write_all(&case.request);
    if case.half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut raw = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 16384];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
            Err(_) => break,
        }
    }
    parse_answer(raw)
}

fn parse_answer(raw: Vec<u8>) -> Answer {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n");
    let (head, mut body) = match split {
        Some(i) => (
            String::from_utf8_lossy(&raw[..i]).into_owned(),
            raw[i + 4..].to_vec(),
        ),
        None => (String::from_utf8_lossy(&raw).into_owned(), Vec::new()),
    };
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok());
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Answer {
        status,
        head,
        body,
        raw,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = data.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&data[..i])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(size) = size else { break };
        data = &data[i + 2..];
        if size == 0 || data.len() < size {
            break;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[(size + 2).min(data.len())..];
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    let lower = needle.to_ascii_lowercase();
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes() || w.to_ascii_lowercase() == lower.as_bytes())
}

fn check_shape(name: &str, shape: Shape, a: &Answer) -> Result<(), String> {
    let v: Value = serde_json::from_slice(&a.body).map_err(|e| {
        format!(
            "{name}: error body is not JSON ({e}): {:?} {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        )
    })?;
    let ok = match shape {
        Shape::OpenAi => {
            let e = &v["error"];
            e["message"].is_string()
                && e["type"].is_string()
                && e.get("param").is_some()
                && (e["code"].is_string() || e["code"].is_null())
        }
        Shape::Anthropic => {
            v["type"] == "error"
                && v["error"]["type"].is_string()
                && v["error"]["message"].is_string()
        }
        Shape::Api => v["error"]["code"].is_string() && v["error"]["message"].is_string(),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{name}: not the {shape:?} error shape: {v}"))
    }
}

fn check(case: &Case, a: &Answer) -> Result<(), String> {
    let name = &case.name;
    let text = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .chars()
            .take(600)
            .collect::<String>()
    };
    if contains(&a.raw, MARK) {
        return Err(format!(
            "{name}: the response echoes request content:\n{}",
            text(&a.raw)
        ));
    }
    match case.expect {
        Expect::Refused(shape) => {
            let status = a
                .status
                .ok_or_else(|| format!("{name}: no answer: {}", text(&a.raw)))?;
            if !(400..500).contains(&status) {
                return Err(format!(
                    "{name}: expected a refusal, got {status}: {}",
                    text(&a.body)
                ));
            }
            check_shape(name, shape, a)
        }
        Expect::Status(want, shape) => {
            if a.status != Some(want) {
                return Err(format!("{name}: expected {want}: {}", text(&a.raw)));
            }
            if want >= 400 && !a.body.is_empty() {
                check_shape(name, shape, a)?;
            }
            Ok(())
        }
        Expect::Framing(shape) => {
            if let Some(status) = a.status {
                if status >= 500 {
                    return Err(format!(
                        "{name}: a server error for bad framing: {}",
                        text(&a.raw)
                    ));
                }
                let json_body = a.head.to_ascii_lowercase().contains("application/json");
                if status >= 400 && json_body && !a.body.is_empty() {
                    check_shape(name, shape, a)?;
                }
            }
            Ok(())
        }
    }
}

/// A request with `Connection: close` and a correct `Content-Length` (unless the headers give
/// their own framing).
fn http(method: &str, target: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {target} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n");
    let framed = headers.iter().any(|(k, _)| {
        k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("transfer-encoding")
    });
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if !framed && (!body.is_empty() || method == "POST" || method == "PUT") {
        r.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    r.push_str("\r\n");
    let mut bytes = r.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn bearer(key: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {key}"))
}

fn json_ct() -> (&'static str, String) {
    ("content-type", "application/json".into())
}

fn mark_header() -> (&'static str, String) {
    ("x-note", MARK.into())
}

/// A framing case: its name, its headers, the bytes after them, and whether to close our
/// side after sending.
type Framed<'a> = (&'a str, Vec<(&'a str, String)>, Vec<u8>, bool);

/// The gated provider routes, their error shape and how their SDK presents the key.
const GATED: &[(&str, Shape)] = &[
    ("/v1/chat/completions", Shape::OpenAi),
    ("/v1/responses", Shape::OpenAi),
    ("/v1/messages", Shape::Anthropic),
];

fn key_header(path: &str, key: &str) -> (&'static str, String) {
    if path == "/v1/messages" {
        ("x-api-key", key.to_string())
    } else {
        bearer(key)
    }
}

/// Bodies every gated route refuses (400), each carrying the marker.
fn bad_bodies() -> Vec<(String, Vec<u8>)> {
    let m = MARK;
    let text = |s: String| s.into_bytes();
    let mut deep = String::new();
    for _ in 0..300 {
        deep.push('[');
    }
    deep.push_str(&format!("\"{m}\""));
    for _ in 0..300 {
        deep.push(']');
    }
    let mut very_deep = vec![b'['; 200_000];
    very_deep.extend_from_slice(m.as_bytes());
    vec![
        ("bare word".into(), text(m.to_string())),
        (
            "truncated".into(),
            text(format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{m}"#)),
        ),
        (
            "trailing garbage".into(),
            text(format!(r#"{{"model":"gpt-4o","messages":[]}} {m}"#)),
        ),
        ("array".into(), text(format!(r#"["{m}"]"#))),
        ("string".into(), text(format!(r#""{m}""#))),
        ("number".into(), text(format!("12{m}"))),
        ("null with marker".into(), text(format!("null {m}"))),
        ("object key truncated".into(), text(format!(r#"{{"{m}":"#))),
        ("single quotes".into(), text(format!("{{'model':'{m}'}}"))),
        ("unquoted keys".into(), text(format!("{{model: {m}}}"))),
        ("comment".into(), text(format!("{{/* {m} */}}"))),
        ("trailing comma".into(), text(format!(r#"{{"a":"{m}",}}"#))),
        (
            "invalid utf-8 in a string".into(),
            [
                format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{m}"#)
                    .into_bytes(),
                vec![0xff, 0xfe, 0xc3, 0x28],
                br#""}]}"#.to_vec(),
            ]
            .concat(),
        ),
        (
            "invalid utf-8 in a key".into(),
            [b"{\"".to_vec(), m.as_bytes().to_vec(), vec![0x80], b"\":1}".to_vec()].concat(),
        ),
        (
            "lone surrogate".into(),
            text(format!(
                r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"\ud800{m}"}}]}}"#
            )),
        ),
        (
            "bad escape".into(),
            text(format!(
                r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"\q{m}"}}]}}"#
            )),
        ),
        (
            "raw control character".into(),
            text(format!(
                "{{\"model\":\"gpt-4o\",\"messages\":[{{\"role\":\"user\",\"content\":\"{m}\u{1}\"}}]}}"
            )),
        ),
        (
            "byte order mark".into(),
            [vec![0xef, 0xbb, 0xbf], text(format!(r#"{{"model":"{m}"}}"#))].concat(),
        ),
        ("deep nesting".into(), text(format!(r#"{{"model":"gpt-4o","messages":{deep}}}"#))),
        ("200k open brackets".into(), very_deep),
        (
            "number out of range".into(),
            text(format!(
                r#"{{"model":"gpt-4o","max_tokens":1e400,"messages":[{{"role":"user","content":"{m}"}}]}}"#
            )),
        ),
        (
            "malformed number".into(),
            text(format!(r#"{{"model":"gpt-4o","max_tokens":1.5e3e4,"note":"{m}"}}"#)),
        ),
        (
            "leading zeros".into(),
            text(format!(r#"{{"model":"gpt-4o","max_tokens":007,"note":"{m}"}}"#)),
        ),
        ("NaN".into(), text(format!(r#"{{"model":"gpt-4o","temperature":NaN,"n":"{m}"}}"#))),
        ("empty object".into(), text(format!("{{}}{}", " ".repeat(3)))),
    ]
    .into_iter()
    .map(|(name, mut body): (String, Vec<u8>)| {
        if name == "empty object" {
            // Valid JSON with no marker to carry: the marker goes in a header instead.
            body.shrink_to_fit();
        }
        (name, body)
    })
    .collect()
}

/// Wrong types and shapes for each gated route (400), marker inside.
fn wrong_types(path: &str) -> Vec<(String, Value)> {
    let m = MARK;
    let msg = json!([{"role": "user", "content": m}]);
    let (list, item_list) = if path == "/v1/responses" {
        ("input", json!([{"role": "user", "content": m}]))
    } else {
        ("messages", msg.clone())
    };
    let ceiling = if path == "/v1/responses" {
        "max_output_tokens"
    } else {
        "max_tokens"
    };
    let with = |k: &str, v: Value| {
        let mut b = json!({"model": "gpt-4o"});
        b[ceiling] = json!(50);
        b[list] = item_list.clone();
        b[k] = v;
        b
    };
    let mut cases = vec![
        ("model a number", with("model", json!(12))),
        ("model an array", with("model", json!([m]))),
        ("model an object", with("model", json!({m: 1}))),
        ("model null", with("model", Value::Null)),
        ("max_tokens a string", with(ceiling, json!(m))),
        ("max_tokens negative", with(ceiling, json!(-5))),
        ("max_tokens a fraction", with(ceiling, json!(1.5))),
        (
            "max_tokens past u64",
            with(ceiling, json!(99_999_999_999_999_999_999_999.0_f64)),
        ),
        ("temperature a string", with("temperature", json!(m))),
        ("stream a string", with("stream", json!(m))),
        ("tools a string", with("tools", json!(m))),
        ("tools of strings", with("tools", json!([m]))),
        ("tools of numbers", with("tools", json!([1, 2]))),
    ];
    let mut missing_model = json!({list: item_list.clone()});
    missing_model["note"] = json!(m);
    cases.push(("model missing", missing_model));
    if path == "/v1/responses" {
        // `input` may be absent (a continuation) or a string (one user turn).
        cases.push(("input a number", with(list, json!(7))));
        cases.push(("input a boolean", with(list, json!(true))));
    } else {
        cases.push(("messages missing", json!({"model": "gpt-4o", "note": m})));
        cases.push(("messages a string", with(list, json!(m))));
    }
    cases.push(("messages an object", with(list, json!({m: m}))));
    cases.push(("messages of numbers", with(list, json!([1, m]))));
    cases.push((
        "message content a number",
        with(list, json!([{"role": "user", "content": 7, "name": m}])),
    ));
    cases.push((
        "message content an object",
        with(list, json!([{"role": "user", "content": {m: m}}])),
    ));
    if path != "/v1/responses" {
        cases.push(("message without role", with(list, json!([{"content": m}]))));
        cases.push((
            "role a number",
            with(list, json!([{"role": 3, "content": m}])),
        ));
        cases.push(("n a string", with("n", json!(m))));
    }
    cases.into_iter().map(|(n, v)| (n.to_string(), v)).collect()
}

fn proxy_cases(h: &Harness) -> Vec<Case> {
    let mut cases = Vec::new();
    let m = MARK;
    for &(path, shape) in GATED {
        let key = key_header(path, KEY_A);
        for (name, body) in bad_bodies() {
            let marker_header = name == "empty object";
            let mut headers = vec![key.clone(), json_ct()];
            if marker_header {
                headers.push(mark_header());
            }
            cases.push(Case {
                name: format!("proxy {path}: {name}"),
                addr: h.proxy,
                request: http("POST", path, &headers, &body),
                half_close: false,
                expect: Expect::Refused(shape),
            });
        }
        for (name, body) in wrong_types(path) {
            cases.push(Case {
                name: format!("proxy {path}: {name}"),
                addr: h.proxy,
                request: http(
                    "POST",
                    path,
                    &[key.clone(), json_ct()],
                    body.to_string().as_bytes(),
                ),
                half_close: false,
                expect: Expect::Refused(shape),
            });
        }
        cases.push(Case {
            name: format!("proxy {path}: empty body"),
            addr: h.proxy,
            request: http("POST", path, &[key.clone(), json_ct(), mark_header()], b""),
            half_close: false,
            expect: Expect::Refused(shape),
        });
        // Every wrong method.
        for method in ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"] {
            cases.push(Case {
                name: format!("proxy {method} {path}"),
                addr: h.proxy,
                request: http(
                    method,
                    &format!("{path}?q={m}"),
                    &[key.clone(), mark_header()],
                    b"",
                ),
                half_close: false,
                expect: Expect::Status(405, shape),
            });
        }
        // Missing and invalid keys, with a valid body.
        let body = if path == "/v1/responses" {
            json!({"model": "gpt-4o", "input": m})
        } else {
            json!({"model": "gpt-4o", "max_tokens": 20, "messages": [{"role": "user", "content": m}]})
        };
        let bad_keys: Vec<(&str, Vec<(&str, String)>)> = vec![
            ("no key", vec![]),
            ("bearer garbage", vec![bearer(m)]),
            (
                "bearer without scheme",
                vec![("authorization", m.to_string())],
            ),
            (
                "unknown key id",
                vec![bearer(&format!("tsk_{m}_0123456789"))],
            ),
            (
                "wrong secret",
                vec![bearer(&format!("tsk_alpha_{m}aaaaaaaaaaaaaaaaaaaaaaaaaa"))],
            ),
            (
                "x-api-key garbage",
                vec![("x-api-key", format!("tsk_beta_{m}"))],
            ),
            ("empty bearer", vec![("authorization", "Bearer ".into())]),
        ];
        for (name, mut headers) in bad_keys {
            headers.push(json_ct());
            headers.push(mark_header());
            cases.push(Case {
                name: format!("proxy {path}: {name}"),
                addr: h.proxy,
                request: http("POST", path, &headers, body.to_string().as_bytes()),
                half_close: false,
                expect: Expect::Status(401, shape),
            });
        }
        // Caller headers with garbage, on a body that is refused anyway.
        for (hname, hval) in [
            ("x-tokensaver-human", m.to_string()),
            ("x-tokensaver-hold", m.to_string()),
            ("x-tokensaver-hold", format!("hold_{m}")),
        ] {
            cases.push(Case {
                name: format!("proxy {path}: {hname} garbage"),
                addr: h.proxy,
                request: http(
                    "POST",
                    path,
                    &[key.clone(), json_ct(), (hname, hval)],
                    format!(r#"{{"model":7,"note":"{m}"}}"#).as_bytes(),
                ),
                half_close: false,
                expect: Expect::Refused(shape),
            });
        }
        // Framing that lies.
        let body =
            format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{m}"}}]}}"#);
        let framing: Vec<Framed> = vec![
            (
                "content-length longer than the body",
                vec![("content-length", "5000".into())],
                body.clone().into_bytes(),
                true,
            ),
            (
                "content-length shorter than the body",
                vec![("content-length", "9".into())],
                body.clone().into_bytes(),
                false,
            ),
            (
                "content-length not a number",
                vec![("content-length", m.into())],
                body.clone().into_bytes(),
                false,
            ),
            (
                "content-length negative",
                vec![("content-length", "-1".into())],
                body.clone().into_bytes(),
                false,
            ),
            (
                "two content-lengths",
                vec![
                    ("content-length", "3".into()),
                    ("content-length", body.len().to_string()),
                ],
                body.clone().into_bytes(),
                false,
            ),
            (
                "content-length and chunked",
                vec![
                    ("content-length", "4".into()),
                    ("transfer-encoding", "chunked".into()),
                ],
                format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len()).into_bytes(),
                false,
            ),
            (
                "chunked, bad JSON",
                vec![("transfer-encoding", "chunked".into())],
                format!("5\r\n{{\"a\":\r\n{:x}\r\n{m}\r\n0\r\n\r\n", m.len()).into_bytes(),
                false,
            ),
            (
                "chunked, size not hex",
                vec![("transfer-encoding", "chunked".into())],
                format!("{m}\r\n{body}\r\n0\r\n\r\n").into_bytes(),
                false,
            ),
            (
                "chunked, size larger than the data",
                vec![("transfer-encoding", "chunked".into())],
                format!("ffff\r\n{body}\r\n").into_bytes(),
                true,
            ),
            (
                "chunked, no last chunk",
                vec![("transfer-encoding", "chunked".into())],
                format!("{:x}\r\n{body}\r\n", body.len()).into_bytes(),
                true,
            ),
            (
                "chunked, extension",
                vec![("transfer-encoding", "chunked".into())],
                format!("{:x};{m}=1\r\n{body}\r\n0\r\n\r\n", body.len()).into_bytes(),
                false,
            ),
            (
                "chunked, huge size",
                vec![("transfer-encoding", "chunked".into())],
                format!("ffffffffffffffffff\r\n{m}\r\n").into_bytes(),
                true,
            ),
            (
                "unknown transfer-encoding",
                vec![("transfer-encoding", format!("{m}, chunked"))],
                b"0\r\n\r\n".to_vec(),
                false,
            ),
            (
                "declared over the body cap",
                vec![("content-length", "9000000".into())],
                body.clone().into_bytes(),
                true,
            ),
        ];
        for (name, mut headers, raw_body, half_close) in framing {
            headers.insert(0, key.clone());
            headers.push(json_ct());
            cases.push(Case {
                name: format!("proxy {path}: {name}"),
                addr: h.proxy,
                request: http("POST", path, &headers, &raw_body),
                half_close,
                expect: Expect::Framing(shape),
            });
        }
    }
    // Paths the gate does not serve, with and without a key.
    for target in [
        format!("/v1/{m}"),
        format!("/{m}"),
        format!("/v1/embeddings?input={m}"),
        format!("/v1/completions/{m}"),
        format!("/v1/chat/completions/{m}"),
        format!("/v1/messages/batches/{m}"),
        format!("//v1/chat/completions?{m}"),
        format!("/v1/chat/completions/../../{m}"),
        format!("/%2e%2e/{m}"),
        format!("/v1/models/{m}"),
        format!("/v1/responses/{m}/input_items"),
    ] {
        for (label, headers) in [
            ("no key", vec![mark_header()]),
            ("bad key", vec![bearer(MARK)]),
        ] {
            cases.push(Case {
                name: format!("proxy GET {target} ({label})"),
                addr: h.proxy,
                request: http("GET", &target, &headers, b""),
                half_close: false,
                expect: Expect::Refused(Shape::OpenAi),
            });
        }
        cases.push(Case {
            name: format!("proxy POST {target} (valid key)"),
            addr: h.proxy,
            request: http(
                "POST",
                &target,
                &[bearer(KEY_A), json_ct()],
                format!(r#"{{"input":"{m}"}}"#).as_bytes(),
            ),
            half_close: false,
            // The billable ones are refused; none reaches a provider.
            expect: Expect::Framing(Shape::OpenAi),
        });
    }
    // HTTP that is not HTTP.
    let raw: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "request line garbage",
            format!("{m} / HTTP/1.1\r\nhost: x\r\n\r\n").into_bytes(),
            false,
        ),
        (
            "bad version",
            format!("POST /v1/chat/completions HTTP/9.{m}\r\n\r\n").into_bytes(),
            false,
        ),
        (
            "header without colon",
            format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n{m}\r\n\r\n").into_bytes(),
            false,
        ),
        (
            "header name with space",
            format!("GET /v1/models HTTP/1.1\r\nbad {m}: 1\r\nconnection: close\r\n\r\n")
                .into_bytes(),
            false,
        ),
        (
            "control bytes in a header",
            [
                b"GET /v1/models HTTP/1.1\r\nx-a: ".to_vec(),
                m.as_bytes().to_vec(),
                vec![1, 0x7f, 0],
                b"\r\nconnection: close\r\n\r\n".to_vec(),
            ]
            .concat(),
            false,
        ),
        (
            "a 200 KB header",
            format!(
                "GET /v1/models HTTP/1.1\r\nx-big: {}{m}\r\nconnection: close\r\n\r\n",
                "a".repeat(200_000)
            )
            .into_bytes(),
            false,
        ),
        (
            "a 32 KB path",
            format!(
                "GET /v1/{}{m} HTTP/1.1\r\nconnection: close\r\n\r\n",
                "p".repeat(32_000)
            )
            .into_bytes(),
            false,
        ),
        (
            "400 headers",
            {
                let mut r = String::from("GET /v1/models HTTP/1.1\r\nconnection: close\r\n");
                for i in 0..400 {
                    r.push_str(&format!("x-h{i}: {m}\r\n"));
                }
                r.push_str("\r\n");
                r.into_bytes()
            },
            false,
        ),
        (
            "header folding",
            format!("GET /v1/models HTTP/1.1\r\nx-a: 1\r\n  {m}\r\nconnection: close\r\n\r\n")
                .into_bytes(),
            false,
        ),
        (
            "nothing but a header, then close",
            format!("POST /v1/chat/completions HTTP/1.1\r\nx-a: {m}\r\n").into_bytes(),
            true,
        ),
        ("binary noise", [vec![0x16, 3, 1, 0, 0xff], m.as_bytes().to_vec()].concat(), true),
        (
            "HTTP/1.0 without host",
            format!("POST /v1/chat/completions HTTP/1.0\r\ncontent-length: 5\r\n\r\n{m}")
                .into_bytes(),
            false,
        ),
        (
            "expect 100-continue then garbage",
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nauthorization: Bearer {KEY_A}\r\nexpect: 100-continue\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{m}",
                m.len()
            )
            .into_bytes(),
            false,
        ),
    ];
    for (name, request, half_close) in raw {
        cases.push(Case {
            name: format!("proxy: {name}"),
            addr: h.proxy,
            request,
            half_close,
            expect: Expect::Framing(Shape::OpenAi),
        });
    }
    cases
}

/// API listener routes: (path, method, keyed).
const API_ROUTES: &[(&str, &str, bool)] = &[
    ("/spec", "GET", false),
    ("/stats", "GET", false),
    ("/verify", "POST", false),
    ("/estimate", "POST", true),
    ("/gate", "POST", true),
    ("/record", "POST", true),
    ("/ledger", "GET", true),
    ("/budget", "GET", true),
    ("/prices", "GET", true),
    ("/forget", "POST", true),
    ("/holds", "GET", true),
    ("/holds/hold_00/approve", "POST", false),
    ("/holds/hold_00/deny", "POST", false),
];

/// Admin listener routes: (path, method, admin key needed).
const ADMIN_ROUTES: &[(&str, &str, bool)] = &[
    ("/metrics", "GET", false),
    ("/healthz", "GET", false),
    ("/readyz", "GET", false),
    ("/budget/alpha", "PUT", true),
    ("/prices", "PUT", true),
    ("/holds", "GET", true),
    ("/holds/hold_00/approve", "POST", true),
    ("/holds/hold_00/deny", "POST", true),
    ("/economics", "GET", true),
    ("/split-profile/criteria", "GET", false),
    ("/split-profile/precheck", "POST", false),
    ("/split-profile/check", "POST", false),
];

const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH"];

/// Every other method on a route: 405 in the API's shape, the marker in the query and body.
fn wrong_methods(
    listener: &str,
    addr: std::net::SocketAddr,
    path: &str,
    method: &str,
    key: &str,
) -> Vec<Case> {
    let m = MARK;
    METHODS
        .iter()
        .filter(|w| **w != method)
        .map(|wrong| Case {
            name: format!("{listener} {wrong} {path}"),
            addr,
            request: http(
                wrong,
                &format!("{path}?x={m}"),
                &[bearer(key), mark_header()],
                m.as_bytes(),
            ),
            half_close: false,
            expect: Expect::Status(405, Shape::Api),
        })
        .collect()
}

fn api_cases(h: &Harness) -> Vec<Case> {
    let m = MARK;
    let mut cases = Vec::new();
    let api = |name: String, request: Vec<u8>, expect: Expect| Case {
        name,
        addr: h.api,
        request,
        half_close: false,
        expect,
    };
    for &(path, method, keyed) in API_ROUTES {
        cases.extend(wrong_methods("api", h.api, path, method, KEY_A));
        if keyed {
            for (label, headers) in [
                ("no key", vec![mark_header()]),
                ("bad key", vec![bearer(m)]),
                ("bad secret", vec![bearer(&format!("tsk_alpha_{m}"))]),
            ] {
                cases.push(api(
                    format!("api {method} {path}: {label}"),
                    http(method, path, &headers, b"{}"),
                    Expect::Status(401, Shape::Api),
                ));
            }
        }
    }
    let keyed_post =
        |path: &str, body: &[u8]| http("POST", path, &[bearer(KEY_A), json_ct()], body);
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        ("not JSON", m.as_bytes().to_vec()),
        (
            "truncated",
            format!(r#"{{"v":6,"request":{{"model":"{m}"#).into_bytes(),
        ),
        ("invalid utf-8", [m.as_bytes(), &[0xff, 0xfe][..]].concat()),
        ("array", format!(r#"["{m}"]"#).into_bytes()),
        (
            "deep",
            format!("{}\"{m}\"{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
        ),
    ];
    for (name, body) in &garbage {
        for path in ["/estimate", "/gate", "/record"] {
            cases.push(api(
                format!("api {path}: {name}"),
                keyed_post(path, body),
                Expect::Refused(Shape::Api),
            ));
        }
        cases.push(api(
            format!("api /verify: {name}"),
            http("POST", "/verify", &[json_ct()], body),
            // `{"valid": false, "error": <static>}`
            Expect::Status(200, Shape::Api),
        ));
    }
    let digests: Vec<(&str, Value)> = vec![
        ("unknown version", json!({"v": 99, "request": {"model": m}})),
        ("v missing", json!({"request": {"model": m}})),
        ("v a string", json!({"v": m, "request": {}})),
        ("request a string", json!({"v": 6, "request": m})),
        (
            "fingerprint not hex",
            json!({"v": 6, "request": {"route": "openai_chat", "fingerprint": m, "model": "gpt-4o"}}),
        ),
        (
            "route unknown",
            json!({"v": 6, "request": {"route": m, "fingerprint": "00", "model": "gpt-4o"}}),
        ),
        ("held garbage", json!({"v": 6, "request": {}, "held": [m]})),
        ("outdated version", json!({"v": 2, "request": {"model": m}})),
        ("unknown field", json!({"v": 6, "request": {}, m: 1})),
    ];
    for (name, d) in &digests {
        for path in ["/gate", "/estimate"] {
            cases.push(api(
                format!("api {path}: digest {name}"),
                keyed_post(path, d.to_string().as_bytes()),
                Expect::Refused(Shape::Api),
            ));
        }
    }
    for (name, q) in [
        ("route unknown", format!("/estimate?route={m}")),
        ("route empty", "/estimate?route=".to_string()),
    ] {
        cases.push(api(
            format!("api {name}"),
            keyed_post(
                &q,
                json!({"model": "gpt-4o", "messages": [{"role": "user", "content": m}]})
                    .to_string()
                    .as_bytes(),
            ),
            Expect::Refused(Shape::Api),
        ));
    }
    let records: Vec<(&str, Value)> = vec![
        (
            "unknown decision",
            json!({"decision_id": m, "wire": "json", "served_model": "gpt-4o", "complete": true, "usage": {"input": 1, "cache_write": 0, "cache_read": 0, "output": 1}}),
        ),
        (
            "wire unknown",
            json!({"decision_id": "00", "wire": m, "served_model": "gpt-4o", "complete": true, "usage": {"input": 1, "cache_write": 0, "cache_read": 0, "output": 1}}),
        ),
        (
            "usage negative",
            json!({"decision_id": m, "wire": "json", "served_model": "x", "complete": true, "usage": {"input": -1, "cache_write": 0, "cache_read": 0, "output": 1}}),
        ),
        (
            "usage huge",
            json!({"decision_id": m, "wire": "json", "served_model": "x", "complete": true, "usage": {"input": 1e300, "cache_write": 0, "cache_read": 0, "output": 1}}),
        ),
        (
            "complete a string",
            json!({"decision_id": "00", "wire": "json", "served_model": m, "complete": m, "usage": {}}),
        ),
        ("unknown field", json!({"decision_id": "00", m: 1})),
    ];
    for (name, body) in &records {
        cases.push(api(
            format!("api /record: {name}"),
            keyed_post("/record", body.to_string().as_bytes()),
            Expect::Refused(Shape::Api),
        ));
    }
    for (name, body) in [
        (
            "envelope fields garbage",
            json!({"body": m, "sig": m, "kid": m}),
        ),
        (
            "envelope extra field",
            json!({"body": "", "sig": "", "kid": "", m: 1}),
        ),
        (
            "envelope wrong types",
            json!({"body": 1, "sig": [m], "kid": null}),
        ),
    ] {
        cases.push(api(
            format!("api /verify: {name}"),
            http("POST", "/verify", &[json_ct()], body.to_string().as_bytes()),
            Expect::Status(200, Shape::Api),
        ));
    }
    for q in [
        format!("/ledger?from={m}"),
        format!("/ledger?to=2026-13-{m}"),
        "/ledger?from=99999-01-01".to_string(),
    ] {
        cases.push(api(
            format!("api GET {q}"),
            http("GET", &q, &[bearer(KEY_A)], b""),
            Expect::Refused(Shape::Api),
        ));
    }
    for (path, owner) in [
        (format!("/holds/{m}/approve"), "alpha:wrong".to_string()),
        ("/holds/hold_00/approve".to_string(), format!("alpha:{m}")),
        ("/holds/hold_00/deny".to_string(), format!("{m}:{m}")),
        ("/holds/hold_00/approve".to_string(), m.to_string()),
    ] {
        cases.push(api(
            format!("api POST {path} owner {owner}"),
            http("POST", &path, &[("x-tokensaver-owner", owner.clone())], b""),
            Expect::Refused(Shape::Api),
        ));
    }
    for target in [
        format!("/{m}"),
        format!("/holds/{m}"),
        format!("/spec/{m}"),
        format!("/holds/x/{m}"),
    ] {
        cases.push(api(
            format!("api GET {target}"),
            http("GET", &target, &[bearer(KEY_A)], b""),
            Expect::Refused(Shape::Api),
        ));
    }
    cases.push(api(
        "api /estimate over the body cap".into(),
        http(
            "POST",
            "/estimate",
            &[bearer(KEY_A), ("content-length", "99999999".into())],
            m.as_bytes(),
        ),
        Expect::Framing(Shape::Api),
    ));
    cases
}

fn admin_cases(h: &Harness) -> Vec<Case> {
    let m = MARK;
    let mut cases = Vec::new();
    let admin = |name: String, request: Vec<u8>, expect: Expect| Case {
        name,
        addr: h.admin,
        request,
        half_close: false,
        expect,
    };
    for &(path, method, keyed) in ADMIN_ROUTES {
        cases.extend(wrong_methods("admin", h.admin, path, method, ADMIN_KEY));
        if keyed {
            for (label, headers) in [
                ("no key", vec![mark_header()]),
                ("bad key", vec![bearer(m)]),
                ("a caller key", vec![bearer(KEY_A)]),
            ] {
                cases.push(admin(
                    format!("admin {method} {path}: {label}"),
                    http(method, path, &headers, b"{}"),
                    Expect::Status(401, Shape::Api),
                ));
            }
        }
    }
    let put = |path: &str, body: &[u8]| http("PUT", path, &[bearer(ADMIN_KEY), json_ct()], body);
    for (name, body) in [
        ("not JSON", m.as_bytes().to_vec()),
        (
            "ceiling a string",
            json!({"ceiling_micro_usd": m}).to_string().into_bytes(),
        ),
        (
            "ceiling negative",
            json!({"ceiling_micro_usd": -1, "note": m})
                .to_string()
                .into_bytes(),
        ),
        (
            "period unknown",
            json!({"ceiling_micro_usd": 1, "period": m})
                .to_string()
                .into_bytes(),
        ),
        ("unknown field", json!({m: 1}).to_string().into_bytes()),
        (
            "ceiling past u64",
            format!(r#"{{"ceiling_micro_usd":1e400,"n":"{m}"}}"#).into_bytes(),
        ),
    ] {
        cases.push(admin(
            format!("admin PUT /budget/alpha: {name}"),
            put("/budget/alpha", &body),
            Expect::Refused(Shape::Api),
        ));
    }
    cases.push(admin(
        "admin PUT /budget for an unknown key".into(),
        put(&format!("/budget/{m}"), br#"{"ceiling_micro_usd":1}"#),
        Expect::Status(404, Shape::Api),
    ));
    for (name, body) in [
        ("not JSON", m.as_bytes().to_vec()),
        ("an array", json!([m]).to_string().into_bytes()),
        ("prices a string", json!({"gpt-4o": m}).to_string().into_bytes()),
        (
            "max_output zero",
            json!({m: {"input": 1, "cache_write": 1, "cache_read": 1, "output": 1, "max_output": 0}})
                .to_string()
                .into_bytes(),
        ),
        (
            "missing part",
            json!({"gpt-4o": {"input": 1, "note": m}}).to_string().into_bytes(),
        ),
    ] {
        cases.push(admin(
            format!("admin PUT /prices: {name}"),
            put("/prices", &body),
            Expect::Refused(Shape::Api),
        ));
    }
    for path in [format!("/holds/{m}/approve"), format!("/holds/{m}/deny")] {
        cases.push(admin(
            format!("admin POST {path}"),
            http(
                "POST",
                &path,
                &[bearer(ADMIN_KEY)],
                format!(r#"{{"attend_minutes":"{m}"}}"#).as_bytes(),
            ),
            Expect::Refused(Shape::Api),
        ));
    }
    cases.push(admin(
        "admin approve with attend_minutes out of range".into(),
        http(
            "POST",
            "/holds/hold_00/approve",
            &[bearer(ADMIN_KEY), mark_header()],
            br#"{"attend_minutes": 99999999999}"#,
        ),
        Expect::Refused(Shape::Api),
    ));
    cases.push(admin(
        "admin GET /economics with an unknown filter".into(),
        http(
            "GET",
            &format!("/economics?{m}=1"),
            &[bearer(ADMIN_KEY)],
            b"",
        ),
        Expect::Status(400, Shape::Api),
    ));
    for (name, body) in [
        ("not JSON", m.as_bytes().to_vec()),
        (
            "tools a string",
            json!({"tools": m}).to_string().into_bytes(),
        ),
        (
            "tool name a number",
            json!({"tools": [{"name": 7, "description": m}]})
                .to_string()
                .into_bytes(),
        ),
        (
            "tool null",
            json!({"tools": [null], "note": m}).to_string().into_bytes(),
        ),
        (
            "deep",
            format!(
                "{{\"tools\":{}\"{m}\"{}}}",
                "[".repeat(20_000),
                "]".repeat(20_000)
            )
            .into_bytes(),
        ),
        (
            "invalid utf-8",
            [
                b"{\"tools\":[\"".to_vec(),
                m.as_bytes().to_vec(),
                vec![0xc0, 0xaf],
                b"\"]}".to_vec(),
            ]
            .concat(),
        ),
    ] {
        // The admin's house check: a refusal is closed-form.
        cases.push(admin(
            format!("admin POST /split-profile/check: {name}"),
            http(
                "POST",
                "/split-profile/check",
                &[bearer(ADMIN_KEY), json_ct()],
                &body,
            ),
            Expect::Refused(Shape::Api),
        ));
        // A pre-check answers a signed document naming the refusal, never the submission.
        cases.push(admin(
            format!("admin POST /split-profile/precheck: {name}"),
            http(
                "POST",
                "/split-profile/precheck",
                &[bearer(ADMIN_KEY), json_ct()],
                &body,
            ),
            Expect::Status(200, Shape::Api),
        ));
    }
    for target in [
        format!("/{m}"),
        format!("/split-profile/{m}"),
        format!("/budget/{m}/x"),
    ] {
        cases.push(admin(
            format!("admin GET {target}"),
            http("GET", &target, &[bearer(ADMIN_KEY)], b""),
            Expect::Refused(Shape::Api),
        ));
    }
    cases
}

#[test]
fn hostile_input_never_crashes_never_echoes_and_leaves_the_server_healthy() {
    let h = Harness::start(Opts {
        // The log is checked for the marker too.
        rust_log: "info",
        ..Opts::default()
    });
    let mut cases = proxy_cases(&h);
    cases.extend(api_cases(&h));
    cases.extend(admin_cases(&h));
    let (proxy, api, admin) = cases.iter().fold((0, 0, 0), |(p, a, d), c| {
        if c.addr == h.proxy {
            (p + 1, a, d)
        } else if c.addr == h.api {
            (p, a + 1, d)
        } else {
            (p, a, d + 1)
        }
    });
    eprintln!(
        "bad-input battery: {} cases (proxy {proxy}, API {api}, admin {admin})",
        cases.len()
    );
    assert!(cases.len() >= 200, "only {} cases", cases.len());

    let pid = h.pid().unwrap();
    let mut failures = Vec::new();
    // Framing that is legal (chunked with an extension; chunked beside a Content-Length,
    // which chunked overrides) can carry a valid request: those are gated and answered.
    let mut answered = std::collections::BTreeMap::<&str, usize>::new();
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for (i, case) in cases.iter().enumerate() {
        let answer = exchange(case);
        let status = answer
            .status
            .map_or_else(|| "closed".to_string(), |s| s.to_string());
        *statuses.entry(status).or_default() += 1;
        if let Err(e) = check(case, &answer) {
            failures.push(e);
        }
        if case.addr == h.proxy && answer.status == Some(200) {
            let path = GATED
                .iter()
                .map(|(p, _)| *p)
                .find(|p| case.request.starts_with(format!("POST {p} ").as_bytes()));
            match path {
                Some(p) => *answered.entry(p).or_default() += 1,
                None => failures.push(format!("{}: answered 200", case.name)),
            }
        }
        if i % 25 == 0 {
            assert!(
                tokensaver::lifecycle::alive(pid),
                "crashed at {}",
                case.name
            );
        }
    }
    eprintln!("answers by status: {statuses:?}");
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    // Still healthy: alive, ready, and a normal request is served as usual.
    assert!(tokensaver::lifecycle::alive(pid), "the server crashed");
    assert_eq!(
        call(client::get(&h.admin_url("/healthz")), None).status,
        200
    );
    let ready = call(client::get(&h.admin_url("/readyz")), None);
    assert_eq!(ready.status, 200, "{}", ready.text());
    let r = h.post(
        CHAT,
        KEY_B,
        &chat(
            "gpt-4o-mini",
            "a normal question after the battery",
            json!({}),
        ),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.verdict(), Some("ALLOW"));
    // Nothing refused reached the provider: only what was answered, and the normal request.
    eprintln!("answered by the provider: {answered:?}");
    for path in [CHAT, MESSAGES, "/v1/responses"] {
        let expected = answered.get(path).copied().unwrap_or(0) + usize::from(path == CHAT);
        assert_eq!(
            h.calls(path),
            expected,
            "{path}: a refused request reached the provider"
        );
    }
    assert!(answered.values().sum::<usize>() <= 6, "{answered:?}");

    // Never in the log either.
    let log = h.log();
    assert!(
        !contains(log.as_bytes(), MARK),
        "the log carries request content"
    );
}
