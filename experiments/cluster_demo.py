"""`python -m experiments.cluster_demo`: the strategy sweep on real engines (Ray, Chroma, MLflow).

A shim that keeps the command; the code is `experiments.perf.cluster_demo`.
"""

import sys

from experiments.perf.cluster_demo import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
