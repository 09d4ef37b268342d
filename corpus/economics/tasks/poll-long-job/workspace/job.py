#!/usr/bin/env python3
"""The quarterly export, as the ops team runs it by hand.

    python3 job.py start     queue the export
    python3 job.py status    how it is doing (writes export.csv when it is done)
"""

import csv
import json
import pathlib
import sys
import time

JOB = "exp_9c1d"
STATE = pathlib.Path(".job/state.json")
CONFIG = pathlib.Path(".job/config.json")


def write_export(path: pathlib.Path) -> int:
    rows = [(i, f"account-{i:04d}", round(40.25 + (i * 6271) % 900 / 10, 2)) for i in range(1, 321)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "account", "balance"])
        w.writerows(rows)
    return len(rows)


def main() -> int:
    cmd = sys.argv[1] if len(sys.argv) > 1 else "status"
    seconds = json.loads(CONFIG.read_text())["seconds"]
    if cmd == "start":
        STATE.write_text(json.dumps({"started": time.time()}))
        print(f"export job {JOB} queued")
        return 0
    if cmd != "status":
        print("usage: python3 job.py start|status")
        return 2
    if not STATE.exists():
        print("error: no export job; run: python3 job.py start")
        return 1
    started = json.loads(STATE.read_text())["started"]
    if time.time() - started >= seconds:
        n = write_export(pathlib.Path("export.csv"))
        print(f"export {JOB}: done, {n} rows written to export.csv")
    else:
        print(f"export {JOB}: running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
