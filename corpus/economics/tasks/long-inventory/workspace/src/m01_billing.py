"""Billing: the billing part of the back office (module 01 of 16)."""

OWNER = "team-money"


def billing_summary(rows):
    """One line per row of billing: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def billing_count(rows):
    """How many billing rows there are."""
    return len(rows)
