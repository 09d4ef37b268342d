"""Seeded fixture state (run in the workspace with the repetition's seed): how many status
checks the export needs before it is done, 8 to 12 — more than the loop rules' three identical
steps, so through the gate the polls are paced (held, never refused)."""
import json
import pathlib
import sys

seed = int(sys.argv[1])
pathlib.Path(".job").mkdir(exist_ok=True)
pathlib.Path(".job/config.json").write_text(json.dumps({"checks_until_done": 8 + seed % 5}))
