"""`python -m experiments.run`: one experiment, or a sweep with -m (Hydra overrides).

A shim that keeps the command; the code is `experiments.harness.run`.
"""

from experiments.harness.run import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    main()
