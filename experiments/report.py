#!/usr/bin/env python3
"""python3 experiments/report.py RESULTS.json [MORE.json ...] [--md OUT.md] [--png OUT.png] [--no-plot] [--wire W.json]

A door of the lab's report job (pdtools/report.py, also ``python3 experiments/pdtools report``):
P/D bench results as a markdown table and a PNG plot."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # experiments/: the pdtools package
from pdtools.report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
