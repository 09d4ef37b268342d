#!/usr/bin/env python3
"""The nightly export, as the ops team runs it by hand.

    python3 job.py start     queue the export
    python3 job.py status    how it is doing (writes export.csv when it is done)
"""

import csv
import json
import pathlib
import sys

JOB = "exp_4f2a"
STATE = pathlib.Path(".job/state.json")
CONFIG = pathlib.Path(".job/config.json")


def write_export(path: pathlib.Path) -> int:
    rows = [(i, f"customer-{i:04d}", round(19.5 + (i * 7919) % 1000 / 10, 2)) for i in range(1, 251)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "customer", "balance"])
        w.writerows(rows)
    return len(rows)


def main() -> int:
    cmd = sys.argv[1] if len(sys.argv) > 1 else "status"
    checks_until_done = json.loads(CONFIG.read_text())["checks_until_done"]
    if cmd == "start":
        STATE.write_text(json.dumps({"checks": 0}))
        print(f"export job {JOB} queued")
        return 0
    if cmd != "status":
        print(f"usage: python3 job.py start|status")
        return 2
    if not STATE.exists():
        print("error: no export job; run: python3 job.py start")
        return 1
    state = json.loads(STATE.read_text())
    state["checks"] += 1
    STATE.write_text(json.dumps(state))
    if state["checks"] >= checks_until_done:
        n = write_export(pathlib.Path("export.csv"))
        print(f"export {JOB}: done, {n} rows written to export.csv")
    else:
        print(f"export {JOB}: running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
