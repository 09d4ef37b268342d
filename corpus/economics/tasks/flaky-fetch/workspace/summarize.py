#!/usr/bin/env python3
"""Sum the `amount` column of a sales extract: python3 summarize.py data.csv"""

import csv
import sys
from decimal import Decimal

with open(sys.argv[1], newline="") as f:
    total = sum(Decimal(r["amount"]) for r in csv.DictReader(f))
print(f"total: {total}")
