"""Payments: the payments part of the back office (module 05 of 16)."""

OWNER = "team-money"


def payments_summary(rows):
    """One line per row of payments: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def payments_count(rows):
    """How many payments rows there are."""
    return len(rows)
