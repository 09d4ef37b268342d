"""Users: the users part of the back office (module 13 of 16)."""

OWNER = "team-money"


def users_summary(rows):
    """One line per row of users: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def users_count(rows):
    """How many users rows there are."""
    return len(rows)
