#!/usr/bin/env python3
"""Apply the pending schema migrations to app.db (SQLite)."""

import json
import pathlib
import sqlite3
import sys

MIGRATIONS = [
    ("0001_accounts", "CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, name TEXT)"),
    ("0002_tenant", "ALTER TABLE accounts ADD COLUMN tenant_id TEXT"),
]


def settings() -> dict:
    return json.loads(pathlib.Path("settings.json").read_text())


def main() -> int:
    cfg = settings()
    db = sqlite3.connect(cfg["database"]["path"])
    tenant = cfg["tenancy"]["default_tenant"]
    db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY)")
    done = {r[0] for r in db.execute("SELECT name FROM migrations")}
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        db.execute(sql)
        db.execute("INSERT INTO migrations VALUES (?)", (name,))
        print(f"applied {name} (tenant {tenant})")
    db.commit()
    print("migrations up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
