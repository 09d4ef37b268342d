"""Roles: the roles part of the back office (module 14 of 16)."""

OWNER = "team-ops"


def roles_summary(rows):
    """One line per row of roles: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def roles_count(rows):
    """How many roles rows there are."""
    return len(rows)
