"""Exports: the exports part of the back office (module 10 of 16)."""

OWNER = "team-ops"


def exports_summary(rows):
    """One line per row of exports: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def exports_count(rows):
    """How many exports rows there are."""
    return len(rows)
