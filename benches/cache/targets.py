"""Cache targets with real clients (issue "cache lifetimes"): what a session costs straight to the
provider against through the gate, when it pauses and when it does not.

    .venv/bin/python benches/cache/targets.py [--only claude-code,codex,agents-sdk] [--out F]

Real parts: the pinned Claude Code, Codex CLI and OpenAI Agents SDK (`tests/agents/install.sh`,
`tests/agents/requirements.txt`), `tokensaver serve` and two built-in providers (one per arm,
so neither reads the other's cache) on 127.0.0.1, in compressed time: each provider's cache
clock runs `--time-scale` times faster (its five minutes last 300/scale s) and the gate judges
pauses by the same lifetime (`[gate.windows] cache_secs`). Each arm's cost is the usage the
provider reported for each call, priced here from `config/prices-builtin.toml` (independently
of the gate's ledger). Both arms of a pair run at once, each against its own provider.

Sessions are task scripts of the built-in provider (`tokensaver-mock:task=`): the model asks
for one shell command per turn; a pause is a command that sleeps (the session waits on a slow
build or a person), so the next call comes after the provider's cache lifetime.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "agents"))
import clients  # noqa: E402

CREDENTIAL = "sk-cache-targets-provider"
CLAUDE_MODEL = "claude-sonnet-5-5"  # what Claude Code sends by default (tests/agents)
CODEX_MODEL = "gpt-5.5"  # the newest Codex model with plain function tools (tests/agents)
SDK_MODEL = "gpt-5-mini"
# gpt-5.5 is not in the built-in table; the agent tests' figures (not a claim).
EXTRA_PRICES = {"gpt-5.5": {"input": 1_250_000, "cache_write": 1_250_000,
                            "cache_read": 125_000, "output": 10_000_000}}
FILES = 16
FILE_CHARS = 24_000  # below Claude Code's and Codex's output truncation


def prices() -> dict:
    table = tomllib.loads((ROOT / "config" / "prices-builtin.toml").read_text())["prices"]
    table.update(EXTRA_PRICES)
    return table


PRICES = prices()


def cost_nano(model: str, path: str, u: dict) -> int:
    """One call's cost at list prices (micro-USD per million tokens = nano-USD per token / 1000)
    from the usage the provider reported."""
    p = PRICES[model]
    n = lambda k: int(u.get(k) or 0)  # noqa: E731
    if path == "/v1/messages":
        c = u.get("cache_creation") or {}
        w5, w1 = int(c.get("ephemeral_5m_input_tokens") or 0), int(c.get("ephemeral_1h_input_tokens") or 0)
        micro = (n("input_tokens") * p["input"] + w5 * p["cache_write"]
                 + w1 * p.get("cache_write_1h", 2 * p["input"])
                 + n("cache_read_input_tokens") * p["cache_read"] + n("output_tokens") * p["output"])
    else:
        prompt = n("prompt_tokens") or n("input_tokens")
        read, write = n("cached_tokens"), n("cache_write_tokens")
        out = n("completion_tokens") or n("output_tokens")
        micro = ((prompt - read - write) * p["input"] + read * p["cache_read"]
                 + write * p["cache_write"] + out * p["output"])
    return micro // 1000


def prompt_parts(path: str, u: dict) -> tuple[int, int]:
    """(prompt tokens billed, of which read from the cache)."""
    n = lambda k: int(u.get(k) or 0)  # noqa: E731
    if path == "/v1/messages":
        read = n("cache_read_input_tokens")
        return n("input_tokens") + n("cache_creation_input_tokens") + read, read
    return n("prompt_tokens") or n("input_tokens"), n("cached_tokens")


def get_json(url: str, headers: dict | None = None):
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


class Provider:
    def __init__(self, scratch: Path, name: str, scale: int, tasks: Path):
        self.port = clients.free_ports(1)[0]
        log = scratch / f"mock-{name}.log"
        self.proc = subprocess.Popen(
            [clients.BIN, "mock-provider", "--listen", f"127.0.0.1:{self.port}",
             "--expected-credential", CREDENTIAL, "--usage", "cl100k", "--tasks", str(tasks),
             "--time-scale", str(scale)],
            stdout=log.open("w"), stderr=subprocess.STDOUT)
        clients.wait_port(self.port, self.proc, log)
        self.url = f"http://127.0.0.1:{self.port}"

    def calls(self) -> list[dict]:
        """Every model call answered, with the model its body names (read from the body's
        first bytes; the record keeps no model of its own)."""
        recs = get_json(f"{self.url}/__mock/requests?limit=1000&max_body=4194304")
        calls = []
        for r in recs:
            if r.get("reported_usage") is None or r["path"] not in (
                    "/v1/messages", "/v1/chat/completions", "/v1/responses"):
                continue
            m = re.search(r'"model"\s*:\s*"([^"]+)"', r.get("body") or "")
            r["model"] = m.group(1) if m else None
            k = re.search(r'"prompt_cache_key"\s*:\s*"([^"]+)"', r.get("body") or "")
            r["routing_key"] = k.group(1) if k else None
            r["retention_24h"] = '"prompt_cache_retention":"24h"' in (r.get("body") or "")
            r["ttl_1h"] = '"ttl":"1h"' in (r.get("body") or "")
            r.pop("body", None)
            calls.append(r)
        return calls

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.url}/__mock/reset", data=b"{}", method="POST")
        urllib.request.urlopen(req, timeout=10).read()
        req = urllib.request.Request(f"{self.url}/__mock/cache/reset", data=b"{}", method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class Gate:
    def __init__(self, scratch: Path, upstream: str, scale: int):
        # The provider's five minutes and its routing minute, compressed alike.
        cache_secs, route_secs = max(1, round(300 / scale)), max(1, round(60 / scale))
        scratch.mkdir(parents=True, exist_ok=True)
        self.proxy, self.api, self.admin = clients.free_ports(3)
        out = subprocess.run([clients.BIN, "key", "new", "--id", "person", "--profile", "agent"],
                             check=True, capture_output=True, text=True).stdout
        self.key = next(w for w in out.split() if w.startswith("tsk_"))
        lines = out.split("config lines:\n", 1)[1].split("   #", 1)[0]
        example = (ROOT / "config" / "tokensaver.toml").read_text()
        profile = example[example.index("[profiles.agent.saturation]"):]
        profile = profile[: profile.index("\n\n")]
        extra = "".join(
            f'\n[prices."{m}"]\n' + "".join(f"{k} = {v}\n" for k, v in p.items())
            + "max_output = 128000\n" for m, p in EXTRA_PRICES.items())
        config = scratch / "tokensaver.toml"
        config.write_text(f"""[listen]
proxy = "127.0.0.1:{self.proxy}"
api = "127.0.0.1:{self.api}"
admin = "127.0.0.1:{self.admin}"

[data]
dir = "{scratch / 'data'}"

[upstreams.openai]
base_url = "{upstream}"
credential_env = "CACHE_TARGETS_PROVIDER_KEY"

[upstreams.anthropic]
base_url = "{upstream}"
credential_env = "CACHE_TARGETS_PROVIDER_KEY"

[gate.windows]
cache_secs = {cache_secs}
route_secs = {route_secs}

{lines.rstrip()}
human = true
budget = {{ ceiling_micro_usd = 1_000_000_000, period = "day" }}

{profile}
{extra}""")
        log = scratch / "serve.log"
        self.proc = subprocess.Popen(
            [clients.BIN, "serve", "--config", config],
            env=dict(os.environ, CACHE_TARGETS_PROVIDER_KEY=CREDENTIAL, RUST_LOG="warn"),
            stdout=log.open("w"), stderr=subprocess.STDOUT)
        for port in (self.proxy, self.api):
            clients.wait_port(port, self.proc, log)
        self.url = f"http://127.0.0.1:{self.proxy}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# --- the sessions --------------------------------------------------------------------------


def workspace(into: Path, project: str = "billing") -> None:
    """A small codebase: FILES modules of FILE_CHARS characters each, deterministic."""
    (into / "src").mkdir(parents=True)
    for i in range(1, FILES + 1):
        lines, k = [], 0
        while sum(len(x) + 1 for x in lines) < FILE_CHARS:
            lines.append(f"def {project}{i:02d}_function{k:03d}(order, ledger):  "
                         f"# rounds {k * 7 % 13} cents, owner team-{i % 5}")
            lines.append(f"    return ledger.post(order.id, order.total * {k % 9 + 1})")
            k += 1
        (into / "src" / f"m{i:02d}.py").write_text("\n".join(lines) + "\n")
    # A slow test suite: what a session waits on (a plain `sleep` is refused by Claude Code).
    (into / "tools").mkdir()
    (into / "tools" / "run_tests.py").write_text(
        "import sys, time\ntime.sleep(float(sys.argv[1]))\nprint('16 passed')\n")


def session_script(pauses_min: list[float], scale: int, longest_command_s: float = 60) -> dict:
    """A session of 33 calls that reads every module (its context grows past 100 k tokens);
    the commands that read the 3rd, 6th, 9th, ... module first run the slow test suite for the
    pause, scaled."""
    steps = [{"run": "ls src"}, {"run": "wc -l src/*.py"}]
    pause_at = {3 + 3 * i: m for i, m in enumerate(pauses_min)}
    for i in range(1, FILES + 1):
        sleep = pause_at.get(i)
        cmd = f"cat src/m{i:02d}.py"
        if sleep:
            secs = min(sleep * 60 / scale, longest_command_s)
            cmd = f"python3 tools/run_tests.py {secs:.2f} && {cmd}"
        steps.append({"run": cmd})
        steps.append({"run": f"grep -c def src/m{i:02d}.py"})
    steps.append({"run": "grep -h owner src/*.py | sort | uniq -c | head"})
    steps.append({"answer": "Read all 16 modules: each posts orders to the ledger.", "words": [20, 40]})
    return {"script": {"steps": steps}}


PROMPT = "Read every module under src/ one by one and summarise what it does."


def run_arm(client: str, base: str, key: str, scratch: Path, task: str, timeout: float):
    ws = scratch / "ws"
    workspace(ws)
    prompt = f"{PROMPT} tokensaver-mock:task={task},seed=1"
    if client == "claude-code":
        return clients.claude(base, key, prompt, scratch / "home", ws, CLAUDE_MODEL, 60,
                              timeout=timeout)
    return clients.codex(base + "/v1", key, prompt, scratch / "codex-home", ws, CODEX_MODEL,
                         timeout=timeout)


def summary(calls: list[dict], lifetime_ms: int) -> dict:
    total = sum(cost_nano(c_model(c), c["path"], c["reported_usage"]) for c in calls)
    prompt = read = 0
    for c in calls:
        p, r = prompt_parts(c["path"], c["reported_usage"])
        prompt, read = prompt + p, read + r
    return {"calls": len(calls), "cost_nano": total, "prompt_tokens": prompt,
            "cache_read_share": read / prompt if prompt else None,
            "largest_prompt": max((prompt_parts(c["path"], c["reported_usage"])[0] for c in calls),
                                  default=0),
            "models": sorted({c["model"] for c in calls}),
            # What the provider saw of the cache placement: routing keys, 24 h retention and
            # one-hour entries (the gate's, or the client's own).
            "routing_keys": len({c["routing_key"] for c in calls if c["routing_key"]}),
            "calls_with_24h_retention": sum(c["retention_24h"] for c in calls),
            "calls_with_1h_entries": sum(c["ttl_1h"] for c in calls),
            # Silences the provider's cache outlived not: what made a call come after a pause.
            "gaps_past_lifetime": gaps_past(calls, lifetime_ms)}


def gaps_past(calls: list[dict], lifetime_ms: int) -> list[float]:
    at = sorted(c["at_unix_ms"] for c in calls)
    return [round((b - a) / 1000, 2) for a, b in zip(at, at[1:]) if b - a >= lifetime_ms]


def c_model(c: dict) -> str:
    if c["model"] not in PRICES:
        raise SystemExit(f"a call of {c['model']!r}, which the price table here lacks")
    return c["model"]


@contextlib.contextmanager
def arms(root: Path, tag: str, scale: int):
    """A provider for each arm and the gate in front of the second: (direct, gated, gate)."""
    tasks = root / "tasks"
    direct = Provider(root, f"{tag}-direct", scale, tasks)
    gated = Provider(root, f"{tag}-gated", scale, tasks)
    gate = Gate(root / f"{tag}-gate", gated.url, scale)
    try:
        yield direct, gated, gate
    finally:
        gate.stop()
        direct.stop()
        gated.stop()


def at_once(jobs: list) -> None:
    """Run the callables at once, each in a thread, and wait for all."""
    threads = [threading.Thread(target=j) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def compare(direct: Provider, gated: Provider, scale: int) -> dict:
    """Both arms' calls as the providers billed them, and what the gate saved."""
    time.sleep(0.5)  # let a streamed answer's record land
    lifetime = 300_000 // scale
    res = {"direct": summary(direct.calls(), lifetime), "gate": summary(gated.calls(), lifetime)}
    d, g = res["direct"]["cost_nano"], res["gate"]["cost_nano"]
    res["saved"] = 1 - g / d if d else None
    return res


def pair(client: str, task: str, scale: int, root: Path, timeout: float) -> dict:
    """Both arms at once, each against its own provider."""
    tag = f"{client}-{task}"
    runs: dict = {}
    with arms(root, tag, scale) as (direct, gated, gate):
        def arm(name, base, key):
            d = root / f"{tag}-{name}"
            d.mkdir(parents=True, exist_ok=True)
            runs[name] = run_arm(client, base, key, d, task, timeout)

        at_once([lambda: arm("direct", direct.url, CREDENTIAL),
                 lambda: arm("gate", gate.url, gate.key)])
        res = compare(direct, gated, scale)
    for name, r in runs.items():
        res[name]["exit_code"] = r.code
        res[name]["seconds"] = round(r.seconds, 1)
        if r.code != 0:
            res[name]["output_tail"] = r.output[-400:]
    return res


def sdk_sessions(scale: int, root: Path, concurrent: int, timeout: float) -> dict:
    """`concurrent` Agents SDK sessions at once, sharing one system prompt (about 2.5 k tokens),
    each a different job of 12 steps that reads a module each; through the gate against
    straight (one session alone, the same way)."""
    system = root / "instructions.txt"
    system.write_text("".join(
        f"Rule {i}: before each command, state the file you expect it to touch; prefer "
        f"read-only commands; never print secrets; keep answers under five lines. " for i in range(110)))
    # Each session its own project: eight agents on one key, none repeating another's step
    # (the same command with the same output would be a repeated step of the key).
    for i in range(concurrent):
        workspace(root / f"sdk-ws-{i}", f"project{i}")
    res: dict = {}
    for arm_name, n in (("concurrent", concurrent), ("lone", 1)):
        with arms(root, f"sdk-{arm_name}", scale) as (direct, gated, gate):
            runs: list = []

            def one(base, key, i):
                prompt = f"Job {i}: check the repository. tokensaver-mock:task=sdk-{i},seed=1"
                runs.append(clients.sdk("chat", base + "/v1", key, prompt, root / f"sdk-ws-{i}",
                                        SDK_MODEL,
                                        "--max-turns", "20", "--instructions-file", str(system),
                                        timeout=timeout))

            for base, key in ((direct.url, CREDENTIAL), (gate.url, gate.key)):
                at_once([lambda i=i, b=base, k=key: one(b, k, i) for i in range(n)])
            entry = compare(direct, gated, scale)
        entry["failed_runs"] = [r.output[-300:] for r in runs if r.code != 0]
        ds, gs = entry["direct"]["cache_read_share"], entry["gate"]["cache_read_share"]
        entry["cached_share_ratio"] = gs / ds if ds else (math.inf if gs else None)
        res[arm_name] = entry
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="claude-code,codex,agents-sdk")
    # 60: the provider's five minutes last 5 s, longer than any silence of the clients' own
    # (Claude Code's first tool call takes about 4 s: at 150x that alone was a pause).
    ap.add_argument("--scale", type=int, default=60)
    # 10 for the Agents SDK: the provider's routing minute lasts 6 s, and 8 sessions at the
    # SDK's own pace (about one call a second each) are well past its 15 a minute per route.
    ap.add_argument("--sdk-scale", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--timeout", type=float, default=420)
    args = ap.parse_args()
    only = args.only.split(",")
    root = Path(tempfile.mkdtemp(prefix="tokensaver-cache-targets-"))
    tasks = root / "tasks"
    # Pauses of 7 to 40 minutes before five turns (Claude Code). Codex CLI returns a command
    # still running after 10 s to the model (exec_command's yield time), so its pauses are
    # commands of 9.9 s: at 60x, silences of 10 minutes and a little more, the shortest.
    scripts = {
        "paused-claude": session_script([7, 12, 20, 30, 40], args.scale),
        "paused-codex": session_script([10, 15, 20, 30, 40], args.scale, 9.9),
        "steady": session_script([], args.scale),
    }
    # The Agents SDK sessions: each its own job, reading 12 modules (its history grows past the
    # shared system prompt, as an agent's does).
    for i in range(8):
        scripts[f"sdk-{i}"] = {"script": {"steps": [
            {"run": f"cat src/m{(i + k) % FILES + 1:02d}.py"} for k in range(12)] + [
            {"answer": f"Job {i} checked.", "words": [5, 10]}]}}
    for name, script in scripts.items():
        (tasks / name).mkdir(parents=True)
        (tasks / name / "task.json").write_text(json.dumps(script))
    results: dict = {"scale": args.scale, "clients": clients.versions()}
    try:
        if "claude-code" in only:
            results["claude-code"] = {
                "paused": pair("claude-code", "paused-claude", args.scale, root, args.timeout),
                "steady": pair("claude-code", "steady", args.scale, root, args.timeout)}
        if "codex" in only:
            results["codex"] = {
                "paused": pair("codex", "paused-codex", args.scale, root, args.timeout),
                "steady": pair("codex", "steady", args.scale, root, args.timeout)}
        if "agents-sdk" in only:
            results["agents-sdk"] = sdk_sessions(args.sdk_scale, root, 8, args.timeout)
    finally:
        print(json.dumps(results, indent=1, default=str))
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1, default=str))
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
