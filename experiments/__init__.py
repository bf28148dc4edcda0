"""The caprag harness: Hydra experiments, metrics, MLflow tracking, reports, dashboard."""

from omegaconf import OmegaConf

from caprag.config import PROJECT_ROOT
from caprag.telemetry import disable_telemetry

disable_telemetry()
OmegaConf.register_new_resolver(
    "project", lambda sub="": str(PROJECT_ROOT / sub) if sub else str(PROJECT_ROOT), replace=True
)
