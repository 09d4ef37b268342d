//! Over-the-socket tests of the deterministic mock provider (`tokensaver::demo::provider`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokensaver::demo::provider::{
    expected_usage, reply_for, Fault, MockProvider, MockReply, ProviderOptions, CREATED, WORDS,
};

// ------------------------------------------------------------------------------------------
// A tiny blocking HTTP/1.1 client
// ------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
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
    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

fn connect(p: &MockProvider) -> TcpStream {
    let s = TcpStream::connect(p.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    let n = r.read_line(&mut line)?;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "eof"));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

fn read_response(r: &mut impl BufRead) -> io::Result<Resp> {
    loop {
        let status_line = read_line(r)?;
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other(format!("bad status line {status_line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let l = read_line(r)?;
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').unwrap();
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        if status == 100 {
            continue;
        }
        let get = |n: &str| headers.iter().find(|(h, _)| h == n).map(|(_, v)| v.clone());
        let mut body = Vec::new();
        if get("transfer-encoding").as_deref() == Some("chunked") {
            loop {
                let size = usize::from_str_radix(&read_line(r)?, 16).unwrap();
                if size == 0 {
                    assert_eq!(read_line(r)?, "");
                    break;
                }
                let mut chunk = vec![0; size];
                r.read_exact(&mut chunk)?;
                body.extend_from_slice(&chunk);
                assert_eq!(read_line(r)?, "");
            }
        } else if let Some(len) = get("content-length") {
            body = vec![0; len.parse().unwrap()];
            r.read_exact(&mut body)?;
        } else {
            r.read_to_end(&mut body)?;
        }
        return Ok(Resp {
            status,
            headers,
            body,
        });
    }
}

fn request_bytes(method: &str, path: &str, extra: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nhost: mock\r\n");
    for (n, v) in extra {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        out.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One request on a fresh connection.
fn send(p: &MockProvider, method: &str, path: &str, extra: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = connect(p);
    s.write_all(&request_bytes(method, path, extra, body))
        .unwrap();
    read_response(&mut BufReader::new(s)).unwrap()
}

fn post(p: &MockProvider, path: &str, body: &Value) -> Resp {
    send(
        p,
        "POST",
        path,
        &[("content-type", "application/json")],
        &serde_json::to_vec(body).unwrap(),
    )
}

/// Reads everything until EOF or an error; returns the bytes and the error, if any.
fn read_all_raw(mut s: TcpStream) -> (Vec<u8>, Option<io::Error>) {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return (out, Some(e)),
        }
    }
}

/// SSE events as (event name, data) pairs.
fn sse_events(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            (name, data)
        })
        .collect()
}

fn start() -> MockProvider {
    MockProvider::start_background(ProviderOptions::default()).unwrap()
}

fn openai_body(model: &str, text: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": text}]})
}

fn anthropic_body(model: &str, text: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
    })
}

// ------------------------------------------------------------------------------------------
// Plain answers
// ------------------------------------------------------------------------------------------

#[test]
fn openai_json_answer_with_documented_usage() {
    let p = start();
    let body = openai_body("gpt-4o-mini", "Hello there, mock!");
    let r = post(&p, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["created"], CREATED);
    assert_eq!(v["model"], "gpt-4o-mini");
    assert_eq!(v["system_fingerprint"], "fp_tokensaver_mock");
    let id = v["id"].as_str().unwrap();
    assert!(
        id.starts_with("chatcmpl-") && id.len() == "chatcmpl-".len() + 24,
        "{id}"
    );
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    let content = choice["message"]["content"].as_str().unwrap();
    let words: Vec<&str> = content.split(' ').collect();
    assert!((3..=8).contains(&words.len()), "{content}");
    assert!(words.iter().all(|w| WORDS.contains(w)));
    // 18 chars → ceil(18/4) + 8 = 13 prompt tokens.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 13, "completion_tokens": words.len(), "total_tokens": 13 + words.len(),
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    // The in-process prediction matches byte for byte.
    let predicted = reply_for(&serde_json::to_vec(&body).unwrap()).unwrap();
    assert_eq!(predicted.openai_json(), r.body);
    assert_eq!(predicted.text, content);
}

#[test]
fn anthropic_json_answer_with_documented_usage() {
    let p = start();
    let body = anthropic_body("claude-3-5-haiku", "Hello there, mock!");
    let r = post(&p, "/v1/messages", &body);
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-3-5-haiku");
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
    let id = v["id"].as_str().unwrap();
    assert!(id.starts_with("msg_") && id.len() == 4 + 24, "{id}");
    assert_eq!(v["content"][0]["type"], "text");
    let text = v["content"][0]["text"].as_str().unwrap();
    let n = text.split(' ').count();
    // "Be brief." (9) + "Hello there, mock!" (18) = 27 chars → ceil(27/4) + 8 = 15.
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 15, "output_tokens": n, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0})
    );
    let predicted = reply_for(&serde_json::to_vec(&body).unwrap()).unwrap();
    assert_eq!(predicted.anthropic_json(), r.body);
}

#[test]
fn cached_models_report_cache_hits() {
    let p = start();
    let r = post(
        &p,
        "/v1/chat/completions",
        &openai_body("gpt-cached", "Hello there, mock!"),
    );
    let u = &r.json()["usage"];
    assert_eq!(u["prompt_tokens"], 13);
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 6);

    let body = json!({"model": "claude-cached", "max_tokens": 50,
                      "messages": [{"role": "user", "content": "Hello there, mock!"}]});
    let r = post(&p, "/v1/messages", &body);
    let u = &r.json()["usage"];
    // P = 13: read 13/2 = 6, creation 13/4 = 3, input 13 - 6 - 3 = 4.
    assert_eq!(u["input_tokens"], 4);
    assert_eq!(u["cache_read_input_tokens"], 6);
    assert_eq!(u["cache_creation_input_tokens"], 3);
    let e = expected_usage(&serde_json::to_vec(&body).unwrap()).unwrap();
    assert_eq!(
        (
            e.input_tokens,
            e.cache_read_input_tokens,
            e.cache_creation_input_tokens
        ),
        (4, 6, 3)
    );
}

#[test]
fn max_tokens_caps_the_reply() {
    let p = start();
    let body = json!({"model": "m", "max_completion_tokens": 2, "max_tokens": 50,
                      "messages": [{"role": "user", "content": "count"}]});
    let v = post(&p, "/v1/chat/completions", &body).json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        2
    );

    let body =
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "count"}]});
    let v = post(&p, "/v1/messages", &body).json();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 1);
}

#[test]
fn identical_requests_get_byte_identical_answers() {
    let p = start();
    let body = openai_body("gpt-4o", "determinism please");
    let a = post(&p, "/v1/chat/completions", &body);
    let b = post(&p, "/v1/chat/completions", &body);
    assert_eq!(a.body, b.body);
    // Key order and whitespace do not matter.
    let reordered = br#"{ "messages" : [ {"content":"determinism please", "role":"user"} ], "model":"gpt-4o" }"#;
    let c = send(&p, "POST", "/v1/chat/completions", &[], reordered);
    assert_eq!(a.body, c.body);
    // A different prompt gives a different id.
    let d = post(
        &p,
        "/v1/chat/completions",
        &openai_body("gpt-4o", "something else"),
    );
    assert_ne!(a.json()["id"], d.json()["id"]);
    let a2 = post(&p, "/v1/messages", &anthropic_body("claude", "x"));
    let b2 = post(&p, "/v1/messages", &anthropic_body("claude", "x"));
    assert_eq!(a2.body, b2.body);
}

#[test]
fn models_list_unknown_path_and_wrong_method() {
    let p = start();
    let r = send(&p, "GET", "/v1/models", &[], b"");
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert!(v["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["id"] == "mock-small"));

    let r = send(&p, "GET", "/nope?x=1", &[], b"");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/nope"));

    let r = send(&p, "GET", "/v1/chat/completions", &[], b"");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    let r = send(&p, "GET", "/v1/messages", &[], b"");
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["type"], "error");

    let r = send(&p, "POST", "/v1/chat/completions", &[], b"{not json");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = send(&p, "POST", "/v1/messages", &[], b"[1,2]");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert_eq!(p.calls("/nope"), 1);
}

// ------------------------------------------------------------------------------------------
// Streaming
// ------------------------------------------------------------------------------------------

fn openai_stream(p: &MockProvider, include_usage: Option<bool>) {
    let mut body = openai_body("gpt-4o", "stream me");
    body["stream"] = json!(true);
    if let Some(u) = include_usage {
        body["stream_options"] = json!({"include_usage": u});
    }
    let plain = post(
        p,
        "/v1/chat/completions",
        &openai_body("gpt-4o", "stream me"),
    )
    .json();
    let r = post(p, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let events = sse_events(&r.text());
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(name, d)| {
            assert!(name.is_none());
            serde_json::from_str(d).unwrap()
        })
        .collect();
    let with_usage = include_usage == Some(true);
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], plain["id"]);
        assert_eq!(c["created"], CREATED);
        assert_eq!(c["model"], "gpt-4o");
        assert_eq!(c.get("usage").is_some(), with_usage, "{c}");
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let words = plain["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let mut text = String::new();
    for c in &chunks[1..=words] {
        assert!(c["choices"][0]["finish_reason"].is_null());
        text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap());
    }
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let fin = &chunks[words + 1];
    assert_eq!(fin["choices"][0]["finish_reason"], "stop");
    assert_eq!(fin["choices"][0]["delta"], json!({}));
    if with_usage {
        assert_eq!(chunks.len(), words + 3);
        let last = &chunks[words + 2];
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"], plain["usage"]);
        assert!(fin["usage"].is_null());
    } else {
        assert_eq!(chunks.len(), words + 2);
    }
}

#[test]
fn openai_streaming_with_and_without_usage() {
    let p = start();
    openai_stream(&p, None);
    openai_stream(&p, Some(false));
    openai_stream(&p, Some(true));
}

#[test]
fn anthropic_streaming() {
    let p = start();
    let plain_body = anthropic_body("claude-cached", "stream me too");
    let plain = post(&p, "/v1/messages", &plain_body).json();
    let mut body = plain_body.clone();
    body["stream"] = json!(true);
    let r = post(&p, "/v1/messages", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&r.text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    let n = plain["usage"]["output_tokens"].as_u64().unwrap() as usize;
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", n));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    let data: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    for (name, d) in names.iter().zip(&data) {
        assert_eq!(d["type"], *name);
    }
    let start = &data[0]["message"];
    assert_eq!(start["id"], plain["id"]);
    assert_eq!(start["type"], "message");
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null());
    assert_eq!(
        start["usage"]["input_tokens"],
        plain["usage"]["input_tokens"]
    );
    assert_eq!(
        start["usage"]["cache_read_input_tokens"],
        plain["usage"]["cache_read_input_tokens"]
    );
    assert_eq!(
        start["usage"]["cache_creation_input_tokens"],
        plain["usage"]["cache_creation_input_tokens"]
    );
    assert_eq!(start["usage"]["output_tokens"], 1);
    assert_eq!(
        data[1]["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = data[3..3 + n]
        .iter()
        .map(|d| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, plain["content"][0]["text"].as_str().unwrap());
    let delta = &data[n + 4];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], n);
}

#[test]
fn stream_delay_paces_events() {
    let p = MockProvider::start_background(ProviderOptions {
        stream_delay_ms: 20,
        ..ProviderOptions::default()
    })
    .unwrap();
    let mut body = openai_body("gpt-4o", "pace");
    body["stream"] = json!(true);
    let t = Instant::now();
    let r = post(&p, "/v1/chat/completions", &body);
    let events = sse_events(&r.text()).len();
    assert!(t.elapsed() >= Duration::from_millis(20 * (events as u64 - 2)));
    let expected = reply_for(&serde_json::to_vec(&body).unwrap())
        .unwrap()
        .openai_sse_events(false)
        .concat();
    assert_eq!(r.text(), expected);
}

// ------------------------------------------------------------------------------------------
// Connection handling
// ------------------------------------------------------------------------------------------

#[test]
fn keep_alive_and_pipelining_on_one_connection() {
    let p = start();
    let s = connect(&p);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let chat = serde_json::to_vec(&openai_body("gpt-4o", "one")).unwrap();
    let mut streamed = openai_body("gpt-4o", "one");
    streamed["stream"] = json!(true);
    let streamed = serde_json::to_vec(&streamed).unwrap();
    let msg = serde_json::to_vec(&anthropic_body("claude", "two")).unwrap();
    let mut first = None;
    for i in 0..6 {
        let (path, body) = match i % 3 {
            0 => ("/v1/chat/completions", &chat),
            1 => ("/v1/chat/completions", &streamed),
            _ => ("/v1/messages", &msg),
        };
        w.write_all(&request_bytes("POST", path, &[], body))
            .unwrap();
        let resp = read_response(&mut r).unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("connection"), None);
        if i == 0 {
            first = Some(resp.body);
        } else if i % 3 == 0 {
            assert_eq!(first.as_ref(), Some(&resp.body));
        }
    }
    // Three pipelined requests in one write, plus a GET.
    let mut batch = Vec::new();
    for _ in 0..3 {
        batch.extend(request_bytes("POST", "/v1/chat/completions", &[], &chat));
    }
    batch.extend(request_bytes("GET", "/v1/models", &[], b""));
    w.write_all(&batch).unwrap();
    for _ in 0..3 {
        let resp = read_response(&mut r).unwrap();
        assert_eq!(Some(&resp.body), first.as_ref());
    }
    assert_eq!(read_response(&mut r).unwrap().json()["object"], "list");
    assert_eq!(p.calls("/v1/chat/completions"), 7);
    assert_eq!(p.calls("/v1/messages"), 2);
    assert_eq!(p.calls("/v1/models"), 1);
}

#[test]
fn connection_close_and_http10_are_honoured() {
    let p = start();
    let body = serde_json::to_vec(&openai_body("gpt-4o", "bye")).unwrap();
    let mut s = connect(&p);
    s.write_all(&request_bytes(
        "POST",
        "/v1/chat/completions",
        &[("Connection", "close")],
        &body,
    ))
    .unwrap();
    let mut r = BufReader::new(s);
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("connection"), Some("close"));
    let mut rest = Vec::new();
    assert_eq!(r.read_to_end(&mut rest).unwrap(), 0, "server must close");

    // HTTP/1.0 without keep-alive: answer then close.
    let mut s = connect(&p);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let (raw, err) = read_all_raw(s);
    assert!(err.is_none());
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
    assert!(text.contains("connection: close\r\n"));

    // HTTP/1.0 with keep-alive: two requests on one connection.
    let s = connect(&p);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    for _ in 0..2 {
        w.write_all(
            req.replace("\r\n\r\n", "\r\nConnection: keep-alive\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        w.write_all(&body).unwrap();
        let resp = read_response(&mut r).unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("connection"), Some("keep-alive"));
    }
}

fn chunked_request(path: &str, body: &[u8], piece: usize) -> Vec<u8> {
    let mut out =
        format!("POST {path} HTTP/1.1\r\nHost: mock\r\nTransfer-Encoding: chunked\r\n\r\n")
            .into_bytes();
    for (i, c) in body.chunks(piece).enumerate() {
        if i % 2 == 0 {
            out.extend(format!("{:x};ext=1\r\n", c.len()).into_bytes());
        } else {
            out.extend(format!("{:X}\r\n", c.len()).into_bytes());
        }
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nX-Trailer: yes\r\n\r\n");
    out
}

#[test]
fn chunked_request_body() {
    let p = start();
    let body = serde_json::to_vec(&openai_body("gpt-4o", "chunk me into little pieces")).unwrap();
    let by_length = send(&p, "POST", "/v1/chat/completions", &[], &body);
    let s = connect(&p);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    // Sent in several writes, then a second request on the same connection.
    let req = chunked_request("/v1/chat/completions", &body, 7);
    for part in req.chunks(11) {
        w.write_all(part).unwrap();
        w.flush().unwrap();
    }
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, by_length.body);
    w.write_all(&chunked_request("/v1/chat/completions", &body, 1000))
        .unwrap();
    assert_eq!(read_response(&mut r).unwrap().body, by_length.body);
    let last = p.last_request().unwrap();
    assert_eq!(last.body.as_ref(), body.as_slice());
    assert_eq!(last.header("transfer-encoding"), Some("chunked"));
}

#[test]
fn four_mib_bodies_by_length_and_chunked() {
    let p = start();
    let prompt = "a".repeat(4 * 1024 * 1024);
    let body = serde_json::to_vec(&openai_body("gpt-4o", &prompt)).unwrap();
    let r = send(&p, "POST", "/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["prompt_tokens"], 1024 * 1024 + 8);
    let rec = p.last_request().unwrap();
    assert_eq!(rec.body_len, body.len());
    assert_eq!(rec.body.len(), body.len());

    let mut s = connect(&p);
    s.write_all(&chunked_request("/v1/chat/completions", &body, 64 * 1024))
        .unwrap();
    let r2 = read_response(&mut BufReader::new(s)).unwrap();
    assert_eq!(r2.body, r.body);

    let abody = serde_json::to_vec(&anthropic_body("claude", &prompt)).unwrap();
    let r3 = send(&p, "POST", "/v1/messages", &[], &abody);
    // 9 + 4 MiB chars → ceil((4194304 + 9) / 4) + 8.
    assert_eq!(
        r3.json()["usage"]["input_tokens"],
        (4 * 1024 * 1024 + 9u64).div_ceil(4) + 8
    );
}

#[test]
fn expect_100_continue() {
    let p = start();
    let body = serde_json::to_vec(&openai_body("gpt-4o", "expecting")).unwrap();
    let s = connect(&p);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes()).unwrap();
    assert_eq!(read_line(&mut r).unwrap(), "HTTP/1.1 100 Continue");
    assert_eq!(read_line(&mut r).unwrap(), "");
    w.write_all(&body).unwrap();
    assert_eq!(read_response(&mut r).unwrap().status, 200);
}

#[test]
fn malformed_requests_get_400_and_close() {
    let p = start();
    for raw in [
        &b"GARBAGE\r\n\r\n"[..],
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ] {
        let mut s = connect(&p);
        s.write_all(raw).unwrap();
        let (out, _) = read_all_raw(s);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
        assert!(text.contains("connection: close"));
    }
    let small = MockProvider::start_background(ProviderOptions {
        max_body_bytes: 10,
        ..ProviderOptions::default()
    })
    .unwrap();
    let r = send(&small, "POST", "/v1/chat/completions", &[], &[b' '; 11]);
    assert_eq!(r.status, 413);
}

// ------------------------------------------------------------------------------------------
// Fault modes
// ------------------------------------------------------------------------------------------

#[test]
fn fault_model_selection() {
    assert_eq!(Fault::for_model("fault-500"), Some(Fault::Status500));
    assert_eq!(Fault::for_model("gpt-4o-fault-429"), Some(Fault::Status429));
    assert_eq!(Fault::for_model("fault-reset"), Some(Fault::Reset));
    assert_eq!(Fault::for_model("fault-slow"), Some(Fault::Slow));
    assert_eq!(Fault::for_model("fault-truncated"), Some(Fault::Truncated));
    assert_eq!(Fault::for_model("gpt-4o"), None);
}

#[test]
fn fault_500_and_429() {
    let p = start();
    let r = post(&p, "/v1/chat/completions", &openai_body("fault-500", "x"));
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["type"], "server_error");
    let mut streamed = anthropic_body("fault-500", "x");
    streamed["stream"] = json!(true);
    let r = post(&p, "/v1/messages", &streamed);
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "api_error");

    let r = post(&p, "/v1/chat/completions", &openai_body("fault-429", "x"));
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    let r = post(&p, "/v1/messages", &anthropic_body("fault-429", "x"));
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert_eq!(p.calls("/v1/chat/completions"), 2);
    assert_eq!(p.calls("/v1/messages"), 2);
}

#[test]
fn fault_500_keeps_the_connection() {
    let p = start();
    let s = connect(&p);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    for model in ["fault-500", "gpt-4o", "fault-429", "gpt-4o"] {
        let body = serde_json::to_vec(&openai_body(model, "x")).unwrap();
        w.write_all(&request_bytes("POST", "/v1/chat/completions", &[], &body))
            .unwrap();
        read_response(&mut r).unwrap();
    }
}

#[test]
fn fault_reset() {
    let p = start();
    // Not streamed: reset before anything is sent.
    let mut s = connect(&p);
    let body = serde_json::to_vec(&openai_body("fault-reset", "x")).unwrap();
    s.write_all(&request_bytes("POST", "/v1/chat/completions", &[], &body))
        .unwrap();
    let (out, err) = read_all_raw(s);
    assert!(out.is_empty());
    assert_eq!(err.map(|e| e.kind()), Some(io::ErrorKind::ConnectionReset));

    // Streamed: head and two events, then a reset.
    for (path, mut body) in [
        ("/v1/chat/completions", openai_body("fault-reset", "x")),
        ("/v1/messages", anthropic_body("fault-reset", "x")),
    ] {
        body["stream"] = json!(true);
        let mut s = connect(&p);
        s.write_all(&request_bytes(
            "POST",
            path,
            &[],
            &serde_json::to_vec(&body).unwrap(),
        ))
        .unwrap();
        let (out, err) = read_all_raw(s);
        assert_eq!(err.map(|e| e.kind()), Some(io::ErrorKind::ConnectionReset));
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(text.contains("transfer-encoding: chunked"));
        let (_, chunks) = text.split_once("\r\n\r\n").unwrap();
        let events = chunks.matches("\n\n").count();
        assert_eq!(events, 2, "{chunks}");
        assert!(!text.contains("[DONE]") && !text.contains("message_stop"));
    }
    assert_eq!(p.calls("/v1/chat/completions"), 2);
}

#[test]
fn fault_slow() {
    let p = MockProvider::start_background(ProviderOptions {
        slow_ms: 300,
        ..ProviderOptions::default()
    })
    .unwrap();
    let body = openai_body("fault-slow", "take your time");
    let t = Instant::now();
    let r = post(&p, "/v1/chat/completions", &body);
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        reply_for(&serde_json::to_vec(&body).unwrap())
            .unwrap()
            .openai_json()
    );
    let mut streamed = anthropic_body("fault-slow", "x");
    streamed["stream"] = json!(true);
    let t = Instant::now();
    let r = post(&p, "/v1/messages", &streamed);
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(r
        .text()
        .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    // The request is counted while it is still pending.
    let addr: SocketAddr = p.addr();
    let h = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let body = serde_json::to_vec(&openai_body("fault-slow", "y")).unwrap();
        s.write_all(&request_bytes("POST", "/v1/chat/completions", &[], &body))
            .unwrap();
        read_response(&mut BufReader::new(s)).unwrap()
    });
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(p.calls("/v1/chat/completions"), 2);
    assert_eq!(h.join().unwrap().status, 200);
}

#[test]
fn fault_truncated() {
    let p = start();
    // Not streamed: Content-Length of the whole answer, half of it sent, then FIN.
    let body = openai_body("fault-truncated", "cut");
    let full = reply_for(&serde_json::to_vec(&body).unwrap())
        .unwrap()
        .openai_json();
    let mut s = connect(&p);
    s.write_all(&request_bytes(
        "POST",
        "/v1/chat/completions",
        &[],
        &serde_json::to_vec(&body).unwrap(),
    ))
    .unwrap();
    let (out, err) = read_all_raw(s);
    assert!(err.is_none(), "{err:?}");
    let text = String::from_utf8(out).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.contains(&format!("content-length: {}", full.len())));
    assert_eq!(rest.as_bytes(), &full[..full.len() / 2]);

    // Streamed: every event through the last word, no end markers, no last chunk, FIN.
    for (path, mut body) in [
        (
            "/v1/chat/completions",
            openai_body("fault-truncated", "cut"),
        ),
        ("/v1/messages", anthropic_body("fault-truncated", "cut")),
    ] {
        body["stream"] = json!(true);
        let reply: MockReply = reply_for(&serde_json::to_vec(&body).unwrap()).unwrap();
        let mut s = connect(&p);
        s.write_all(&request_bytes(
            "POST",
            path,
            &[],
            &serde_json::to_vec(&body).unwrap(),
        ))
        .unwrap();
        let (out, err) = read_all_raw(s);
        assert!(err.is_none(), "{err:?}");
        let text = String::from_utf8(out).unwrap();
        assert!(!text.ends_with("0\r\n\r\n"));
        assert!(!text.contains("[DONE]") && !text.contains("message_stop"));
        assert!(!text.contains("finish_reason\":\"stop") && !text.contains("content_block_stop"));
        let expected_events = if path.ends_with("messages") {
            3 + reply.words.len()
        } else {
            1 + reply.words.len()
        };
        let (_, chunks) = text.split_once("\r\n\r\n").unwrap();
        assert_eq!(chunks.matches("\n\n").count(), expected_events, "{chunks}");
        assert!(chunks.contains(reply.words.last().unwrap()));
    }
}

// ------------------------------------------------------------------------------------------
// Authentication, recording, introspection
// ------------------------------------------------------------------------------------------

#[test]
fn credential_checks_and_header_recording() {
    let p = MockProvider::start_background(ProviderOptions {
        expected_credential: Some("sk-real".into()),
        ..ProviderOptions::default()
    })
    .unwrap();
    let oa = serde_json::to_vec(&openai_body("gpt-4o", "auth")).unwrap();
    let an = serde_json::to_vec(&anthropic_body("claude", "auth")).unwrap();
    let r = send(&p, "POST", "/v1/chat/completions", &[], &oa);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = send(
        &p,
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer sk-wrong")],
        &oa,
    );
    assert_eq!(r.status, 401);
    let r = send(
        &p,
        "POST",
        "/v1/chat/completions",
        &[("AUTHORIZATION", "bearer sk-real")],
        &oa,
    );
    assert_eq!(r.status, 200);
    let r = send(
        &p,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sk-virtual")],
        &an,
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = send(&p, "POST", "/v1/messages", &[("X-Api-Key", "sk-real")], &an);
    assert_eq!(r.status, 200);
    let r = send(&p, "GET", "/v1/models", &[], b"");
    assert_eq!(r.status, 401);
    // Introspection needs no credential.
    let r = send(&p, "GET", "/__mock/calls", &[], b"");
    assert_eq!(r.status, 200);

    let recs = p.requests_to("/v1/messages");
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].header("x-api-key"), Some("sk-virtual"));
    assert_eq!(recs[1].header("X-API-KEY"), Some("sk-real"));
    assert_eq!(recs[1].method, "POST");
    assert_eq!(recs[1].body.as_ref(), an.as_slice());
    let chat = p.requests_to("/v1/chat/completions");
    assert_eq!(chat[2].header("authorization"), Some("bearer sk-real"));
    assert!(chat[0].header("authorization").is_none());
}

#[test]
fn counters_and_introspection_routes() {
    let p = start();
    for _ in 0..3 {
        post(&p, "/v1/chat/completions", &openai_body("gpt-4o", "count"));
    }
    post(&p, "/v1/messages", &anthropic_body("claude", "count"));
    send(&p, "GET", "/v1/models?limit=1", &[], b"");
    assert_eq!(p.calls("/v1/chat/completions"), 3);
    assert_eq!(p.calls("/v1/messages"), 1);
    assert_eq!(p.calls("/v1/models"), 1);
    assert_eq!(p.total_calls(), 5);
    let calls = send(&p, "GET", "/__mock/calls", &[], b"").json();
    assert_eq!(
        calls,
        json!({"/v1/chat/completions": 3, "/v1/messages": 1, "/v1/models": 1})
    );
    let reqs = send(
        &p,
        "GET",
        "/__mock/requests?limit=2&path=%2Fv1%2Fchat%2Fcompletions",
        &[],
        b"",
    )
    .json();
    let reqs = reqs.as_array().unwrap();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1]["path"], "/v1/chat/completions");
    assert_eq!(reqs[1]["method"], "POST");
    let body: Value = serde_json::from_str(reqs[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["model"], "gpt-4o");
    assert!(reqs[0]["seq"].as_u64() < reqs[1]["seq"].as_u64());
    assert!(reqs[1]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h[0] == "content-type" && h[1] == "application/json"));
    assert_eq!(
        send(&p, "GET", "/__mock/health", &[], b"").json()["ok"],
        true
    );

    let r = send(&p, "POST", "/__mock/reset", &[], b"");
    assert_eq!(r.json(), json!({"ok": true}));
    assert_eq!(p.calls("/v1/chat/completions"), 0);
    assert!(p.requests().is_empty());
    assert_eq!(send(&p, "GET", "/__mock/calls", &[], b"").json(), json!({}));
    post(&p, "/v1/messages", &anthropic_body("claude", "again"));
    assert_eq!(p.calls("/v1/messages"), 1);
    p.reset();
    assert_eq!(p.total_calls(), 0);
}

#[test]
fn record_retention_is_capped_but_counting_is_not() {
    let p = MockProvider::start_background(ProviderOptions {
        max_records: 5,
        max_recorded_bytes: 1000,
        ..ProviderOptions::default()
    })
    .unwrap();
    let s = connect(&p);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let body = serde_json::to_vec(&openai_body("gpt-4o", &"z".repeat(300))).unwrap();
    for _ in 0..20 {
        w.write_all(&request_bytes("POST", "/v1/chat/completions", &[], &body))
            .unwrap();
        read_response(&mut r).unwrap();
    }
    assert_eq!(p.calls("/v1/chat/completions"), 20);
    let recs = p.requests();
    assert_eq!(recs.len(), 1000 / body.len());
    assert_eq!(recs.last().unwrap().seq, 20);
    // A body above the byte budget is kept truncated.
    let big = serde_json::to_vec(&openai_body("gpt-4o", &"z".repeat(3000))).unwrap();
    send(&p, "POST", "/v1/chat/completions", &[], &big);
    let last = p.last_request().unwrap();
    assert_eq!(last.body_len, big.len());
    assert_eq!(last.body.len(), 1000);
    assert_eq!(p.requests().len(), 1);
}

#[test]
fn ureq_client_works() {
    let p = start();
    let body = openai_body("gpt-4o", "via ureq");
    let agent = ureq::AgentBuilder::new().build();
    for _ in 0..3 {
        let resp = agent
            .post(&format!("{}/v1/chat/completions", p.base_url()))
            .set("content-type", "application/json")
            .send_bytes(&serde_json::to_vec(&body).unwrap())
            .unwrap();
        let v: Value = serde_json::from_str(&resp.into_string().unwrap()).unwrap();
        assert_eq!(v["object"], "chat.completion");
    }
    assert_eq!(p.calls("/v1/chat/completions"), 3);
    let err = agent
        .post(&format!("{}/v1/chat/completions", p.base_url()))
        .send_bytes(&serde_json::to_vec(&openai_body("fault-429", "x")).unwrap())
        .unwrap_err();
    match err {
        ureq::Error::Status(code, resp) => {
            assert_eq!(code, 429);
            assert_eq!(resp.header("retry-after"), Some("1"));
        }
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_start_and_shutdown() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = MockProvider::start("127.0.0.1:0".parse().unwrap(), ProviderOptions::default())
        .await
        .unwrap();
    assert!(p.base_url().starts_with("http://127.0.0.1:"));
    let mut s = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    let body = serde_json::to_vec(&openai_body("gpt-4o", "async")).unwrap();
    let mut req = request_bytes(
        "POST",
        "/v1/chat/completions",
        &[("connection", "close")],
        &body,
    );
    req.extend_from_slice(b"");
    s.write_all(&req).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let expected = reply_for(&body).unwrap().openai_json();
    assert!(out.ends_with(&expected));
    let addr = p.addr();
    p.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[test]
fn background_shutdown_frees_the_port() {
    let p = start();
    let addr = p.addr();
    drop(p);
    assert!(TcpStream::connect(addr).is_err());
}

/// Rough throughput figure: `cargo test --release --test mock_provider -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    let p = start();
    let body = serde_json::to_vec(&openai_body("gpt-4o", &"w".repeat(8 * 1024))).unwrap();
    let per_conn = 20_000;
    let conns = 4;
    let t = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|_| {
            let addr = p.addr();
            let req = request_bytes("POST", "/v1/chat/completions", &[], &body);
            std::thread::spawn(move || {
                let s = TcpStream::connect(addr).unwrap();
                s.set_nodelay(true).unwrap();
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                for _ in 0..per_conn {
                    w.write_all(&req).unwrap();
                    assert_eq!(read_response(&mut r).unwrap().status, 200);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let n = per_conn * conns;
    let secs = t.elapsed().as_secs_f64();
    println!("{n} requests in {secs:.2}s = {:.0} req/s", n as f64 / secs);
    assert_eq!(p.calls("/v1/chat/completions"), n);
}

#[test]
fn head_requests_get_no_body_and_streams_honour_close() {
    let p = start();
    let s = connect(&p);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    w.write_all(b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut head = Vec::new();
    loop {
        let l = read_line(&mut r).unwrap();
        if l.is_empty() {
            break;
        }
        head.push(l);
    }
    assert!(head[0].starts_with("HTTP/1.1 405 "));
    // The next answer on the connection starts right after the head.
    w.write_all(&request_bytes("GET", "/v1/models", &[], b""))
        .unwrap();
    assert_eq!(read_response(&mut r).unwrap().status, 200);

    let mut body = anthropic_body("claude", "close after stream");
    body["stream"] = json!(true);
    let mut s = connect(&p);
    s.write_all(&request_bytes(
        "POST",
        "/v1/messages",
        &[("connection", "close")],
        &serde_json::to_vec(&body).unwrap(),
    ))
    .unwrap();
    let (raw, err) = read_all_raw(s);
    assert!(err.is_none());
    let text = String::from_utf8(raw).unwrap();
    assert!(text.contains("connection: close\r\n"));
    assert!(text.ends_with("0\r\n\r\n"));
}
