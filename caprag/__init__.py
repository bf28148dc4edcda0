"""caprag: retrieval-augmented question answering over rulebooks, built to be measured."""

from caprag.secrets import install_log_redaction
from caprag.telemetry import disable_telemetry

disable_telemetry()
install_log_redaction()  # entry points call it again once their logging is configured

__version__ = "0.1.0"
