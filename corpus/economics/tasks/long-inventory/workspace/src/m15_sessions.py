"""Sessions: the sessions part of the back office (module 15 of 16)."""

OWNER = "team-people"


def sessions_summary(rows):
    """One line per row of sessions: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def sessions_count(rows):
    """How many sessions rows there are."""
    return len(rows)
