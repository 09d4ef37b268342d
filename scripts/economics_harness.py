"""The closed-loop economics harness: real agent clients on fixture tasks, in two arms.

    .venv/bin/python scripts/economics_harness.py PLAN.json

Driven by `tokensaver economics run` (which writes the plan: tasks, clients, seeds, keys, the
treatment gate's config, the provider) and reads back the runs it writes to the plan's `out`.
Run it through that command, not by hand: the command owns the evidence format, the
identities (build, gate config, methodology, tasks) and the history.

For every planned pair (task × client × repetition) it runs both arms, in an order drawn
from the pair's seed (a provider that caches prompts would otherwise favour the second arm):

    control    client → tap → provider
    treatment  client → tap → tokensaver serve → tap → provider

Each session of an arm runs the client in a fresh copy of the task's workspace (seeded by
the task's `setup`; a task of several sessions is the same job run again on a fresh checkout,
same prompt), then the task's own `check` in that workspace: the run succeeds when every
session's check passes — the check's exit status, never an HTTP status. A client the gate
refuses (409, 429, 402, 403) reacts as it does for a user — Claude Code and the Agents SDK
stop, Codex re-sends then stops — and the task's check says whether the work got done.

Against the built-in provider (`simulated`), the harness starts `tokensaver mock-provider
--usage cl100k --tasks <tasks>` and appends the task marker `tokensaver-mock:task=<id>,seed=<n>`
to the prompt; against a real provider (`real`) the prompt goes as written and the model does
the work.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "agents"))
import clients  # noqa: E402
from economics_tap import Tap  # noqa: E402

HARNESS_VERSION = "4"


def log(msg: str) -> None:
    print(f"[economics] {msg}", file=sys.stderr, flush=True)


def start(cmd: list, log_path: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([str(c) for c in cmd], stdout=log_path.open("w"),
                            stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def substitute(args: list, task_dir: str, seed: int) -> list:
    return [a.replace("{task}", task_dir).replace("{seed}", str(seed)) for a in args]


def short(text: str, n: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= n else "…" + text[-n:]


class Harness:
    def __init__(self, plan: dict):
        self.plan = plan
        self.scratch = Path(plan["scratch"])
        self.procs: list[subprocess.Popen] = []
        provider = plan["provider"]
        self.simulated = provider["kind"] == "simulated"
        bin_ = plan["bin"]
        if self.simulated:
            # One provider per arm, alike but for their prompt caches: what one arm wrote
            # must not be read by the other (the arms run one after the other, well within
            # the cache's 5-minute lifetime), as two provider accounts would not share them.
            mock = provider["mock"]
            upstreams = []
            for arm, port in (("control", mock["port"]), ("treatment", mock["treatment_port"])):
                log_path = self.scratch / f"mock-{arm}.log"
                p = start([bin_, "mock-provider", "--listen", f"127.0.0.1:{port}",
                           "--expected-credential", mock["credential"], "--usage",
                           mock["usage"], "--tasks", mock["tasks"]], log_path)
                self.procs.append(p)
                clients.wait_port(port, p, log_path)
                upstreams.append(f"http://127.0.0.1:{port}")
            self.credential = mock["credential"]
        else:
            self.credential = os.environ.get(provider["credential_env"], "")
            if not self.credential:
                raise SystemExit(f"${provider['credential_env']} is empty: the provider "
                                 "credential is read from it")
            # A real provider's cache is the account's: both arms share it (README).
            upstreams = [provider["upstream"]] * 2
        self.provider_tap = Tap(upstreams[0])
        self.gate_provider_tap = Tap(upstreams[1])
        gate = plan["gate"]
        # The gate's upstream is its provider's tap: rewrite the config's placeholder.
        config = Path(gate["config"])
        config.write_text(config.read_text().replace(gate["upstream_placeholder"],
                                                    self.gate_provider_tap.url))
        env = dict(os.environ, **{gate["credential_env"]: self.credential})
        p = start([bin_, "serve", "--config", config], self.scratch / "serve.log", env)
        self.procs.append(p)
        for port in gate["ports"].values():
            clients.wait_port(port, p, self.scratch / "serve.log")
        self.gate_url = f"http://127.0.0.1:{gate['ports']['proxy']}"
        self.client_tap = Tap(self.gate_url)

    def close(self) -> None:
        for tap in (getattr(self, "client_tap", None), getattr(self, "provider_tap", None),
                    getattr(self, "gate_provider_tap", None)):
            if tap is not None:
                tap.stop()
        for p in reversed(self.procs):
            stop(p)

    # --- one arm -----------------------------------------------------------------------

    def client_session(self, spec: dict, base: str, key: str, ws: Path, home: Path):
        client, model = spec["client"], spec["model"]
        prompt, timeout = spec["prompt"], spec["timeout_s"]
        if client == "claude-code":
            return clients.claude(base, key, prompt, home, ws, model, spec["max_turns"],
                                  timeout=timeout)
        if client == "codex":
            return clients.codex(base + "/v1", key, prompt, home, ws, model, timeout)
        if client == "anthropic-sdk":
            return clients.anthropic_agent(base, key, prompt, ws, model, "--max-steps",
                                           str(spec["max_turns"]), timeout=timeout)
        api = "chat" if client == "agents-sdk-chat" else "responses"
        extra = ["--max-turns", str(spec["max_turns"])]
        if spec.get("temperature") is not None:
            extra += ["--temperature", str(spec["temperature"])]
        return clients.sdk(api, base + "/v1", key, prompt, ws, model, *extra, timeout=timeout)

    def arm(self, spec: dict, arm: str, order: int) -> dict:
        # Both arms of a pair run in the same workspace path (one after the other, each in a
        # fresh copy): paths show up in what the tools print (tracebacks, `pwd`), and a path
        # that differed between arms would be a difference the gate did not make.
        name = hashlib.blake2b(spec["id"].encode(), digest_size=6).hexdigest()
        ws = self.scratch / "ws" / name
        home = self.scratch / "home" / name
        bodies = self.scratch / "bodies" / f"{name}-{arm}"
        if arm == "control":
            base, key = self.provider_tap.url, self.credential
            front = self.provider_tap
        else:
            base, key = self.client_tap.url, spec["key"]
            front = self.client_tap
        front.bodies = bodies if arm == "treatment" else None
        self.provider_tap.take()
        self.gate_provider_tap.take()
        self.client_tap.take()
        sessions, calls, provider_calls, checks = [], [], [], []
        started = time.time()
        for s in range(spec["sessions"]):
            shutil.rmtree(ws, ignore_errors=True)
            shutil.copytree(Path(spec["task_dir"]) / "workspace", ws)
            if spec.get("setup"):
                subprocess.run(substitute(spec["setup"], spec["task_dir"], spec["seed"]),
                               cwd=ws, check=True, capture_output=True)
            r = self.client_session(spec, base, key, ws, home)
            time.sleep(0.2)  # let a streamed answer's record land
            got = front.take()
            for c in got:
                c["session"] = s
            calls += got
            if arm == "treatment":
                bought = self.gate_provider_tap.take()
                for c in bought:
                    c["session"] = s
                provider_calls += bought
            sessions.append({"index": s, "exit_code": r.code, "seconds": round(r.seconds, 2),
                             "output_tail": short(r.output)})
            checks.append(subprocess.run(
                substitute(spec["check"], spec["task_dir"], spec["seed"]), cwd=ws,
                capture_output=True, text=True, timeout=120))
        if arm == "control":
            provider_calls = calls
        front.bodies = None
        shutil.rmtree(ws, ignore_errors=True)
        failed = [(i, c) for i, c in enumerate(checks) if c.returncode != 0]
        i, check = failed[0] if failed else (len(checks) - 1, checks[-1])
        prefix = f"session {i + 1}: " if len(checks) > 1 else ""
        shutil.rmtree(home, ignore_errors=True)
        return {
            "id": f"{spec['id']}--{'direct' if arm == 'control' else 'gate'}",
            "pair": spec["id"],
            "task": spec["task"],
            "client": spec["client"],
            "model": spec["model"],
            "arm": arm,
            "repetition": spec["repetition"],
            "seed": spec["seed"],
            "order": order,
            "started_at_unix_ms": int(started * 1000),
            "seconds": round(time.time() - started, 2),
            "sessions": sessions,
            "check": {"passed": not failed, "exit_code": check.returncode,
                      "output": prefix + short(check.stdout + check.stderr, 300)},
            "calls": calls,
            "provider_calls": provider_calls,
        }

    def pair(self, spec: dict) -> list[dict]:
        # The arm order, drawn from the pair's id: reproducible, and balanced over pairs.
        first_treatment = hashlib.blake2b(spec["id"].encode(), digest_size=1).digest()[0] & 1
        arms = ["treatment", "control"] if first_treatment else ["control", "treatment"]
        return [self.arm(spec, a, i + 1) for i, a in enumerate(arms)]


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    h = Harness(plan)
    runs = []
    try:
        for i, spec in enumerate(plan["runs"], 1):
            t = time.monotonic()
            pair = h.pair(spec)
            runs += pair
            c, tr = sorted(pair, key=lambda r: r["arm"])
            log(f"{i}/{len(plan['runs'])} {spec['id']}: control "
                f"{'ok' if c['check']['passed'] else 'FAILED'} ({len(c['provider_calls'])} calls), "
                f"treatment {'ok' if tr['check']['passed'] else 'FAILED'} "
                f"({len(tr['calls'])} sent, {len(tr['provider_calls'])} bought) "
                f"in {time.monotonic() - t:.0f}s")
    finally:
        h.close()
    out = {
        "harness": {"path": "scripts/economics_harness.py", "version": HARNESS_VERSION},
        "clients": clients.versions(),
        "runs": runs,
    }
    Path(plan["out"]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
