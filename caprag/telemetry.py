"""Turn off every library's usage reporting before any of them is imported."""

from __future__ import annotations

import os

OFF = {
    "ANONYMIZED_TELEMETRY": "False",
    "RAGAS_DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
    "TOKENIZERS_PARALLELISM": "false",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def disable_telemetry() -> None:
    """Set the opt-out variables unless the user set them already."""
    for key, value in OFF.items():
        os.environ.setdefault(key, value)
