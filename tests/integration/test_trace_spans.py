"""What a question's MLflow trace carries: tags to filter by, scores as assessments, passage texts,
LLM calls in the chat format, and a trace for a failed question (written to a SQLite store and
read back through MLflow)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow.entities import Expectation, Feedback
from mlflow.tracing.constant import SpanAttributeKey

from caprag.schemas import CallUsage, Document, RetrievedRef
from caprag.serve.services import AskResult
from caprag.steps.analyze import SufficiencyDecision
from caprag.trace import HopTrace
from experiments.results import traces
from experiments.results.row import PASSAGE_CHARS, PassageInfo, QuestionRow


@pytest.fixture
def target(tmp_path: Path) -> traces.Target:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("spans", artifact_location=(tmp_path / "a").as_uri())
    return traces.Target(uri, experiment, client.create_run(experiment).info.run_id, "multi-hop")


def written(row: QuestionRow, target: traces.Target) -> mlflow.entities.Trace:
    """The row's trace as MLflow stores it."""
    assert [w.case for w in traces.write_traces([row], target)] == [traces.case_of(row)]
    trace_id = traces.find_trace(target, traces.case_of(row))
    assert trace_id is not None
    return mlflow.MlflowClient(target.uri).get_trace(trace_id)


MESSAGES = [
    {"role": "system", "content": "You decide whether passages suffice."},
    {"role": "user", "content": "Question: Flurry penalty?\n\nPassages: ..."},
]
REPLY = '{"sufficient": false, "new_queries": ["Old Soldier"]}'


def doc(pid: str, new: bool = True) -> RetrievedRef:
    return RetrievedRef(passage_id=pid, book_id=pid.split("/")[0], page=3, score=0.5, new=new)


def answered() -> QuestionRow:
    """A two-hop answered question with one model call and one rule call."""
    now = time.time_ns()
    analyze = CallUsage(
        step="analyze",
        model="gpt-4o-mini",
        prompt_tokens=400,
        completion_tokens=30,
        latency_s=0.01,
        messages=MESSAGES,
        reply=REPLY,
    )
    generate = CallUsage(
        step="generate",
        model="offline",
        prompt_version="generate-v2",
        prompt_tokens=100,
        completion_tokens=10,
    )
    return QuestionRow(
        case_id="c1",
        question_id="t-cb-1",
        set="cross_book",
        query_type="factual",
        turn=2,
        question="Flurry penalty?",
        gold_answer="-4",
        answer="-4.",
        context_ids=["fighting/flurry", "gifts/old-soldier"],
        gold_ids=["fighting/flurry"],
        values={"recall_at_k": 0.5, "all_gold_at_k": 0.0, "mrr": 1.0, "f1": 0.8},
        missing={"correct_refusal": "question is answerable"},
        started_ns=now,
        timings={"total": 0.05},
        hops=[
            HopTrace(
                hop=1,
                queries=["flurry"],
                documents=[doc("fighting/flurry")],
                usage=[analyze.model_copy(update={"messages": None, "reply": None})],
                latency_s=0.02,
                decision=SufficiencyDecision(sufficient=False),
            ),
            HopTrace(
                hop=2,
                queries=["old soldier"],
                latency_s=0.01,
                documents=[doc("fighting/flurry", new=False), doc("gifts/old-soldier")],
            ),
        ],
        passages={
            "fighting/flurry": PassageInfo(
                book_id="fighting", page=3, section="Flurry", text="Two attacks."
            ),
            "gifts/old-soldier": PassageInfo(book_id="gifts", page=3, text="Halves the penalty."),
        },
        calls=[analyze, generate],
    )


def spans_by_name(trace: mlflow.entities.Trace) -> dict[str, Any]:
    return {span.name: span for span in trace.data.spans}


def root_of(trace: mlflow.entities.Trace) -> Any:
    return next(span for span in trace.data.spans if span.parent_id is None)


def test_a_trace_is_tagged_with_what_the_trace_list_filters_by(target: traces.Target) -> None:
    trace = written(answered(), target)
    assert (
        trace.info.tags.items()
        >= {
            traces.CASE_TAG: "0:t-cb-1",
            "caprag.question_id": "t-cb-1",
            "caprag.set": "cross_book",
            "caprag.query_type": "factual",
            "caprag.turn": "2",
            "caprag.status": "ok",
            "caprag.strategy": "multi-hop",
            "mlflow.traceName": "t-cb-1 · cross_book · multi-hop",
        }.items()
    )
    assert root_of(trace).name == "t-cb-1 · cross_book · multi-hop"
    # the trace list's Tokens and Run columns: usage summed from the chat spans, the source run
    # (the rule step's tokens too: the ones it is priced by, as if its prompt were sent)
    assert trace.info.token_usage == {"input_tokens": 500, "output_tokens": 40, "total_tokens": 540}
    assert trace.info.trace_metadata["mlflow.sourceRun"] == target.run_id
    found = mlflow.search_traces(
        locations=[target.experiment_id],
        filter_string="tags.`caprag.set` = 'cross_book'",
        return_type="list",
    )
    assert [t.info.trace_id for t in found] == [trace.info.trace_id]


def test_every_score_is_a_code_feedback_and_a_missing_one_keeps_its_reason(
    target: traces.Target,
) -> None:
    row = answered()
    row.values["latency_s"] = float("nan")
    trace = written(row, target)
    found = trace.info.assessments
    feedback = {a.name: a for a in found if isinstance(a, Feedback)}
    scored = {name: a.value for name, a in feedback.items() if a.error is None}
    assert scored == {"recall_at_k": 0.5, "all_gold_at_k": 0.0, "mrr": 1.0, "f1": 0.8}
    errors = {name: a.error.error_message for name, a in feedback.items() if a.error}
    assert errors == {
        "correct_refusal": "question is answerable",
        "latency_s": "not a number (nan)",
    }
    expected = {a.name: a.value for a in found if isinstance(a, Expectation)}
    assert expected == {"gold_answer": "-4", "gold_passages": ["fighting/flurry"]}
    assert {a.source.source_type for a in found} == {"CODE"}
    assert {a.trace_id for a in found} == {trace.info.trace_id}
    assert all(a.metadata == {"mlflow.assessment.sourceRunId": target.run_id} for a in found)
    # Writing the trace again replaces it, its assessments with it.
    again = written(answered(), target)
    assert traces.traced_cases(target) == {"0:t-cb-1"}
    assert len(again.info.assessments) == len(found) - 1  # no latency_s this time


def test_hop_spans_carry_their_documents_with_passage_text_in_retriever_format(
    target: traces.Target,
) -> None:
    spans = spans_by_name(written(answered(), target))
    hop1, hop2, retrieve = spans["hop 1"], spans["hop 2"], spans["retrieve"]
    assert hop1.outputs == [
        {
            "page_content": "Two attacks.",
            "metadata": {"passage_id": "fighting/flurry", "book_id": "fighting", "page": 3,
                         "score": 0.5, "new": True, "query": 0, "gold": True, "section": "Flurry"},
            "id": "fighting/flurry",
        }
    ]  # fmt: skip
    # The row keeps a passage's text once; every span that shows the passage gets it.
    assert [d["page_content"] for d in hop2.outputs] == ["Two attacks.", "Halves the penalty."]
    assert [d["metadata"]["gold"] for d in hop2.outputs] == [True, False]
    assert [d["page_content"] for d in retrieve.outputs] == ["Two attacks.", "Halves the penalty."]
    assert hop1.attributes["decision"] == {"sufficient": False, "new_queries": [], "reasoning": ""}
    assert hop1.attributes["prompt_tokens"] == "400"  # from the hop's usage


def test_a_model_call_is_a_chat_span_with_its_messages_and_reply(target: traces.Target) -> None:
    spans = spans_by_name(written(answered(), target))
    call = spans["llm analyze"]
    assert call.span_type == "CHAT_MODEL"
    assert call.inputs == {"model": "gpt-4o-mini", "messages": MESSAGES}
    assert call.outputs["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert call.attributes[traces.CHAT_MESSAGES] == [
        *MESSAGES,
        {"role": "assistant", "content": REPLY},
    ]
    assert call.attributes[SpanAttributeKey.CHAT_USAGE] == {
        "input_tokens": 400,
        "output_tokens": 30,
        "total_tokens": 430,
    }
    rule = spans["llm generate"]
    assert rule.inputs == {"rule": "no call (generate-v2)"}
    assert traces.CHAT_MESSAGES not in rule.attributes
    assert rule.attributes[SpanAttributeKey.CHAT_USAGE] == {
        "input_tokens": 100,
        "output_tokens": 10,
        "total_tokens": 110,
    }


def test_a_failed_question_gets_an_error_trace_with_the_calls_it_made(
    target: traces.Target,
) -> None:
    row = answered()
    row.status, row.error = "failed", "StructuredOutputError: could not parse the reply"
    row.hops, row.values, row.missing = [], {}, {}
    assert row.calls is not None
    row.calls = [row.calls[0].model_copy(update={"reply": "{not json", "error": "could not parse"})]
    row.timings = {"total": 0.5}
    trace = written(row, target)
    root = root_of(trace)
    assert root.status.status_code == "ERROR"
    assert root.status.description == row.error
    (event,) = root.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "StructuredOutputError"
    assert event.attributes["exception.message"] == "could not parse the reply"
    assert (root.end_time_ns or 0) - root.start_time_ns == pytest.approx(0.5e9, abs=1e6)
    call = spans_by_name(trace)["llm analyze"]
    assert call.outputs["choices"][0]["message"]["content"] == "{not json"
    assert call.attributes["error"] == "could not parse"
    assert trace.info.tags["caprag.status"] == "failed"
    assert trace.info.state.value == "ERROR"
    # No score was computed; the gold answer is still there to compare with.
    assert {a.name for a in trace.info.assessments} == {"gold_answer", "gold_passages"}


def test_a_timed_out_question_s_error_has_no_exception_name(target: traces.Target) -> None:
    row = answered()
    row.status, row.error, row.calls, row.hops = "failed", "timed out after 120s", [], []
    (event,) = root_of(written(row, target)).events
    assert event.attributes["exception.type"] == "Error"
    assert event.attributes["exception.message"] == "timed out after 120s"


def test_a_question_s_trace_is_found_by_its_run_and_case(target: traces.Target) -> None:
    trace = written(answered(), target)
    assert traces.find_trace(target, "0:t-cb-1") == trace.info.trace_id
    assert traces.find_trace(target, "1:t-cb-1") is None
    assert traces.trace_ids(target) == {"0:t-cb-1": trace.info.trace_id}


def test_the_row_keeps_each_passage_s_text_once_and_cuts_a_long_one() -> None:
    long = "x" * (PASSAGE_CHARS + 50)
    flurry = Document(passage_id="fighting/flurry", book_id="fighting", text="Two attacks.")
    sent = CallUsage(step="analyze", model="m", messages=MESSAGES, reply=REPLY)
    hops = [
        HopTrace(
            hop=1, queries=["a"], documents=[ref("fighting/flurry"), ref("big/one")], usage=[sent]
        ),
        HopTrace(hop=2, queries=["b"], documents=[ref("fighting/flurry"), ref("gifts/x")]),
    ]
    result = AskResult(
        question="q", main_question="q", answer="a", sources=[], thread_id="t", strategy="s",
        hops=hops, context=[flurry], usage=[sent], prompt_tokens=0, completion_tokens=0,
        cost_usd=0.0, latency_s=0.0,
    )  # fmt: skip
    row = QuestionRow(
        case_id="c", question_id="q", set="s", query_type="factual", turn=1, question="q",
        gold_answer="", gold_ids=["gifts/x"],
    )  # fmt: skip
    # Texts from the index where it has them, else from the context handed to generation.
    index = {"big/one": long, "gifts/x": "Gift."}
    row.add_answer(result, {"gifts/x": "Gifts"}, lambda pid: index.get(pid, ""))
    assert {pid: p.text for pid, p in row.passages.items()} == {
        "fighting/flurry": "Two attacks.",
        "big/one": "x" * PASSAGE_CHARS + "…",
        "gifts/x": "Gift.",
    }
    assert row.passage("gifts/x").section == "Gifts" and row.passage("big/one").book_id == "big"
    assert row.retrieved_ids() == ["fighting/flurry", "big/one", "gifts/x"]
    assert [row.is_gold(pid) for pid in row.retrieved_ids()] == [False, False, True]
    # The messages and reply are kept once, in the row's calls; the hop keeps the call's cost.
    assert row.calls == [sent]
    assert row.hops[0].usage[0].messages is None and row.hops[0].usage[0].reply is None
    assert result.hops[0].usage[0].messages == MESSAGES  # the answer itself is left as it was


def ref(pid: str) -> RetrievedRef:
    return RetrievedRef(passage_id=pid, book_id=pid.split("/")[0], page=1, score=0.1, new=True)
