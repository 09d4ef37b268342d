"""Imports: the imports part of the back office (module 11 of 16)."""

OWNER = "team-people"


def imports_summary(rows):
    """One line per row of imports: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def imports_count(rows):
    """How many imports rows there are."""
    return len(rows)
