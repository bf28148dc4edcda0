"""`python -m experiments.report`: a Markdown report of runs.

A shim that keeps the command; the code is `experiments.cli.runs_report`.
"""

import sys

from experiments.cli.runs_report import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
