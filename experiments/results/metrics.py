"""Every metric the harness knows, once: its name, label, unit, direction and how it is written.

Rows and MLflow keep a metric under its `name` in its own unit (`cost_usd` in dollars per
question); every table, page, gate and report reads the rest from here: `get(name).heading` for
a column or row title, `get(name).display(value)` for a value (cost: dollars per 1,000 questions),
`higher_is_better` for which way is better. A name nobody registered (a new metric before its
registration, an older run's column) still reads: `get` gives it a plain fallback; a per-slice
name (`cost_usd/cross_book`, `recall_at_k/type/bridge`) reads as its metric on that slice.

Adding a metric is one module and one `register(Metric(...))` call in it. A metric with a
`score` function is computed for every answered question by the harness's evaluator (see
`QuestionScore`), then aggregated, logged to MLflow, tabled and shown like the built-in ones. The
module must be imported where the run is built: name it in `+experiment.metric_modules=[...]`
(the harness imports those before it builds anything, worker processes too).

The built-in metrics below are computed in groups by `experiments.scoring.question` (retrieval,
answer, cost, adaptive), `experiments.scoring.ragas_metrics`, `experiments.scoring.judges` and
`experiments.results.aggregate.summary_metrics` (run-level numbers); they carry no `score`.

How a failed question counts (today's rules, kept): it has no value for any metric, so means,
slices, significance and the oracle leave it out and it shows in the metric's coverage
(`57/60`); only when two runs are compared question by question (Regressions) does a failed
question count as `failed_counts_as` where the other run has a value (0 for quality scores: a
question that now fails got worse; None: not scored).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from experiments.results.row import MAX_HOPS_REPORTED

if TYPE_CHECKING:
    import pandas as pd

    from caprag.serve.services import AskResult
    from experiments.results.questions import GoldQuestion

Values = TypeVar("Values", float, "pd.Series[Any]")
Group = Literal["retrieval", "answer", "ragas", "judge", "cost", "adaptive", "run", "other"]
MISSING = "—"
"""How a value that is not there is written."""


@dataclass(frozen=True)
class NotScored:
    """Why a metric has no value for a question: recorded as missing with this reason, never 0."""

    reason: str


QuestionScore = Callable[["GoldQuestion", "AskResult", int], "float | NotScored | None"]
"""A per-question scorer: (the gold question, the answered turn, k) → the value, `NotScored`
with the reason it has none, or None when the metric does not apply to this kind of run (as
adaptive's depth for other strategies: then not even a reason is recorded). An exception is
recorded as the reason (the question is still answered)."""


@dataclass(frozen=True)
class Format:
    """How a number is written: scaled, rounded to `decimals`, after a prefix, with thousands
    separators when `grouping`."""

    decimals: int = 3
    scale: float = 1.0
    prefix: str = ""
    grouping: bool = False

    def __call__(self, value: float) -> str:
        scaled = value * self.scale
        number = f"{abs(scaled):{',' if self.grouping else ''}.{self.decimals}f}"
        sign = "-" if scaled < 0 and number.strip("0.,") else ""
        return f"{sign}{self.prefix}{number}"

    @property
    def printf(self) -> str:
        """The same as a printf format of the scaled value (Streamlit's NumberColumn)."""
        return f"{self.prefix}%.{self.decimals}f"


SHARE = Format(3)
"""Shares and means of shares (0-1): recall, F1, refusal rates…"""
COUNT = Format(1)
"""Means of counts (calls, tokens, passages per question)."""
WHOLE = Format(0)
"""Whole numbers (questions, failures)."""
PER_1K = Format(3, scale=1000.0, prefix="$")
"""Dollars per question, written per 1,000 questions (a question's cost is too small to read)."""
DOLLARS = Format(6)
"""Dollars as they are, to 6 places (a total over some questions; its unit says USD)."""


@dataclass(frozen=True)
class Metric:
    """One metric: what it is called, measured in and written as, which way is better, and where
    it appears."""

    name: str
    """The key in rows, aggregates and MLflow (`recall_at_k`)."""
    label: str
    """The one friendly name every table, page and report shows (`gold-passage recall@k`)."""
    unit: str = ""
    """The unit of the displayed value ('' for shares and plain counts; 's', 'tokens',
    'USD per 1,000 questions')."""
    higher_is_better: bool | None = None
    """Which way is better; None when neither is (counts, depths)."""
    format: Format = SHARE
    """How a value (a per-question value or a mean of them) is written, with its display scale."""
    group: Group = "other"
    description: str = ""
    failed_counts_as: float | None = None
    """A failed question's value when two runs are compared question by question (Regressions)
    and the other run has a value; None: the question is not scored there. Means leave failed
    questions out (see the module docstring)."""
    per_question: bool = True
    """A per-question value (aggregated as a mean); False: a run-level number (`failed`,
    `latency_p95_s`) computed from all rows."""
    listed: bool = True
    """Shown in the run and comparison tables (False: logged, shown only when asked for)."""
    always: bool = False
    """Every answered question has it, as a value or a missing reason: a run keeps it (coverage
    0/N) even when every question failed."""
    sliced: bool = False
    """Logged to MLflow per question set, type and gold hops, and shown in the slice tables."""
    headline: bool = False
    """A main metric: tested by default when two runs are compared, shown with a trace."""
    total: Format | None = None
    """How a sum over questions is written (None: as `format` without its scale)."""
    total_unit: str = ""
    """The unit of such a sum ('' : `unit`)."""
    score: QuestionScore | None = field(default=None, compare=False)
    """Computes the metric per answered question (see `QuestionScore`); None: computed elsewhere."""

    @property
    def heading(self) -> str:
        """The label with its unit, for a table's row or column: 'latency (s)'."""
        return _with_unit(self.label, self.unit)

    @property
    def total_heading(self) -> str:
        """The heading of a sum over questions: 'total cost (USD)'."""
        return _with_unit(f"total {self.label}", self.total_unit or self.unit)

    @property
    def direction(self) -> str:
        """'higher is better', 'lower is better' or ''."""
        if self.higher_is_better is None:
            return ""
        return "higher is better" if self.higher_is_better else "lower is better"

    def display(self, value: float | None) -> str:
        """A value as every view writes it ('—' when missing)."""
        if value is None or math.isnan(value):
            return MISSING
        return self.format(value)

    def display_total(self, value: float | None) -> str:
        """A sum of the metric's per-question values ('—' when missing)."""
        if value is None or math.isnan(value):
            return MISSING
        return (self.total or replace(self.format, scale=1.0))(value)

    def scaled(self, values: Values) -> Values:
        """A value (or a column of them) in the displayed unit (cost: per 1,000 questions)."""
        return values * self.format.scale


def _with_unit(label: str, unit: str) -> str:
    """'latency (s)'; the unit left out when the label already names it ('prompt tokens')."""
    if not unit or unit in label.replace("(", " ").replace(")", " ").split():
        return label
    return f"{label} ({unit})"


_REGISTRY: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Add a metric (or replace the one of that name, keeping its place in the order)."""
    if not metric.name or "/" in metric.name or metric.name.endswith(".coverage"):
        raise ValueError(f"{metric.name!r} cannot be a metric name ('/' and .coverage are taken)")
    _REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    """Forget a metric (a test's own, when it is done)."""
    _REGISTRY.pop(name, None)


def known(name: str) -> bool:
    """Whether a metric of that name is registered."""
    return name in _REGISTRY


def get(name: str) -> Metric:
    """The metric of that name; a per-slice name (`cost_usd/cross_book`) as its metric on the
    slice ('cost · cross_book', written like cost); any other unknown name as itself: label =
    name, no direction, written to 3 places."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    base, _, part = name.partition("/")
    if part and base in _REGISTRY:
        metric = _REGISTRY[base]
        where = part.replace("/", " ")
        return replace(
            metric, name=name, label=f"{metric.label} · {where}", score=None, sliced=False
        )
    return Metric(name=name, label=name, listed=False)


def all() -> list[Metric]:
    """Every registered metric, in display order (registration order)."""
    return list(_REGISTRY.values())


def names(metrics: Iterable[Metric]) -> list[str]:
    """The names of some metrics, in their order."""
    return [m.name for m in metrics]


def listed() -> list[Metric]:
    """The metrics the run and comparison tables show, in display order."""
    return [m for m in _REGISTRY.values() if m.listed]


def per_question() -> list[Metric]:
    """The metrics with a value per question, in display order."""
    return [m for m in _REGISTRY.values() if m.per_question]


def directed() -> list[Metric]:
    """The per-question metrics with a better direction (those one run can beat another on)."""
    return [m for m in per_question() if m.higher_is_better is not None]


def headline() -> list[Metric]:
    """The main metrics: tested by default when runs are compared."""
    return [m for m in _REGISTRY.values() if m.headline]


def sliced() -> list[Metric]:
    """The metrics logged and shown per slice (question set, type, gold hops)."""
    return [m for m in _REGISTRY.values() if m.sliced]


def always() -> list[Metric]:
    """The metrics every answered question has (as a value or a missing reason)."""
    return [m for m in _REGISTRY.values() if m.always]


def scored() -> list[Metric]:
    """The metrics with their own per-question scorer (computed by the evaluator)."""
    return [m for m in _REGISTRY.values() if m.score is not None]


# The built-in metrics, in display order.


def _quality(name: str, label: str, group: Group, description: str, **more: Any) -> Metric:
    """A score where higher is better and a failed question counts as 0 (Regressions)."""
    return Metric(
        name, label, group=group, higher_is_better=True, failed_counts_as=0.0,
        description=description, **more,
    )  # fmt: skip


def _cost(name: str, label: str, unit: str, description: str, **more: Any) -> Metric:
    """What an answer costs (lower is better; every answered question has it)."""
    more.setdefault("higher_is_better", False)
    return Metric(name, label, unit, group="cost", always=True, description=description, **more)


def _run(name: str, label: str, description: str, **more: Any) -> Metric:
    """A run-level number (computed from all rows, not a mean of per-question values)."""
    return Metric(name, label, group="run", per_question=False, description=description, **more)


def _adaptive(name: str, label: str, description: str, **more: Any) -> Metric:
    """What the adaptive strategy decided (no better direction; other strategies have none)."""
    return Metric(name, label, group="adaptive", description=description, **more)


for _metric in (
    _quality(
        "recall_at_k", "gold-passage recall@k", "retrieval",
        "Share of the question's gold passages among the k passages handed to generation "
        "(hops merged, ranked, cut to k).",
        always=True, sliced=True, headline=True,
    ),
    _quality(
        "all_gold_at_k", "all gold passages in k", "retrieval",
        "1 when every gold passage is among the k passages handed to generation.",
        sliced=True, headline=True,
    ),
    _quality(
        "mrr", "MRR", "retrieval",
        "1 / rank of the first gold passage in the context (0 when none is there).",
        always=True, sliced=True, headline=True,
    ),
    _quality(
        "precision_at_k", "precision@k", "retrieval",
        "Share of the first k passages handed to generation that are gold.",
        always=True,
    ),
    _quality(
        "cumulative_recall", "cumulative recall (everything retrieved)", "retrieval",
        "Share of the gold passages among every distinct passage the strategy retrieved, over "
        "all its hops (not only those handed on): what it found, beside what it handed on.",
        always=True, sliced=True, headline=True,
    ),
    _quality(
        "context_recall", "gold passages in context", "retrieval",
        "Share of the gold passages among every passage handed to generation (not cut to k): "
        "adaptive's success when it is 1.",
        listed=False, headline=True,
    ),
    *(
        _quality(
            f"recall_hop{hop}", f"cumulative recall after hop {hop}", "retrieval",
            f"Share of the gold passages among the distinct passages retrieved up to hop {hop} "
            "(carried past the last hop taken).",
            always=True,
        )
        for hop in range(1, MAX_HOPS_REPORTED + 1)
    ),
    _quality(
        "exact_match", "exact match", "answer",
        "1 when the answer equals the gold answer or an alias (SQuAD normalisation).",
        always=True, headline=True,
    ),
    _quality(
        "f1", "token F1", "answer",
        "SQuAD token F1 of the answer against the best of the gold answer and its aliases.",
        always=True, sliced=True, headline=True,
    ),
    _quality(
        "correct_refusal", "correct refusal (unanswerable)", "answer",
        "1 when an unanswerable question's answer says the books do not answer it.",
        always=True, sliced=True,
    ),
    Metric(
        "false_refusal", "false refusal (answerable)", group="answer", higher_is_better=False,
        always=True, sliced=True,
        description="1 when an answerable question's answer says the books do not answer it.",
    ),
    _quality(
        "ragas_context_recall", "RAGAS context recall (non-LLM)", "ragas",
        "RAGAS NonLLMContextRecall against the gold passages' text.",
    ),
    _quality(
        "ragas_context_precision", "RAGAS context precision (non-LLM)", "ragas",
        "RAGAS NonLLMContextPrecisionWithReference against the gold passages' text.",
    ),
    _quality(
        "ragas_string_similarity", "RAGAS string similarity", "ragas",
        "RAGAS NonLLMStringSimilarity of the answer and the reference answer.",
    ),
    _quality(
        "ragas_rouge_l", "RAGAS ROUGE-L", "ragas",
        "RAGAS RougeScore (ROUGE-L) of the answer and the reference answer.",
    ),
    _quality(
        "judge_faithfulness", "judge: faithfulness", "judge",
        "RAGAS Faithfulness by the LLM judge: the share of the answer's claims the context backs.",
    ),
    _quality(
        "judge_answer_relevancy", "judge: answer relevancy", "judge",
        "RAGAS AnswerRelevancy by the LLM judge.",
    ),
    _quality(
        "judge_context_precision", "judge: context precision", "judge",
        "RAGAS ContextPrecision by the LLM judge, against the reference answer.",
    ),
    _cost("hops", "hops", "", "Retrieval rounds the strategy took.", sliced=True, headline=True),
    _adaptive("depth", "adaptive: final depth", "The depth adaptive ended at (1-3)."),
    _adaptive("confidence", "adaptive: final confidence", "Confidence after the last round."),
    _adaptive(
        "reached_threshold", "adaptive: reached its threshold",
        "1 when the final confidence reached the query type's threshold.",
    ),
    _adaptive(
        "needed_2plus_rounds", "adaptive: needed 2+ rounds",
        "1 when adaptive searched deeper than its first depth.",
    ),
    _adaptive(
        "budget_stop", "adaptive: stopped by its budget",
        "1 when adaptive stopped because a token, call or time budget ran out.",
    ),
    _adaptive(
        "classified_as_gold_type", "adaptive: query type = gold type",
        "1 when the classifier's query type is the question's gold type (curated sets only).",
        higher_is_better=True,
    ),
    _cost("retrieval_calls", "retrieval calls", "", "Searches over all hops.", format=COUNT),
    _cost(
        "llm_calls", "LLM calls", "",
        "LLM steps run (a rule step counts as the call it stands in for).",
        format=COUNT,
    ),
    _cost(
        "llm_calls_cached", "LLM calls answered from the cache", "",
        "LLM calls this run took from the response cache (nothing sent).",
        format=COUNT, higher_is_better=None, listed=False,
    ),
    _cost(
        "passages_handed", "passages handed to generation", "",
        "Passages given to the generator: k for most strategies, adaptive's depth ladder "
        "(5 / 15 / 30) for adaptive, so unequal budgets are visible beside every score.",
        format=COUNT, higher_is_better=None, headline=True,
    ),
    _cost(
        "followup_queries", "follow-up queries", "",
        "Queries searched after the first hop (multi-hop's analyzer, adaptive's deeper rounds).",
        format=COUNT,
    ),
    Metric(
        "followup_gold", "gold passages found by follow-ups", group="retrieval",
        higher_is_better=True, format=COUNT, always=True,
        description="Gold passages a follow-up query found that no earlier query had.",
    ),
    Metric(
        "followup_hits", "follow-ups that found gold", group="retrieval",
        higher_is_better=True, format=COUNT, always=True, listed=False,
        description="Follow-up queries that found at least one new gold passage.",
    ),
    _cost(
        "distinct_passages", "distinct passages retrieved", "",
        "Distinct passages retrieved over all hops (before the cut to k).",
        format=COUNT, higher_is_better=None,
    ),
    _cost(
        "prompt_tokens", "prompt tokens", "tokens",
        "Prompt tokens of every LLM step (a rule step: the prompt it stands in for).",
        format=COUNT, sliced=True, total=Format(0, grouping=True),
    ),
    _cost(
        "completion_tokens", "completion tokens", "tokens",
        "Completion tokens of every LLM step.",
        format=COUNT, total=Format(0, grouping=True),
    ),
    _cost(
        "tokens", "tokens", "tokens",
        "Prompt plus completion tokens of every LLM step.",
        format=COUNT, sliced=True, headline=True, total=Format(0, grouping=True),
    ),
    _cost(
        "cost_usd", "cost", "USD per 1,000 questions",
        "What the LLM calls cost at the price table's rates (calls answered from the cache at "
        "their original price): kept per question in dollars, shown per 1,000 questions.",
        format=PER_1K, sliced=True, headline=True, total=DOLLARS, total_unit="USD",
    ),
    _cost(
        "cost_usd_spent", "cost paid", "USD per 1,000 questions",
        "What this run paid: the cost without the calls answered from the cache.",
        format=PER_1K, listed=False, total=DOLLARS, total_unit="USD",
    ),
    _cost(
        "latency_s", "latency", "s", "Seconds from question to answer.",
        sliced=True, headline=True,
    ),
    _run(
        "later_turns_recall_at_k", "recall@k of follow-up turns 2+",
        "Gold-passage recall@k over the second and later turns of conversations.",
        higher_is_better=True,
    ),
    _run(
        "latency_p50_s", "latency p50", "Median latency of the answered questions.",
        unit="s", higher_is_better=False,
    ),
    _run(
        "latency_p95_s", "latency p95", "95th-percentile latency of the answered questions.",
        unit="s", higher_is_better=False,
    ),
    _run(
        "failed", "failed questions", "Questions that raised or timed out (they have no scores).",
        format=WHOLE, higher_is_better=False,
    ),
    _run("questions", "questions", "Questions asked, failed ones included.", format=WHOLE,
         listed=False),
    _run(
        "cost_per_1k_usd", "cost per 1,000 questions (MLflow copy)",
        "The cost mean × 1,000, logged beside cost_usd only so that MLflow's own UI shows a "
        "readable number (overall and per slice); every other view reads cost_usd.",
        unit="USD per 1,000 questions", format=Format(3, prefix="$"), higher_is_better=False,
        listed=False,
    ),
    _run(
        "later_turns", "follow-up turns scored", "Second and later turns with a recall@k.",
        format=WHOLE, listed=False,
    ),
    *(
        _run(
            f"share_hops_{hops}", f"share answered in {hops} hop{'s' if hops > 1 else ''}",
            f"Share of the answered questions that took {hops} hop{'s' if hops > 1 else ''}.",
            listed=False,
        )
        for hops in range(1, MAX_HOPS_REPORTED + 1)
    ),
    _run(
        "followup_yield", "follow-up yield (new gold per follow-up query)",
        "Gold passages found by follow-up queries, per follow-up query, over the whole run (a "
        "ratio of sums: questions with more follow-ups weigh more).",
        higher_is_better=True,
    ),
    _run(
        "followup_hit_share", "share of follow-ups that found gold",
        "Follow-up queries that found at least one new gold passage, over all follow-up queries.",
        higher_is_better=True,
    ),
    *(
        _run(
            f"followup_{what}_hop{hop}", f"hop {hop}: {label}",
            f"{label.capitalize()} of hop {hop}'s follow-up queries, over the whole run.",
            higher_is_better=True, listed=False,
        )
        for hop in range(2, MAX_HOPS_REPORTED + 1)
        for what, label in (("yield", "follow-up yield"), ("hit_share", "share that found gold"))
    ),
    *(
        Metric(
            f"followup_{what}_hop{hop}", f"hop {hop}: {label}", group="retrieval",
            format=COUNT, listed=False,
            description=f"{label.capitalize()} in hop {hop} (per question).",
        )
        for hop in range(2, MAX_HOPS_REPORTED + 1)
        for what, label in (
            ("queries", "follow-up queries"),
            ("gold", "gold passages found by follow-ups"),
            ("hits", "follow-ups that found gold"),
        )
    ),
    _run(
        "reused_cases", "cases reused from an identical run",
        "Cases whose rows came from the row cache of an identical earlier run (experiment.cache).",
        format=WHOLE, listed=False,
    ),
):  # fmt: skip
    register(_metric)
