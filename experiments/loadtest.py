"""`python -m experiments.loadtest`: a bounded load test of the chat API on loopback.

A shim that keeps the command; the code is `experiments.perf.loadtest`.
"""

import sys

from experiments.perf.loadtest import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
