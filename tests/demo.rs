//! `tokensaver demo`, the quick start, as a newcomer runs it: the example config in front of
//! the built-in provider. Its claims are checked against its own printed figures: the paused
//! session is cheaper through the gate by what the two spends say, the stuck agent is paced
//! and then stopped, and the session table shows both.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

/// The dollar figures of a line, in order.
fn dollars(line: &str) -> Vec<f64> {
    line.split_whitespace()
        .filter_map(|w| w.strip_prefix('$'))
        .map(|d| d.parse().unwrap())
        .collect()
}

fn line<'a>(out: &'a str, start: &str) -> &'a str {
    out.lines()
        .find(|l| l.trim_start().starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?} in\n{out}"))
}

#[test]
fn the_demo_shows_a_paused_session_saved_and_a_stuck_agent_paced_then_stopped() {
    let out = Command::new(env!("CARGO_BIN_EXE_tokensaver"))
        .args(["demo", "--config"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/tokensaver.toml"
        ))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The paused session: the same requests, as sent and through the gate.
    let plain = dollars(line(&text, "as sent (key with cache off)"));
    let gated = dollars(line(&text, "through the gate"));
    let (plain_spend, gated_spend) = (plain[0], gated[0]);
    assert!(gated_spend > 0.0 && plain_spend > 0.0, "{text}");
    let saved = 1.0 - gated_spend / plain_spend;
    assert!(saved >= 0.30, "{:.1} % saved\n{text}", saved * 100.0);
    // Straight, every pause rebuilt the expired cache; through the gate only the first did
    // (its one-hour entries bridged the rest), at the one-hour premium.
    let rebuilds = |l: &str| -> u64 {
        let cells: Vec<&str> = l.split_whitespace().collect();
        cells[cells.len() - 3].parse().unwrap()
    };
    assert_eq!(
        rebuilds(line(&text, "as sent (key with cache off)")),
        4,
        "{text}"
    );
    assert_eq!(rebuilds(line(&text, "through the gate")), 1, "{text}");
    assert_eq!(plain[2], 0.0, "no premium without one-hour entries: {text}");
    assert!(gated[2] > 0.0, "{text}");
    let claimed = dollars(line(&text, "the placed lifetime saved"))[0];
    assert!(
        (claimed - (plain_spend - gated_spend)).abs() < 2e-6,
        "{claimed} against {plain_spend} - {gated_spend}\n{text}"
    );

    // The stuck agent: paced (held), then stopped by runaway_step; nothing after the stop.
    let stuck: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("step"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let last = stuck.last().expect("the stuck agent's steps");
    assert_eq!(&last[1..4], &["429", "BLOCK", "runaway_step"], "{text}");
    let held: Vec<f64> = stuck.iter().map(|c| c[4].parse().unwrap()).collect();
    assert!(held[..3].iter().all(|h| *h == 0.0), "{text}");
    assert!(held.iter().any(|h| *h >= 1.0), "{text}");
    assert!(
        stuck[..stuck.len() - 1].iter().all(|c| c[1] == "200"),
        "{text}"
    );

    // The session table: both keys' sessions and the stopped one.
    let table = &text[text
        .find("sessions of every key")
        .expect("the session table")..];
    for key in [" coder ", " coder-plain ", "runaway_step"] {
        assert!(table.contains(key), "{key} not in\n{table}");
    }
}
