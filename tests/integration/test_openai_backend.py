"""The openai backend through real HTTP against a local OpenAI-protocol stub on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from caprag.config import load_settings
from caprag.errors import MissingAPIKeyError, StructuredOutputError
from caprag.llm import StepFailedError, build_openai_client
from caprag.llm.budget import CHARS_PER_TOKEN, retry_cap
from caprag.retrieval.store import PassageIndex
from caprag.serve.services import Pipeline, build_pipeline
from caprag.steps.analyze import SufficiencyDecision
from caprag.strategies import MultiHopStrategy
from experiments.support.openai_stub import StubServer
from tests.fakes import FLURRY as DOC
from tests.fakes import openai_steps


def llm_for(stub: StubServer, **kwargs: object):  # type: ignore[no-untyped-def]
    return openai_steps(
        "gpt-4o-mini",
        api_key="test-key",
        base_url=stub.base_url,
        max_retries=kwargs.pop("max_retries", 0),
        **kwargs,
    )


def request_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in body["messages"]]


async def test_structured_decision_is_parsed_and_usage_recorded() -> None:
    args = {"sufficient": False, "new_queries": ["Old Soldier (Gifts, p. 7)"], "reasoning": "ref"}
    with StubServer(
        [{"args": args, "usage": {"prompt_tokens": 120, "completion_tokens": 30}}]
    ) as stub:
        result = await llm_for(stub).analyze("Flurry penalty?", [DOC], ["Flurry penalty?"])
    assert result.value.new_queries == ["Old Soldier (Gifts, p. 7)"]
    assert not result.value.sufficient
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (120, 30)
    assert result.usage.counted == "reported"
    assert result.usage.cost_usd == pytest.approx((120 * 0.15 + 30 * 0.60) / 1e6)
    assert result.usage.prompt_version == "analyze-v4"
    assert result.usage.messages == request_messages(stub.bodies[0])
    assert result.usage.reply and "Old Soldier (Gifts, p. 7)" in result.usage.reply
    request = stub.bodies[0]
    assert request["tools"][0]["function"]["name"] == "SufficiencyDecision"
    assert request["max_tokens"] == 512  # the output cap every server honours
    assert "Old Soldier (Gifts, p. 7)" in request["messages"][1]["content"]


async def test_malformed_answer_raises_named_error_after_retries() -> None:
    with StubServer(default={"malformed": "{not json"}) as stub:
        llm = llm_for(stub, parse_attempts=3)
        with pytest.raises(StructuredOutputError, match="GeneratedAnswer after 3 attempt") as err:
            await llm.generate("q", [DOC])
    assert stub.requests == 3
    assert isinstance(err.value, StepFailedError) and err.value.usage.attempts == 3


async def test_analysis_breaking_the_schema_stops_the_hops_and_is_recorded() -> None:
    bad = {"args": {"sufficient": "maybe", "new_queries": "x"}}
    with StubServer(default=bad) as stub:
        result = await llm_for(stub, parse_attempts=2).analyze("q", [DOC], ["q"])
    assert stub.requests == 2
    assert result.value.sufficient and result.value.new_queries == []
    assert "could not be used" in result.value.reasoning
    assert result.usage is not None and result.usage.attempts == 2
    assert result.usage.error and "unparseable reply" in result.usage.error


async def test_a_json_schema_reply_cut_at_the_cap_is_retried_then_recorded() -> None:
    cut = {"content": '{"sufficient": false, "new_queries": ["Old', "finish": "length"}
    cut["usage"] = {"prompt_tokens": 50, "completion_tokens": 16}
    ok = {"content": '{"sufficient": true, "new_queries": [], "reasoning": "done"}'}
    with StubServer([cut, ok], default=None) as stub:
        steps = llm_for(stub, structured_method="json_schema", max_output_tokens=16)
        result = await steps.analyze("q", [DOC], ["q"])
    assert stub.bodies[0]["response_format"]["type"] == "json_schema"
    # The cut reply is retried once with a larger cap, even with one parse attempt, and noted.
    larger = retry_cap(SufficiencyDecision, 16)
    assert larger is not None and larger >= 32
    assert [b["max_tokens"] for b in stub.bodies] == [16, larger]
    assert result.value.sufficient and result.usage is not None
    assert result.usage.attempts == 2 and result.usage.prompt_tokens == 50 + 42
    assert result.usage.notes == [f"cut at the 16-token output cap: retried with {larger}"]
    with StubServer(default=cut) as stub:
        steps = llm_for(stub, structured_method="json_schema", parse_attempts=2)
        failed = await steps.analyze("q", [DOC], ["q"])
    # Two parse attempts, plus the one retry with a larger cap: then it counts as unusable.
    assert [b["max_tokens"] for b in stub.bodies] == [
        512,
        *[retry_cap(SufficiencyDecision, 512)] * 2,
    ]
    assert failed.usage is not None and failed.usage.error is not None
    assert "output cap before its JSON was complete" in failed.usage.error
    assert failed.usage.completion_tokens == 3 * 16 and failed.usage.reply == cut["content"]
    assert failed.usage.attempts == 3


async def test_json_schema_requests_carry_bounds_that_fit_the_cap() -> None:
    ok = {"content": '{"answer": "-2 per extra attack.", "source_ids": []}'}
    with StubServer(default=ok) as stub:
        steps = llm_for(stub, structured_method="json_schema", max_output_tokens=128)
        await steps.generate("Flurry penalty?", [DOC])
    body = stub.bodies[0]
    schema = body["response_format"]["json_schema"]["schema"]
    answer = schema["properties"]["answer"]["maxLength"]
    ids = schema["properties"]["source_ids"]
    longest = answer + ids["maxItems"] * ids["items"]["maxLength"]
    assert answer > 100 and longest <= 128 * CHARS_PER_TOKEN  # what the cap holds, no more
    assert "budget" not in str(schema)  # the weights are ours, not sent
    system = body["messages"][0]["content"]
    assert f"at most {answer} characters" in system
    assert f"(at most {ids['maxItems']})" in system


async def test_a_json_schema_reply_breaking_the_schema_is_recorded_not_raised() -> None:
    """Seen with SmolLM2 on llama.cpp: a confidence of -1 once failed the whole question."""
    bad = {"content": '{"confidence": -1.0, "reasoning": "", "missing_info": []}'}
    with StubServer(default=bad) as stub:
        steps = llm_for(stub, structured_method="json_schema", parse_attempts=2)
        result = await steps.assess("q", [DOC])
    assert stub.requests == 2
    assert result.value.confidence == 0.0  # the documented fallback: deepen
    assert result.usage is not None and result.usage.error is not None
    assert "greater than or equal to 0" in result.usage.error
    assert result.usage.reply == bad["content"] and result.usage.counted == "reported"


async def test_a_turn_whose_answer_is_unusable_keeps_its_retrieval(
    fixture_index: PassageIndex,
) -> None:
    replies = [{"args": {"sufficient": True, "new_queries": []}}]
    with StubServer(replies, default={"malformed": "{not json"}) as stub:
        steps = llm_for(stub, parse_attempts=2)
        result = await Pipeline(MultiHopStrategy(fixture_index, steps, k=2), steps).ask(
            "What penalty does the second attack of a Flurry suffer?"
        )
    assert result.answer == "" and result.context and result.hop_count == 1
    assert result.answer_error == "generate: unparseable reply: no GeneratedAnswer in the reply"
    [generate] = [u for u in result.usage if u.step == "generate"]
    assert generate.attempts == 2 and generate.messages and generate.reply == "{not json"


def test_the_api_says_why_a_turn_has_no_answer(fixture_index: PassageIndex) -> None:
    from fastapi.testclient import TestClient

    from caprag.serve.api import create_app

    replies = [{"args": {"sufficient": True, "new_queries": []}}]
    with StubServer(replies, default={"malformed": "{not json"}) as stub:
        steps = llm_for(stub, parse_attempts=1)
        app = create_app(Pipeline(MultiHopStrategy(fixture_index, steps, k=2), steps))
        with TestClient(app, base_url="http://127.0.0.1") as client:
            response = client.post("/api/ask", json={"question": "What does a torch cost?"})
    assert response.status_code == 502
    assert response.json() == {
        "error": "the model gave no usable answer (generate: unparseable reply: no "
        "GeneratedAnswer in the reply)"
    }


async def test_too_many_new_queries_are_cut_to_the_cap_and_noted() -> None:
    queries = [f"Rule {n} (Gifts, p. {n})" for n in range(1, 7)]
    with StubServer(
        [{"args": {"sufficient": False, "new_queries": queries}}], default=None
    ) as stub:
        result = await llm_for(stub).analyze("q", [DOC], ["q"])
    assert result.value.new_queries == queries[:3]
    assert result.usage is not None
    assert result.usage.notes == ["6 queries cut to 3: dropped " + "; ".join(queries[3:])]
    assert "at most 3 new_queries" in stub.bodies[0]["messages"][0]["content"]


async def test_server_errors_are_retried_with_backoff() -> None:
    ok = {"args": {"questions": ["Old Soldier"]}}
    with StubServer([{"status": 500}, {"status": 429}, ok], default=None) as stub:
        result = await llm_for(stub, max_retries=3).expand("Flurry and veterans?", 3)
    assert result.value == ["Old Soldier"]
    assert stub.requests == 3


async def test_plain_text_rewrite_and_generate_over_http() -> None:
    replies = [
        {"content": "What does the Old Soldier gift cost?"},
        {"args": {"answer": "6 gift points.", "source_ids": ["fighting/flurry", "made/up"]}},
    ]
    with StubServer(replies, default=None) as stub:
        llm = llm_for(stub)
        rewritten = await llm.rewrite("what does it cost?", [("Tell me about Old Soldier", "...")])
        answer = await llm.generate("q", [DOC])
    assert rewritten.value == "What does the Old Soldier gift cost?"
    assert answer.value.source_ids == ["fighting/flurry"]  # ids not in the context are dropped


async def test_whole_pipeline_over_the_stub(fixture_index: PassageIndex) -> None:
    replies = [
        {"args": {"sufficient": False, "new_queries": ["Old Soldier (Gifts, p. 7)"]}},
        {"args": {"sufficient": True, "new_queries": []}},
        {"args": {"answer": "-4, halved by Old Soldier.", "source_ids": ["fighting/flurry"]}},
    ]
    with StubServer(replies, default=None) as stub:
        llm = llm_for(stub)
        result = await Pipeline(MultiHopStrategy(fixture_index, llm, k=2), llm).ask(
            "What penalty does the second attack of a Flurry suffer?"
        )
    assert result.hop_count == 2
    assert result.answer == "-4, halved by Old Soldier."
    assert result.prompt_tokens == 3 * 42
    assert stub.requests == 3


def test_missing_key_is_refused_before_any_question(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPRAG_LLM", "openai")
    with pytest.raises(MissingAPIKeyError):
        build_pipeline(ingest=False)
    with pytest.raises(MissingAPIKeyError, match="OPENAI_API_KEY"):
        build_openai_client(api_key=None)
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    assert load_settings().llm == "openai"


def test_cli_missing_key_message_not_traceback(fixture_env: object) -> None:
    env = {"CAPRAG_LLM": "openai", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "caprag", "ask", "What is a Flurry?"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 2
    assert "error: CAPRAG_LLM=openai needs an API key" in done.stderr
    assert "Traceback" not in done.stderr


async def test_ragas_judge_goes_through_the_openai_compatible_endpoint() -> None:
    from experiments.scoring.judges import RagasJudge

    with StubServer(default={"fill_schema": "A torch burns for one hour."}) as stub:
        judge = RagasJudge("judge-model", api_key="k", base_url=stub.base_url)
        values, missing = await judge.score(
            "How long does a torch burn?",
            "A torch burns for one hour.",
            "one hour",
            ["A torch burns for one hour."],
            ["A torch burns for one hour."],
        )
    assert missing == {}
    assert set(RagasJudge.names) <= set(values)
    assert all(0.0 <= v <= 1.0 for v in values.values())
    assert values["judge_faithfulness"] == 1.0
    assert {r["model"] for r in stub.bodies} == {"judge-model"}
    # Structured output the server constrains, with every string and list bounded for the cap.
    formats = [r["response_format"] for r in stub.bodies]
    assert all(f["type"] == "json_schema" for f in formats)
    assert all(r["max_tokens"] == 1024 for r in stub.bodies)
    statements = next(
        f["json_schema"]["schema"]
        for f in formats
        if f["json_schema"]["name"] == "StatementGeneratorOutput"
    )["properties"]["statements"]
    assert statements["maxItems"] >= 1 and statements["items"]["maxLength"] >= 16
    recall = next(
        f["json_schema"]["schema"]
        for f in formats
        if f["json_schema"]["name"] == "ContextRecallOutput"
    )
    attributed = recall["$defs"]["ContextRecallClassification"]["properties"]["attributed"]
    assert (attributed["minimum"], attributed["maximum"]) == (0, 1)  # a verdict is 0 or 1
    # Beside the non-LLM counterparts on the gold passages (here identical: no gap).
    assert values["judge_context_recall_gap"] == 0.0


async def test_the_judge_in_json_mode_for_servers_without_json_schema() -> None:
    from experiments.scoring.judges import RagasJudge

    with StubServer(default={"fill_schema": "A torch burns for one hour."}) as stub:
        judge = RagasJudge(
            "judge-model", api_key="k", base_url=stub.base_url, structured_method="json_object"
        )
        values, missing = await judge.score("q?", "a", "r", ["c"], ["c"])
    assert missing == {} and set(RagasJudge.names) <= set(values)
    assert all(r["response_format"] == {"type": "json_object"} for r in stub.bodies)


async def test_judge_failures_are_missing_with_reason_not_zero() -> None:
    from experiments.scoring.judges import RagasJudge

    with StubServer(default={"content": "{}"}) as stub:
        judge = RagasJudge("judge-model", api_key="k", base_url=stub.base_url)
        values, missing = await judge.score("q", "a", "r", ["c"], ["c"])
    assert values == {}
    assert set(missing) == set(RagasJudge.names)
    assert all("does not fit" in reason for reason in missing.values())


async def test_a_judge_reply_cut_at_the_cap_is_retried_larger_then_a_reason() -> None:
    from experiments.scoring.judges import RagasJudge

    cut = {"content": '{"statements": ["A torch', "finish": "length"}
    with StubServer(default=cut) as stub:
        judge = RagasJudge("judge-model", api_key="k", base_url=stub.base_url, max_output_tokens=64)
        values, missing = await judge.score("q", "a", "r", ["c"], ["c"])
    assert values == {}
    # retried once with room for the longest reply its schema allows (at least twice the cap)
    first, larger = [b["max_tokens"] for b in stub.bodies][:2]
    assert first == 64 and larger >= 128
    assert f"cut at the output cap (64 tokens, then {larger})" in missing["judge_faithfulness"]


async def test_judge_repeats_are_seeded_and_their_spread_reported() -> None:
    from experiments.scoring.judges import RagasJudge, agreement

    with StubServer(default={"fill_schema": "A torch burns for one hour."}) as stub:
        judge = RagasJudge("judge-model", api_key="k", base_url=stub.base_url, repeats=3, seed=7)
        values, missing = await judge.score("q?", "a", "r", ["c"], ["c"])
    assert missing == {}
    # The stub answers alike every time: repeats agree, and each call had its own seed.
    assert {values[f"{name}_spread"] for name in RagasJudge.names} == {0.0}
    seeds = [b["seed"] for b in stub.bodies]
    assert len(set(seeds)) == len(seeds)
    # Run-level agreement from rows: spread, and the gap/correlation with the non-LLM metric.

    class Row:
        def __init__(self, **values: float) -> None:
            self.values = values

    rows = [
        Row(judge_context_recall=a, ragas_context_recall=b, judge_context_recall_spread=s)
        for a, b, s in [(0.0, 0.0, 0.5), (0.5, 1.0, 0.0), (1.0, 1.0, 0.0)]
    ]
    stats = agreement(rows)["judge_context_recall"]
    assert stats["scored"] == 3 and stats["pairs"] == 3
    assert stats["spread"] == pytest.approx(0.5 / 3)
    assert stats["gap"] == pytest.approx(0.5 / 3)
    assert stats["correlation"] == pytest.approx(0.866, abs=1e-3)


def test_judge_without_key_is_refused() -> None:
    from experiments.scoring.judges import RagasJudge

    with pytest.raises(MissingAPIKeyError, match="judge=openai"):
        RagasJudge("m", api_key=None, base_url=None)
