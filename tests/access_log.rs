//! The access log (issue 21, point 5): one line per proxy request, early answers included, in
//! the server's text and JSON log formats, with no request content — every body below carries
//! a marker word that must appear nowhere in the log — and the metrics that count them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;

use serde_json::{json, Value};
use support::*;

const MARKER: &str = "quokkazebra";
const UNATTENDED: (&str, &str) = ("x-tokensaver-human", "0");

/// One access line's fields, by name.
type Line = BTreeMap<String, String>;

/// The requests, and what each line must say: (route, status, verdict, decision id).
fn drive(h: &Harness) -> Vec<(&'static str, u16, &'static str, Option<String>)> {
    let decision = |r: &Resp| {
        let env = tokensaver::receipt::Envelope::from_header_value(
            r.header("x-tokensaver-receipt").unwrap(),
        )
        .unwrap();
        Some(tokensaver::receipt::decision_id(&env.body_bytes().unwrap()).to_string())
    };
    let mut expected = Vec::new();
    let text = format!("Say {MARKER} in French.");
    // Forwarded, then served from the store.
    let reusable = chat(
        "gpt-4o-mini",
        &text,
        json!({"max_tokens": 50, "temperature": 0}),
    );
    let r = h.post(CHAT, KEY_A, &reusable, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    expected.push((CHAT, 200, "ALLOW", decision(&r)));
    settle();
    let r = h.post(CHAT, KEY_A, &reusable, &[HUMAN]);
    assert_eq!(r.verdict(), Some("SERVE"), "{}", r.text());
    expected.push((CHAT, 200, "SERVE", decision(&r)));
    // A retry storm of an unattended caller: its 4th identical request is a BLOCK.
    let storm = chat(
        "gpt-4o-mini",
        &format!("{MARKER} storm"),
        json!({"max_tokens": 50, "temperature": 0.7}),
    );
    for i in 0..4 {
        let r = h.post(CHAT, KEY_A, &storm, &[UNATTENDED]);
        let (status, verdict) = if i < 3 {
            (200, "ALLOW")
        } else {
            (429, "BLOCK")
        };
        assert_eq!(r.status, status, "{i}: {}", r.text());
        expected.push((CHAT, status, verdict, decision(&r)));
    }
    // Early answers: no key, no JSON, no route, too large.
    let r = h.post(
        CHAT,
        "tsk_alpha_wrongwrongwrongwrongwrongwrongwrongwrong",
        &reusable,
        &[],
    );
    assert_eq!(r.status, 401);
    expected.push((CHAT, 401, "none", None));
    let r = h.post_raw(
        CHAT,
        Some(KEY_A),
        format!("{{\"{MARKER}\": ").as_bytes(),
        &[],
    );
    assert_eq!(r.status, 400);
    expected.push((CHAT, 400, "none", None));
    let r = keyed_get(&h.proxy_url(&format!("/v1/{MARKER}")), Some(KEY_A));
    assert_eq!(r.status, 404);
    expected.push(("unknown", 404, "none", None));
    let big = chat(
        "gpt-4o-mini",
        &format!("{MARKER} ").repeat(1_000),
        json!({}),
    );
    let r = h.post(CHAT, KEY_A, &big, &[]);
    assert_eq!(r.status, 413);
    expected.push((CHAT, 413, "none", None));
    expected
}

fn harness(format: &str) -> Harness {
    Harness::start(Opts {
        rust_log: "warn,tokensaver::access=info",
        serve_args: vec!["--log-format".into(), format.into()],
        max_body_bytes: Some(4_096),
        ..Opts::default()
    })
}

/// Wait for `n` access lines (the last is written when its connection's request ends).
fn lines_of(h: &Harness, n: usize, parse: impl Fn(&str) -> Option<Line>) -> Vec<Line> {
    for _ in 0..100 {
        let lines: Vec<Line> = h.log().lines().filter_map(&parse).collect();
        if lines.len() >= n {
            return lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("fewer than {n} access lines:\n{}", h.log());
}

fn check(h: &Harness, lines: &[Line], expected: &[(&str, u16, &str, Option<String>)]) {
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    // A line is written when its request ends, after the answer reached the client, so two
    // requests in a row may log in either order: pair lines and requests by what they say.
    let field = |l: &Line, k: &str| l.get(k).cloned().unwrap_or_default();
    let mut lines: Vec<&Line> = lines.iter().collect();
    lines.sort_by_key(|l| ["status", "route", "verdict", "decision"].map(|k| field(l, k)));
    let mut expected: Vec<_> = expected.iter().collect();
    expected.sort_by_key(|(route, status, verdict, decision)| {
        let decision = decision.as_deref().unwrap_or("-");
        [&status.to_string(), *route, *verdict, decision].map(str::to_string)
    });
    for (line, (route, status, verdict, decision)) in lines.into_iter().zip(expected) {
        let f = |k: &str| {
            line.get(k)
                .map(String::as_str)
                .unwrap_or_else(|| panic!("no {k}: {line:?}"))
        };
        assert_eq!(f("route"), *route, "{line:?}");
        assert_eq!(f("status"), status.to_string(), "{line:?}");
        assert_eq!(f("verdict"), *verdict, "{line:?}");
        assert_eq!(
            f("decision"),
            decision.as_deref().unwrap_or("-"),
            "{line:?}"
        );
        for k in [
            "bytes_in",
            "bytes_out",
            "total_ms",
            "upstream_ms",
            "ttfb_ms",
            "rule",
            "upstream_status",
        ] {
            f(k);
        }
        if *status != 401 && *route != "unknown" {
            assert_eq!(f("key"), "alpha", "{line:?}");
        }
        if *verdict == "ALLOW" {
            assert_eq!(f("upstream"), "openai");
            assert_eq!(f("upstream_status"), "200");
            assert_eq!(f("model_requested"), "gpt-4o-mini");
            assert_eq!(f("model_served"), "gpt-4o-mini");
            assert!(f("ttfb_ms").parse::<f64>().unwrap() > 0.0, "{line:?}");
            assert!(f("bytes_out").parse::<u64>().unwrap() > 0, "{line:?}");
        }
        if *verdict == "BLOCK" {
            assert_eq!(f("rule"), "runaway_loop_unattended", "{line:?}");
            assert_eq!(f("upstream"), "-", "{line:?}");
        }
    }
    let log = h.log();
    assert!(!log.contains(MARKER), "request content in the log:\n{log}");
    // Early answers are counted by status; every request by verdict.
    let metrics = call(client::get(&h.admin_url("/metrics")), None).text();
    for status in [400, 401, 404, 413] {
        let line = format!("tokensaver_early_answers_total{{status=\"{status}\"}} 1");
        assert!(metrics.contains(&line), "{line} not in:\n{metrics}");
    }
    for (verdict, n) in [("ALLOW", 4), ("SERVE", 1), ("BLOCK", 1), ("none", 4)] {
        let line = format!("tokensaver_request_seconds_count{{verdict=\"{verdict}\"}} {n}");
        assert!(metrics.contains(&line), "{line} not in:\n{metrics}");
    }
}

#[test]
fn one_text_line_per_request_early_answers_included_and_no_content() {
    let h = harness("text");
    let expected = drive(&h);
    // `… INFO tokensaver::access: access route=… key=… …`: key=value, values quoted or bare.
    let lines = lines_of(&h, expected.len(), |l| {
        let at = l.find("tokensaver::access: access ")?;
        Some(
            key_values(&l[at..])
                .into_iter()
                .map(|(k, v)| (k, v.trim_matches('"').to_string()))
                .collect(),
        )
    });
    check(&h, &lines, &expected);
}

#[test]
fn one_json_object_per_request_in_the_json_log_format() {
    let h = harness("json");
    let expected = drive(&h);
    let lines = lines_of(&h, expected.len(), |l| {
        let v: Value = serde_json::from_str(l).ok()?;
        (v["target"] == "tokensaver::access").then(|| {
            v["fields"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_string),
                    )
                })
                .collect()
        })
    });
    check(&h, &lines, &expected);
}

/// `key=value` pairs of a text line (`"…"` values may hold spaces).
fn key_values(s: &str) -> Vec<(String, String)> {
    {
        let mut out = Vec::new();
        let mut rest = s;
        while let Some(eq) = rest.find('=') {
            let key_start = rest[..eq].rfind(' ').map_or(0, |i| i + 1);
            let key = rest[key_start..eq].to_string();
            let after = &rest[eq + 1..];
            let (value, next) = if let Some(q) = after.strip_prefix('"') {
                let end = q.find('"').unwrap_or(q.len());
                (format!("\"{}\"", &q[..end]), &q[(end + 1).min(q.len())..])
            } else {
                let end = after.find(' ').unwrap_or(after.len());
                (after[..end].to_string(), &after[end..])
            };
            if key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !key.is_empty() {
                out.push((key, value));
            }
            rest = next;
        }
        out
    }
}
