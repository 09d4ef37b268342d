"""Seeded fixture state: how many times the download fails before it succeeds, 1 to 3."""
import json
import pathlib
import sys

seed = int(sys.argv[1])
pathlib.Path(".flaky").mkdir(exist_ok=True)
pathlib.Path(".flaky/config.json").write_text(json.dumps({"fail_first": 1 + (seed * 5) % 3}))
