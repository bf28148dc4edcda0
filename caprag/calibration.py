"""Adaptive's confidence calibration: the rule's signals -> P(every needed passage was read).

A `Calibration` is a logistic model fitted on one dataset (`python -m experiments.calibration fit`)
and judged on another. The saved ones ship with the library (`caprag/calibrations/NAME.yaml`), so
the API and the harness read the same files: a served answer and a harness row use the same
confidence model. Light on purpose: settings import it to check a name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SIGNALS = (
    "relevance",
    "recency",
    "diversity",
    "completeness",
    "coverage",
    "open_references",
    "margin",
    "log_passages",
)
"""What a calibration may weigh: the heuristic's four signals and its retrieval measures
(`caprag.steps.assess`)."""


@dataclass(frozen=True)
class Calibration:
    """Signals → probability that every needed passage was read: a logistic model.

    p = 1 / (1 + exp(-(intercept + sum(weight * signal)))). Fitted by `python -m
    experiments.calibration fit` on one dataset (`fitted_on` says which) and to be judged on
    another.
    """

    intercept: float
    weights: Mapping[str, float]
    fitted_on: str = ""
    features: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        known = SIGNALS
        unknown = sorted(set(self.weights) - set(known))
        if unknown:
            raise ValueError(f"calibration weights for unknown signals {unknown}; use {known}")
        if not self.weights:
            raise ValueError("a calibration needs at least one signal weight")
        object.__setattr__(self, "features", tuple(self.weights))

    @classmethod
    def from_config(cls, config: Calibration | Mapping[str, object] | None) -> Calibration | None:
        """A Calibration from its config mapping (intercept, weights, fitted_on); empty: None."""
        if config is None or isinstance(config, Calibration):
            return config
        if not config:
            return None
        weights = config.get("weights") or {}
        if not isinstance(weights, Mapping):
            raise ValueError("calibration.weights must map signal names to numbers")
        return cls(
            intercept=float(str(config.get("intercept", 0.0))),
            weights={str(k): float(v) for k, v in weights.items()},
            fitted_on=str(config.get("fitted_on") or ""),
        )

    def probability(self, signals: Mapping[str, float]) -> float:
        """The calibrated confidence for one retrieval's signals (all features must be there)."""
        missing = [name for name in self.features if name not in signals]
        if missing:
            raise KeyError(f"the calibration needs signals {missing}, which were not measured")
        z = self.intercept + sum(w * float(signals[n]) for n, w in self.weights.items())
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


CALIBRATIONS = Path(__file__).resolve().parent / "calibrations"
"""The saved calibrations (`NAME.yaml`), shipped with the library: the API and the harness read
the same files, so a served answer and a harness row use the same confidence model."""
NO_CALIBRATION = "none"
DEFAULT_CALIBRATION = NO_CALIBRATION
"""The served default and the rulebooks' choice: the weighted heuristic as it is (it was made
for the rulebooks, and held-out fits are less sure of a passage that answers the question at
depth 1: reports/calibration.md). The benchmarks use the calibration fitted on the rulebooks."""


def calibration_names() -> list[str]:
    """The saved calibrations, and `none` (the weighted heuristic as it is)."""
    return [*sorted(p.stem for p in CALIBRATIONS.glob("*.yaml")), NO_CALIBRATION]


def load_calibration(name: str) -> Calibration | None:
    """A saved calibration by name (None for `none`); ValueError naming the saved ones."""
    if name == NO_CALIBRATION:
        return None
    path = CALIBRATIONS / f"{name}.yaml"
    if "/" in name or not path.is_file():
        raise ValueError(f"no calibration {name!r}: use one of {', '.join(calibration_names())}")
    calibration = Calibration.from_config(yaml.safe_load(path.read_text(encoding="utf-8")))
    if calibration is None:
        raise ValueError(f"{path} holds no calibration")
    return calibration
