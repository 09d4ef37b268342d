import unittest
from decimal import Decimal

from vat import gross, invoice_total, vat


class VatTest(unittest.TestCase):
    def test_whole_cents(self):
        self.assertEqual(vat(Decimal("10.00")), Decimal("2.00"))
        self.assertEqual(vat(Decimal("10.00"), "reduced"), Decimal("0.50"))

    def test_half_cent_rounds_up(self):
        self.assertEqual(vat(Decimal("0.125")), Decimal("0.03"))
        self.assertEqual(vat(Decimal("10.10"), "reduced"), Decimal("0.51"))

    def test_gross(self):
        self.assertEqual(gross(Decimal("0.125")), Decimal("0.155"))

    def test_invoice_rounds_per_line(self):
        lines = [(Decimal("10.10"), "reduced"), (Decimal("0.125"), "standard")]
        self.assertEqual(invoice_total(lines), Decimal("10.765"))

    def test_unknown_rate(self):
        with self.assertRaises(ValueError):
            vat(Decimal("1"), "luxury")


if __name__ == "__main__":
    unittest.main()
