"""Success: INVENTORY.md lists all 16 modules of src/ with their owners."""
import pathlib
import sys

p = pathlib.Path("INVENTORY.md")
lines = [l for l in p.read_text().splitlines() if l.startswith("- m")] if p.exists() else []
ok = len(lines) == 16 and all("team-" in l for l in lines)
print(f"{len(lines)} modules listed")
sys.exit(0 if ok else 1)
