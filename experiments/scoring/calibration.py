"""Calibration of a strategy's confidence: does 80 % confidence mean 80 % retrieval success?

Two parts:
- the reliability table and expected calibration error (ECE) the reports and dashboard plot;
- fitting adaptive's `Calibration` (caprag/steps/assess.py): the heuristic's signals at every depth
  of the ladder, labelled with whether every gold passage was among the passages read, a logistic
  model fitted on them, and the model judged on another dataset.

The command line that fits, checks and summarises is `experiments.cli.calibration`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import optimize, stats

from caprag.calibration import Calibration, load_calibration
from caprag.steps.assess import MEASURES
from caprag.trace import HopTrace
from experiments.results.row import rows_of

FEATURES = ("coverage", "margin", "log_passages")
"""The signals a fit uses by default: measured from the retrieval, none tied to one corpus.
open_references is left out: HotpotQA passages cite nothing, so a fit on the rulebooks leans on
it and turns over-confident there (ECE 0.06 without it, 0.13 with it, fitted on curated)."""
L2 = 1.0
"""Ridge penalty on the weights (not the intercept): keeps a fit on a few hundred rows sane."""


def reliability(
    confidence: Iterable[float], success: Iterable[float], bins: int = 5
) -> pd.DataFrame:
    """Per confidence bucket: mean confidence, observed success rate, number of questions."""
    frame = pd.DataFrame({"confidence": list(confidence), "success": list(success)}).dropna()
    if frame.empty:
        return pd.DataFrame(columns=["bucket", "mean_confidence", "success_rate", "questions"])
    edges = [i / bins for i in range(bins + 1)]
    labels = [f"{edges[i]:.1f}–{edges[i + 1]:.1f}" for i in range(bins)]
    frame["bucket"] = pd.cut(
        frame["confidence"].clip(0, 1), edges, labels=labels, include_lowest=True
    )
    grouped = frame.groupby("bucket", observed=True).agg(
        mean_confidence=("confidence", "mean"),
        success_rate=("success", "mean"),
        questions=("success", "size"),
    )
    return grouped.reset_index()


def expected_calibration_error(table: pd.DataFrame) -> float:
    """Question-weighted mean gap between confidence and success over the buckets."""
    if table.empty:
        return float("nan")
    weights = table["questions"] / table["questions"].sum()
    return float((weights * (table["mean_confidence"] - table["success_rate"]).abs()).sum())


def ranking_auc(score: Sequence[float], success: Sequence[float]) -> float:
    """Chance that a success scores above a failure (Mann-Whitney U / n1 n0); NaN if one class."""
    y = np.asarray(success, dtype=bool)
    s = np.asarray(score, dtype=float)
    if y.all() or not y.any():
        return float("nan")
    u = stats.mannwhitneyu(s[y], s[~y], alternative="two-sided").statistic
    return float(u / (y.sum() * (~y).sum()))


# Signals at every depth, labelled.


def signal_rows(
    question_id: str, gold: Sequence[str], hops: Sequence[HopTrace]
) -> list[dict[str, object]]:
    """The heuristic's signals after each round of an adaptive turn that never stops on
    confidence (`unbounded`), with whether every gold passage is among the passages read so far
    (`success`): what a calibration maps the signals to."""
    rows: list[dict[str, object]] = []
    read: set[str] = set()
    for hop in hops:
        read.update(ref.passage_id for ref in hop.documents)
        signals = dict(hop.confidence_signals or {})
        heuristic = signals.pop("heuristic", hop.confidence)
        rows.append(
            {
                "question_id": question_id,
                "depth": hop.depth,
                "heuristic": heuristic,
                **signals,
                "success": float(all(g in read for g in gold)),
            }
        )
    return rows


UNBOUNDED = {
    query_type: {"threshold": 2.0, "depth": 1}
    for query_type in ("factual", "operational", "decision", "strategic")
}
"""Adaptive's profiles for collecting signals: every question starts at depth 1 and no
confidence is enough, so each turn goes through every depth its budgets allow."""


# Fit and check.


def fit(
    frame: pd.DataFrame, features: Sequence[str] = FEATURES, l2: float = L2, name: str = ""
) -> Calibration:
    """The logistic model of `success` on the features (log-loss plus a ridge on the weights)."""
    unknown = sorted(set(features) - set(MEASURES) - {"relevance", "diversity", "completeness"})
    if unknown:
        raise ValueError(f"cannot fit on {unknown}: not a heuristic signal")
    x = frame[list(features)].to_numpy(dtype=float)
    y = frame["success"].to_numpy(dtype=float)
    design = np.column_stack([np.ones(len(x)), x])

    def loss(beta: np.ndarray) -> tuple[float, np.ndarray]:
        z = design @ beta
        p = 1.0 / (1.0 + np.exp(-z))
        nll = float(np.sum(np.logaddexp(0.0, z) - y * z)) + l2 * float(beta[1:] @ beta[1:])
        grad = design.T @ (p - y) + 2.0 * l2 * np.concatenate([[0.0], beta[1:]])
        return nll, grad

    result = optimize.minimize(loss, np.zeros(design.shape[1]), jac=True, method="L-BFGS-B")
    if not result.success:
        raise RuntimeError(f"the calibration fit did not converge: {result.message}")
    beta = [round(float(b), 4) for b in result.x]
    return Calibration(
        intercept=beta[0], weights=dict(zip(features, beta[1:], strict=True)), fitted_on=name
    )


def judge(calibration: Calibration, frame: pd.DataFrame) -> dict[str, float]:
    """How the calibration does on labelled rows: mean confidence vs success rate, ECE, AUC."""
    rows = frame[list(calibration.features)].to_dict("records")
    confidence = [calibration.probability({str(k): v for k, v in row.items()}) for row in rows]
    table = reliability(confidence, frame["success"], bins=10)
    return {
        "rows": float(len(frame)),
        "mean_confidence": float(np.mean(confidence)),
        "success_rate": float(frame["success"].mean()),
        "ece": expected_calibration_error(table),
        "auc": ranking_auc(confidence, frame["success"].tolist()),
        "auc_uncalibrated": ranking_auc(frame["heuristic"].tolist(), frame["success"].tolist()),
    }


def save(calibration: Calibration, path: Path, note: str = "") -> None:
    """Write the calibration as a Hydra config (caprag/calibrations/<name>.yaml)."""
    body = {
        "fitted_on": calibration.fitted_on,
        "intercept": calibration.intercept,
        "weights": dict(calibration.weights),
    }
    header = "".join(f"# {line}\n" for line in note.splitlines())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(body, sort_keys=False))


def load(name: str) -> Calibration:
    """A saved calibration by its name (caprag/calibrations/NAME.yaml)."""
    calibration = load_calibration(name)
    if calibration is None:
        raise ValueError(f"{name!r} is the uncalibrated choice, not a saved calibration")
    return calibration


def describe(label: str, scores: dict[str, float]) -> str:
    """One line of judged numbers."""
    return (
        f"{label}: {scores['rows']:.0f} rows, mean confidence {scores['mean_confidence']:.3f} vs "
        f"success {scores['success_rate']:.3f}, ECE {scores['ece']:.3f}, AUC {scores['auc']:.3f} "
        f"(uncalibrated heuristic AUC {scores['auc_uncalibrated']:.3f})"
    )


# Adaptive against always-deep, from finished runs (the report's numbers).

TARGET_SAVINGS = 0.40
"""Issue #19: at least 40 % fewer prompt tokens than always depth 3 ..."""
TARGET_RECALL_LOSS = 0.01
"""... at no more than 1 point of gold-passage recall@k lost."""


def final_decision(hops: Sequence[HopTrace]) -> str:
    """The last hop's adaptive decision (budget stops by their budget), '—' without one."""
    return (hops[-1].adaptive_decision or "—") if hops else "—"


def adaptive_summary(auto: pd.DataFrame, deep: pd.DataFrame) -> dict[str, float]:
    """Adaptive (auto) against always-deep, question by question (ok rows of both runs)."""
    auto = auto[auto["status"] == "ok"]
    deep = deep[deep["status"] == "ok"]
    shared = sorted(set(auto["question_id"]) & set(deep["question_id"]))
    a = auto.set_index("question_id").loc[shared]
    d = deep.set_index("question_id").loc[shared]
    success = (a["context_recall"] == 1.0).astype(float)
    table = reliability(a["confidence"], success)
    decisions = pd.Series([final_decision(row.hops) for row in rows_of(a)])
    return {
        "questions": float(len(shared)),
        "tokens_auto": float(a["prompt_tokens"].mean()),
        "tokens_deep": float(d["prompt_tokens"].mean()),
        "savings": 1.0 - float(a["prompt_tokens"].mean()) / float(d["prompt_tokens"].mean()),
        "recall_at_k_auto": float(a["recall_at_k"].mean()),
        "recall_at_k_deep": float(d["recall_at_k"].mean()),
        "context_recall_auto": float(a["context_recall"].mean()),
        "context_recall_deep": float(d["context_recall"].mean()),
        "mean_confidence": float(a["confidence"].mean()),
        "success_rate": float(success.mean()),
        "ece": expected_calibration_error(table),
        "auc": ranking_auc(a["confidence"].tolist(), success.tolist()),
        "needed_2plus_rounds": float(a["needed_2plus_rounds"].mean()),
        "reached_threshold": float(a["reached_threshold"].mean()),
        **{f"depth_{n}": float((a["depth"] == n).mean()) for n in (1, 2, 3)},
        **{f"stop:{name}": float(share) for name, share in decisions.value_counts(True).items()},
    }


def verdict_line(summary: dict[str, float]) -> str:
    """Whether the issue's targets were met on recall@k, and what cumulative recall lost."""
    loss = summary["recall_at_k_deep"] - summary["recall_at_k_auto"]
    saved = summary["savings"]
    met_savings = saved >= TARGET_SAVINGS
    met_recall = loss <= TARGET_RECALL_LOSS + 1e-9
    parts = [
        f"{saved:.1%} fewer prompt tokens than always depth 3 "
        f"({'met' if met_savings else 'missed'}: target >= {TARGET_SAVINGS:.0%}, "
        f"{(saved - TARGET_SAVINGS) * 100:+.1f} points)",
        f"recall@k {summary['recall_at_k_auto']:.3f} vs {summary['recall_at_k_deep']:.3f} "
        f"({(summary['recall_at_k_auto'] - summary['recall_at_k_deep']) * 100:+.1f} points; "
        f"{'met' if met_recall else 'missed'}: at most -1 point)",
        f"cumulative recall of every passage handed to generation "
        f"{summary['context_recall_auto']:.3f} vs {summary['context_recall_deep']:.3f} "
        f"({(summary['context_recall_auto'] - summary['context_recall_deep']) * 100:+.1f} points)",
    ]
    return "; ".join(parts)
