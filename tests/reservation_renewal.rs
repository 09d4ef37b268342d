//! A reservation stays live while its answer is relayed (SPEC §4, "Budget reservations"): an
//! answer that outlasts several reservation TTLs — a slow stream, or a JSON answer the provider
//! is silent on for longer than a TTL — is settled at the usage the provider reported, never
//! expired at its worst case; a reservation nothing relays (a digest decision never recorded)
//! is still charged its worst case once the TTL has passed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;
use tokensaver::auth::fingerprint_key;
use tokensaver::request::{self, Digest, Route};
use tokensaver_mock_provider::expected_usage;

/// The smallest TTL the config takes (whole seconds): renewed every 666 ms.
const TTL: Duration = Duration::from_secs(2);

fn short_ttl(opts: Opts) -> Harness {
    Harness::start(Opts {
        extra_config: format!("reservation_ttl_secs = {}\n", TTL.as_secs()),
        ..opts
    })
}

fn decision_lines(h: &Harness) -> Vec<Value> {
    let r = keyed_get(&h.api_url("/ledger/decisions"), Some(KEY_A));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["decisions"].as_array().unwrap().clone()
}

fn line_of(lines: &[Value], r: &Resp) -> Value {
    let env =
        tokensaver::receipt::Envelope::from_header_value(r.header("x-tokensaver-receipt").unwrap())
            .unwrap();
    let id = tokensaver::receipt::decision_id(&env.body_bytes().unwrap()).to_string();
    lines
        .iter()
        .find(|l| l["decision_id"] == id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{id} not listed: {lines:?}"))
}

/// Settled at what the provider reported for `body`: its tokens, on the reported basis.
fn assert_settled_as_reported(line: &Value, body: &Value) {
    let exp = expected_usage(body.to_string().as_bytes()).unwrap();
    assert_eq!(line["status"], "complete", "{line}");
    assert_eq!(line["basis"], "reported", "{line}");
    assert_eq!(
        line["input"].as_u64().unwrap() + line["cache_read"].as_u64().unwrap(),
        exp.prompt_tokens,
        "{line}"
    );
    assert_eq!(line["output"].as_u64().unwrap(), exp.completion_tokens);
    assert!(
        line["spend_nano"].as_u64().unwrap() < line["reserved_nano"].as_u64().unwrap(),
        "charged below its worst case: {line}"
    );
}

#[test]
fn answers_relayed_for_several_ttls_are_settled_at_their_reported_usage() {
    // One SSE event a second (7 to 12 events), and a JSON answer withheld for 5 s.
    let h = short_ttl(Opts {
        stream_delay_ms: 1_000,
        slow_ms: 5_000,
        ..Opts::default()
    });
    let stream = chat(
        "gpt-4o-mini",
        "Stream a long reasoning answer slowly.",
        json!({"stream": true}),
    );
    let silent = chat("gpt-fault-slow", "Think for a long while first.", json!({}));
    let started = Instant::now();
    let (streamed, answered) = std::thread::scope(|s| {
        let streamed = s.spawn(|| (h.post(CHAT, KEY_A, &stream, &[HUMAN]), started.elapsed()));
        let answered = s.spawn(|| (h.post(CHAT, KEY_A, &silent, &[HUMAN]), started.elapsed()));
        (streamed.join().unwrap(), answered.join().unwrap())
    });
    let ((streamed, stream_took), (answered, silent_took)) = (streamed, answered);
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    assert!(streamed.text().contains("[DONE]"), "{}", streamed.text());
    assert_eq!(answered.status, 200, "{}", answered.text());
    // The premise: each answer outlived its reservation's TTL (the stream, three of them),
    // with the expiry sweep running every second meanwhile.
    assert!(stream_took > 3 * TTL, "the stream took {stream_took:?}");
    assert!(
        silent_took > 2 * TTL,
        "the silent answer took {silent_took:?}"
    );
    settle();

    let lines = decision_lines(&h);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_settled_as_reported(&line_of(&lines, &streamed), &stream);
    assert_settled_as_reported(&line_of(&lines, &answered), &silent);
    assert!(
        lines.iter().all(|l| l["status"] != "expired"),
        "no expiry charge: {lines:?}"
    );
    // The key's spend is those two reported charges, nothing more.
    let reported: u64 = lines
        .iter()
        .map(|l| l["spend_nano"].as_u64().unwrap())
        .sum();
    let ledger = h.ledger(KEY_A);
    assert_eq!(
        ledger["total"]["spend_nano"].as_u64(),
        Some(reported),
        "{ledger}"
    );
}

#[test]
fn a_reservation_nothing_relays_is_charged_its_worst_case_after_the_ttl() {
    let h = short_ttl(Opts::default());
    let body = chat("gpt-4o-mini", "Decided, then never recorded.", json!({}));
    let parsed = request::parse(
        Route::OpenAiChat,
        body.to_string().as_bytes(),
        &fingerprint_key(SECRET_A),
    )
    .unwrap();
    let mut digest = Digest::new(parsed.shape);
    digest.human = Some(true);
    let asked = Instant::now();
    let decided = keyed_send(
        "POST",
        &h.api_url("/gate"),
        Some(KEY_A),
        serde_json::to_string(&digest).unwrap().as_bytes(),
    );
    assert_eq!(decided.status, 200, "{}", decided.text());
    let id = decided.json()["decision_id"].as_str().unwrap().to_string();
    let line = || {
        decision_lines(&h)
            .into_iter()
            .find(|l| l["decision_id"] == id.as_str())
            .unwrap()
    };
    assert_eq!(line()["status"], "open", "{}", line());

    // Past the TTL the once-a-second sweep (up to two seconds behind a request's own sweep)
    // charges it; a loaded machine may commit later still.
    let expired = loop {
        let l = line();
        if l["status"] != "open" || asked.elapsed() > TTL + Duration::from_secs(8) {
            break l;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(asked.elapsed() >= TTL, "expired before its TTL: {expired}");
    assert_eq!(expired["status"], "expired", "{expired}");
    assert_eq!(expired["spend_nano"], expired["reserved_nano"], "{expired}");
    assert!(expired["spend_nano"].as_u64().unwrap() > 0, "{expired}");
}

/// Issue "fair over hours": a digest-mode instance relaying a stream that outlives several TTLs
/// of the central gate's reservation renews it there (`POST /renew`, keyed, only the key's own
/// digest reservations), so the central gate settles it at the usage the client reports — not
/// at its worst case on expiry.
#[test]
fn a_digest_client_renews_the_central_reservation_of_a_long_stream() {
    let h = short_ttl(Opts {
        stream_delay_ms: 1_000,
        ..Opts::default()
    });
    let client = start_client(&h, h.api, KEY_A);
    let stream = chat(
        "gpt-4o-mini",
        "Stream a long reasoning answer slowly, through the local instance.",
        json!({"stream": true}),
    );
    let started = Instant::now();
    let r = call(
        client::post(&format!("http://{}{CHAT}", client.1))
            .set("authorization", &format!("Bearer {KEY_A}"))
            .set("content-type", "application/json")
            .set(HUMAN.0, HUMAN.1),
        Some(stream.to_string().as_bytes()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("[DONE]"), "{}", r.text());
    assert!(
        started.elapsed() > 3 * TTL,
        "the stream took {:?}",
        started.elapsed()
    );
    settle();
    // The central gate's row: settled at the reported usage, never expired.
    let lines = decision_lines(&h);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_settled_as_reported(&lines[0], &stream);
    // `/renew` is the key's own: another key, or an id that is no open digest reservation,
    // renews nothing.
    let id = lines[0]["decision_id"].as_str().unwrap();
    for (key, id) in [(KEY_B, id), (KEY_A, id)] {
        let r = keyed_send(
            "POST",
            &h.api_url("/renew"),
            Some(key),
            json!({"decision_id": id}).to_string().as_bytes(),
        );
        assert_eq!(r.status, 404, "{}", r.text());
    }
}
