"""From rows to a run's numbers: metric means with coverage, run summaries, failures by kind."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from experiments.results import metrics as registry
from experiments.results.row import MAX_HOPS_REPORTED, QuestionRow


@dataclass(frozen=True)
class Aggregate:
    """A metric's mean over the questions that have it, and how many do."""

    name: str
    mean: float | None
    n: int
    total: int
    missing_reasons: dict[str, int]

    @property
    def coverage(self) -> str:
        """'57/60'."""
        return f"{self.n}/{self.total}"


def aggregate(
    rows: Sequence[QuestionRow], expected: Sequence[str] | None = None
) -> dict[str, Aggregate]:
    """Mean of each metric over the rows that have it; failed rows count in the total.

    The `expected` metrics (default: those registered as `always`, which every answered question
    has as a value or a missing reason) are there even when no row has them (every question
    failed): their coverage is 0/N with the failures as the reason, not an empty table.
    """
    if expected is None:
        expected = registry.names(registry.always())
    names: list[str] = []
    for row in rows:
        names += [n for n in [*row.values, *row.missing] if n not in names]
    if rows:
        names += [n for n in expected if n not in names]
    result: dict[str, Aggregate] = {}
    for name in names:
        present = [
            r.values[name] for r in rows if name in r.values and not math.isnan(r.values[name])
        ]
        reasons: dict[str, int] = {}
        for row in rows:
            if name in row.values:
                continue
            reason = row.missing.get(name) or (f"question failed: {row.error}" if row.error else "")
            key = reason.split(":")[0] if reason.startswith("question failed") else reason
            reasons[key or "not computed"] = reasons.get(key or "not computed", 0) + 1
        result[name] = Aggregate(
            name=name,
            mean=statistics.fmean(present) if present else None,
            n=len(present),
            total=len(rows),
            missing_reasons=reasons,
        )
    return result


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0-1) by linear interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary_metrics(rows: Sequence[QuestionRow]) -> dict[str, float]:
    """Run-level numbers beyond means: failures, latency percentiles, hop distribution."""
    ok = [r for r in rows if r.status == "ok"]
    latencies = [r.values["latency_s"] for r in ok if "latency_s" in r.values]
    out: dict[str, float] = {
        "questions": float(len(rows)),
        "failed": float(len(rows) - len(ok)),
    }
    for label, q in (("p50", 0.5), ("p95", 0.95)):
        value = percentile(latencies, q)
        if value is not None:
            out[f"latency_{label}_s"] = value
    later = [r.values["recall_at_k"] for r in ok if r.turn > 1 and "recall_at_k" in r.values]
    if later:
        out["later_turns_recall_at_k"] = statistics.fmean(later)
        out["later_turns"] = float(len(later))
    for hops in range(1, MAX_HOPS_REPORTED + 1):
        out[f"share_hops_{hops}"] = (
            sum(1 for r in ok if r.values.get("hops") == hops) / len(ok) if ok else 0.0
        )
    out.update(follow_up_rates(ok))
    return out


def follow_up_rates(rows: Sequence[QuestionRow]) -> dict[str, float]:
    """The run's follow-up yield (new gold passages per follow-up query) and the share of
    follow-ups that found gold, overall and per hop: ratios of the rows' sums (none when no
    follow-up query was searched)."""
    out: dict[str, float] = {}
    for suffix in ("", *(f"_hop{hop}" for hop in range(2, MAX_HOPS_REPORTED + 1))):
        queries = sum(r.values.get(f"followup_queries{suffix}", 0.0) for r in rows)
        if queries:
            gold = sum(r.values.get(f"followup_gold{suffix}", 0.0) for r in rows)
            hits = sum(r.values.get(f"followup_hits{suffix}", 0.0) for r in rows)
            out[f"followup_yield{suffix}"] = gold / queries
            out[f"followup_hit_share{suffix}"] = hits / queries
    return out


@dataclass(frozen=True)
class Failures:
    """The failed questions of a run, grouped by kind of error (most common first)."""

    failed: int
    total: int
    kinds: list[tuple[str, int, str]]
    """(kind, count, the first message of that kind) per kind of error."""

    @property
    def all_failed(self) -> bool:
        """Every question of a non-empty run failed: there is no result to read."""
        return self.total > 0 and self.failed == self.total

    def most_common(self, width: int = 160) -> str:
        """'3 of 4: StructuredOutputError: could not parse ...' (the first message of the most
        common kind), cut to `width` characters."""
        if not self.kinds:
            return ""
        _kind, count, message = self.kinds[0]
        text = f"{count} of {self.failed}: {message}"
        return text if len(text) <= width else text[: width - 1] + "…"


def failures(rows: Sequence[QuestionRow]) -> Failures:
    """Count the failed rows by the kind of their error (its exception name, or 'timed out')."""
    found: dict[str, tuple[int, str]] = {}
    for row in rows:
        if row.status == "ok":
            continue
        error = row.error or "no error recorded"
        kind = "timed out" if error.startswith("timed out") else error.split(":", 1)[0]
        count, first = found.get(kind, (0, error))
        found[kind] = (count + 1, first)
    kinds = sorted(
        ((kind, count, first) for kind, (count, first) in found.items()), key=lambda k: -k[1]
    )
    failed = sum(count for _, count, _ in kinds)
    return Failures(failed=failed, total=len(rows), kinds=kinds)
