"""Ledger: the ledger part of the back office (module 03 of 16)."""

OWNER = "team-people"


def ledger_summary(rows):
    """One line per row of ledger: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def ledger_count(rows):
    """How many ledger rows there are."""
    return len(rows)
