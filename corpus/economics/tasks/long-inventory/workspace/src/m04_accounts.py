"""Accounts: the accounts part of the back office (module 04 of 16)."""

OWNER = "team-core"


def accounts_summary(rows):
    """One line per row of accounts: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def accounts_count(rows):
    """How many accounts rows there are."""
    return len(rows)
