"""`python -m experiments.gate`: the regression gate against reports/baseline.json.

A shim that keeps the command; the code is `experiments.cli.gate`.
"""

import sys

from experiments.cli.gate import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
