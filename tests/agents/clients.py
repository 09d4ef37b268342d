"""The real agent clients, as programs: how to run each against a base URL and a key.

Shared by the agent tests (`conftest.py`'s `Gate`), `scripts/agent-verdicts.py` and the
economics harness (`scripts/economics_harness.py`). The clients are installed at pinned
versions by `tests/agents/install.sh` (Claude Code, Codex CLI) and `requirements.txt`
(openai-agents, run by `sdk_agent.py` as its own process).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TOKENSAVER_BIN", ROOT / "target" / "debug" / "tokensaver"))
CLIENTS = Path(os.environ.get("AGENT_CLIENTS", ROOT / "tests" / "agents" / ".clients"))
CLAUDE = CLIENTS / "node_modules" / ".bin" / "claude"
CODEX = CLIENTS / "node_modules" / ".bin" / "codex"
SDK_AGENT = Path(__file__).with_name("sdk_agent.py")
ANTHROPIC_AGENT = Path(__file__).with_name("anthropic_agent.py")
CLIENT_TIMEOUT = 150


def free_ports(n: int) -> list[int]:
    """n distinct free ports: every socket stays bound until all are chosen, so the kernel
    cannot hand the same port out twice (two servers on one port, with SO_REUSEPORT, would
    share its connections)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited ({proc.returncode}) before :{port} opened:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f":{port} did not open within {timeout}s:\n{log.read_text()}")


@dataclass
class Run:
    """One client run: exit code, what it printed, and how long it took."""

    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run(cmd: list, env: dict, cwd: Path, timeout: float = CLIENT_TIMEOUT) -> Run:
    started = time.monotonic()
    try:
        p = subprocess.run(
            cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=timeout,
        )
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code = -9
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    return Run(code, out, err, time.monotonic() - started)


def claude(base_url: str, api_key: str, prompt: str, home: Path, cwd: Path, model: str,
           max_turns: int = 12, headers: str | None = None,
           timeout: float = CLIENT_TIMEOUT) -> Run:
    """Claude Code (`claude -p`), Anthropic messages at `base_url` (no `/v1`)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
    }
    if headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = headers
    return run(
        [CLAUDE, "-p", prompt, "--model", model, "--max-turns", str(max_turns),
         "--output-format", "text", "--allowedTools", "Bash"],
        env, cwd, timeout,
    )


def codex(base_url: str, api_key: str, prompt: str, home: Path, cwd: Path, model: str,
          timeout: float = CLIENT_TIMEOUT) -> Run:
    """Codex CLI (`codex exec`), Responses API at `base_url` (ending in `/v1`)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f"""model = "{model}"
model_provider = "tokensaver"

[model_providers.tokensaver]
name = "tokensaver"
base_url = "{base_url}"
wire_api = "responses"
env_key = "TOKENSAVER_KEY"
"""
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home.parent),
        "CODEX_HOME": str(home),
        "TOKENSAVER_KEY": api_key,
    }
    return run(
        [CODEX, "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access", prompt],
        env, cwd, timeout,
    )


def sdk(api: str, base_url: str, api_key: str, prompt: str, cwd: Path, model: str,
        *extra: str, timeout: float = CLIENT_TIMEOUT) -> Run:
    """The OpenAI Agents SDK (`sdk_agent.py`), `api` = `responses` or `chat`."""
    return run(
        [sys.executable, SDK_AGENT, api, base_url, api_key, prompt, "--model", model, *extra],
        dict(os.environ), cwd, timeout,
    )


def versions() -> dict[str, str]:
    """The installed version of each client, as the clients themselves report it."""
    out = {}
    for name, exe in (("claude-code", CLAUDE), ("codex", CODEX)):
        try:
            text = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                  timeout=60).stdout.strip()
            out[name] = text.split()[0] if name == "claude-code" else text.split()[-1]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            out[name] = "unavailable"
    try:
        from importlib.metadata import version

        out["openai-agents"] = version("openai-agents")
    except Exception:  # noqa: BLE001 - any failure is "unavailable"
        out["openai-agents"] = "unavailable"
    try:
        from importlib.metadata import version

        out["anthropic"] = version("anthropic")
    except Exception:  # noqa: BLE001 - any failure is "unavailable"
        out["anthropic"] = "unavailable"
    return out


def anthropic_agent(base_url: str, api_key: str, prompt: str, cwd: Path, model: str,
                    *extra: str, timeout: float = CLIENT_TIMEOUT) -> Run:
    """The caching-naive tool-use loop on the official `anthropic` SDK (`anthropic_agent.py`),
    Anthropic messages at `base_url` (no `/v1`)."""
    return run(
        [sys.executable, ANTHROPIC_AGENT, base_url, api_key, prompt, "--model", model, *extra],
        dict(os.environ), cwd, timeout,
    )
