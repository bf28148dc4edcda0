"""`python -m experiments.compare`: paired significance of run B against run A.

A shim that keeps the command; the code is `experiments.cli.compare`.
"""

import sys

from experiments.cli.compare import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
