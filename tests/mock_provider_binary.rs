//! The mock provider is a binary of its own (`tokensaver-mock-provider`, crates/mock-provider),
//! not linked into `tokensaver`: `tokensaver mock-provider ARGS` runs it in its own place (same
//! pid, same flags), and without it beside the executable `mock-provider` and `demo` fail with
//! a closed-form error. The sibling binary is built by `cargo build` / `cargo test --workspace`
//! at the workspace root (what `.ci/run` does).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokensaver::processes::{free_port, wait_for_port, MOCK_PROVIDER_BIN};

/// One request on a fresh connection; the raw answer.
fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn tokensaver_mock_provider_runs_the_sibling_binary_in_its_place() {
    let bin = Path::new(env!("CARGO_BIN_EXE_tokensaver"));
    let sibling = bin.with_file_name(MOCK_PROVIDER_BIN);
    assert!(
        sibling.is_file(),
        "{} is missing: run `cargo build` (or `cargo test --workspace`) at the workspace root",
        sibling.display()
    );
    let addr: SocketAddr = ([127, 0, 0, 1], free_port().unwrap()).into();
    let mut child = Command::new(bin)
        .args(["mock-provider", "--listen", &addr.to_string()])
        .args(["--expected-credential", "sk-test", "--usage", "cl100k"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for_port(addr, Duration::from_secs(10)));

    let health = exchange(
        addr,
        "GET /__mock/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
    assert!(health.ends_with("{\"ok\":true}"), "{health}");
    // The flags reached the provider: without the credential, 401.
    let body = r#"{"model":"mock-small","messages":[{"role":"user","content":"hi"}]}"#;
    let unauthorised = exchange(
        addr,
        &format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(unauthorised.starts_with("HTTP/1.1 401 "), "{unauthorised}");

    // exec, not a child process: stopping the pid we started stops the provider.
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(TcpStream::connect(addr).is_err());
}

#[test]
fn without_the_sibling_binary_mock_provider_and_demo_fail_closed_form() {
    // A copy of `tokensaver` alone in a directory (a hard link: same file system, no 200 MB
    // copy; current_exe() then names this directory).
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lonely-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lonely = dir.join("tokensaver");
    let _ = std::fs::remove_file(&lonely);
    std::fs::hard_link(env!("CARGO_BIN_EXE_tokensaver"), &lonely)
        .or_else(|_| std::fs::copy(env!("CARGO_BIN_EXE_tokensaver"), &lonely).map(|_| ()))
        .unwrap();
    for args in [
        &["mock-provider", "--listen", "127.0.0.1:0"][..],
        &["demo", "--config", "config/tokensaver.toml"][..],
    ] {
        let out = Command::new(&lonely)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "{} is missing: the mock provider is a binary of its own",
                dir.join(MOCK_PROVIDER_BIN).display()
            )),
            "{args:?}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
