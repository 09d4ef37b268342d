"""Seeded fixture state (run in the workspace with the repetition's seed): how many status
checks the export needs before it is done, 2 to 5."""
import json
import pathlib
import sys

seed = int(sys.argv[1])
pathlib.Path(".job").mkdir(exist_ok=True)
pathlib.Path(".job/config.json").write_text(json.dumps({"checks_until_done": 2 + (seed * 3) % 4}))
