//! Issue "hostile-2": the surfaces built since issue "hostile" — pacing, gate-placed caching,
//! the decision clock, Responses ownership and chains, named upstreams, the API listener, the
//! log, the page — against a caller who means harm, through the real binary. Each test fails on
//! the build before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;
use tokensaver::request::{self, Digest, Route};

const RESPONSES: &str = "/v1/responses";

/// Windows scaled down: a step is paced to 3 (unattended) per 2 s, held at most 4 s.
const SCALED_STEPS: &str = "\n[gate.steps]\npace_window_secs = 2\nmax_hold_secs = 4\n\
                            runaway_after_secs = 60\n";

fn scaled(extra_limits: &str, budget_a: Option<u64>) -> Harness {
    Harness::start(Opts {
        // Appended inside `[limits]`, then the steps table.
        extra_config: format!("{extra_limits}{SCALED_STEPS}"),
        budget_a,
        ..Opts::default()
    })
}

/// A chat request after `steps` tool steps that all poll one job (one step fingerprint, a
/// growing history: a stuck agent's or a patient poller's).
fn polling(tag: &str, steps: usize, result: &str) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": format!("You are a build agent ({tag}).")}),
        json!({"role": "user", "content": "Wait for job 7."}),
    ];
    for i in 0..steps {
        let id = format!("call_{tag}_{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "job_status",
             "arguments": "{\"job\":7}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
    }
    json!({"model": "gpt-4o", "max_tokens": 100, "messages": messages})
}

/// Write a whole HTTP/1.1 request on a new connection; the connection is returned unread.
fn send_raw(addr: SocketAddr, head: &str, body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s
}

fn post_head(path: &str, key: Option<&str>, len: usize, extra: &str) -> String {
    let auth = key.map_or(String::new(), |k| format!("authorization: Bearer {k}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         {auth}content-length: {len}{extra}\r\n\r\n"
    )
}

/// Everything the server sends until it closes or `wait` passes.
fn read_all(s: &mut TcpStream, wait: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

fn status_of(raw: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(raw);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

/// The key's decisions on the ledger, oldest first (up to 1,000).
fn decisions(h: &Harness, key: &str) -> Vec<Value> {
    settle();
    let r = keyed_get(&h.api_url("/ledger/decisions?limit=1000"), Some(key));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["decisions"].as_array().unwrap().clone()
}

fn metric(h: &Harness, name: &str) -> f64 {
    let text = keyed_get(&h.admin_url("/metrics"), Some(ADMIN_KEY)).text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Issue hostile-2.1 (and "fair over hours"): a caller whose held step it stops waiting for —
/// its client closes the connection — is never decided, forwarded, reserved or charged, on
/// the proxy and through `POST /gate` alike. The SDK's retry is then the only call.
#[test]
fn a_caller_who_leaves_a_held_step_buys_nothing() {
    let h = scaled("", None);
    for i in 1..=3 {
        let r = h.post(CHAT, KEY_A, &polling("gone", i, "running"), &[]);
        assert_eq!(r.status, 200, "step {i}: {}", r.text());
        assert!(
            r.receipt().get("paced_ms").is_none(),
            "step {i} was not held"
        );
    }
    assert_eq!(h.calls(CHAT), 3);
    // The 4th identical step is held; its client gives up after half a second.
    let body = polling("gone", 4, "running").to_string();
    let s = send_raw(
        h.proxy,
        &post_head(CHAT, Some(KEY_A), body.len(), ""),
        body.as_bytes(),
    );
    std::thread::sleep(Duration::from_millis(500));
    s.shutdown(Shutdown::Both).unwrap();
    drop(s);
    // Past the window and the slack: a gate that kept it would have bought it by now.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(h.calls(CHAT), 3, "the abandoned step reached the provider");
    assert_eq!(
        decisions(&h, KEY_A).len(),
        3,
        "the abandoned step was booked"
    );
    assert_eq!(metric(&h, "tokensaver_paced_abandoned_total"), 1.0);
    assert_eq!(metric(&h, "tokensaver_paced_waiting"), 0.0);

    // Through `POST /gate` (digest mode): a digest held the same way, its client gone.
    let fp_key = tokensaver::auth::fingerprint_key(SECRET_B);
    let digest = |steps: usize| {
        let body = polling("gone-digest", steps, "running").to_string();
        let parsed = request::parse(Route::OpenAiChat, body.as_bytes(), &fp_key).unwrap();
        serde_json::to_vec(&Digest::new(parsed.shape)).unwrap()
    };
    for i in 1..=3 {
        let r = keyed_send("POST", &h.api_url("/gate"), Some(KEY_B), &digest(i));
        assert_eq!(r.status, 200, "digest {i}: {}", r.text());
        assert!(
            matches!(r.json()["verdict"].as_str(), Some("ALLOW" | "DOWNGRADE")),
            "{}",
            r.text()
        );
    }
    let budget = |h: &Harness| keyed_get(&h.api_url("/budget"), Some(KEY_B)).json();
    let reserved_before = budget(&h)["reserved_nano"].as_u64().unwrap();
    let held = digest(4);
    let s = send_raw(
        h.api,
        &post_head("/gate", Some(KEY_B), held.len(), ""),
        &held,
    );
    std::thread::sleep(Duration::from_millis(500));
    s.shutdown(Shutdown::Both).unwrap();
    drop(s);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        decisions(&h, KEY_B).len(),
        3,
        "the abandoned digest was decided"
    );
    assert_eq!(
        budget(&h)["reserved_nano"].as_u64().unwrap(),
        reserved_before,
        "the abandoned digest reserved"
    );
}

/// Issue hostile-2.4: a key whose budget refuses every call parks nothing: a repeated step the
/// budget refuses is refused at once, not held first; and past `[limits] max_paced_per_key`
/// a key's further held steps are refused as loops rather than parked.
#[test]
fn a_key_that_cannot_spend_parks_nothing_and_held_steps_are_capped() {
    // One micro-dollar: every call's worst case exceeds what is left.
    let h = scaled("max_paced_per_key = 2\n", Some(1));
    for i in 1..=3 {
        let r = h.post(CHAT, KEY_A, &polling("broke", i, "running"), &[]);
        assert_eq!(r.status, 402, "step {i}: {}", r.text());
    }
    let started = Instant::now();
    let r = h.post(CHAT, KEY_A, &polling("broke", 4, "running"), &[]);
    assert_eq!(r.status, 402, "{}", r.text());
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the refused step was held {:?}",
        started.elapsed()
    );
    assert!(r.receipt().get("paced_ms").is_none());

    // Key beta, which can spend: three steps of each of four sessions, then each session's
    // 4th step at once. Two are held; the other two are refused at once as loops.
    for tag in ["s1", "s2", "s3", "s4"] {
        for i in 1..=3 {
            let r = h.post(CHAT, KEY_B, &polling(tag, i, "running"), &[]);
            assert_eq!(r.status, 200, "{tag} {i}: {}", r.text());
        }
    }
    let started = Instant::now();
    let handles: Vec<_> = ["s1", "s2", "s3", "s4"]
        .into_iter()
        .map(|tag| {
            let url = h.proxy_url(CHAT);
            std::thread::spawn(move || {
                let body = polling(tag, 4, "running").to_string();
                let r = call(
                    client::post(&url)
                        .set("authorization", &format!("Bearer {KEY_B}"))
                        .set("content-type", "application/json"),
                    Some(body.as_bytes()),
                );
                (r.status, Instant::now())
            })
        })
        .collect();
    let results: Vec<(u16, Instant)> = handles.into_iter().map(|t| t.join().unwrap()).collect();
    let refused_at_once = results
        .iter()
        .filter(|(status, at)| {
            *status == 429 && at.duration_since(started) < Duration::from_secs(1)
        })
        .count();
    let held_then_allowed = results.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!((refused_at_once, held_then_allowed), (2, 2), "{results:?}");
    assert_eq!(metric(&h, "tokensaver_paced_refused_total"), 2.0);
}

/// Issue hostile-2.2: a prefix the key only ever sent in refused calls is not "seen": the next
/// call that is forwarded gets no gate-placed breakpoint (no cache write on a prefix nothing
/// has read), and the one after it does.
#[test]
fn a_prefix_that_was_only_ever_refused_earns_no_cache_write() {
    let h = Harness::default();
    let system = "You are a meticulous reviewer of build logs. ".repeat(180);
    let call = |max_tokens: u64, text: &str| {
        json!({"model": "claude-sonnet-4-5", "max_tokens": max_tokens, "system": system,
               "messages": [{"role": "user", "content": text}]})
    };
    // An absurd ceiling: refused by the budget (402), never sent.
    let r = h.post(MESSAGES, KEY_A, &call(50_000_000, "review the log"), &[]);
    assert_eq!(r.status, 402, "{}", r.text());
    let r = h.post(MESSAGES, KEY_A, &call(100, "review the first log"), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        !h.mock
            .last_request()
            .unwrap()
            .body_text()
            .contains("cache_control"),
        "a breakpoint was placed on a prefix only a refused call had sent"
    );
    settle();
    let r = h.post(MESSAGES, KEY_A, &call(100, "review the second log"), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        h.mock
            .last_request()
            .unwrap()
            .body_text()
            .contains("cache_control"),
        "the prefix a forwarded call sent gets its breakpoint"
    );
}

/// `connections` × `per_connection` identical requests of `key`, pipelined, every answer read.
fn flood(h: &Harness, key: &str, text: &str, connections: usize, per_connection: usize) {
    let body = chat("gpt-4o", text, json!({"max_tokens": 5})).to_string();
    let one = format!("{}{body}", post_head(CHAT, Some(key), body.len(), ""));
    let floods: Vec<_> = (0..connections)
        .map(|_| {
            let addr = h.proxy;
            let batch = one.repeat(per_connection);
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let writer = {
                    let mut w = s.try_clone().unwrap();
                    std::thread::spawn(move || w.write_all(batch.as_bytes()).unwrap())
                };
                let mut answers = 0;
                let mut tail: Vec<u8> = Vec::new();
                let mut buf = [0u8; 65536];
                s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                while answers < per_connection {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0, "closed after {answers} answers");
                    tail.extend_from_slice(&buf[..n]);
                    answers += tail.windows(9).filter(|w| w == b"HTTP/1.1 ").count();
                    // Keep the last 8 bytes: a status line may straddle two reads.
                    let keep = tail.len().saturating_sub(8);
                    tail.drain(..keep);
                }
                writer.join().unwrap();
            })
        })
        .collect();
    for f in floods {
        f.join().unwrap();
    }
}

/// Issue hostile-2.11: the admin page lists the sessions running now, whatever another key
/// did earlier in the day: a flood of 5,200 decisions of one key before a session of another
/// does not push that session off the page.
#[test]
fn a_flood_does_not_push_the_current_sessions_off_the_page() {
    let h = Harness::start(Opts {
        budget_b: None,
        ..Opts::default()
    });
    flood(&h, KEY_B, "page flood", 4, 1_300);
    let r = h.post(CHAT, KEY_A, &polling("current", 1, "running"), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    settle();
    let admin = format!("http://{}", h.admin);
    let form = format!("key={}", ADMIN_KEY);
    let login = call(
        client::post(&format!("{admin}/page/login"))
            .no_redirects()
            .set("content-type", "application/x-www-form-urlencoded")
            .set("origin", &admin)
            .set("sec-fetch-site", "same-origin"),
        Some(form.as_bytes()),
    );
    assert_eq!(login.status, 303, "{}", login.text());
    let cookie = login
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = call(
        client::get(&format!("{admin}/page/")).set("cookie", &cookie),
        None,
    )
    .text();
    let sessions = &page[page.find("id=\"sessions\"").expect("a sessions section")..];
    let sessions = &sessions[..sessions.find("</section>").unwrap_or(sessions.len())];
    assert!(
        sessions.contains("<td>alpha</td>"),
        "the current session of alpha is not listed: {sessions}"
    );
}

/// Issue hostile-2.3: a key that floods never runs its decision clock ahead of the wall
/// clock: every decision is stamped at most the wall time it was answered, and every decision
/// keeps its own id.
#[test]
fn a_flood_does_not_run_the_decision_clock_ahead_of_the_wall_clock() {
    let h = Harness::start(Opts {
        budget_a: None,
        ..Opts::default()
    });
    // One identical request pipelined 1,000 times on each of 4 connections: decided and
    // refused (a retry storm) as fast as the gate can, nothing forwarded.
    let per_connection = 1_000;
    flood(&h, KEY_A, "flood", 4, per_connection);
    let answered_by_ms = tokensaver::now_ms();
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let r = keyed_get(
            &h.api_url(&format!("/ledger/decisions?limit=1000{after}")),
            Some(KEY_A),
        );
        let page = r.json();
        all.extend(page["decisions"].as_array().unwrap().clone());
        match page["next_after"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(
        all.len(),
        4 * per_connection,
        "every decision kept its own row"
    );
    let latest = all
        .iter()
        .map(|d| d["decided_at_ms"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(
        latest <= answered_by_ms,
        "a decision was stamped {} ms after every answer had arrived",
        latest - answered_by_ms
    );
}

/// Issue hostile-2.5, 2.18 and 2.17: a path with dot segments (or their encodings) is refused
/// before it is routed — a normalising front would read the model route as another key's
/// stored response; an HTTP/1.1 request without `Host` is a 400; a body in a coding the gate
/// does not read is a 415, never priced as plain and forwarded labelled. Nothing reaches the
/// provider, and the SDKs are not told to retry (4xx other than 408/409/429).
#[test]
fn malformed_paths_hosts_and_codings_are_refused_before_anything_is_decided() {
    let h = Harness::default();
    let created = h.post(
        RESPONSES,
        KEY_A,
        &json!({"model": "gpt-4o", "input": "Alpha's secret.", "max_output_tokens": 50}),
        &[HUMAN],
    );
    assert_eq!(created.status, 200, "{}", created.text());
    let id = created.json()["id"].as_str().unwrap().to_string();
    let before = h.mock.total_calls();
    for path in [
        format!("/v1/models/llama-x/../../responses/{id}/input_items"),
        format!("/v1/models/llama-x/%2e%2e/%2E%2E/responses/{id}"),
        format!("/v1/models/x%2f..%2f..%2fresponses%2f{id}"),
        "/v1/models/./x".to_string(),
        format!("/v1/models/x\\..\\..\\responses\\{id}"),
    ] {
        let head = format!(
            "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY_B}\r\n\r\n"
        );
        let mut s = send_raw(h.proxy, &head, b"");
        let raw = read_all(&mut s, Duration::from_secs(5));
        assert_eq!(
            status_of(&raw),
            400,
            "{path}: {}",
            String::from_utf8_lossy(&raw)
        );
        assert!(
            String::from_utf8_lossy(&raw).contains("invalid_path"),
            "{path}"
        );
    }
    // HTTP/1.1 without Host.
    let body = chat("gpt-4o", "no host", json!({})).to_string();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\ncontent-type: application/json\r\nauthorization: Bearer {KEY_A}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut s = send_raw(h.proxy, &head, body.as_bytes());
    let raw = read_all(&mut s, Duration::from_secs(5));
    assert_eq!(status_of(&raw), 400, "{}", String::from_utf8_lossy(&raw));
    assert!(String::from_utf8_lossy(&raw).contains("missing_host"));
    // A plain body labelled gzip.
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o", "labelled", json!({})),
        &[("content-encoding", "gzip")],
    );
    assert_eq!(r.status, 415, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "unsupported_content_encoding");
    assert_eq!(
        h.mock.total_calls(),
        before,
        "something reached the provider"
    );
    assert!(
        decisions(&h, KEY_A).len() == 1,
        "only the created response was decided"
    );
}

/// Issue hostile-2.6 and 2.8: a `previous_response_id` that is not a string, a `conversation`
/// (provider-side state the gate cannot bind to a key) and a model name past 256 bytes are
/// refused with a closed-form 400 before anything is decided; the long name is never stored.
#[test]
fn untyped_chains_conversations_and_long_model_names_are_refused_unbooked() {
    let h = Harness::default();
    for previous in [json!({"id": "resp_0123"}), json!(["resp_0123"]), json!(7)] {
        let r = h.post(
            RESPONSES,
            KEY_A,
            &json!({"model": "gpt-4o", "input": "go on", "previous_response_id": previous}),
            &[],
        );
        assert_eq!(r.status, 400, "{previous}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "wrong_type");
    }
    let r = h.post(
        RESPONSES,
        KEY_A,
        &json!({"model": "gpt-4o", "input": "go on", "conversation": "conv_0123"}),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "conversation_not_gated");
    let long = "m".repeat(512 * 1024);
    let r = h.post(CHAT, KEY_A, &chat(&long, "hi", json!({})), &[]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "field_too_long");
    assert!(!r.text().contains("mmmm"), "the name was echoed");
    assert_eq!(h.mock.total_calls(), 0);
    assert!(decisions(&h, KEY_A).is_empty());
    // The same bound in a digest.
    let fp_key = tokensaver::auth::fingerprint_key(SECRET_A);
    let parsed = request::parse(
        Route::OpenAiChat,
        chat("gpt-4o", "hi", json!({})).to_string().as_bytes(),
        &fp_key,
    )
    .unwrap();
    let mut digest = serde_json::to_value(Digest::new(parsed.shape)).unwrap();
    digest["request"]["model"] = json!("m".repeat(300));
    let r = keyed_send(
        "POST",
        &h.api_url("/gate"),
        Some(KEY_A),
        digest.to_string().as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(decisions(&h, KEY_A).is_empty());
}

/// Issue hostile-2.9: the API listener authenticates a keyed route from its headers before it
/// reads a byte of the body, and a public route takes only a small body: a keyless caller that
/// declares 8 MiB and trickles it gets its answer at once, not after the body.
#[test]
fn the_api_listener_refuses_before_it_reads_a_body() {
    let h = Harness::default();
    for (path, key, expected) in [
        ("/estimate", None, 401),
        ("/gate", Some("tsk_alpha_wrong"), 401),
        ("/record", None, 401),
        ("/verify", None, 413),
    ] {
        let head = post_head(path, key, 8 * 1024 * 1024, "");
        let mut s = send_raw(h.api, &head, b"{\"v\":");
        let started = Instant::now();
        let raw = read_all(&mut s, Duration::from_secs(3));
        assert!(!raw.is_empty(), "{path}: no answer before the body");
        assert_eq!(status_of(&raw), expected, "{path}");
        assert!(started.elapsed() < Duration::from_secs(2), "{path}");
    }
    // The admin listener's admin routes likewise.
    let head = "PUT /prices HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 8388608\r\n\r\n";
    let mut s = send_raw(h.admin, head, b"{");
    let raw = read_all(&mut s, Duration::from_secs(3));
    assert_eq!(status_of(&raw), 401);
}

/// SO_LINGER 0: closing the socket resets the connection.
fn reset_on_close(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket, and a `linger` of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
}

/// Issue hostile-2.10: a keyless request with a long request-target, reset at once, writes
/// nothing of its target to the log, on the proxy and on the API listener.
#[test]
fn a_request_target_never_reaches_the_log() {
    let h = Harness::start(Opts {
        rust_log: "debug",
        ..Opts::default()
    });
    let marker = "zq".repeat(30_000);
    for (addr, path) in [
        (h.proxy, format!("/v1/models/{marker}")),
        (h.proxy, format!("/v1/chat/completions?{marker}")),
        (h.api, format!("/spec?{marker}")),
        (h.api, format!("/gate?{marker}")),
    ] {
        for _ in 0..3 {
            let mut s = TcpStream::connect(addr).unwrap();
            reset_on_close(&s);
            let _ =
                s.write_all(format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").as_bytes());
            // Reset at once: the answer cannot be written.
            drop(s);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let log = h.log();
    assert!(
        !log.contains("zqzqzqzq"),
        "the request-target was logged ({} bytes of log)",
        log.len()
    );
}

/// Issue hostile-2.12: a stuck Responses loop chained by `previous_response_id` — each call
/// sends only the tool's output and continues the response before — is one repeated step, paced
/// like the same loop sent with its whole history.
#[test]
fn a_stuck_loop_chained_by_previous_response_id_is_paced() {
    let h = scaled("", None);
    let tools = json!([{"type": "function", "name": "shell", "description": "run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}]);
    let first = h.post(
        RESPONSES,
        KEY_A,
        &json!({"model": "gpt-4o", "max_output_tokens": 100, "tools": tools,
                "input": "Deploy it. tokensaver-mock:loop"}),
        &[],
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let mut previous = first.json()["id"].as_str().unwrap().to_string();
    let mut paced = Vec::new();
    for i in 0..5 {
        let call_id = format!("call_{i}");
        let r = h.post(
            RESPONSES,
            KEY_A,
            &json!({"model": "gpt-4o", "max_output_tokens": 100, "tools": tools,
                    "previous_response_id": previous,
                    "input": [
                        {"type": "function_call_output", "call_id": call_id,
                         "output": "deploy: waiting for lock"},
                        {"role": "user", "content": "tokensaver-mock:loop"}]}),
            &[],
        );
        assert_eq!(r.status, 200, "chained call {i}: {}", r.text());
        paced.push(
            r.receipt()
                .get("paced_ms")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        );
        previous = r.json()["id"].as_str().unwrap().to_string();
        settle();
    }
    // Every chained call continues the same answer (the loop's tool call) with the same
    // output: one step. Three pass; the 4th identical step in the window is held.
    assert_eq!(&paced[..3], &[0, 0, 0], "{paced:?}");
    assert!(
        paced[3] > 0,
        "the repeated chained step was not paced: {paced:?}"
    );
}

/// Issue hostile-2.13: a clock right after a colour code (`ESC[2m`, as `tracing`, pytest and
/// cargo print it) is normalised: a stuck agent whose tool output is coloured still repeats
/// its step and is paced.
#[test]
fn a_coloured_clock_does_not_hide_a_stuck_agent() {
    let h = scaled("", None);
    let mut paced = Vec::new();
    for i in 1..=4 {
        let result = format!(
            "\u{1b}[2m2026-12-05T10:0{i}:1{i}.12{i}Z\u{1b}[0m \u{1b}[32mINFO\u{1b}[0m waiting for lock"
        );
        let r = h.post(CHAT, KEY_A, &polling("ansi", i, &result), &[]);
        assert_eq!(r.status, 200, "step {i}: {}", r.text());
        paced.push(
            r.receipt()
                .get("paced_ms")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        );
    }
    assert_eq!(&paced[..3], &[0, 0, 0]);
    assert!(
        paced[3] > 0,
        "the coloured-clock step was not paced: {paced:?}"
    );
}

/// Issue hostile-2.14: a person who answers different assistant texts with the same word is
/// taking different steps: never paced, never stopped as `runaway_step`.
#[test]
fn a_person_who_keeps_saying_continue_is_not_a_stuck_agent() {
    let h = scaled("", None);
    let mut messages = vec![json!({"role": "user", "content": "Write the report."})];
    for i in 0..10 {
        messages.push(json!({"role": "assistant", "content": format!("Part {i} of the report: the figures for region {i} rose.")}));
        messages.push(json!({"role": "user", "content": "continue"}));
        let body = json!({"model": "gpt-4o", "max_tokens": 100, "messages": messages});
        let r = h.post(CHAT, KEY_A, &body, &[]);
        assert_eq!(r.status, 200, "turn {i}: {}", r.text());
        assert!(
            r.receipt().get("paced_ms").is_none(),
            "turn {i} was held as a repeated step"
        );
    }
}

/// Issue hostile-2.15: `/estimate` predicts what the proxy does with a repeated step — it is
/// held until its window admits it, then decided — not a BLOCK the proxy never gives.
#[test]
fn estimate_predicts_the_pacing_the_proxy_applies() {
    let h = scaled("", None);
    for i in 1..=3 {
        let r = h.post(CHAT, KEY_A, &polling("estimate", i, "running"), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let fourth = polling("estimate", 4, "running");
    let e = keyed_send(
        "POST",
        &h.api_url("/estimate"),
        Some(KEY_A),
        fourth.to_string().as_bytes(),
    );
    assert_eq!(e.status, 200, "{}", e.text());
    let predicted = &e.json()["decision"];
    assert_eq!(predicted["verdict"], "ALLOW", "{predicted}");
    assert!(
        predicted["paced_ms"].as_u64().unwrap_or(0) > 0,
        "{predicted}"
    );
    let r = h.post(CHAT, KEY_A, &fourth, &[]);
    assert_eq!(r.verdict(), Some("ALLOW"));
    assert!(r.receipt()["paced_ms"].as_u64().unwrap_or(0) > 0);
}

/// Issue hostile-2.16: an HTTP/1.0 client gets a stream without chunked coding (which it does
/// not know): the events as they are, the end of the answer marked by the connection closing.
#[test]
fn an_http_1_0_client_gets_a_stream_without_chunk_sizes() {
    let h = Harness::default();
    let body = chat(
        "gpt-4o",
        "Stream a haiku, please.",
        json!({"stream": true, "max_tokens": 50}),
    )
    .to_string();
    let head = format!(
        "POST {CHAT} HTTP/1.0\r\ncontent-type: application/json\r\nauthorization: Bearer {KEY_A}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut s = send_raw(h.proxy, &head, body.as_bytes());
    let raw = read_all(&mut s, Duration::from_secs(10));
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(status_of(&raw), 200, "{text}");
    let (head, events) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    assert!(
        events.starts_with("data: "),
        "chunk sizes in the body: {events:?}"
    );
    assert!(events.trim_end().ends_with("data: [DONE]"), "{events:?}");
}

/// Issue hostile-2.19: a response created on a named upstream is read back from that upstream,
/// with its credential — not from the default upstream with the default's.
#[test]
fn a_stored_response_is_read_back_from_the_upstream_that_created_it() {
    let special = tokensaver_mock_provider::MockProvider::start_background(
        tokensaver_mock_provider::ProviderOptions {
            expected_credential: Some("sk-special".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let h = Harness::start(Opts {
        upstreams_toml: Some(format!(
            "[upstreams.openai]\nbase_url = \"{{mock}}\"\ncredential_env = \"OPENAI_API_KEY\"\n\n\
             [upstreams.anthropic]\nbase_url = \"{{mock}}\"\ncredential_env = \"ANTHROPIC_API_KEY\"\n\n\
             [upstreams.special]\napi = \"openai\"\nbase_url = \"{}\"\ncredential_env = \"SPECIAL_KEY\"\n\
             models = [\"gpt-4o-mini\"]\n",
            special.base_url()
        )),
        env: vec![("SPECIAL_KEY".into(), "sk-special".into())],
        ..Opts::default()
    });
    let created = h.post(
        RESPONSES,
        KEY_A,
        &json!({"model": "gpt-4o-mini", "input": "Keep me.", "max_output_tokens": 50}),
        &[],
    );
    assert_eq!(created.status, 200, "{}", created.text());
    assert_eq!(special.calls(RESPONSES), 1);
    let id = created.json()["id"].as_str().unwrap().to_string();
    let read = keyed_get(&h.proxy_url(&format!("/v1/responses/{id}")), Some(KEY_A));
    assert_eq!(read.status, 200, "{}", read.text());
    assert_eq!(read.json()["id"], json!(id));
    let path = format!("{RESPONSES}/{id}");
    assert_eq!(special.calls(&path), 1, "not read from its own upstream");
    assert_eq!(h.mock.calls(&path), 0, "read from the default upstream");
}

/// Issue hostile-2.7: a key bound to its own provider credential (`[[keys]] credential_env`)
/// sends it, and only it, on its calls to that upstream: its prompts share no provider cache
/// with the keys behind the shared credential. Another key still sends the shared one.
#[test]
fn a_key_bound_to_its_own_credential_sends_it() {
    let h = Harness::start(Opts {
        key_b_extra: "credential_env = { openai = \"BETA_OPENAI_KEY\" }\n".into(),
        env: vec![("BETA_OPENAI_KEY".into(), "sk-beta-own".into())],
        ..Opts::default()
    });
    let auth_of_last = || {
        h.mock
            .last_request()
            .unwrap()
            .headers
            .into_iter()
            .find(|(n, _)| n == "authorization")
            .map(|(_, v)| v)
    };
    // The mock answers 401 to a credential it does not expect: what matters is what it got.
    let _ = h.post(
        CHAT,
        KEY_B,
        &chat("gpt-4o", "beta's call", json!({})),
        &[HUMAN],
    );
    assert_eq!(auth_of_last().as_deref(), Some("Bearer sk-beta-own"));
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o", "alpha's call", json!({})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        auth_of_last().as_deref(),
        Some(format!("Bearer {PROVIDER_CREDENTIAL}").as_str())
    );
}
