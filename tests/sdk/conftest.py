"""Session fixtures for the SDK-path tests.

Starts `tokensaver mock-provider` and `tokensaver serve` (with a temp copy of
config/tokensaver.toml pointing both upstreams at the mock), and gives tests the proxy
address, the demo key and a small client for the mock's `/__mock/*` routes.

Run: `.venv/bin/python -m pytest tests/sdk -q` from the repository root.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import tomllib
from pathlib import Path

try:
    import httpx2 as httpx  # the SDK versions pinned here use httpx2
except ImportError:  # pragma: no cover
    import httpx
import pytest
import tomli_w

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "debug" / "tokensaver"
EXAMPLE_CONFIG = ROOT / "config" / "tokensaver.toml"
PROVIDER_CREDENTIAL = "sk-test-provider"
DEMO_KEY = "tsk_demo_0123456789abcdef0123456789abcdef0123456789abcdef"


def _free_ports(n: int) -> list[int]:
    """n distinct free ports (each socket stays bound until all are chosen)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_port(addr: str, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}) before {addr} opened:\n{log.read_text()}")
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{addr} did not open within {timeout}s:\n{log.read_text()}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Mock:
    """The mock provider's observation routes."""

    def __init__(self, addr: str):
        self.addr = addr
        self.http = httpx.Client(base_url=f"http://{addr}", timeout=10)

    def calls(self, path: str) -> int:
        r = self.http.get("/__mock/calls")
        r.raise_for_status()
        return int(r.json().get(path, 0))

    def requests(self, path: str | None = None, limit: int = 50) -> list:
        params = {"limit": limit}
        if path:
            params["path"] = path
        r = self.http.get("/__mock/requests", params=params)
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="session")
def tokensaver_bin() -> Path:
    if not BIN.exists():
        subprocess.run(["cargo", "build", "-q"], cwd=ROOT, check=True)
    return BIN


@pytest.fixture(scope="session")
def stack(tokensaver_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tokensaver")
    mock_port, proxy_port, api_port, admin_port = _free_ports(4)
    mock_addr = f"127.0.0.1:{mock_port}"
    mock_log = tmp / "mock.log"
    with open(mock_log, "wb") as out:
        mock = subprocess.Popen(
            [str(tokensaver_bin), "mock-provider", "--listen", mock_addr,
             "--expected-credential", PROVIDER_CREDENTIAL],
            stdout=out, stderr=subprocess.STDOUT,
        )
    procs = [mock]
    try:
        _wait_port(mock_addr, mock, mock_log)

        config = tomllib.loads(EXAMPLE_CONFIG.read_text())
        proxy_addr = f"127.0.0.1:{proxy_port}"
        config["listen"] = {
            "proxy": proxy_addr,
            "api": f"127.0.0.1:{api_port}",
            "admin": f"127.0.0.1:{admin_port}",
        }
        (tmp / "data").mkdir()
        config.setdefault("data", {})["dir"] = str(tmp / "data")
        for name in ("openai", "anthropic"):
            config["upstreams"][name]["base_url"] = f"http://{mock_addr}"
        config_path = tmp / "tokensaver.toml"
        config_path.write_text(tomli_w.dumps(config))

        env = dict(os.environ, OPENAI_API_KEY=PROVIDER_CREDENTIAL, ANTHROPIC_API_KEY=PROVIDER_CREDENTIAL)
        serve_log = tmp / "serve.log"
        with open(serve_log, "wb") as out:
            serve = subprocess.Popen(
                [str(tokensaver_bin), "serve", "--config", str(config_path)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp,
            )
        procs.append(serve)
        for addr in config["listen"].values():
            _wait_port(addr, serve, serve_log)

        yield {
            "proxy": proxy_addr,
            "api": config["listen"]["api"],
            "admin": config["listen"]["admin"],
            "mock": Mock(mock_addr),
            "serve_log": serve_log,
        }
    finally:
        for p in reversed(procs):
            _stop(p)


@pytest.fixture(scope="session")
def proxy(stack) -> str:
    return stack["proxy"]


@pytest.fixture(scope="session")
def mock(stack) -> Mock:
    return stack["mock"]


@pytest.fixture(scope="session")
def demo_key() -> str:
    return DEMO_KEY


class AttemptCounter:
    """An httpx request hook counting the attempts an SDK actually sends (retries included)."""

    def __init__(self):
        self.n = 0

    def __call__(self, request: httpx.Request) -> None:
        self.n += 1


@pytest.fixture
def attempts() -> AttemptCounter:
    return AttemptCounter()
