"""caprag: retrieval-augmented question answering over rulebooks, built to be measured."""

from caprag.telemetry import disable_telemetry

disable_telemetry()

__version__ = "0.1.0"
