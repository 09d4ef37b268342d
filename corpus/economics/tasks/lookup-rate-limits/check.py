"""Success: answer.txt holds the Team plan's batch limit in operations per minute."""
import pathlib
import sys

p = pathlib.Path("answer.txt")
got = p.read_text().strip().replace(" ", "").replace(",", "") if p.exists() else None
print(f"answer.txt: {got!r}")
sys.exit(0 if got == "20000" else 1)
