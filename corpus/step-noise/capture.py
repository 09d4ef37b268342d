"""Capture real tool results from the real agent clients for `corpus/step-noise/`.

    bash tests/agents/install.sh                      # Claude Code, Codex CLI (pinned)
    python3 -m venv /work/venv-step && /work/venv-step/bin/pip install -r tests/agents/requirements.txt pytest
    cargo build -p tokensaver-mock-provider
    PATH=/work/venv-step/bin:$PATH /work/venv-step/bin/python corpus/step-noise/capture.py \
        --mock target/debug/tokensaver-mock-provider [--only claude-code,codex,...]

Each client is pointed straight at the built-in provider (no gate in between), which plays a
scripted model (`tokensaver-mock:task=step-noise,seed=1`, the task script below): it asks for
each command of `CASES` three times in a row, in one session, then answers. Each client runs
two such sessions, each in a fresh work directory under /tmp with the same fixture files.
The tool results are then read back from what the client sent (the provider's
`GET /__mock/requests`): the newest request of a session carries every result of it, in
order, exactly as the client wrote it (its tool-result value: a string, or a list of parts).
Only those values are kept, with the call they answer (the provider's own arguments), the
client's name and version. Nothing is typed by hand: `captures.json` is this script's output.

Cases marked `same` repeat a step whose output differs only by its noise (a clock, a
duration, a temporary path, an id, a pid, an ANSI escape, the client's envelope); the others
make progress (a count, a failing test, a listing, an exit code), so their consecutive results
differ in substance. Every client run is bounded by `timeout`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "agents"))
import clients  # noqa: E402

REPEATS = 3
SESSIONS = 2
CLIENT_TIMEOUT = 600

# (case, same, command). `same`: the repeats differ only by noise.
CASES = [
    ("date-ls", True, "sleep 1; date; ls"),
    ("clocks", True,
     "sleep 1; date -R; date -u +%Y-%m-%dT%H:%M:%S.%NZ; date --rfc-3339=ns; "
     "python3 -c \"import email.utils,time,datetime;print('Date:', email.utils.formatdate(usegmt=True));"
     "print(time.ctime());print(datetime.datetime.now().isoformat())\""),
    ("epoch", True, "python3 -c 'import time;print(time.time());print(time.time_ns())'; date +%s%3N"),
    ("pytest-timings", True, "./run-tests -q -p no:cacheprovider --durations=3 test_sample.py"),
    ("tmp-listing", True, "d=$(mktemp -d); touch \"$d/report.txt\"; ls -l \"$d\"; echo \"wrote $d/report.txt\""),
    ("ids-pids", True,
     "python3 -c 'import os,uuid,secrets,base64;print(\"job\", uuid.uuid4(), \"pid\", os.getpid());"
     "print(\"trace\", secrets.token_hex(16));print(\"token\", base64.urlsafe_b64encode(os.urandom(24)).decode())'; "
     "sh -c 'echo \"worker[$$]: ready\"'"),
    ("time-builtin", True, "bash -c 'time sleep 0.0$RANDOM' 2>&1"),
    ("ansi", True, "printf '\\033[1;32mPASS\\033[0m build at %s in %sms\\n' \"$(date +%T.%N)\" $RANDOM; ls --color=always"),
    ("progress-count", False,
     "n=$(( $(cat .n 2>/dev/null || echo 2) + 1 )); echo $n > .n; echo \"$(date -Iseconds) $n of 10 done\""),
    ("failing-test", False,
     "echo $(( $(cat .f 2>/dev/null || echo 0) + 1 )) > .f; "
     "./run-tests -q -p no:cacheprovider test_flaky.py | tail -n 4"),
    ("growing-listing", False, "touch \"item$(ls | wc -l).txt\"; ls -la"),
    ("exit-code", False,
     "n=$(( $(cat .e 2>/dev/null || echo 0) + 1 )); echo $n > .e; "
     "echo \"$(date +%T) attempt $n\"; exit $(( n % 2 ))"),
]

FIXTURES = {
    "README.md": "A work directory for the step-noise capture.\n",
    "main.py": "print('hello')\n",
    "test_sample.py": (
        "import random, time\n\n\n"
        "def test_fast():\n    time.sleep(random.uniform(0.006, 0.009))\n\n\n"
        "def test_slow():\n    time.sleep(random.uniform(0.02, 0.05))\n\n\n"
        "def test_plain():\n    assert 1 + 1 == 2\n"
    ),
    "test_flaky.py": (
        "import pathlib, time, random\n\n"
        "N = int(pathlib.Path('.f').read_text())\n\n\n"
        "def test_alpha():\n    time.sleep(random.uniform(0, 0.01))\n    assert N % 3 != 1, f'alpha broke on run {N}'\n\n\n"
        "def test_beta():\n    assert N % 3 != 2, f'beta broke on run {N}'\n\n\n"
        "def test_gamma():\n    assert N % 3 != 0, f'gamma broke on run {N}'\n"
    ),
}

TASK = "step-noise"
PROMPT = (
    "Run each command you are given and report what you see. "
    f"tokensaver-mock:task={TASK},seed=1"
)

# How each client carries a tool result.
CLIENTS = {
    "claude-code": {"route": "anthropic_messages", "carrier": "tool_result.content"},
    "codex": {"route": "openai_responses", "carrier": "function_call_output.output"},
    "agents-sdk-responses": {"route": "openai_responses", "carrier": "function_call_output.output"},
    "agents-sdk-chat": {"route": "openai_chat", "carrier": "tool.content"},
}


def task_script() -> dict:
    steps = [{"run": cmd, "times": [REPEATS, REPEATS], "say": f"Running {case}."}
             for case, _, cmd in CASES]
    steps.append({"answer": "All commands ran."})
    return {"script": {"steps": steps}}


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def start_mock(binary: Path, tasks: Path, log: Path):
    port = clients.free_port()
    proc = subprocess.Popen(
        [str(binary), "--listen", f"127.0.0.1:{port}", "--tasks", str(tasks)],
        stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    clients.wait_port(port, proc, log)
    return port, proc


def results_of(client: str, body: dict) -> list:
    """(call, result) pairs of a request body, in order, as the client sent them."""
    out = []
    if client == "claude-code":
        calls = {}
        for m in body.get("messages", []):
            content = m.get("content")
            if not isinstance(content, list):
                continue
            for block in content:
                if block.get("type") == "tool_use":
                    calls[block["id"]] = {"name": block["name"], "arguments": block["input"]}
                elif block.get("type") == "tool_result":
                    out.append((calls.get(block["tool_use_id"]), block.get("content"),
                                block.get("is_error")))
    elif client == "agents-sdk-chat":
        calls = {}
        for m in body.get("messages", []):
            for c in m.get("tool_calls") or []:
                calls[c["id"]] = {"name": c["function"]["name"],
                                  "arguments": c["function"]["arguments"]}
            if m.get("role") == "tool":
                out.append((calls.get(m["tool_call_id"]), m.get("content"), None))
    else:
        calls = {}
        for item in body.get("input", []):
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call":
                calls[item["call_id"]] = {"name": item["name"], "arguments": item["arguments"]}
            elif item.get("type") == "function_call_output":
                out.append((calls.get(item["call_id"]), item.get("output"), None))
    return out


def run_client(client: str, port: int, home: Path, work: Path) -> clients.Run:
    base = f"http://127.0.0.1:{port}"
    key = "sk-step-noise-capture"
    turns = len(CASES) * REPEATS + 5
    if client == "claude-code":
        return clients.claude(base, key, PROMPT, home, work, "claude-sonnet-5-5",
                              max_turns=turns, timeout=CLIENT_TIMEOUT)
    if client == "codex":
        return clients.codex(base + "/v1", key, PROMPT, home, work, "gpt-5.5",
                             timeout=CLIENT_TIMEOUT)
    api = client.rsplit("-", 1)[1]
    return clients.sdk(api, base + "/v1", key, PROMPT, work, "gpt-5.6-luna",
                       "--max-turns", str(turns), timeout=CLIENT_TIMEOUT)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mock", type=Path,
                    default=ROOT / "target" / "debug" / "tokensaver-mock-provider")
    ap.add_argument("--only", default=",".join(CLIENTS))
    ap.add_argument("--out", type=Path, default=HERE / "captures.json")
    ap.add_argument("--raw", type=Path, help="also keep the raw request bodies here (not committed)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="step-noise-"))
    tasks = tmp / "tasks"
    (tasks / TASK).mkdir(parents=True)
    (tasks / TASK / "task.json").write_text(json.dumps(task_script(), indent=1))
    versions = clients.versions()
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc = {
        "about": "Real tool results captured by corpus/step-noise/capture.py; see README.md.",
        "repeats": REPEATS,
        "cases": [{"case": c, "same": s, "command": cmd} for c, s, cmd in CASES],
        "clients": existing.get("clients", {}),
    }
    port, mock = start_mock(args.mock, tasks, tmp / "mock.log")
    try:
        for client in args.only.split(","):
            sessions = []
            for session in range(SESSIONS):
                req = urllib.request.Request(f"http://127.0.0.1:{port}/__mock/reset", method="POST")
                urllib.request.urlopen(req, timeout=10).read()
                # A parent of its own, so that `..` in a listing is the same in every session.
                work = tmp / f"{client}-{session}" / "work"
                work.mkdir(parents=True)
                for name, text in FIXTURES.items():
                    (work / name).write_text(text)
                # pytest from the Python running this script, whatever PATH the client's shell
                # has (Codex and the SDK run a login shell).
                runner = work / "run-tests"
                runner.write_text(f"#!/bin/sh\nexec {sys.executable} -m pytest \"$@\"\n")
                runner.chmod(0o755)
                home = tmp / f"home-{client}-{session}"
                started = time.monotonic()
                run = run_client(client, port, home, work)
                records = get(f"http://127.0.0.1:{port}/__mock/requests?limit=1000&max_body=67108864")
                bodies = []
                for r in records:
                    try:
                        bodies.append(json.loads(r["body"]))
                    except (ValueError, TypeError):
                        pass
                if args.raw:
                    args.raw.mkdir(parents=True, exist_ok=True)
                    (args.raw / f"{client}-{session}.json").write_text(json.dumps(bodies))
                pairs = max((results_of(client, b) for b in bodies), key=len, default=[])
                print(f"{client} session {session}: exit {run.code}, {len(records)} requests, "
                      f"{len(pairs)} tool results, {time.monotonic() - started:.0f}s", flush=True)
                want = len(CASES) * REPEATS
                if len(pairs) < want:
                    print(run.output[-3000:], file=sys.stderr)
                    raise SystemExit(f"{client}: {len(pairs)} of {want} tool results")
                results = []
                for i, (call, result, is_error) in enumerate(pairs[:want]):
                    case, _, command = CASES[i // REPEATS]
                    entry = {"case": case, "repeat": i % REPEATS, "call": call, "result": result}
                    if is_error is not None:
                        entry["is_error"] = is_error
                    results.append(entry)
                sessions.append(results)
            version = versions.get("openai-agents" if client.startswith("agents-sdk") else client)
            doc["clients"][client] = {**CLIENTS[client], "version": version, "sessions": sessions}
    finally:
        mock.terminate()
        mock.wait(timeout=10)
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
