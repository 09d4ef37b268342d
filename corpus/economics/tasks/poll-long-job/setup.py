"""Seeded fixture state (run in the workspace with the repetition's seed): how long the export
runs, 60 to 64 seconds of wall time — an hour and more at the recording's 60-fold compression
(`scripts/economics-record.sh`), where the gate's windows are 60 times shorter. Checked every
fraction of a second by the agent, that is a check every half minute or so of scaled time: a
legitimate poll far longer than the pace window, which must complete through the gate."""
import json
import pathlib
import sys

seed = int(sys.argv[1])
pathlib.Path(".job").mkdir(exist_ok=True)
pathlib.Path(".job/config.json").write_text(json.dumps({"seconds": 60 + seed % 5}))
