"""Reports: the reports part of the back office (module 09 of 16)."""

OWNER = "team-money"


def reports_summary(rows):
    """One line per row of reports: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def reports_count(rows):
    """How many reports rows there are."""
    return len(rows)
