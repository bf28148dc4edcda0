"""Oracle-routing ceiling: what a perfect per-question router over several runs would cost.

For every question that each run answered, the oracle picks the cheapest run (by `cost`: total
prompt + completion `tokens` by default, or `cost_usd`) among those that reached the best quality
(`recall_at_k` by default) any run reached on that question. Its total cost and mean quality,
set against each single run's over the same questions, say how much a router that always knew
the right strategy would save, and at what quality.

Rows are a run's per-question rows (the `questions.json` table the report generator loads from
MLflow, as a DataFrame or as a sequence of mappings). Repeats are averaged per question and failed
rows left out, as in `experiments.scoring.significance`. A question that some run has no ok row for
is left out of every total (so all totals cover the same questions). A question whose quality no run
could measure (unanswerable: no gold passage) goes to the cheapest run and counts in `unscored`; its
cost is in the totals, and mean quality is over the scored questions only.

    from experiments.scoring.oracle import oracle_routing
    result = oracle_routing({"single": rows_a, "multi-hop": rows_b})
    result.summary()          # one row per run + the oracle: cost, quality, saving
    result.choices            # one row per question: the run chosen, its cost and quality
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from experiments.results import metrics as registry
from experiments.results.tables import markdown_table
from experiments.scoring.significance import KEY, question_means

RunRows = pd.DataFrame | Sequence[Mapping[str, Any]]
"""One run's per-question rows: needs `question_id`, the cost and quality columns, and
optionally `status` (non-ok rows are left out), `repeat` and `set`."""

ORACLE = "oracle"
QUALITY_TOLERANCE = 1e-9
"""Runs whose quality is within this of the question's best reached the best."""


class OracleError(ValueError):
    """The runs cannot be routed over (fewer than two, or a column the oracle needs is absent)."""


@dataclass(frozen=True)
class RunTotals:
    """One run (or the oracle) over the routed questions."""

    name: str
    total_cost: float
    mean_cost: float | None
    mean_quality: float | None
    chosen: int
    """Questions the oracle routed to this run (for the oracle itself: all of them)."""


@dataclass(frozen=True)
class OracleResult:
    """The oracle's per-question choices and its totals beside each single run's."""

    cost: str
    quality: str
    runs: tuple[str, ...]
    choices: pd.DataFrame
    """Index question_id; columns: set, run (the chosen one), cost, quality, best_quality,
    scored (False when no run measured quality on the question)."""
    per_run: pd.DataFrame
    """Index question_id; one `<run>.cost` and one `<run>.quality` column per run."""
    left_out: int
    """Questions asked by some run but without an ok row in every run."""

    @property
    def questions(self) -> int:
        """Questions routed."""
        return len(self.choices)

    @property
    def unscored(self) -> int:
        """Routed questions no run measured quality on (routed by cost alone)."""
        return int((~self.choices["scored"]).sum()) if self.questions else 0

    def totals(self) -> list[RunTotals]:
        """Each run's totals over the routed questions, then the oracle's."""
        out = []
        chosen = self.choices["run"].value_counts()
        scored = self.choices["scored"].to_numpy(dtype=bool)
        for name in self.runs:
            cost = self.per_run[f"{name}.cost"]
            quality = self.per_run[f"{name}.quality"][scored]
            out.append(
                RunTotals(
                    name,
                    float(cost.sum()),
                    _mean(cost),
                    _mean(quality),
                    int(chosen.get(name, 0)),
                )
            )
        out.append(
            RunTotals(
                ORACLE,
                float(self.choices["cost"].sum()),
                _mean(self.choices["cost"]),
                _mean(self.choices["quality"][scored]),
                self.questions,
            )
        )
        return out

    def saving(self, name: str) -> float | None:
        """Share of run `name`'s total cost the oracle saves (negative: the oracle costs more)."""
        totals = {t.name: t for t in self.totals()}
        run = totals[name].total_cost
        return None if run == 0 else 1.0 - totals[ORACLE].total_cost / run

    def best_single(self) -> str:
        """The run with the highest mean quality (the cheaper one on a tie)."""
        runs = [t for t in self.totals() if t.name != ORACLE]
        return min(runs, key=lambda t: (-(t.mean_quality or 0.0), t.total_cost)).name

    def summary(self) -> pd.DataFrame:
        """One row per run and one for the oracle: total and mean cost, mean quality, questions
        routed to it, and the oracle's saving against it."""
        rows = []
        for t in self.totals():
            rows.append(
                {
                    "run": t.name,
                    f"total {self.cost}": t.total_cost,
                    f"{self.cost} / question": t.mean_cost,
                    f"mean {self.quality}": t.mean_quality,
                    "routed to it": t.chosen,
                    "oracle saves": None if t.name == ORACLE else self.saving(t.name),
                }
            )
        return pd.DataFrame(rows).set_index("run")

    def by_set(self) -> pd.DataFrame:
        """Per question set: questions, the oracle's mean cost and quality, and its saving
        against each run."""
        frame = self.choices.join(self.per_run)
        rows = []
        for set_name, group in frame.groupby("set", sort=True):
            scored = group["scored"].to_numpy(dtype=bool)
            row: dict[str, Any] = {
                "set": set_name,
                "questions": len(group),
                f"oracle {self.cost} / question": _mean(group["cost"]),
                f"oracle {self.quality}": _mean(group["quality"][scored]),
            }
            for name in self.runs:
                run_cost = float(group[f"{name}.cost"].sum())
                row[f"{name} {self.quality}"] = _mean(group[f"{name}.quality"][scored])
                row[f"saves vs {name}"] = (
                    None if run_cost == 0 else 1.0 - float(group["cost"].sum()) / run_cost
                )
            rows.append(row)
        return pd.DataFrame(rows)


def oracle_routing(
    runs: Mapping[str, RunRows],
    cost: str = "tokens",
    quality: str = "recall_at_k",
    tolerance: float = QUALITY_TOLERANCE,
) -> OracleResult:
    """Route each question to the cheapest run that reached the best quality any run reached.

    Ties on cost go to the run named first in `runs`. See the module docstring for the questions
    left out and those with no quality.
    """
    if len(runs) < 2:
        raise OracleError(f"the oracle routes between at least two runs, got {len(runs)}")
    names = tuple(runs)
    frames = {name: _frame(name, rows, cost, quality) for name, rows in runs.items()}
    means = {name: question_means(frame, [cost, quality]) for name, frame in frames.items()}
    asked = set().union(*(m.index for m in means.values()))
    common = sorted(set.intersection(*(set(m.index[m[cost].notna()]) for m in means.values())))
    per_run = pd.DataFrame(index=pd.Index(common, name=KEY))
    for name in names:
        per_run[f"{name}.cost"] = means[name].loc[common, cost].to_numpy(dtype=float)
        column = means[name][quality] if quality in means[name] else pd.Series(dtype=float)
        per_run[f"{name}.quality"] = column.reindex(common).to_numpy(dtype=float)
    costs = per_run[[f"{n}.cost" for n in names]].to_numpy(dtype=float)
    qualities = per_run[[f"{n}.quality" for n in names]].to_numpy(dtype=float)
    chosen = [_choose(c, q, tolerance) for c, q in zip(costs, qualities, strict=True)]
    best = [float(np.nanmax(q)) if not np.isnan(q).all() else math.nan for q in qualities]
    choices = pd.DataFrame(
        {
            "set": _sets(frames, common),
            "run": [names[i] for i in chosen],
            "cost": [float(costs[r, i]) for r, i in enumerate(chosen)],
            "quality": [float(qualities[r, i]) for r, i in enumerate(chosen)],
            "best_quality": best,
            "scored": [not math.isnan(b) for b in best],
        },
        index=pd.Index(common, name=KEY),
    )
    return OracleResult(cost, quality, names, choices, per_run, left_out=len(asked) - len(common))


def _choose(costs: np.ndarray, qualities: np.ndarray, tolerance: float) -> int:
    """Index of the cheapest run among those at the best quality (any run when none scored)."""
    if np.isnan(qualities).all():
        candidates = list(range(len(costs)))
    else:
        top = float(np.nanmax(qualities))
        candidates = [
            i for i, q in enumerate(qualities) if not np.isnan(q) and q >= top - tolerance
        ]
    return min(candidates, key=lambda i: (costs[i], i))


def _frame(name: str, rows: RunRows, cost: str, quality: str) -> pd.DataFrame:
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    missing = [c for c in (KEY, cost) if c not in frame.columns]
    if missing:
        raise OracleError(f"run {name!r}: its rows have no {', '.join(missing)} column")
    return frame


def _sets(frames: Mapping[str, pd.DataFrame], ids: list[str]) -> list[str]:
    """Each question's set, from the first run whose rows name it ('' when none does)."""
    found: dict[str, str] = {}
    for frame in frames.values():
        if "set" not in frame.columns:
            continue
        for qid, set_name in zip(frame[KEY].astype(str), frame["set"], strict=True):
            found.setdefault(qid, str(set_name))
    return [found.get(qid, "") for qid in ids]


def _mean(values: pd.Series) -> float | None:
    clean = values.dropna()
    return float(clean.mean()) if len(clean) else None


def _share(value: float | None) -> str:
    if value is None or value != value:
        return "—"
    return f"{value:+.1%}" if value < 0 else f"{value:.1%}"


def markdown(result: OracleResult) -> str:
    """The oracle section's tables and a sentence reading them (for `experiments.cli.runs_report`);
    names, units and numbers as the metrics' registry entries write them."""
    cost, quality = registry.get(result.cost), registry.get(result.quality)
    best = result.best_single()
    head = [
        f"Per question, the cheapest run (by {cost.label}) among those that reached the best "
        f"{quality.label} any run reached on it; {result.questions} questions routed"
        + (
            f" ({result.unscored} with no {quality.label}, routed by cost alone)"
            if result.unscored
            else ""
        )
        + (f"; {result.left_out} left out (not answered by every run)" if result.left_out else "")
        + ". `oracle saves` is the share of that run's total the oracle does not spend "
        "(negative: the oracle spends more than that run, for its higher quality).",
        "",
    ]
    rows = [
        [
            t.name,
            cost.display_total(t.total_cost),
            cost.display(t.mean_cost),
            quality.display(t.mean_quality),
            str(t.chosen),
            "—" if t.name == ORACLE else _share(result.saving(t.name)),
        ]
        for t in result.totals()
    ]
    header = ["run", cost.total_heading, cost.heading, quality.heading, "routed to it"]
    table = markdown_table([*header, "oracle saves"], rows)
    totals = {t.name: t for t in result.totals()}
    reading = (
        f"A perfect router would spend {_share(result.saving(best))} less than always "
        f"running {best} (the best single run, {quality.label} "
        f"{quality.display(totals[best].mean_quality)}) and reach {quality.label} "
        f"{quality.display(totals[ORACLE].mean_quality)}."
    )
    lines = [*head, table, "", reading, ""]
    sets = result.by_set()
    if len(sets) > 1:
        set_header = ["set", "questions", f"oracle {cost.heading}", f"oracle {quality.heading}"]
        set_header += [
            h for name in result.runs for h in (f"{name} {quality.heading}", f"saves vs {name}")
        ]
        set_rows = [
            [
                str(row["set"]),
                str(row["questions"]),
                cost.display(row[f"oracle {result.cost} / question"]),
                quality.display(row[f"oracle {result.quality}"]),
                *[
                    cell
                    for name in result.runs
                    for cell in (
                        quality.display(row[f"{name} {result.quality}"]),
                        _share(row[f"saves vs {name}"]),
                    )
                ],
            ]
            for _, row in sets.iterrows()
        ]
        lines += ["By question set:", "", markdown_table(set_header, set_rows), ""]
    return "\n".join(lines)
