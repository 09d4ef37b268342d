"""VAT helpers for the invoicing service.

Amounts are `Decimal`s in the invoice currency. Tax is computed per line and rounded to the
cent, half up, as the tax office requires (a half cent is always rounded away from zero).
"""

from decimal import Decimal

RATES = {
    "standard": Decimal("0.20"),
    "reduced": Decimal("0.05"),
    "zero": Decimal("0"),
}

CENT = Decimal("0.01")


def vat(net: Decimal, rate: str = "standard") -> Decimal:
    """The VAT on a net amount at the named rate, rounded to the cent, half up."""
    if rate not in RATES:
        raise ValueError(f"unknown VAT rate: {rate}")
    return (net * RATES[rate]).quantize(CENT)


def gross(net: Decimal, rate: str = "standard") -> Decimal:
    """Net plus VAT."""
    return net + vat(net, rate)


def invoice_total(lines: list[tuple[Decimal, str]]) -> Decimal:
    """The gross total of an invoice: VAT is rounded per line, then summed."""
    return sum((gross(net, rate) for net, rate in lines), Decimal("0"))
