"""How fast the dashboard's pages open over a large store (200 runs × 300 question rows).

The store is filled with the real logging functions (experiments.results.tracking) from synthetic
rows, so every run has real metrics and a real `questions.json` table (no MLflow traces).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from caprag.config import PROJECT_ROOT
from caprag.schemas import RetrievedRef
from caprag.steps.analyze import SufficiencyDecision
from caprag.trace import HopTrace
from experiments.results import tracking
from experiments.results.aggregate import aggregate, summary_metrics
from experiments.results.row import PassageInfo, QuestionRow

APP = PROJECT_ROOT / "experiments" / "dashboard" / "app.py"
PAGES = {
    "Runs": "views/runs.py",
    "Compare (4 runs)": "views/compare.py",
    "Trace viewer": "views/trace.py",
    "Ask": "views/ask.py",
}
STRATEGIES = ("single", "multi-question", "multi-hop")
SETS = ("single_book", "cross_book", "follow_up")


def synthetic_rows(rng: random.Random, strategy: str, questions: int) -> list[QuestionRow]:
    """Question rows shaped like the harness's own, with hop traces of plausible size."""
    rows = []
    for n in range(questions):
        hops = 1 if strategy != "multi-hop" else rng.choice((1, 2, 2, 3))
        gold = [f"book{n % 5}/gold-{n}", f"book{(n + 1) % 5}/gold-{n}"]
        hop_traces = [
            HopTrace(
                hop=h,
                queries=[f"query {h} of question {n}"],
                documents=[
                    RetrievedRef(
                        passage_id=f"book{d % 5}/passage-{n}-{h}-{d}",
                        book_id=f"book{d % 5}",
                        page=d + 1,
                        score=round(rng.random(), 4),
                        new=True,
                    )
                    for d in range(8)
                ],
                new_documents=8,
                duplicate_documents=0,
                decision=SufficiencyDecision(sufficient=h == hops),
                latency_s=0.1,
            )
            for h in range(1, hops + 1)
        ]
        passages = {
            ref.passage_id: PassageInfo(
                book_id=ref.book_id, page=ref.page, section=f"Passage {ref.page - 1}"
            )
            for hop in hop_traces
            for ref in hop.documents
        }
        recall = rng.choice((0.0, 0.5, 1.0))
        tokens = 300.0 * hops + rng.random() * 200
        rows.append(
            QuestionRow(
                case_id=f"q-{n}",
                question_id=f"q-{n}",
                set=SETS[n % len(SETS)],
                query_type=("factual", "strategic", "decision")[n % 3],
                turn=1,
                question=f"Synthetic question number {n} about rules?",
                gold_answer="an answer",
                main_question=f"Synthetic question number {n} about rules?",
                answer="an answer, probably",
                context_ids=[d.passage_id for d in hop_traces[-1].documents],
                gold_ids=gold,
                values={
                    "recall_at_k": recall,
                    "all_gold_at_k": float(recall == 1.0),
                    "precision_at_k": recall / 4,
                    "mrr": recall,
                    **{f"recall_hop{h}": min(1.0, recall * h / hops) for h in range(1, 4)},
                    "f1": rng.random(),
                    "exact_match": 0.0,
                    "hops": float(hops),
                    "llm_calls": float(hops + 1),
                    "retrieval_calls": float(hops),
                    "prompt_tokens": tokens * 0.9,
                    "completion_tokens": tokens * 0.1,
                    "tokens": tokens,
                    "cost_usd": tokens * 2e-7,
                    "latency_s": 0.2 * hops,
                    "distinct_passages": 8.0 * hops,
                },
                hops=hop_traces,
                passages=passages,
                timings={"rewrite": 0.0, "retrieve": 0.2 * hops, "generate": 0.05},
            )
        )
    return rows


def fill_store(uri: str, runs: int, questions: int) -> float:
    """Log `runs` runs of `questions` rows each; return the seconds it took."""
    start = time.perf_counter()
    experiment = tracking.use_experiment(uri, "caprag")
    rng = random.Random(7)
    for n in range(runs):
        strategy = STRATEGIES[n % len(STRATEGIES)]
        rows = synthetic_rows(rng, strategy, questions)
        tags = {
            "caprag.strategy": strategy,
            "caprag.dataset": ("curated", "cross_book")[n % 2],
            "caprag.llm": "offline",
            "caprag.schema": "1",
        }
        with tracking.mlflow.start_run(experiment_id=experiment, run_name=f"bench-{n}", tags=tags):
            tracking.log_config({"strategy": {"name": strategy}, "retriever": {"k": 8}})
            tracking.log_results(rows, aggregate(rows), summary_metrics(rows))
    return time.perf_counter() - start


def open_page(page: str, **state: Any) -> float:
    """Seconds for one AppTest pass that opens `page` (the app's first pass included)."""
    from streamlit.testing.v1 import AppTest

    start = time.perf_counter()
    at = AppTest.from_file(str(APP), default_timeout=600)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    if page != PAGES["Runs"]:
        at.switch_page(page).run()
    if at.exception:
        raise RuntimeError(f"{page}: {at.exception[0].value}")
    return time.perf_counter() - start


def bench_dashboard(runs: int = 200, questions: int = 300) -> dict[str, object]:
    """Fill a temporary store, then time each page's first (uncached) and cached open."""
    import streamlit as st
    from streamlit.logger import set_log_level

    set_log_level("error")  # AppTest's "no runtime" / "missing ScriptRunContext" notes
    with tempfile.TemporaryDirectory() as folder:
        uri = f"sqlite:///{Path(folder) / 'mlruns.db'}"
        fill_s = fill_store(uri, runs, questions)
        previous = os.environ.get("MLFLOW_TRACKING_URI")
        os.environ["MLFLOW_TRACKING_URI"] = uri
        try:
            tracking.mlflow.set_tracking_uri(uri)
            latest = tracking.mlflow.search_runs(
                order_by=["start_time DESC"], max_results=4, output_format="list"
            )
            state = {"selected_runs": [r.info.run_id for r in latest]}
            open_page(PAGES["Ask"])  # imports and Streamlit's own start-up, not counted
            timings = {}
            for title, page in PAGES.items():
                st.cache_data.clear()  # drops every cached MLflow read of the dashboard
                first = open_page(page, **state)
                cached = open_page(page, **state)
                timings[title] = {"first_s": round(first, 2), "cached_s": round(cached, 2)}
        finally:
            if previous is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = previous
    lines = [
        f"Store: {runs} runs × {questions} question rows (real `questions.json` tables and "
        f"metrics, logged in {fill_s:.0f} s). Time to open each page with Streamlit's AppTest "
        "(one full script pass); first = MLflow caches empty, cached = opened again.",
        "",
        "| page | first open | cached open |",
        "|---|---|---|",
        *(f"| {t} | {v['first_s']} s | {v['cached_s']} s |" for t, v in timings.items()),
    ]
    return {
        "markdown": "\n".join(lines),
        "runs": runs,
        "questions_per_run": questions,
        "fill_s": round(fill_s, 1),
        "pages": timings,
    }


if __name__ == "__main__":
    print(bench_dashboard()["markdown"])
