"""Audit: the audit part of the back office (module 12 of 16)."""

OWNER = "team-core"


def audit_summary(rows):
    """One line per row of audit: id and total, sorted by id."""
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        out.append(f"{row['id']}: {row.get('total', 0):.2f}")
    return out


def audit_count(rows):
    """How many audit rows there are."""
    return len(rows)
