"""caprag: retrieval-augmented question answering over your own books, built to be measured.

Importing it turns off every library's usage reporting (before any of them is imported) and
redacts secrets from log records.
"""

import os

from caprag.secrets import install_log_redaction

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


disable_telemetry()
install_log_redaction()  # entry points call it again once their logging is configured

__version__ = "0.1.0"
