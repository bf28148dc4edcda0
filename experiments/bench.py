"""`python -m experiments.bench`: measured numbers, written to reports/bench.md.

A shim that keeps the command; the code is `experiments.perf.bench`.
"""

import sys

from experiments.perf.bench import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
