"""`python -m experiments.calibration`: fit, check and summarise adaptive's confidence calibration.

A shim that keeps the command; the code is `experiments.cli.calibration`.
"""

import sys

from experiments.cli.calibration import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
