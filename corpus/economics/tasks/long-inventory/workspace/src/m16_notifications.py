"""Notifications: the notifications part of the back office (module 16 of 16)."""

OWNER = "team-core"


def notifications_summary(rows):
    """One line per row of notifications: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def notifications_count(rows):
    """How many notifications rows there are."""
    return len(rows)
