"""Success: the migrations are applied (app.db has both, in its migrations table)."""
import pathlib
import sqlite3
import sys

ok = False
if pathlib.Path("app.db").exists():
    try:
        names = {r[0] for r in sqlite3.connect("app.db").execute("SELECT name FROM migrations")}
        ok = {"0001_accounts", "0002_tenant"} <= names
    except sqlite3.Error:
        ok = False
print("migrations applied" if ok else "migrations not applied")
sys.exit(0 if ok else 1)
