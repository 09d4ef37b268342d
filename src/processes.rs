//! Local processes the commands and the test rigs start: the mock provider's binary beside
//! this one, free loopback ports, and waiting for a port to answer.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The mock provider's binary name (package `tokensaver-mock-provider`, `crates/mock-provider`).
pub const MOCK_PROVIDER_BIN: &str = "tokensaver-mock-provider";

/// The mock provider's binary, next to the running executable: the provider is a crate of its
/// own, built beside `tokensaver` by a plain `cargo build` at the workspace root, and not
/// linked into this binary.
pub fn mock_provider_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot locate this executable: {}", e.kind()))?;
    let bin = exe.with_file_name(format!(
        "{MOCK_PROVIDER_BIN}{}",
        std::env::consts::EXE_SUFFIX
    ));
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(anyhow::anyhow!(
            "{} is missing: the mock provider is a binary of its own; build it with `cargo build` \
             at the workspace root (or `cargo build -p tokensaver-mock-provider`)",
            bin.display()
        ))
    }
}

/// `n` distinct free ports: every listener stays bound until all are chosen, so the kernel
/// cannot hand one port out twice.
pub fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(anyhow::Error::from)?;
        *port = listener.local_addr().map_err(anyhow::Error::from)?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(anyhow::Error::from)?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(anyhow::Error::from)
}

pub fn wait_for_port(addr: SocketAddr, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
