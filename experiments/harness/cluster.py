"""What a sweep on a Ray cluster needs from the driver (conf/hydra/launcher/ray.yaml)."""

from __future__ import annotations

import os
import warnings

from omegaconf import OmegaConf

from caprag import OFF
from caprag.secrets import is_secret_name

FORWARDED_PREFIXES = ("CAPRAG_", "MLFLOW_")
"""Environment variables a job reads for its stores and tracking (CAPRAG_CHROMA_URL, ...)."""


def forwarded_env() -> dict[str, str]:
    """The driver's caprag, MLflow and telemetry variables, secrets left out, for Ray's
    runtime_env: a Ray worker's environment is its node's, not the driver's."""
    return {
        name: value
        for name, value in os.environ.items()
        if (name.startswith(FORWARDED_PREFIXES) or name in OFF) and not is_secret_name(name)
    }


OmegaConf.register_new_resolver("caprag_forwarded_env", forwarded_env, replace=True)
# Ray (2.47+) turns a driver started under `uv run` into a runtime_env that uploads the working
# folder and runs every worker through `uv run` there, which builds a new environment per node
# without the `cluster` group (the workers then fail: "No module named 'ray'"). The workers of a
# machine that has this project's environment use it as it is; RAY_ENABLE_UV_RUN_RUNTIME_ENV=1
# (with `uv run --group cluster`) restores Ray's behaviour for nodes that do not.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# Ray folds lines that several jobs print alike into one ("[repeated 2x across cluster]"), which
# cuts rows out of each job's results table: print every job's lines as they are.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def quiet_launcher_schema_warning() -> None:
    """Hide Hydra's warning that conf/hydra/launcher/ray.yaml is merged onto the plugin's schema
    of the same name: that merge (typed keys, our values) is what the file is for."""
    warnings.filterwarnings(
        "ignore", message=r"\n'hydra/launcher/ray' is validated against ConfigStore schema"
    )
