"""Success: answer.txt names the region with the highest Q3 2026 revenue (West)."""
import pathlib
import sys

p = pathlib.Path("answer.txt")
got = p.read_text().strip() if p.exists() else ""
print(f"answer.txt: {got!r}")
sys.exit(0 if got == "West" else 1)
