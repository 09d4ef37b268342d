//! The key commands and check-config, as a script or an operator runs them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::process::{Command, Stdio};

fn tokensaver(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokensaver"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn key_hash_gives_the_hash_key_new_puts_in_the_config() {
    let mut expected = Vec::new();
    let mut keys = String::new();
    for id in ["bulk-1", "bulk-2"] {
        let (ok, out, _) = tokensaver(&["key", "new", "--id", id, "--profile", "none"], "");
        assert!(ok);
        let key = out
            .split_whitespace()
            .find(|w| w.starts_with("tsk_"))
            .unwrap()
            .to_string();
        let hash = out
            .lines()
            .find_map(|l| l.strip_prefix("secret_hash = \""))
            .unwrap()
            .trim_end_matches('"')
            .to_string();
        expected.push(format!("{id} {hash}"));
        keys.push_str(&key);
        keys.push('\n');
    }
    let (ok, out, _) = tokensaver(&["key", "hash"], &keys);
    assert!(ok);
    assert_eq!(out.lines().collect::<Vec<_>>(), expected);

    let (ok, out, err) = tokensaver(&["key", "hash"], &format!("{keys}not-a-key-SECRETWORD\n"));
    assert!(!ok);
    assert!(out.is_empty(), "nothing printed for a partial batch");
    assert!(err.contains("line 3"), "{err}");
    assert!(
        !err.contains("SECRETWORD"),
        "the bad line is never echoed: {err}"
    );
}

#[test]
fn check_config_refuses_a_gate_url_that_is_not_a_url_and_takes_ipv6() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[client]\ngate_url = \"not a url\"\n").unwrap();
    let (ok, _, err) = tokensaver(&["check-config", path.to_str().unwrap()], "");
    assert!(!ok);
    assert!(err.contains("client.gate_url"), "{err}");
    std::fs::write(
        &path,
        "[client]\ngate_url = \"http://[::1]:8788\"\n[upstreams.openai]\nbase_url = \"http://[::1]:9\"\n",
    )
    .unwrap();
    let (ok, _, err) = tokensaver(&["check-config", path.to_str().unwrap()], "");
    assert!(ok, "{err}");
}
