"""Refunds: the refunds part of the back office (module 06 of 16)."""

OWNER = "team-ops"


def refunds_summary(rows):
    """One line per row of refunds: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def refunds_count(rows):
    """How many refunds rows there are."""
    return len(rows)
