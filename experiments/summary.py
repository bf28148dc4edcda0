"""`python -m experiments.summary`: compare runs (default: the latest sweep).

A shim that keeps the command; the code is `experiments.cli.summary`.
"""

import sys

from experiments.cli.summary import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
