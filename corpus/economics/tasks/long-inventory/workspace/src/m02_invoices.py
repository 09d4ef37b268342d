"""Invoices: the invoices part of the back office (module 02 of 16)."""

OWNER = "team-ops"


def invoices_summary(rows):
    """One line per row of invoices: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def invoices_count(rows):
    """How many invoices rows there are."""
    return len(rows)
