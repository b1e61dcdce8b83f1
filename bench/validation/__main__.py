"""`python -m bench.validation` = `disagg-sim validate-cost`."""

import sys

from bench.cli import main

sys.exit(main(["validate-cost", *sys.argv[1:]]))
