"""`python -m experiments.hardness`: gold-passage ranks for one search with the question alone.

A shim that keeps the command; the code is `experiments.cli.hardness`.
"""

import sys

from experiments.cli.hardness import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
