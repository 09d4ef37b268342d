"""Taxes: the taxes part of the back office (module 07 of 16)."""

OWNER = "team-people"


def taxes_summary(rows):
    """One line per row of taxes: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def taxes_count(rows):
    """How many taxes rows there are."""
    return len(rows)
