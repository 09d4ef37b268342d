"""Success: the release is deployed (it cannot be while the lock is held: the task fails in
both arms by design — what it measures is what the stuck agent spends)."""
import pathlib
import sys

ok = pathlib.Path("DEPLOYED").exists()
print("deployed" if ok else "not deployed")
sys.exit(0 if ok else 1)
