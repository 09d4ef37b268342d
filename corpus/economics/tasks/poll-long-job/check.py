"""Success: export.csv is the finished export (320 rows) and ops.txt names its row count."""
import csv
import pathlib
import sys

p = pathlib.Path("export.csv")
rows = list(csv.reader(p.open())) if p.exists() else []
ops = pathlib.Path("ops.txt").read_text().strip() if pathlib.Path("ops.txt").exists() else ""
ok = len(rows) == 321 and rows[0] == ["id", "account", "balance"] and "320" in ops
print(f"export rows {max(len(rows) - 1, 0)}, ops.txt {ops!r}")
sys.exit(0 if ok else 1)
