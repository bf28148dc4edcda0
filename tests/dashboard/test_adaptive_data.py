"""The dashboard's adaptive and oracle views as pure functions, over hand-made runs and rows:
which runs are adaptive and always deep, the savings, the decision log, the deeper questions."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from caprag.trace import HopTrace
from experiments.dashboard import data
from experiments.results.row import QuestionRow
from experiments.scoring.oracle import ORACLE, oracle_routing
from experiments.scoring.significance import PairingError


def raw_runs() -> pd.DataFrame:
    """search_runs-shaped: adaptive auto, two always-deep runs (one older), a depth-1 run, a
    depth-3 run of another dataset, one on another retriever, a multi-hop run, and an
    adaptive run known only by its name (no power param)."""
    ids = ["auto", "deep", "deep_old", "one", "deep_other", "deep_bm25", "hop", "named"]
    return pd.DataFrame(
        {
            "run_id": ids,
            "experiment_id": ["1"] * 8,
            "status": ["FINISHED"] * 8,
            "start_time": pd.to_datetime(
                [f"2026-01-0{day}" for day in (5, 4, 1, 3, 6, 7, 2, 8)], utc=True
            ),
            "tags.mlflow.runName": [
                "x:adaptive power=auto:curated:offline",
                "x:adaptive power=3:curated:offline",
                "x:adaptive power=3:curated:offline",
                "x:adaptive power=1:curated:offline",
                "x:adaptive power=3:hotpotqa:offline",
                "x:adaptive power=3:curated:offline:bm25",
                "x:multi-hop:curated:offline",
                "y:adaptive power=3:curated:offline",
            ],
            "tags.caprag.strategy": ["adaptive"] * 6 + ["multi-hop", "adaptive"],
            "tags.caprag.dataset": ["curated"] * 4 + ["hotpotqa"] + ["curated"] * 3,
            "tags.caprag.llm": ["offline"] * 8,
            "tags.caprag.retriever": ["minilm"] * 5 + ["bm25"] + ["minilm"] * 2,
            "params.strategy.power": ["auto", "3", "3", "1", "3", "3", None, None],
        }
    )


def test_runs_frame_reads_the_power_from_the_param_or_else_the_run_name() -> None:
    runs = data.runs_frame(raw_runs()).set_index("run_id")
    assert runs["power"].to_dict() == {
        "auto": "auto", "deep": "3", "deep_old": "3", "one": "1", "deep_other": "3",
        "deep_bm25": "3", "hop": None, "named": "3",
    }  # fmt: skip
    assert list(data.adaptive_runs(runs.reset_index())["run_id"]) == ["auto"]
    assert data.adaptive_runs(data.runs_frame(pd.DataFrame())).empty


def test_always_deep_run_has_the_same_dataset_backend_and_retriever_latest_first() -> None:
    runs = data.runs_frame(raw_runs())
    auto = runs.set_index("run_id", drop=False).loc["auto"]
    assert data.always_deep_run(runs, auto)["run_id"] == "named"  # the latest matching
    assert data.always_deep_run(runs, auto, prefer=["deep_old", "hop"])["run_id"] == "deep_old"
    assert data.always_deep_run(runs, auto, prefer=["deep_bm25"])["run_id"] == "named"
    alone = runs[~runs["run_id"].isin(["deep", "deep_old", "named"])]
    assert data.always_deep_run(alone, auto) is None  # other dataset / retriever do not count
    assert data.always_deep_run(runs.drop(columns="power"), auto) is None


def row(qid: str, prompt: float, usd: float, recall: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "question_id": qid,
        "status": extra.pop("status", "ok"),
        "prompt_tokens": prompt,
        "cost_usd": usd,
        "recall_at_k": recall,
        **extra,
    }


def test_savings_pair_questions_average_repeats_and_leave_out_the_unpaired() -> None:
    adaptive = pd.DataFrame(
        [
            row("q1", 100, 0.01, 1.0),
            row("q2", 300, 0.03, 0.5, repeat=0),
            row("q2", 500, 0.05, 1.0, repeat=1),  # q2: 400 tokens, 0.04 USD, recall 0.75
            row("q3", 999, 0.99, 0.0, status="failed"),
            row("q4", 50, 0.005, None),  # unanswerable: cost counts, no recall
        ]
    )
    deep = pd.DataFrame(
        [
            *(row(qid, 500, 0.05, 1.0) for qid in ("q1", "q2", "q3")),
            row("q4", 100, 0.01, None),
            row("q5", 100, 0.01, 1.0),
        ]
    )
    saved = data.savings_vs_deep(adaptive, deep)
    assert saved.questions == 3 and saved.left_out == 2  # q3 failed in adaptive, q5 only deep
    assert saved.prompt_tokens == (550.0, 1100.0)
    assert saved.cost_usd == pytest.approx((0.055, 0.11))
    assert saved.token_saving == pytest.approx(0.5) and saved.cost_saving == pytest.approx(0.5)
    assert saved.recall_at_k == (pytest.approx(0.875), 1.0)
    assert data.saving_text(saved.token_saving, "prompt tokens") == "50.0% fewer prompt tokens"
    more = data.savings_vs_deep(deep.iloc[:1], adaptive.iloc[:1])
    assert data.saving_text(more.cost_saving, "cost") == "400.0% more cost"


def test_savings_explain_what_cannot_be_computed() -> None:
    free = pd.DataFrame([row("q1", 0, 0.0, None)])
    saved = data.savings_vs_deep(free, free)
    assert saved.token_saving is None and saved.recall_at_k == (None, None)
    assert data.saving_text(saved.token_saving, "tokens").startswith("— (nothing spent")
    with pytest.raises(PairingError, match="no `question_id` column"):
        data.savings_vs_deep(free.drop(columns="question_id"), free)


def hop(number: int, depth: int | None, confidence: float, decision: str) -> HopTrace:
    return HopTrace(
        hop=number, depth=depth, chunks=5 * number, confidence=confidence, threshold=0.9,
        adaptive_decision=decision, queries=["q"],
    )  # fmt: skip


def test_decision_log_lists_each_adaptive_round() -> None:
    log = data.decision_log([hop(1, 1, 0.7, "increase_depth"), hop(2, 2, 0.92, "sufficient")])
    assert log.to_dict("records") == [
        {"round": 1, "depth": 1, "chunks": 5, "confidence": 0.7, "threshold": 0.9,
         "decision": "increase_depth"},
        {"round": 2, "depth": 2, "chunks": 10, "confidence": 0.92, "threshold": 0.9,
         "decision": "sufficient"},
    ]  # fmt: skip
    shown = data.decision_table(log)
    assert list(shown["round"]) == [1, 2] and list(shown["confidence"]) == ["70%", "92%"]
    assert data.decision_log([HopTrace(hop=1, queries=["a multi-hop hop"])]).empty


def test_deeper_questions_are_those_past_their_first_depth_with_their_rounds() -> None:
    def question(qid: str, hops: list[HopTrace] | None) -> dict[str, Any]:
        return QuestionRow(
            case_id=qid, question_id=qid, set="s", query_type="factual", turn=1,
            question=f"{qid}?", gold_answer="", hops=hops or [], values={"recall_at_k": 1.0},
        ).record()  # fmt: skip

    table = pd.DataFrame(
        [
            question("stops", [hop(1, 1, 0.95, "sufficient")]),
            question(
                "deeper",
                [
                    hop(1, 1, 0.6, "increase_depth"),
                    hop(2, 2, 0.7, "increase_depth"),
                    hop(3, 3, 0.8, "budget_exhausted:depth"),
                ],
            ),
            question("forced", [hop(1, 3, 0.5, "forced_depth")]),
            question("old", None),
            question(
                "timed out",
                [hop(1, 2, 0.6, "increase_depth"), hop(2, 2, 0.6, "budget_exhausted:timeout")],
            ),
        ],
        index=[10, 11, 12, 13, 14],
    )
    deeper = data.deeper_questions(table)
    assert list(deeper.index) == [11]  # the row of the table, to open its trace
    found = deeper.loc[11]
    assert found["rounds"] == 3 and found["depths"] == "1 → 2 → 3"
    assert found["confidences"] == "60% → 70% → 80%" and found["threshold"] == "90%"
    assert found["decisions"] == "increase_depth → increase_depth → budget_exhausted:depth"
    assert data.deeper_questions(table.drop(index=11)).empty


def test_oracle_summary_puts_the_router_last_with_what_it_saves() -> None:
    single = [row("q1", 0, 0, 1.0, tokens=100), row("q2", 0, 0, 0.5, tokens=100)]
    deep = [row("q1", 0, 0, 1.0, tokens=400), row("q2", 0, 0, 1.0, tokens=400)]
    summary = data.oracle_summary(oracle_routing({"single": single, "deep": deep}))
    assert list(summary["run"]) == ["single", "deep", ORACLE]
    assert list(summary["total"]) == [200, 800, 500] and list(summary["routed"]) == [1, 1, 2]
    assert list(summary["recall"]) == [0.75, 1.0, 1.0]
    assert summary["saves"].tolist()[:2] == [pytest.approx(-1.5), pytest.approx(0.375)]
    assert pd.isna(summary["saves"].iloc[-1])
    assert data.oracle_cell(1234.4, "tokens", total=True) == "1,234 tokens"
    assert data.oracle_cell(0.00012, "cost_usd", total=True) == "0.000120 USD"
    assert data.oracle_cell(0.00012, "cost_usd") == "$0.120"  # per question: per 1,000 questions
    assert data.oracle_cell(None, "") == "—"
    shown = data.oracle_display(summary, "tokens")
    assert list(shown["saves"]) == ["150.0% more tokens", "37.5% fewer tokens", "—"]
