//! The corpus of real recorded provider answers (`corpus/provider-answers/`), replayed byte for
//! byte through the real `tokensaver serve`: a local upstream on 127.0.0.1 answers each request
//! with one recorded answer, and for every answer the test checks that the client received the
//! provider's bytes unchanged, that the ledger recorded each usage part and billed item the
//! provider reported, and the spend — against figures `derive.py` derived from the providers'
//! documented rules, never from tokensaver's readers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use support::*;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/provider-answers")
}

struct Case {
    json: Value,
    answer: Vec<u8>,
}

impl Case {
    fn id(&self) -> &str {
        self.json["id"].as_str().unwrap()
    }
    fn route(&self) -> &str {
        self.json["route"].as_str().unwrap()
    }
    fn is_sse(&self) -> bool {
        self.content_type().starts_with("text/event-stream")
    }
    fn content_type(&self) -> &str {
        self.json["content_type"].as_str().unwrap()
    }
    fn status(&self) -> u16 {
        self.json["status"].as_u64().unwrap() as u16
    }
    fn model(&self) -> &str {
        self.json["request"]["model"].as_str().unwrap()
    }
}

fn load_cases() -> Vec<Case> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(corpus_dir().join("cases"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let json: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            let answer =
                std::fs::read(corpus_dir().join(json["answer"].as_str().unwrap())).unwrap();
            Case { json, answer }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The replay upstream: answers a request carrying `x-corpus-case: ID` with that case's bytes,
// a JSON answer with its length, a stream chunked one SSE event per chunk as a provider sends.

/// A case's recorded answer: status, content type, bytes.
type Recorded = (u16, String, Vec<u8>);

struct Replay {
    base_url: String,
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

fn replay_server(cases: &[Case]) -> Replay {
    let answers: Arc<HashMap<String, Recorded>> = Arc::new(
        cases
            .iter()
            .map(|c| {
                (
                    c.id().to_string(),
                    (c.status(), c.content_type().to_string(), c.answer.clone()),
                )
            })
            .collect(),
    );
    let hits = Arc::new(Mutex::new(HashMap::new()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::clone(&hits);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let answers = Arc::clone(&answers);
            let hits = Arc::clone(&served);
            std::thread::spawn(move || serve_connection(conn, &answers, &hits));
        }
    });
    Replay { base_url, hits }
}

fn serve_connection(
    conn: TcpStream,
    answers: &HashMap<String, Recorded>,
    hits: &Mutex<HashMap<String, usize>>,
) {
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    // Keep-alive: one request after another on the connection the proxy pools.
    loop {
        let mut case = None;
        let mut length = 0usize;
        let mut first = true;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                if first {
                    continue;
                }
                break;
            }
            first = false;
            if let Some((name, value)) = line.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "x-corpus-case" => case = Some(value.trim().to_string()),
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let Some((status, ctype, bytes)) = case.as_deref().and_then(|c| answers.get(c)) else {
            let _ = writer.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
            continue;
        };
        *hits
            .lock()
            .unwrap()
            .entry(case.clone().unwrap_or_default())
            .or_default() += 1;
        let mut out = format!("HTTP/1.1 {status} OK\r\ncontent-type: {ctype}\r\n").into_bytes();
        if ctype.starts_with("text/event-stream") {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
            for event in split_events(bytes) {
                out.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
                out.extend_from_slice(event);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
        } else {
            out.extend_from_slice(format!("content-length: {}\r\n\r\n", bytes.len()).as_bytes());
            out.extend_from_slice(bytes);
        }
        if writer.write_all(&out).is_err() {
            return;
        }
    }
}

/// SSE events with their trailing blank line (the last piece as it is).
fn split_events(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == b'\n' && bytes[i + 1] == b'\n' {
            out.push(&bytes[start..i + 2]);
            start = i + 2;
            i += 2;
            continue;
        }
        i += 1;
    }
    if start < bytes.len() {
        out.push(&bytes[start..]);
    }
    out
}

/// The stream a client that did not ask for usage should get: the provider's bytes without
/// the usage-only chunks (`choices: []`) the gate asked for on its behalf. Usage on a chunk
/// that still has choices stays.
fn without_usage_only_chunks(bytes: &[u8]) -> Vec<u8> {
    split_events(bytes)
        .into_iter()
        .filter(|event| {
            let text = String::from_utf8_lossy(event);
            let data: String = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
                .collect();
            match serde_json::from_str::<Value>(&data) {
                Ok(v) => !(v["choices"] == serde_json::json!([]) && v["usage"].is_object()),
                Err(_) => true,
            }
        })
        .flat_map(|e| e.to_vec())
        .collect()
}

// ---------------------------------------------------------------------------------------------

fn corpus_prices(cases: &[Case]) -> String {
    let table = std::fs::read_to_string(corpus_dir().join("prices.toml")).unwrap();
    let body: String = table
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    let models: BTreeSet<&str> = cases.iter().map(Case::model).collect();
    models
        .into_iter()
        .map(|m| format!("\n[prices.\"{m}\"]\n{body}"))
        .collect()
}

fn send(h: &Harness, case: &Case, request: &Value) -> Resp {
    let (path, key_header) = match case.route() {
        "openai_chat" => (CHAT, ("authorization", format!("Bearer {KEY_A}"))),
        "openai_responses" => (
            "/v1/responses",
            ("authorization", format!("Bearer {KEY_A}")),
        ),
        _ => (MESSAGES, ("x-api-key", KEY_A.to_string())),
    };
    h.post_raw(
        path,
        None,
        request.to_string().as_bytes(),
        &[
            (key_header.0, key_header.1.as_str()),
            ("x-corpus-case", case.id()),
            HUMAN,
        ],
    )
}

fn decision_id(r: &Resp) -> String {
    let header = r.header("x-tokensaver-receipt").expect("receipt header");
    let env = tokensaver::receipt::Envelope::from_header_value(header).unwrap();
    tokensaver::receipt::decision_id(&env.body_bytes().unwrap()).to_string()
}

/// Where a recorded decision differs from the case's expected figures (empty: it matches).
fn mismatches(case: &Case, line: &Value) -> Vec<String> {
    let exp = &case.json["expected"];
    let mut out = Vec::new();
    let mut check = |what: &str, got: &Value, want: &Value| {
        if got != want {
            out.push(format!("{what}: recorded {got}, expected {want}"));
        }
    };
    for part in [
        "input",
        "cache_write",
        "cache_write_1h",
        "cache_read",
        "output",
        "web_search_requests",
    ] {
        check(part, &line[part], &exp["usage"][part]);
    }
    check("spend_nano", &line["spend_nano"], &exp["spend_nano"]);
    check("status", &line["status"], &exp["status"]);
    check("ending", &line["ending"], &exp["ending"]);
    check("basis", &line["basis"], &exp["basis"]);
    out
}

#[test]
fn real_provider_answers_replay_unchanged_and_settle_exactly() {
    let cases = load_cases();
    assert!(
        cases.len() >= 15,
        "the corpus holds {} answers",
        cases.len()
    );
    let replay = replay_server(&cases);
    let h = Harness::start(Opts {
        budget_a: None,
        upstream: Some(replay.base_url.clone()),
        extra_config: corpus_prices(&cases),
        ..Opts::default()
    });

    // decision id → (case index, what the client got was checked)
    let mut decisions: Vec<(String, usize, &'static str)> = Vec::new();
    let mut byte_failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let request = case.json["request"].clone();
        let r = send(&h, case, &request);
        assert_eq!(r.status, case.status(), "{}: {}", case.id(), r.text());
        assert_eq!(r.verdict(), Some("ALLOW"), "{}", case.id());
        if r.body != case.answer {
            byte_failures.push(format!("{}: the client's bytes differ", case.id()));
        }
        decisions.push((decision_id(&r), i, "as asked"));

        // A streamed chat client that did not ask for usage: the gate asks on its behalf and
        // removes only the usage-only chunk; usage on a chunk with choices reaches it as sent.
        if case.route() == "openai_chat" && case.is_sse() {
            let mut plain = request.clone();
            plain.as_object_mut().unwrap().remove("stream_options");
            let r = send(&h, case, &plain);
            assert_eq!(r.status, case.status(), "{}: {}", case.id(), r.text());
            if r.body != without_usage_only_chunks(&case.answer) {
                byte_failures.push(format!(
                    "{}: a client that did not ask for usage got other bytes",
                    case.id()
                ));
            }
            decisions.push((decision_id(&r), i, "without usage asked"));
        }
    }
    settle();

    let r = call(
        client::get(&h.api_url("/ledger/decisions?limit=1000"))
            .set("authorization", &format!("Bearer {KEY_A}")),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let listed: HashMap<String, Value> = r.json()["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["decision_id"].as_str().unwrap().to_string(), d.clone()))
        .collect();

    let mut matched = BTreeMap::new();
    let mut failures = byte_failures;
    for (id, i, how) in &decisions {
        let case = &cases[*i];
        let line = listed
            .get(id)
            .unwrap_or_else(|| panic!("{}: decision not listed", case.id()));
        let diff = mismatches(case, line);
        if diff.is_empty() {
            *matched.entry(case.id()).or_insert(0) += 1;
        } else {
            failures.push(format!("{} ({how}): {}", case.id(), diff.join("; ")));
        }
    }
    let answers_matched = matched.len();
    eprintln!(
        "usage corpus: {} answers, {} replays; {answers_matched} answers matched on every replay",
        cases.len(),
        decisions.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(answers_matched, cases.len());

    // An answer that ended without its usage is never stored: the identical reproducible
    // request goes to the provider again, and nothing counts as not bought.
    for case in cases
        .iter()
        .filter(|c| c.json["expected"]["status"] == "incomplete")
    {
        let before = replay.hits.lock().unwrap()[case.id()];
        let r = send(&h, case, &case.json["request"]);
        assert_ne!(r.verdict(), Some("SERVE"), "{}", case.id());
        assert_eq!(replay.hits.lock().unwrap()[case.id()], before + 1);
    }
    settle();
    assert_eq!(h.ledger(KEY_A)["total"]["tokens_not_bought"], 0);
}
