"""`python -m experiments.reports build|check`: the committed reports, regenerated and checked.

A shim that keeps the command; the code is `experiments.cli.reports`.
"""

import sys

from experiments.cli.reports import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
