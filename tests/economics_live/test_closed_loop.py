"""The closed-loop economics suites end to end, at CI size (one repetition of five pairs: four of
healthy work, one stuck agent).

`tokensaver economics run` against the built-in scripted provider: real Claude Code, Codex CLI
and Agents SDK processes do fixture tasks straight to the provider and through the gate; then
`tokensaver economics summary` reads the evidence files it appended, one per suite. Checks the
pipeline, not
the savings: every pair is recorded and judged by its task's own check, the gate's refusals
show up as the failures they cause, a rerun at temperature 0 is served, the bought usage is
what the client was answered, and the statement is a simulation's.

    .venv/bin/python -m pytest -q tests/economics_live      (after cargo build and
                                                             bash tests/agents/install.sh)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TOKENSAVER_BIN", ROOT / "target" / "debug" / "tokensaver"))
HEALTHY = [
    "bugfix-vat-rounding:agents-sdk",       # a bug fixed; nothing for the gate to do
    "poll-export-job:claude-code",          # r1 polls 4 identical times: paced, it completes
    "rerun-sales-report:agents-sdk-chat",   # temperature 0, two sessions: the second is served
    "flaky-fetch:codex",                    # retries of a flaky tool: not a runaway
]
STUCK = ["runaway-migration:claude-code"]  # a short stuck loop: paced, not cut; fails either way
PAIRS = HEALTHY + STUCK


def recording_config() -> str:
    """The config the committed evidence is recorded with (`scripts/economics-record.sh`: the
    example config with every window of the gate shortened 60 times, as tests/agents runs), its
    data dir here: a stuck step is paced for up to `runaway_after_secs`, 90 s."""
    text = (ROOT / "corpus/economics/recording.toml").read_text()
    assert text.count('dir = "../../data"') == 1
    assert text.count("runaway_after_secs = 90\n") == 1
    return text.replace('dir = "../../data"', 'dir = "data"', 1)


@pytest.fixture(scope="module")
def recorded():
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: build it first (cargo build)")
    tmp = Path(tempfile.mkdtemp(prefix="tokensaver-economics-ci-"))
    econ = tmp / "economics"
    econ.mkdir()
    shutil.copy(ROOT / "corpus/economics/methodology.json", econ)
    shutil.copytree(ROOT / "corpus/economics/tasks", econ / "tasks")
    # Time-compressed with the provider, which answers at once (a stuck step is paced for up to
    # 90 minutes with the defaults; compressed, the same decisions 60 times sooner).
    config = tmp / "tokensaver.toml"
    config.write_text(recording_config())
    run = subprocess.run(
        [BIN, "economics", "run", "--dir", econ, "--reps", "1", "--only", ",".join(PAIRS),
         "--config", config],
        cwd=ROOT, capture_output=True, text=True, timeout=220,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    summary = subprocess.run(
        [BIN, "economics", "summary", "--dir", econ, "--json", "--config", config],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    text = subprocess.run(
        [BIN, "economics", "summary", "--dir", econ, "--config", config],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    files = sorted((econ / "evidence").glob("*/*.json"))
    yield {"run": run, "summary": json.loads(summary.stdout), "text": text,
           "evidence": [json.loads(f.read_text()) for f in files], "files": files,
           "config": config, "tmp": tmp}
    shutil.rmtree(tmp, ignore_errors=True)


def pair(s: dict, name: str) -> dict:
    task, client = name.split(":")
    return next(p for p in s["pairs"] if p["task"] == task and p["client"] == client
                and p["repetition"] == 1)


def test_one_evidence_file_per_suite_with_its_identities(recorded):
    by_suite = {ev["suite"]: ev for ev in recorded["evidence"]}
    assert len(recorded["evidence"]) == 2 and set(by_suite) == {"healthy-work", "stuck-agents"}
    for suite, pairs in (("healthy-work", HEALTHY), ("stuck-agents", STUCK)):
        ev = by_suite[suite]
        assert ev["format"] == 2 and ev["provider"]["kind"] == "simulated"
        assert "cl100k_base" in ev["provider"]["usage_counting"]
        assert {c["id"] for c in ev["clients"]} == {p.split(":")[1] for p in pairs}
        assert all(c["version"] not in ("", "unknown", "unavailable") for c in ev["clients"])
        assert len(ev["build"]["source_blake3"]) == 64 and len(ev["gate_config_blake3"]) == 64
        assert set(ev["tasks"]) >= {p.split(":")[0] for p in pairs}
        assert len(ev["runs"]) == 2 * len(pairs)
    # A task is recorded in its own suite only.
    assert not set(by_suite["healthy-work"]["tasks"]) & set(by_suite["stuck-agents"]["tasks"])


def test_the_evidence_files_are_signed_and_verify(recorded):
    for f in recorded["files"]:
        sig = f.with_name(f.name + ".sig")
        assert sig.exists(), sig
        verify = [BIN, "verify", sig, "--config", recorded["config"]]
        ok = subprocess.run([*verify, "--document", f], capture_output=True, text=True)
        assert ok.returncode == 0 and ok.stdout.startswith("VALID evidence"), ok.stdout + ok.stderr
    # One byte changed: the signature no longer covers it.
    f = recorded["files"][0]
    verify = [BIN, "verify", f.with_name(f.name + ".sig"), "--config", recorded["config"]]
    tampered = recorded["tmp"] / "tampered.json"
    tampered.write_bytes(f.read_bytes().replace(b'"format": 2', b'"format": 3', 1))
    bad = subprocess.run([*verify, "--document", tampered], capture_output=True, text=True)
    assert bad.returncode != 0 and "INVALID" in bad.stderr, bad.stdout + bad.stderr


def test_every_pair_is_judged_by_its_task(recorded):
    s = recorded["summary"]
    live = next(v for v in s["suites"] if v["kind"] == "live")
    assert live["id"] == "healthy-work"
    assert live["freshness"] == "current", live.get("freshness_detail")
    assert live["pairs"]["attempted"] == len(HEALTHY)
    stuck = next(v for v in s["suites"] if v["kind"] == "stuck")
    assert stuck["freshness"] == "current", stuck.get("freshness_detail")
    assert stuck["pairs"]["attempted"] == len(STUCK)
    assert pair(s, "bugfix-vat-rounding:agents-sdk")["status"] == "valid"
    assert pair(s, "flaky-fetch:codex")["status"] == "valid"
    # A job polled past the loop limit is paced, not stopped (issue 24): the task completes.
    poll = pair(s, "poll-export-job:claude-code")
    assert poll["status"] == "valid", poll
    assert not poll.get("refusals"), poll
    # A short stuck loop (14-22 repeats) is paced, never refused: it ends on its own before its
    # run is `runaway_after_secs` old, fails either way, and the gate stops none of it (a
    # stated limit; a long one is stopped, `stuck-noisy-deploy` in the committed evidence).
    runaway = pair(s, "runaway-migration:claude-code")
    assert runaway["status"] == "both_failed", runaway
    assert not runaway.get("refusals"), runaway
    assert runaway["treatment_usage"]["requests"] == runaway["control_usage"]["requests"]
    # Reported apart, as what the stuck session bought each way.
    (row,) = s["stuck"]
    assert (row["task"], row["client"]) == ("runaway-migration", "claude-code")
    assert row["treatment"]["calls"] == runaway["treatment_usage"]["requests"]
    assert row["stopped"] == 0


def test_a_rerun_at_temperature_zero_is_served(recorded):
    p = pair(recorded["summary"], "rerun-sales-report:agents-sdk-chat")
    assert p["status"] == "valid" and p["sessions"] == 2
    assert p["continuation_reduction"] == 1.0, p
    assert p["tokens_not_bought"] > 0


def test_bought_usage_is_what_the_clients_were_answered(recorded):
    for run in (r for ev in recorded["evidence"] for r in ev["runs"]):
        if run["arm"] != "treatment":
            continue
        answered = [s["usage"] for s in run["steps"]
                    if s.get("verdict") in ("ALLOW", "DOWNGRADE") and s.get("usage")]
        bought = [b["usage"] for b in run["bought"] if b.get("usage")]
        assert answered == bought, run["id"]
        counted = [s["context"]["counted"] for s in run["steps"] if s.get("context")]
        assert len(counted) == len(run["steps"]) and all(c > 0 for c in counted), run["id"]


def test_the_statement_is_a_simulations(recorded):
    s = recorded["summary"]
    assert s["simulated"] is True and s["verdict"]["publishable"] is False
    st = s["verdict"]["statement"]
    assert st.startswith("In a simulation against a scripted provider, "), st
    assert st.startswith("In a simulation against a scripted provider, no task that succeeded "
                         "without the gate failed through it."), st
    assert f"of {len(HEALTHY)} attempted pairs over {len(HEALTHY)} tasks" in st, st
    assert all(m["status"] != "verified" for m in s["metrics"])
    text = recorded["text"]
    assert st in text and "provider: simulated" in text and "    not: " in text
    assert "wrote " in recorded["run"].stdout


def test_the_real_provider_path_against_the_built_in_provider():
    """`--upstream URL --credential-env VAR`: the harness as a user runs it against their own
    provider, here the built-in one without task scripts (so the model does no work and the
    tasks fail): the credential comes from the environment in both arms — and because the
    built-in provider names itself on every answer, the evidence is labelled a simulation
    whatever the flags said, and its statement is a simulation's."""
    import socket
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "agents"))
    import clients

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="tokensaver-economics-real-"))
    econ = tmp / "economics"
    econ.mkdir()
    shutil.copy(ROOT / "corpus/economics/methodology.json", econ)
    shutil.copytree(ROOT / "corpus/economics/tasks", econ / "tasks")
    log = tmp / "provider.log"
    provider = subprocess.Popen(
        [BIN, "mock-provider", "--listen", f"127.0.0.1:{port}", "--expected-credential",
         "sk-users-own-key", "--usage", "cl100k"],
        stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        clients.wait_port(port, provider, log)
        run = subprocess.run(
            [BIN, "economics", "run", "--dir", econ, "--reps", "1",
             "--only", "bugfix-vat-rounding:agents-sdk", "--upstream", f"http://127.0.0.1:{port}",
             "--credential-env", "USERS_PROVIDER_KEY"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env=dict(os.environ, USERS_PROVIDER_KEY="sk-users-own-key"),
        )
        assert run.returncode == 0, run.stdout + run.stderr
        (f,) = (econ / "evidence" / "healthy-work").glob("*.json")
        ev = json.loads(f.read_text())
        assert ev["provider"]["kind"] == "simulated", ev["provider"]
        assert "its answers say it is the built-in one" in ev["provider"]["name"]
        assert ev["provider"]["upstream"] == f"http://127.0.0.1:{port}"
        statuses = {b["status"] for r in ev["runs"] for b in r["bought"]}
        assert statuses == {200}, "the credential reached the provider in both arms"
        summary = json.loads(subprocess.run(
            [BIN, "economics", "summary", "--dir", econ, "--json"],
            cwd=ROOT, capture_output=True, text=True, check=True).stdout)
        st = summary["verdict"]["statement"]
        assert summary["simulated"] is True
        assert st.startswith("In a simulation against a scripted provider, "), st
    finally:
        provider.terminate()
        provider.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
