//! Over-the-socket tests of the deterministic mock provider (`tokensaver_mock_provider`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokensaver_mock_provider::{
    argument_pieces, expected_usage, reply_for, reply_for_api, Api, Fault, MockProvider, MockReply,
    ProviderOptions, Scripted, CREATED, WORDS,
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
    // hyper answers an HTTP/1.0 request in HTTP/1.0 (the hand-written server said HTTP/1.1).
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n"));
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

    // The same prompt again would read the first one's prompt cache (≥ 1024 tokens): start
    // from an empty cache so that the answer is byte-identical.
    p.reset_prompt_cache();
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

// ------------------------------------------------------------------------------------------
// The Responses API
// ------------------------------------------------------------------------------------------

fn responses_body(model: &str, input: Value) -> Value {
    json!({"model": model, "instructions": "Be brief.", "input": input})
}

/// The fields the official SDK's `Response` model requires or reads.
fn assert_response_shape(v: &Value) {
    for key in [
        "id",
        "object",
        "created_at",
        "status",
        "error",
        "incomplete_details",
        "instructions",
        "metadata",
        "model",
        "output",
        "parallel_tool_calls",
        "temperature",
        "tool_choice",
        "tools",
        "top_p",
        "max_output_tokens",
        "previous_response_id",
        "reasoning",
        "text",
        "truncation",
        "usage",
        "user",
        "store",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["object"], "response");
    assert_eq!(v["created_at"], CREATED);
    let id = v["id"].as_str().unwrap();
    assert!(id.starts_with("resp_") && id.len() == 5 + 24, "{id}");
}

#[test]
fn responses_json_answer_with_documented_usage() {
    let p = start();
    let body = responses_body("gpt-4.1-mini", json!("Hello there, mock!"));
    let r = post(&p, "/v1/responses", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_response_shape(&v);
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "gpt-4.1-mini");
    assert_eq!(v["instructions"], "Be brief.");
    assert!(v["incomplete_details"].is_null() && v["error"].is_null());
    assert_eq!(v["parallel_tool_calls"], true);
    assert_eq!(v["tool_choice"], "auto");
    assert_eq!(v["tools"], json!([]));
    assert_eq!(v["store"], true);
    let item = &v["output"][0];
    assert_eq!(v["output"].as_array().unwrap().len(), 1);
    assert_eq!(item["type"], "message");
    assert_eq!(item["role"], "assistant");
    assert_eq!(item["status"], "completed");
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    let part = &item["content"][0];
    assert_eq!(part["type"], "output_text");
    assert_eq!(part["annotations"], json!([]));
    let text = part["text"].as_str().unwrap();
    let n = text.split(' ').count();
    assert!((3..=8).contains(&n) && text.split(' ').all(|w| WORDS.contains(&w)));
    // "Be brief." (9) + "Hello there, mock!" (18) = 27 chars → ceil(27/4) + 8 = 15.
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 15, "input_tokens_details": {"cached_tokens": 0},
               "output_tokens": n, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": 15 + n})
    );
    let predicted = reply_for_api(Api::Responses, &serde_json::to_vec(&body).unwrap()).unwrap();
    assert_eq!(predicted.responses_json(&body), r.body);
    assert_eq!(predicted.text, text);
    // Echoed request fields.
    let mut echo = body.clone();
    echo["temperature"] = json!(0.5);
    echo["metadata"] = json!({"k": "v"});
    echo["store"] = json!(false);
    echo["tool_choice"] = json!("none");
    let v = post(&p, "/v1/responses", &echo).json();
    assert_eq!(v["temperature"], 0.5);
    assert_eq!(v["metadata"], json!({"k": "v"}));
    assert_eq!(v["store"], false);
    assert_eq!(v["tool_choice"], "none");
}

#[test]
fn responses_prompt_characters_of_items_and_cache() {
    let p = start();
    let input = json!([
        {"role": "user", "content": "abcd"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "efgh"}, {"type": "input_image", "image_url": "x"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "123456"},
        {"type": "reasoning", "summary": []},
    ]);
    // 9 (instructions) + 4 + 4 + 7 + 6 = 30 chars → ceil(30/4) + 8 = 16.
    let v = post(&p, "/v1/responses", &responses_body("gpt-4o-cached", input)).json();
    assert_eq!(v["usage"]["input_tokens"], 16);
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 8);
}

#[test]
fn responses_max_output_tokens_cuts_the_reply() {
    let p = start();
    let mut body = responses_body("gpt-4o", json!("cut me short"));
    body["max_output_tokens"] = json!(1);
    let v = post(&p, "/v1/responses", &body).json();
    assert_eq!(v["status"], "incomplete");
    assert_eq!(
        v["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(v["output"][0]["status"], "incomplete");
    assert_eq!(v["usage"]["output_tokens"], 1);
    assert_eq!(v["max_output_tokens"], 1);
    body["stream"] = json!(true);
    let events = sse_events(&post(&p, "/v1/responses", &body).text());
    let (name, data) = events.last().unwrap();
    assert_eq!(name.as_deref(), Some("response.incomplete"));
    let last: Value = serde_json::from_str(data).unwrap();
    assert_eq!(last["response"], v);
}

/// The streamed events as (name, JSON), checking the name, `type` and `sequence_number`.
fn responses_events(text: &str) -> Vec<(String, Value)> {
    assert!(!text.contains("[DONE]"));
    sse_events(text)
        .into_iter()
        .enumerate()
        .map(|(i, (name, data))| {
            let name = name.unwrap();
            let v: Value = serde_json::from_str(&data).unwrap();
            assert_eq!(v["type"], name.as_str());
            assert_eq!(v["sequence_number"], i);
            (name, v)
        })
        .collect()
}

#[test]
fn responses_streaming() {
    let p = start();
    let plain_body = responses_body("gpt-4o", json!("stream me"));
    let plain = post(&p, "/v1/responses", &plain_body).json();
    let mut body = plain_body.clone();
    body["stream"] = json!(true);
    let r = post(&p, "/v1/responses", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = responses_events(&r.text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let words = plain["usage"]["output_tokens"].as_u64().unwrap() as usize;
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", words));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    assert!(created["usage"].is_null());
    assert_eq!(created["id"], plain["id"]);
    let item_id = plain["output"][0]["id"].clone();
    assert_eq!(events[2].1["item"]["id"], item_id);
    assert_eq!(events[2].1["item"]["content"], json!([]));
    let mut text = String::new();
    for (_, e) in &events[4..4 + words] {
        assert_eq!(e["item_id"], item_id);
        assert_eq!(
            (e["output_index"].as_u64(), e["content_index"].as_u64()),
            (Some(0), Some(0))
        );
        text.push_str(e["delta"].as_str().unwrap());
    }
    let plain_text = plain["output"][0]["content"][0]["text"].as_str().unwrap();
    assert_eq!(text, plain_text);
    assert_eq!(events[4 + words].1["text"], plain_text);
    assert_eq!(events[6 + words].1["item"], plain["output"][0]);
    // The final event carries the same response as the plain answer.
    assert_eq!(events.last().unwrap().1["response"], plain);
    let predicted = reply_for_api(Api::Responses, &serde_json::to_vec(&body).unwrap()).unwrap();
    assert_eq!(predicted.responses_sse_events(&body).concat(), r.text());
}

#[test]
fn responses_kept_by_id() {
    let p = MockProvider::start_background(ProviderOptions {
        max_stored_responses: 2,
        ..ProviderOptions::default()
    })
    .unwrap();
    let input = json!([
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"type": "function_call_output", "call_id": "c1", "output": "out", "id": "fco_1"},
    ]);
    let v = post(&p, "/v1/responses", &responses_body("gpt-4o", input)).json();
    let id = v["id"].as_str().unwrap().to_owned();
    assert_eq!(p.stored_response(&id), Some(v.clone()));
    let got = send(&p, "GET", &format!("/v1/responses/{id}"), &[], b"");
    assert_eq!((got.status, got.json()), (200, v.clone()));
    let cancel = send(&p, "POST", &format!("/v1/responses/{id}/cancel"), &[], b"");
    assert_eq!((cancel.status, cancel.json()), (200, v.clone()));

    let items = send(
        &p,
        "GET",
        &format!("/v1/responses/{id}/input_items"),
        &[],
        b"",
    )
    .json();
    assert_eq!(items["object"], "list");
    assert_eq!(items["has_more"], false);
    let data = items["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    assert_eq!(data[0]["type"], "message");
    assert_eq!(data[0]["role"], "user");
    assert_eq!(
        data[0]["content"],
        json!([{"type": "input_text", "text": "first"}])
    );
    assert_eq!(
        data[1]["content"],
        json!([{"type": "output_text", "text": "ok", "annotations": []}])
    );
    assert_eq!(data[2]["id"], "fco_1");
    assert_eq!(data[2]["output"], "out");
    let first = data[0]["id"].as_str().unwrap();
    assert!(
        first.starts_with("msg_") && first.len() == 4 + 24,
        "{first}"
    );
    assert_eq!(items["first_id"], data[0]["id"]);
    assert_eq!(items["last_id"], "fco_1");
    let desc = send(
        &p,
        "GET",
        &format!("/v1/responses/{id}/input_items?order=desc"),
        &[],
        b"",
    )
    .json();
    assert_eq!(desc["first_id"], "fco_1");
    assert_eq!(desc["data"][2], data[0]);

    // A string input is one user message.
    let s = post(
        &p,
        "/v1/responses",
        &responses_body("gpt-4o", json!("just text")),
    )
    .json();
    let sid = s["id"].as_str().unwrap();
    let items = send(
        &p,
        "GET",
        &format!("/v1/responses/{sid}/input_items"),
        &[],
        b"",
    )
    .json();
    assert_eq!(items["data"][0]["content"][0]["text"], "just text");
    assert_eq!(items["data"].as_array().unwrap().len(), 1);

    // DELETE, then 404 everywhere.
    let del = send(&p, "DELETE", &format!("/v1/responses/{id}"), &[], b"");
    assert_eq!(
        (del.status, del.json()),
        (
            200,
            json!({"id": id, "object": "response", "deleted": true})
        )
    );
    for (method, path) in [
        ("GET", format!("/v1/responses/{id}")),
        ("DELETE", format!("/v1/responses/{id}")),
        ("GET", format!("/v1/responses/{id}/input_items")),
        ("POST", format!("/v1/responses/{id}/cancel")),
    ] {
        let r = send(&p, method, &path, &[], b"");
        assert_eq!(r.status, 404, "{method} {path}");
        assert_eq!(
            r.json(),
            json!({"error": {"message": format!("Response with id '{id}' not found."),
                   "type": "invalid_request_error", "param": null, "code": null}})
        );
    }
    // `store: false` is not kept; the cap drops the oldest.
    let mut unstored = responses_body("gpt-4o", json!("not kept"));
    unstored["store"] = json!(false);
    let u = post(&p, "/v1/responses", &unstored).json();
    assert_eq!(u["store"], false);
    let uid = u["id"].as_str().unwrap();
    assert_eq!(
        send(&p, "GET", &format!("/v1/responses/{uid}"), &[], b"").status,
        404
    );
    let a = post(&p, "/v1/responses", &responses_body("gpt-4o", json!("a"))).json();
    let b = post(&p, "/v1/responses", &responses_body("gpt-4o", json!("b"))).json();
    assert!(p.stored_response(sid).is_none());
    assert!(p.stored_response(a["id"].as_str().unwrap()).is_some());
    assert!(p.stored_response(b["id"].as_str().unwrap()).is_some());
    // Wrong methods and unknown sub-routes.
    let r = send(&p, "PUT", &format!("/v1/responses/{sid}"), &[], b"");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, DELETE")));
    let r = send(&p, "GET", "/v1/responses", &[], b"");
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    let r = send(&p, "GET", &format!("/v1/responses/{sid}/cancel"), &[], b"");
    assert_eq!(r.status, 405);
    assert_eq!(
        send(&p, "GET", "/v1/responses/x/other", &[], b"").status,
        404
    );
    // Reset forgets kept answers.
    p.reset();
    assert!(p.stored_response(b["id"].as_str().unwrap()).is_none());
}

#[test]
fn responses_faults() {
    let p = start();
    let r = post(
        &p,
        "/v1/responses",
        &responses_body("fault-500", json!("x")),
    );
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["type"], "server_error");
    let r = post(
        &p,
        "/v1/responses",
        &responses_body("fault-429", json!("x")),
    );
    assert_eq!((r.status, r.header("retry-after")), (429, Some("1")));
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");

    // Reset: two events, then RST.
    let mut body = responses_body("fault-reset", json!("x"));
    body["stream"] = json!(true);
    let mut s = connect(&p);
    s.write_all(&request_bytes(
        "POST",
        "/v1/responses",
        &[],
        &serde_json::to_vec(&body).unwrap(),
    ))
    .unwrap();
    let (out, err) = read_all_raw(s);
    assert_eq!(err.map(|e| e.kind()), Some(io::ErrorKind::ConnectionReset));
    let text = String::from_utf8(out).unwrap();
    let (_, chunks) = text.split_once("\r\n\r\n").unwrap();
    assert_eq!(chunks.matches("\n\n").count(), 2, "{chunks}");
    assert!(chunks.contains("response.in_progress") && !chunks.contains("output_item"));

    // Truncated: every event but the last, no final chunk, FIN.
    let mut body = responses_body("fault-truncated", json!("x"));
    body["stream"] = json!(true);
    let all = reply_for_api(Api::Responses, &serde_json::to_vec(&body).unwrap())
        .unwrap()
        .responses_sse_events(&body);
    let mut s = connect(&p);
    s.write_all(&request_bytes(
        "POST",
        "/v1/responses",
        &[],
        &serde_json::to_vec(&body).unwrap(),
    ))
    .unwrap();
    let (out, err) = read_all_raw(s);
    assert!(err.is_none(), "{err:?}");
    let text = String::from_utf8(out).unwrap();
    assert!(!text.ends_with("0\r\n\r\n") && !text.contains("response.completed"));
    let (_, chunks) = text.split_once("\r\n\r\n").unwrap();
    assert_eq!(chunks.matches("\n\n").count(), all.len() - 1);
    assert!(chunks.contains("response.output_item.done"));
    // Faulted answers are not kept.
    let id = reply_for_api(Api::Responses, &serde_json::to_vec(&body).unwrap())
        .unwrap()
        .response_id();
    assert!(p.stored_response(&id).is_none());
}

#[test]
fn count_tokens_query_strings_and_counters() {
    let p = MockProvider::start_background(ProviderOptions {
        expected_credential: Some("sk-mock".into()),
        ..ProviderOptions::default()
    })
    .unwrap();
    let body = anthropic_body("claude-sonnet-4-5", "Hello there, mock!");
    let bytes = serde_json::to_vec(&body).unwrap();
    let key = [("x-api-key", "sk-mock")];
    let r = send(
        &p,
        "POST",
        "/v1/messages/count_tokens?beta=true",
        &key,
        &bytes,
    );
    assert_eq!((r.status, r.json()), (200, json!({"input_tokens": 15})));
    let r = send(&p, "POST", "/v1/messages/count_tokens", &[], &bytes);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = send(&p, "GET", "/v1/messages/count_tokens", &key, b"");
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    assert_eq!(r.json()["type"], "error");
    let r = send(&p, "POST", "/v1/messages/count_tokens", &key, b"[1]");
    assert_eq!(r.status, 400);

    // Claude Code's `?beta=true` and any query string on the answering routes.
    let r = send(&p, "POST", "/v1/messages?beta=true", &key, &bytes);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, reply_for(&bytes).unwrap().anthropic_json());
    let rb = serde_json::to_vec(&responses_body("gpt-4o", json!("q"))).unwrap();
    let auth = [("authorization", "Bearer sk-mock")];
    let r = send(&p, "POST", "/v1/responses?x=1", &auth, &rb);
    assert_eq!(r.status, 200);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(send(&p, "POST", "/v1/responses", &[], &rb).status, 401);
    assert_eq!(
        send(&p, "GET", &format!("/v1/responses/{id}"), &[], b"").status,
        401
    );
    assert_eq!(
        send(
            &p,
            "GET",
            &format!("/v1/responses/{id}?include=x"),
            &auth,
            b""
        )
        .status,
        200
    );
    let calls = send(&p, "GET", "/__mock/calls", &[], b"").json();
    assert_eq!(
        calls,
        json!({"/v1/messages/count_tokens": 4, "/v1/messages": 1, "/v1/responses": 2,
               format!("/v1/responses/{id}"): 2})
    );
    let recs = p.requests_to("/v1/messages");
    assert_eq!(recs[0].target, "/v1/messages?beta=true");
    // `max_body` shows more (or less) of a recorded body.
    let reqs = send(
        &p,
        "GET",
        "/__mock/requests?path=/v1/responses&limit=1&max_body=5",
        &[],
        b"",
    )
    .json();
    assert_eq!(reqs[0]["body"].as_str().unwrap().len(), 5);
    assert_eq!(reqs[0]["body_truncated"], true);
}

// ------------------------------------------------------------------------------------------
// Scripted agents
// ------------------------------------------------------------------------------------------

const CODEX_EXEC: &str = r#"{"type": "function", "name": "exec_command", "strict": false,
  "parameters": {"type": "object", "properties": {"cmd": {"type": "string"},
  "workdir": {"type": "string"}}, "required": ["cmd"], "additionalProperties": false}}"#;

fn chat_tools() -> Value {
    json!([{"type": "function", "function": {"name": "run", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["command", "n"]}}}])
}

fn claude_tools() -> Value {
    json!([
        {"name": "Read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
        {"name": "Bash", "input_schema": {"type": "object", "properties": {
            "command": {"type": "string"}, "description": {"type": "string"}},
            "required": ["command"]}},
    ])
}

/// Appends the client's side of one step (tool call + its result) to a request body.
fn push_step(api: Api, body: &mut Value, answer: &Value, output: &str) {
    match api {
        Api::ChatCompletions => {
            let msg = answer["choices"][0]["message"].clone();
            let id = msg["tool_calls"][0]["id"].clone();
            let msgs = body["messages"].as_array_mut().unwrap();
            msgs.push(msg);
            msgs.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
        }
        Api::Messages => {
            let id = answer["content"][0]["id"].clone();
            let msgs = body["messages"].as_array_mut().unwrap();
            msgs.push(json!({"role": "assistant", "content": answer["content"]}));
            msgs.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": output}]}));
        }
        Api::Responses => {
            let item = answer["output"][0].clone();
            let call_id = item["call_id"].clone();
            let items = body["input"].as_array_mut().unwrap();
            items.push(item);
            items.push(
                json!({"type": "function_call_output", "call_id": call_id, "output": output}),
            );
        }
    }
}

/// The tool call of an answer: (id, name, arguments JSON string).
fn tool_call_of(api: Api, v: &Value) -> Option<(String, String, String)> {
    let s = |v: &Value| v.as_str().unwrap().to_owned();
    match api {
        Api::ChatCompletions => {
            let c = v["choices"][0]["message"]["tool_calls"].get(0)?;
            assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
            assert!(v["choices"][0]["message"]["content"].is_null());
            assert_eq!(c["type"], "function");
            Some((
                s(&c["id"]),
                s(&c["function"]["name"]),
                s(&c["function"]["arguments"]),
            ))
        }
        Api::Messages => {
            let c = &v["content"][0];
            if c["type"] != "tool_use" {
                return None;
            }
            assert_eq!(v["stop_reason"], "tool_use");
            Some((s(&c["id"]), s(&c["name"]), c["input"].to_string()))
        }
        Api::Responses => {
            let c = &v["output"][0];
            if c["type"] != "function_call" {
                return None;
            }
            assert_eq!(c["status"], "completed");
            assert!(c["id"].as_str().unwrap().starts_with("fc_"));
            Some((s(&c["call_id"]), s(&c["name"]), s(&c["arguments"])))
        }
    }
}

fn final_text_of(api: Api, v: &Value) -> String {
    let t = match api {
        Api::ChatCompletions => &v["choices"][0]["message"]["content"],
        Api::Messages => &v["content"][0]["text"],
        Api::Responses => &v["output"][0]["content"][0]["text"],
    };
    t.as_str().unwrap().to_owned()
}

fn output_tokens_of(api: Api, v: &Value) -> u64 {
    match api {
        Api::ChatCompletions => v["usage"]["completion_tokens"].as_u64().unwrap(),
        Api::Messages | Api::Responses => v["usage"]["output_tokens"].as_u64().unwrap(),
    }
}

fn path_of(api: Api) -> &'static str {
    match api {
        Api::ChatCompletions => "/v1/chat/completions",
        Api::Messages => "/v1/messages",
        Api::Responses => "/v1/responses",
    }
}

/// Rebuilds the tool call (id, name, arguments) or the text of a streamed answer.
fn stream_result(api: Api, text: &str) -> (Option<(String, String, String)>, String) {
    let events = sse_events(text);
    let mut call: Option<(String, String, String)> = None;
    let mut out = String::new();
    for (name, data) in &events {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        match api {
            Api::ChatCompletions => {
                let d = &v["choices"][0]["delta"];
                if let Some(tc) = d["tool_calls"].get(0) {
                    assert_eq!(tc["index"], 0);
                    let c = call.get_or_insert_with(Default::default);
                    if let Some(id) = tc["id"].as_str() {
                        c.0 = id.to_owned();
                        c.1 = tc["function"]["name"].as_str().unwrap().to_owned();
                    }
                    c.2.push_str(tc["function"]["arguments"].as_str().unwrap());
                } else if let Some(t) = d["content"].as_str() {
                    out.push_str(t);
                }
            }
            Api::Messages => match name.as_deref() {
                Some("content_block_start") if v["content_block"]["type"] == "tool_use" => {
                    let b = &v["content_block"];
                    assert_eq!(b["input"], json!({}));
                    call = Some((
                        b["id"].as_str().unwrap().to_owned(),
                        b["name"].as_str().unwrap().to_owned(),
                        String::new(),
                    ));
                }
                Some("content_block_delta") => {
                    let d = &v["delta"];
                    if d["type"] == "input_json_delta" {
                        call.as_mut()
                            .unwrap()
                            .2
                            .push_str(d["partial_json"].as_str().unwrap());
                    } else {
                        out.push_str(d["text"].as_str().unwrap());
                    }
                }
                _ => {}
            },
            Api::Responses => match name.as_deref() {
                Some("response.output_item.added") if v["item"]["type"] == "function_call" => {
                    let i = &v["item"];
                    assert_eq!(i["arguments"], "");
                    call = Some((
                        i["call_id"].as_str().unwrap().to_owned(),
                        i["name"].as_str().unwrap().to_owned(),
                        String::new(),
                    ));
                }
                Some("response.function_call_arguments.delta") => {
                    call.as_mut()
                        .unwrap()
                        .2
                        .push_str(v["delta"].as_str().unwrap());
                }
                Some("response.function_call_arguments.done") => {
                    assert_eq!(v["arguments"].as_str(), call.as_ref().map(|c| c.2.as_str()));
                }
                Some("response.output_text.delta") => out.push_str(v["delta"].as_str().unwrap()),
                _ => {}
            },
        }
    }
    (call, out)
}

/// Drives a `steps=2` session through both steps to the final answer, plain and streamed.
fn scripted_session(api: Api, mut body: Value) {
    let p = start();
    let mut ids = Vec::new();
    for k in 0..=2u64 {
        let plain = post(&p, path_of(api), &body);
        assert_eq!(plain.status, 200);
        let v = plain.json();
        let bytes = serde_json::to_vec(&body).unwrap();
        let reply = reply_for_api(api, &bytes).unwrap();
        let expected_body = match api {
            Api::ChatCompletions => reply.openai_json(),
            Api::Messages => reply.anthropic_json(),
            Api::Responses => reply.responses_json(&body),
        };
        assert_eq!(expected_body, plain.body);
        let mut streamed_body = body.clone();
        streamed_body["stream"] = json!(true);
        if api == Api::ChatCompletions {
            streamed_body["stream_options"] = json!({"include_usage": true});
        }
        let streamed = post(&p, path_of(api), &streamed_body).text();
        let (s_call, s_text) = stream_result(api, &streamed);
        if k < 2 {
            let (id, name, args) = tool_call_of(api, &v).expect("a tool call");
            let args_v: Value = serde_json::from_str(&args).unwrap();
            let cmd = format!("echo tokensaver-step-{}", k + 1);
            let want = match name.as_str() {
                "Bash" => json!({"command": cmd, "description": "tokensaver mock step"}),
                "exec_command" => json!({"cmd": cmd}),
                "run" => json!({"command": cmd, "n": k + 1}),
                other => panic!("unexpected tool {other}"),
            };
            assert_eq!(args_v, want);
            let Some(Scripted::ToolCall(c)) = &reply.script else {
                panic!("not scripted")
            };
            let arguments = c.arguments.clone();
            assert_eq!(
                output_tokens_of(api, &v),
                (arguments.chars().count() as u64).div_ceil(4)
            );
            assert_eq!(s_call, Some((id.clone(), name, arguments.clone())));
            if api != Api::Messages {
                assert_eq!(args, arguments);
            }
            assert!(argument_pieces(&arguments).len() >= 2);
            assert!(s_text.is_empty());
            ids.push(id);
            push_step(api, &mut body, &v, &format!("tokensaver-step-{}\n", k + 1));
        } else {
            assert!(tool_call_of(api, &v).is_none());
            assert_eq!(final_text_of(api, &v), "tokensaver-done after 2 steps");
            assert_eq!(output_tokens_of(api, &v), 4);
            assert_eq!(s_call, None);
            assert_eq!(s_text, "tokensaver-done after 2 steps");
            assert_eq!(reply.script, Some(Scripted::Done { steps: 2 }));
        }
        // The usage's prompt side follows the usual rule.
        let prompt = match api {
            Api::ChatCompletions => v["usage"]["prompt_tokens"].clone(),
            _ => v["usage"]["input_tokens"].clone(),
        };
        assert_eq!(prompt, reply.usage.input_tokens);
    }
    assert_ne!(ids[0], ids[1], "ids vary between steps");
}

#[test]
fn scripted_steps_chat_completions() {
    let mut body = openai_body("gpt-4o", "Do it. tokensaver-mock:steps=2");
    body["tools"] = chat_tools();
    scripted_session(Api::ChatCompletions, body);
}

#[test]
fn scripted_steps_anthropic_messages() {
    let mut body = anthropic_body("claude-sonnet-4-5", "<context/>");
    body["messages"][0]["content"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "text", "text": "Do it. tokensaver-mock:steps=2"}));
    body["tools"] = claude_tools();
    scripted_session(Api::Messages, body);
}

#[test]
fn scripted_steps_responses_codex_style() {
    // Codex sends its environment context as an earlier user turn of its own.
    let body = json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run it. tokensaver-mock:steps=2"}]},
        ],
        "tools": [serde_json::from_str::<Value>(CODEX_EXEC).unwrap(), {"type": "web_search"}],
        "store": false,
    });
    scripted_session(Api::Responses, body);
}

#[test]
fn scripted_loop_shell_variants_and_plain_fallbacks() {
    let p = start();
    // `loop` answers the same command however many results came back.
    let mut body = json!({"model": "gpt-4o", "input": [
        {"role": "user", "content": "tokensaver-mock:loop"}],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}}}}]});
    let mut call_ids = Vec::new();
    for _ in 0..3 {
        let v = post(&p, "/v1/responses", &body).json();
        let (id, name, args) = tool_call_of(Api::Responses, &v).unwrap();
        assert_eq!(name, "shell");
        assert_eq!(args, r#"{"command":["bash","-lc","echo tokensaver-loop"]}"#);
        call_ids.push(id);
        push_step(Api::Responses, &mut body, &v, "tokensaver-loop\n");
    }
    assert!(call_ids[0] != call_ids[1] && call_ids[1] != call_ids[2]);

    // A string-typed `shell` command.
    let v = post(
        &p,
        "/v1/chat/completions",
        &json!({"model": "m",
        "messages": [{"role": "user", "content": "tokensaver-mock:steps=1"}],
        "tools": [{"type": "function", "function": {"name": "shell", "parameters": {
            "properties": {"command": {"type": "string"}}}}}]}),
    )
    .json();
    let (_, _, args) = tool_call_of(Api::ChatCompletions, &v).unwrap();
    assert_eq!(args, r#"{"command":"echo tokensaver-step-1"}"#);

    // The Responses built-in `local_shell`, plain and streamed.
    let mut ls = json!({"model": "codex-mini-latest", "input": "tokensaver-mock:steps=1",
        "tools": [{"type": "local_shell"}]});
    let v = post(&p, "/v1/responses", &ls).json();
    let item = &v["output"][0];
    assert_eq!(item["type"], "local_shell_call");
    assert_eq!(item["status"], "completed");
    assert!(item["id"].as_str().unwrap().starts_with("lsh_"));
    assert!(item["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(item["action"]["type"], "exec");
    assert_eq!(
        item["action"]["command"],
        json!(["bash", "-lc", "echo tokensaver-step-1"])
    );
    let action_chars = item["action"].to_string().chars().count() as u64;
    assert_eq!(v["usage"]["output_tokens"], action_chars.div_ceil(4));
    ls["stream"] = json!(true);
    let events = responses_events(&post(&p, "/v1/responses", &ls).text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert_eq!(events[2].1["item"]["status"], "in_progress");
    assert_eq!(events[4].1["response"], v);
    // A `local_shell_call_output` counts as a tool result.
    ls["stream"] = json!(false);
    ls["input"] = json!([{"role": "user", "content": "tokensaver-mock:steps=1"}, item,
        {"type": "local_shell_call_output", "call_id": item["call_id"], "output": "x"}]);
    let v = post(&p, "/v1/responses", &ls).json();
    assert_eq!(
        final_text_of(Api::Responses, &v),
        "tokensaver-done after 1 steps"
    );

    // No tools, no callable tool, no marker, or a marker only in a tool result: the words.
    for (path, body) in [
        (
            "/v1/chat/completions",
            openai_body("gpt-4o", "tokensaver-mock:steps=3"),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "tokensaver-mock:loop",
            "tools": [{"type": "web_search"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "tokensaver-mock:steps=0",
            "tools": [serde_json::from_str::<Value>(CODEX_EXEC).unwrap()]}),
        ),
        (
            "/v1/messages",
            json!({"model": "c", "max_tokens": 50, "tools": claude_tools(),
            "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                "content": "tokensaver-mock:loop"}]}]}),
        ),
    ] {
        let r = post(&p, path, &body);
        let bytes = serde_json::to_vec(&body).unwrap();
        let api = match path {
            "/v1/responses" => Api::Responses,
            "/v1/messages" => Api::Messages,
            _ => Api::ChatCompletions,
        };
        let reply = reply_for_api(api, &bytes).unwrap();
        assert!(reply.script.is_none(), "{body}");
        assert!(!reply.words.is_empty());
        let text = final_text_of(api, &r.json());
        assert!(text.split(' ').all(|w| WORDS.contains(&w)), "{text}");
    }
}

#[test]
fn scripted_answers_obey_fault_modes() {
    let p = start();
    let mut body = openai_body("fault-truncated", "tokensaver-mock:steps=1");
    body["tools"] = chat_tools();
    body["stream"] = json!(true);
    let reply = reply_for(&serde_json::to_vec(&body).unwrap()).unwrap();
    let pieces = reply.content_delta_count();
    let mut s = connect(&p);
    s.write_all(&request_bytes(
        "POST",
        "/v1/chat/completions",
        &[],
        &serde_json::to_vec(&body).unwrap(),
    ))
    .unwrap();
    let (out, _) = read_all_raw(s);
    let text = String::from_utf8(out).unwrap();
    let (_, chunks) = text.split_once("\r\n\r\n").unwrap();
    assert_eq!(chunks.matches("\n\n").count(), 1 + pieces);
    assert!(!text.contains("finish_reason\":\"tool_calls"));
    let mut body = anthropic_body("fault-429", "tokensaver-mock:loop");
    body["tools"] = claude_tools();
    assert_eq!(post(&p, "/v1/messages", &body).status, 429);
}

// ------------------------------------------------------------------------------------------
// Task scripts and cl100k usage (the economics suite's scripted provider)
// ------------------------------------------------------------------------------------------

#[test]
fn task_script_closed_loop_with_cl100k_usage() {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use tokensaver_mock_provider::{canonical_text, TaskScript, UsageCounting};
    let script: TaskScript = serde_json::from_value(json!({"steps": [
        {"run": "./job status", "until": "done", "max": 5},
        {"answer": "The export finished.", "words": [30, 30]}
    ]}))
    .unwrap();
    let p = MockProvider::start_background(ProviderOptions {
        usage: UsageCounting::Cl100k,
        tasks: Arc::new(BTreeMap::from([("poll".to_owned(), script)])),
        ..Default::default()
    })
    .unwrap();
    let mut body = json!({
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "Export. tokensaver-mock:task=poll,seed=2"}],
        "tools": chat_tools(),
    });
    // The provider polls while the tool says "running", then answers.
    for output in ["status: running", "status: running", "status: done"] {
        let r = post(&p, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200);
        let v = r.json();
        let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        let (name, args) = (
            call["name"].as_str().unwrap(),
            call["arguments"].to_string(),
        );
        assert_eq!(name, "run");
        assert!(
            v["choices"][0]["message"]["content"].is_string(),
            "text before the call"
        );
        assert!(args.contains("./job status"), "{args}");
        // cl100k over the whole canonical body: the tool definitions count.
        let want = tokensaver_tokenizer::count(&canonical_text(&body)).unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], want);
        assert!(want > 40, "tools and parameters count: {want}");
        push_step(Api::ChatCompletions, &mut body, &v, output);
    }
    let v = post(&p, "/v1/chat/completions", &body).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with("The export finished.\n\n"), "{text}");
    let out = tokensaver_tokenizer::count(text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], out);
    // The default counting is unchanged: the same body under the character rule.
    let chars = reply_for(&serde_json::to_vec(&body).unwrap()).unwrap();
    assert_ne!(
        chars.usage.prompt_tokens,
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    // The record's reported usage follows the options too.
    let recs = send(&p, "GET", "/__mock/requests?limit=1&max_body=0", &[], b"").json();
    assert_eq!(
        recs[0]["reported_usage"]["prompt_tokens"],
        v["usage"]["prompt_tokens"]
    );
}

#[test]
fn task_script_tool_calls_carry_text_in_every_wire_format() {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use tokensaver_mock_provider::TaskScript;
    let script: TaskScript = serde_json::from_value(json!({"steps": [
        {"run": "ls", "say": "Let me look around first."},
        {"answer": "Done."}
    ]}))
    .unwrap();
    let p = MockProvider::start_background(ProviderOptions {
        tasks: Arc::new(BTreeMap::from([("t".to_owned(), script)])),
        ..Default::default()
    })
    .unwrap();
    let prompt = "Go. tokensaver-mock:task=t,seed=1";
    let say = "Let me look around first.";
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": prompt}], "tools": chat_tools()}),
        ),
        (
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100,
                   "messages": [{"role": "user", "content": prompt}], "tools": claude_tools()}),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-5.5", "input": prompt,
                   "tools": [serde_json::from_str::<Value>(CODEX_EXEC).unwrap()]}),
        ),
    ];
    for (path, body) in cases {
        let v = post(&p, path, &body).json();
        let text = match path {
            "/v1/chat/completions" => v["choices"][0]["message"]["content"].clone(),
            "/v1/messages" => v["content"][0]["text"].clone(),
            _ => v["output"][0]["content"][0]["text"].clone(),
        };
        assert_eq!(text, say, "{path}: {v}");
        let call = match path {
            "/v1/chat/completions" => {
                v["choices"][0]["message"]["tool_calls"][0]["function"]["name"].clone()
            }
            "/v1/messages" => v["content"][1]["name"].clone(),
            _ => v["output"][1]["name"].clone(),
        };
        assert!(call.is_string(), "{path}: the call follows the text: {v}");
        // Streamed: the text deltas spell the text, and the call follows.
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let r = post(&p, path, &streamed);
        let mut spelled = String::new();
        let mut saw_call = false;
        for (_, data) in sse_events(&r.text()) {
            let Ok(e) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            if let Some(d) = e["choices"][0]["delta"]["content"].as_str() {
                spelled.push_str(d);
            }
            if e["type"] == "content_block_delta" && e["delta"]["type"] == "text_delta" {
                spelled.push_str(e["delta"]["text"].as_str().unwrap());
            }
            if e["type"] == "response.output_text.delta" {
                spelled.push_str(e["delta"].as_str().unwrap());
            }
            saw_call |= !e["choices"][0]["delta"]["tool_calls"].is_null()
                || e["content_block"]["type"] == "tool_use"
                || e["type"] == "response.function_call_arguments.done";
        }
        assert_eq!(spelled, say, "{path} streamed");
        assert!(saw_call, "{path} streamed: no tool call");
    }
}
