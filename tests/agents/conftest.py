"""The real agent clients through `tokensaver serve`, in front of the built-in provider.

Each test gets a fresh gate: `tokensaver mock-provider` and `tokensaver serve` on free
loopback ports, a temp data dir, and keys made with the real `tokensaver key new`. The clients
are the real programs, installed by `tests/agents/install.sh` at pinned versions: Claude Code
(`claude -p`), Codex CLI (`codex exec`) and the OpenAI Agents SDK (`sdk_agent.py`, run as its
own process). Nothing leaves 127.0.0.1.

The built-in provider scripts an agent from a marker in the prompt (`crates/mock-provider/src/lib.rs`):
`tokensaver-mock:steps=N` asks for N different shell commands, then answers
`tokensaver-done after N steps`; `tokensaver-mock:loop` asks for the same command forever.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import httpx2 as httpx  # the SDK versions pinned here use httpx2
except ImportError:  # pragma: no cover
    import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clients  # noqa: E402  (shared with scripts/economics_harness.py)
from clients import (  # noqa: E402,F401
    BIN, CLAUDE, CLIENT_TIMEOUT, CLIENTS, CODEX, ROOT, SDK_AGENT, Run,
    free_ports as _free_ports, run as _run, wait_port as _wait_port,
)

ADMIN_KEY = "tsa_demo-admin-key-not-for-production"
ADMIN_HASH = "ca9b790a34f739223b65bdd9124d2c340ee7ff59bc0140af9576813fb4cf82a8"
PROVIDER_CREDENTIAL = "sk-agent-tests-provider"
# The models each client sends by default (priced in config/prices-builtin.toml).
CLAUDE_MODEL = "claude-sonnet-5-5"
CODEX_MODEL = "gpt-6.2-sol"
# Codex's models from gpt-5.6 on call tools only through a JavaScript "code mode" tool, which
# the built-in provider cannot script; gpt-5.5, the newest model with plain function tools, is
# used for the tool-calling tests. Its output price is not on the provider's page as stored
# here, so the test config prices it (test figures, not a claim).
CODEX_TOOLS_MODEL = "gpt-5.5"
SDK_MODEL = "gpt-5.6-luna"

# The keys every test gate has: (id, human default, budget in micro-USD, profile).
# The step windows scaled down for the tests (the defaults: a 120 s pace window, holds of at
# most 240 s, a run of one step stopped at 90 minutes; crates/core/src/gate/schedule.rs): 3
# identical steps in any 2 s, then gaps of 2, 4 and 8 s, a run stopped once 24 s old. A client
# that asks again at once buys MOST_CALLS calls before the stop (fewer when it thinks between
# steps); a poll of a job shorter than 24 s completes. The windows the score and the hard rules
# count in are shortened 60 times alike (loop 120 s → 2 s, burst 60 s → 1 s, grind an hour → 60
# s), so the loop signal sees what it sees at full length: the window's paced steps, not every
# step of the compressed run.
PACE_WINDOW_MS = 2_000
MOST_CALLS = 7  # steps at 0, 0, 0, 2, 6, 14 and 22 s; the next, at 30 s, is past the bound
MOST_CALLS_ATTENDED = 11  # 7 at once, then at 2, 6, 14 and 22 s
STEPS = f"""[gate.steps]
pace_window_secs = {PACE_WINDOW_MS // 1000}
max_hold_secs = 8
runaway_after_secs = 24

[gate.windows]
loop_secs = 2
burst_secs = 1
grind_secs = 60"""

KEYS = [
    ("agent", False, 100_000_000, "agent"),  # an unattended agent, $100 a day
    ("attended", True, 100_000_000, "agent"),  # a person at the terminal
    ("tight", True, 1_000_000, "agent"),  # $1 a day: an agent's worst case is held for a person
]


def _new_key(key_id: str, profile: str) -> tuple[str, str]:
    """`tokensaver key new`: the key and its config lines."""
    out = subprocess.run(
        [BIN, "key", "new", "--id", key_id, "--profile", profile],
        check=True, capture_output=True, text=True,
    ).stdout
    key = re.search(r"(tsk_\S+)", out).group(1)
    lines = out.split("config lines:\n", 1)[1]
    return key, lines


class Gate:
    """A running gate in front of the built-in provider, and the clients pointed at it."""

    def __init__(self, tmp: Path, keys: list = KEYS):
        self.tmp = tmp
        self.mock_port, self.proxy_port, self.api_port, self.admin_port = _free_ports(4)
        self.keys: dict[str, str] = {}
        blocks = []
        for key_id, human, budget, profile in keys:
            key, lines = _new_key(key_id, profile)
            self.keys[key_id] = key
            blocks.append(
                re.sub(r"   # needs \[profiles\.\w+\] in the config", "", lines)
                + f"human = {'true' if human else 'false'}\n"
                + f'budget = {{ ceiling_micro_usd = {budget}, period = "day" }}\n'
            )
        example = (ROOT / "config" / "tokensaver.toml").read_text()
        profile = example[example.index("[profiles.agent.saturation]"):]
        profile = profile[: profile.index("\n\n")]
        self.config = tmp / "tokensaver.toml"
        mock = f"http://127.0.0.1:{self.mock_port}"
        self.config.write_text(
            f"""[listen]
proxy = "127.0.0.1:{self.proxy_port}"
api = "127.0.0.1:{self.api_port}"
admin = "127.0.0.1:{self.admin_port}"

[data]
dir = "{tmp / 'data'}"

[upstreams.openai]
base_url = "{mock}"
credential_env = "AGENT_TESTS_PROVIDER_KEY"

[upstreams.anthropic]
base_url = "{mock}"
credential_env = "AGENT_TESTS_PROVIDER_KEY"

[admin]
key_hash = "{ADMIN_HASH}"

{STEPS}

{profile}

[prices."{CODEX_TOOLS_MODEL}"]   # test figures (see CODEX_TOOLS_MODEL)
input = 1_250_000
cache_write = 1_250_000
cache_read = 125_000
output = 10_000_000
max_output = 128_000

{''.join(b + chr(10) for b in blocks)}"""
        )
        env = dict(os.environ, AGENT_TESTS_PROVIDER_KEY=PROVIDER_CREDENTIAL)
        self.mock_log = tmp / "mock.log"
        self.mock = subprocess.Popen(
            [BIN, "mock-provider", "--listen", f"127.0.0.1:{self.mock_port}",
             "--expected-credential", PROVIDER_CREDENTIAL],
            stdout=self.mock_log.open("w"), stderr=subprocess.STDOUT,
        )
        _wait_port(self.mock_port, self.mock, self.mock_log)
        self.serve_log = tmp / "serve.log"
        self.serve = subprocess.Popen(
            [BIN, "serve", "--config", self.config], env=env,
            stdout=self.serve_log.open("w"), stderr=subprocess.STDOUT,
        )
        for port in (self.proxy_port, self.api_port, self.admin_port):
            _wait_port(port, self.serve, self.serve_log)
        self.http = httpx.Client(timeout=10)
        self.work = tmp / "work"
        self.work.mkdir()

    def stop(self) -> None:
        for proc in (self.serve, self.mock):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    # --- what the gate and the provider saw ---------------------------------------------

    def provider_calls(self) -> list[dict]:
        """Every model call the provider answered (with the usage it reported)."""
        r = self.http.get(
            f"http://127.0.0.1:{self.mock_port}/__mock/requests",
            params={"limit": 1000, "max_body": 0},
        )
        r.raise_for_status()
        return [c for c in r.json() if c["reported_usage"] is not None]

    def verdicts(self) -> dict[tuple[str, str], int]:
        """(verdict, reason) → count, from the gate's /metrics."""
        text = self.http.get(f"http://127.0.0.1:{self.admin_port}/metrics").text
        counts = {}
        for m in re.finditer(
            r'^tokensaver_requests_total\{([^}]*)\} (\d+)$', text, re.MULTILINE
        ):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            counts[(labels["verdict"], labels["reason"])] = int(m.group(2))
        return counts

    def ledger(self, key_id: str) -> dict:
        r = self.http.get(
            f"http://127.0.0.1:{self.api_port}/ledger",
            headers={"authorization": f"Bearer {self.keys[key_id]}"},
        )
        r.raise_for_status()
        return r.json()

    def assert_ledger_matches_provider(self, key_id: str, since: int = 0) -> dict:
        """The key's recorded usage equals, part by part, what the provider reported (for
        the provider's calls from the `since`-th on: the earlier ones did not pass the gate)."""
        expected = {"input": 0, "cache_write": 0, "cache_read": 0, "output": 0}
        for call in self.provider_calls()[since:]:
            u = call["reported_usage"]
            if call["path"] == "/v1/messages":
                expected["input"] += u["input_tokens"]
                expected["cache_write"] += u["cache_creation_input_tokens"]
                expected["cache_read"] += u["cache_read_input_tokens"]
            else:  # OpenAI: the prompt includes its cached part and (GPT-5.6 on) its writes
                written = u["cache_write_tokens"]
                expected["input"] += u["prompt_tokens"] - u["cached_tokens"] - written
                expected["cache_read"] += u["cached_tokens"]
                expected["cache_write"] += written
            expected["output"] += u["completion_tokens"]
        deadline = time.monotonic() + 10
        while True:
            usage = self.ledger(key_id)["total"]["usage"]
            got = {part: usage.get(part, 0) for part in expected}
            if got == expected or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert got == expected, f"ledger {got} != provider {expected}"
        assert sum(expected.values()) > 0
        return got

    def holds(self, key_id: str) -> str:
        return self.cli("holds", "list", "--key", key_id).stdout

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [BIN, *args, "--config", self.config], check=True, capture_output=True, text=True,
            env=dict(os.environ, TOKENSAVER_ADMIN_KEY=ADMIN_KEY),
        )

    # --- the clients ---------------------------------------------------------------------

    def claude(self, key_id: str, prompt: str, home: Path, max_turns: int = 12,
               headers: str | None = None, model: str = CLAUDE_MODEL) -> Run:
        return clients.claude(f"http://127.0.0.1:{self.proxy_port}", self.keys[key_id], prompt,
                              home, self.work, model, max_turns, headers)

    def codex(self, key_id: str, prompt: str, home: Path, timeout: float = CLIENT_TIMEOUT,
              model: str = CODEX_TOOLS_MODEL) -> Run:
        return clients.codex(f"http://127.0.0.1:{self.proxy_port}/v1", self.keys[key_id],
                             prompt, home, self.work, model, timeout)

    def anthropic_agent(self, key_id: str | None, prompt: str, *extra: str,
                        model: str = "claude-sonnet-4-5") -> Run:
        """The `anthropic` SDK loop through the gate; `key_id=None`: straight to the provider
        with the provider's credential."""
        if key_id is None:
            base, key = f"http://127.0.0.1:{self.mock_port}", PROVIDER_CREDENTIAL
        else:
            base, key = f"http://127.0.0.1:{self.proxy_port}", self.keys[key_id]
        return clients.anthropic_agent(base, key, prompt, self.work, model, *extra)

    def sdk(self, key_id: str, api: str, prompt: str, *extra: str) -> Run:
        return clients.sdk(api, f"http://127.0.0.1:{self.proxy_port}/v1", self.keys[key_id],
                           prompt, self.work, SDK_MODEL, *extra)


@pytest.fixture
def gate():
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: build it first (cargo build)")
    tmp = Path(tempfile.mkdtemp(prefix="tokensaver-agents-"))
    g = Gate(tmp)
    try:
        yield g
    finally:
        g.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def assert_paced(calls: list[dict], admits: int) -> None:
    """No more than `admits` of these calls (one repeated step) reached the provider within
    any pace window, as the provider saw them arrive."""
    times = [c["at_unix_ms"] for c in calls]
    for i in range(len(times) - admits):
        span = times[i + admits] - times[i]
        assert span >= PACE_WINDOW_MS - 100, f"{admits + 1} identical steps in {span} ms: {times}"


def assert_run_stopped(calls: list[dict], attended: bool = False) -> None:
    """A stuck session's calls: its first call, then one repeated step paced and stopped: more
    than the window admits at once, no more than the schedule lets a client buy."""
    most = MOST_CALLS_ATTENDED if attended else MOST_CALLS
    assert 4 <= len(calls) <= 1 + most, f"{len(calls)} calls"


def assert_polled_job_completed(gate, run, key: str) -> None:
    """A `tokensaver-mock:poll=4` session finished: 5 calls, none refused, the 4th identical
    step paced when nobody attends."""
    assert run.code == 0, run.output
    assert "tokensaver-done after 4 steps" in run.stdout
    calls = gate.provider_calls()
    assert len(calls) == 5
    assert not loop_rules(gate.verdicts()) and not score_verdicts(gate.verdicts())
    if key == "agent":
        assert_paced(calls[1:], 3)


def loop_rules(verdicts: dict) -> dict:
    return {reason: n for (verdict, reason), n in verdicts.items() if reason.startswith("runaway")}


def score_verdicts(verdicts: dict) -> dict:
    return {reason: n for (verdict, reason), n in verdicts.items() if reason.startswith("score")}


HOLD_ID = re.compile(r"hold_[0-9a-f]{8,}")
