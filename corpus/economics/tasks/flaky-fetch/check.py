"""Success: total.txt holds the sum of the extract's amounts (21119.00)."""
import pathlib
import sys
from decimal import Decimal, InvalidOperation

p = pathlib.Path("total.txt")
got = p.read_text().strip() if p.exists() else ""
try:
    ok = Decimal(got) == Decimal("21119.00")
except InvalidOperation:
    ok = False
print(f"total.txt: {got!r}")
sys.exit(0 if ok else 1)
