"""`python -m experiments.import_benchmark`: official benchmark files to the JSONL schema.

A shim that keeps the command; the code is `experiments.cli.import_benchmark`.
"""

import sys

from experiments.cli.import_benchmark import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
