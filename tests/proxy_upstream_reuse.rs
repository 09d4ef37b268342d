//! A pooled keep-alive connection the provider closes at the moment of reuse (it read the
//! request, answered nothing) is retried once on a new connection: the caller gets the retry's
//! answer, and the ledger charges the usage that answer reports — never the worst case.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use support::*;

const PROMPT_TOKENS: u64 = 11;
const COMPLETION_TOKENS: u64 = 3;

/// Which connection (numbered from 0 in accept order) each request arrived on, and whether it
/// was answered.
type Seen = Arc<Mutex<Vec<(usize, bool)>>>;

/// A provider that answers the first request of each connection (keep-alive) and closes the
/// connection, unanswered, on the second: a keep-alive connection it dropped as it was reused.
fn start_closing_provider() -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for (conn, stream) in listener.incoming().enumerate() {
            // The test's assertions on `seen` fail if this provider stops accepting.
            let stream = stream.expect("the provider accepts");
            let log = log.clone();
            std::thread::spawn(move || serve_once_then_close(conn, stream, &log));
        }
    });
    (url, seen)
}

fn serve_once_then_close(conn: usize, stream: TcpStream, log: &Mutex<Vec<(usize, bool)>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    for answered in [true, false] {
        if !read_request(&mut reader) {
            return;
        }
        log.lock().unwrap().push((conn, answered));
        if !answered {
            return; // dropped: closed without a byte of an answer
        }
        let body = json!({
            "id": "chatcmpl-reuse", "object": "chat.completion", "created": 1,
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "three words here"}}],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                      "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS},
        })
        .to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: keep-alive\r\n\r\n",
            body.len()
        );
        writer.write_all(head.as_bytes()).unwrap();
        writer.write_all(body.as_bytes()).unwrap();
        writer.flush().unwrap();
    }
}

/// Read one request (header, then its `content-length` body); `false` at end of stream.
fn read_request(reader: &mut BufReader<TcpStream>) -> bool {
    let mut content_length = 0usize;
    let mut saw_any = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return false;
        }
        if line == "\r\n" && saw_any {
            break;
        }
        saw_any = true;
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body).is_ok()
}

#[test]
fn a_reused_connection_closed_unanswered_is_retried_once_and_charged_as_answered() {
    let (url, seen) = start_closing_provider();
    let h = Harness::start(Opts {
        upstream: Some(url),
        ..Opts::default()
    });
    let ask = |text: &str| h.post(CHAT, KEY_A, &chat("gpt-4o-mini", text, json!({})), &[HUMAN]);
    let first = ask("the first question, on a new connection");
    assert_eq!(first.status, 200, "{}", first.text());
    let second = ask("the second question, on the pooled connection");
    assert_eq!(second.status, 200, "{}", second.text());
    settle();

    // The second request reached the pooled connection, which closed on it, then a new one.
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(0, true), (0, false), (1, true)],
        "one retry on a new connection"
    );
    let r = keyed_get(&h.api_url("/ledger/decisions"), Some(KEY_A));
    assert_eq!(r.status, 200, "{}", r.text());
    let lines: Vec<Value> = r.json()["decisions"].as_array().unwrap().clone();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        assert_eq!(line["status"], "complete", "{line}");
        assert_eq!(line["basis"], "reported", "{line}");
        assert_eq!(line["input"], PROMPT_TOKENS, "{line}");
        assert_eq!(line["output"], COMPLETION_TOKENS, "{line}");
        assert!(
            line["spend_nano"].as_u64().unwrap() < line["reserved_nano"].as_u64().unwrap(),
            "{line}"
        );
    }
    assert_eq!(lines[0]["spend_nano"], lines[1]["spend_nano"]);
    let spend: u64 = lines
        .iter()
        .map(|l| l["spend_nano"].as_u64().unwrap())
        .sum();
    assert_eq!(h.ledger(KEY_A)["total"]["spend_nano"].as_u64(), Some(spend));
}
