"""Currency: the currency part of the back office (module 08 of 16)."""

OWNER = "team-core"


def currency_summary(rows):
    """One line per row of currency: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def currency_count(rows):
    """How many currency rows there are."""
    return len(rows)
