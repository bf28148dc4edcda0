"""`python -m experiments.openai_stub`: a local OpenAI-protocol server for tests and benchmarks.

A shim that keeps the command; the code is `experiments.support.openai_stub`.
"""

import sys

from experiments.support.openai_stub import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
