#!/usr/bin/env python3
"""Download this quarter's sales extract to data.csv (the data service drops connections)."""

import csv
import json
import pathlib
import sys

URL = "https://data.example.test/extracts/sales-2026-q3.csv"
STATE = pathlib.Path(".flaky/state.json")
CONFIG = pathlib.Path(".flaky/config.json")


def main() -> int:
    fail_first = json.loads(CONFIG.read_text())["fail_first"]
    state = json.loads(STATE.read_text()) if STATE.exists() else {"calls": 0}
    state["calls"] += 1
    STATE.write_text(json.dumps(state))
    if state["calls"] <= fail_first:
        print(f"error: connection reset by peer while downloading {URL}", file=sys.stderr)
        return 1
    with open("data.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["order", "amount"])
        for i in range(1, 41):
            w.writerow([f"SO-{1000 + i}", f"{(i * 613) % 997 + 0.25:.2f}"])
    print(f"fetched 40 rows from {URL} to data.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
