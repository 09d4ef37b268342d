"""The verdicts each real agent client gets under each shipped scoring profile.

    .venv/bin/python scripts/agent-verdicts.py [CASE [PROFILE,...]]
                                                    (after `bash tests/agents/install.sh`)

Runs Claude Code, Codex CLI and the OpenAI Agents SDK through `tokensaver serve` in front of the
built-in provider, one session each under every key below (or only the PROFILEs named), and
prints a Markdown table of the verdicts, the time the gate paced the session's repeated steps
and the highest score of each session, read from the gate's own ledger. CASE is the built-in
provider's script: `steps=N` (N tool steps that make progress; a bare N means the same; default
3), `poll=N` (a job polled N times with the same call and result, then done) or `loop` (stuck on
one call forever). The gate runs with the tests' scaled step windows (`tests/agents/conftest.py`:
a 2 s pace window, the 5th identical step stopped). The README's "Agents" section publishes it.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "agents"))
from conftest import Gate  # noqa: E402

# (id, human default, budget in micro-USD, profile)
PROFILES = [
    ("seed-unattended", False, 20_000_000, "none"),
    ("seed-attended", True, 20_000_000, "none"),
    ("agent-unattended", False, 20_000_000, "agent"),
    ("agent-attended", True, 20_000_000, "agent"),
    ("demo-1usd", False, 1_000_000, "none"),
]
CLIENTS = ["claude", "codex", "sdk-responses", "sdk-chat"]
# One key per client and profile: the burst and grind windows are per key, and the sessions
# run back to back.
CASE = sys.argv[1] if len(sys.argv) > 1 else "steps=3"
CASE = f"steps={CASE}" if CASE.isdigit() else CASE
if len(sys.argv) > 2:
    PROFILES = [p for p in PROFILES if p[0] in sys.argv[2].split(",")]
KEYS = [(f"{c}-{p}", h, b, prof) for p, h, b, prof in PROFILES for c in CLIENTS]
STEPS = int(CASE.split("=")[1]) if "=" in CASE else 30
PROMPT = f"Run the checks. tokensaver-mock:{CASE}"


def sessions(gate: Gate):
    for profile, *_ in PROFILES:
        k = f"claude-{profile}"
        yield "Claude Code", profile, k, lambda k=k: gate.claude(
            k, PROMPT, gate.tmp / f"h-{k}", max_turns=STEPS + 3
        )
        k = f"codex-{profile}"
        yield "Codex CLI (gpt-5.5)", profile, k, lambda k=k: gate.codex(k, PROMPT, gate.tmp / k)
        for api in ("responses", "chat"):
            k = f"sdk-{api}-{profile}"
            yield f"Agents SDK ({api})", profile, k, lambda k=k, a=api: gate.sdk(
                k, a, PROMPT, "--max-turns", str(STEPS + 3)
            )


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tokensaver-verdicts-"))
    gate = Gate(tmp, KEYS)
    rows = []
    try:
        db = tmp / "data" / "tokensaver.db"
        seen: Counter = Counter()
        for client, profile, key_id, run in sessions(gate):
            result = run()
            time.sleep(0.5)  # the ledger writer commits in batches, off the request path
            with sqlite3.connect(db) as conn:
                found = conn.execute(
                    "SELECT verdict, reason, score, paced_ms FROM decisions WHERE key_id = ? "
                    "ORDER BY id",
                    (key_id,),
                ).fetchall()
            rows.append((client, profile, result.code, found[seen[key_id]:]))
            seen[key_id] = len(found)
    finally:
        gate.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"`{CASE}`:\n")
    print("| client | key (profile, attendance, budget) | exit | verdicts (reason) | paced | "
          "highest score |")
    print("|---|---|---|---|---|---|")
    for client, key_id, code, decisions in rows:
        verdicts = Counter(f"{v} ({r})" if v != "ALLOW" else v for v, r, _, _ in decisions)
        text = ", ".join(f"{n}× {v}" for v, n in verdicts.items())
        top = max((s for _, _, s, _ in decisions), default=0.0)
        paced = sum(p for *_, p in decisions) / 1000
        print(f"| {client} | {key_id} | {code} | {text} | {paced:.1f} s | {top:.3f} |")


if __name__ == "__main__":
    main()
