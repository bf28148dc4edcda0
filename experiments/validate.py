"""`python -m experiments.validate`: check the question sets against the schema and the corpus.

A shim that keeps the command; the code is `experiments.cli.validate`.
"""

import sys

from experiments.cli.validate import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
