"""Any question the API accepts is answered by every strategy: no schema error, no 500.

Probe: a realistic 528-character question, ~40 unknown words or many page citations made the
offline analyzer build a follow-up query over 300 characters (or a reasoning over 2,000), which
its schema rejected: `/api/ask` answered 500 and `caprag ask` printed a traceback.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caprag.config import BUNDLED_CORPUS
from caprag.retrieval.catalog import Catalog
from caprag.retrieval.store import PassageIndex
from caprag.schemas import MAX_QUERY_CHARS, Document
from caprag.serve.api import create_app
from caprag.serve.services import MAX_QUESTION_CHARS, AskResult, Pipeline
from caprag.steps import rule_steps
from caprag.steps.analyze import MAX_REASONING_CHARS, RuleAnalyzer
from caprag.steps.generate import MAX_ANSWER_CHARS
from caprag.strategies import STRATEGIES

pytestmark = pytest.mark.slow

SHORTS = sorted(
    {
        m.group(1).strip()
        for book in BUNDLED_CORPUS.glob("*.md")
        if (m := re.search(r"^short:\s*(.+)$", book.read_text(encoding="utf-8"), re.M))
    }
)
WORDS = sorted(
    {
        w
        for book in BUNDLED_CORPUS.glob("*.md")
        for w in re.findall(r"[A-Za-z]{4,}", book.read_text())
    }
)

CITATION = st.builds(
    lambda short, page, name: f"{name} ({short}, p. {page})" if name else f"see {short}, p. {page}",
    st.sampled_from(SHORTS),
    st.integers(1, 400),
    st.sampled_from(["", "Rapid Strike", "Arcane Aptitude", "Ember Pool", "Trained by a Veteran"]),
)
PIECE = st.one_of(
    st.sampled_from(WORDS),  # words of the corpus: passages match, references get followed
    st.from_regex(r"[a-z]{5,14}[0-9]{0,3}", fullmatch=True),  # words no passage has
    CITATION,
    st.text(min_size=1, max_size=12),  # any unicode: accents, emoji, controls, zero-width
    st.sampled_from(["?", ",", ";", " and ", " or ", "\n", "p.", "(", ")", "'"]),
)
QUESTIONS = st.lists(PIECE, min_size=1, max_size=700).map(
    lambda parts: " ".join(parts)[:MAX_QUESTION_CHARS]
)

REALISTIC = (
    "My character is a level 3 arcanist who took Arcane Aptitude and Trained by a Veteran; when "
    "she uses Rapid Strike (Combat, p. 41) during the second round of combat against two "
    "opponents while standing in difficult terrain, and she has already spent her reaction on a "
    "parry, how many actions does she have left, what penalty does each blow take, does the "
    "aptitude's cost change (see Powers, p. 100 and Gifts, p. 12), and can she still cast a minor "
    "spell before the round ends, assuming the gamemaster uses the optional initiative rules?"
)
PROBES = [
    REALISTIC,
    " ".join(f"zorblax{i} quintessential{i}" for i in range(40)),
    " ".join(f"(Combat, p. {page})" for page in range(1, 120)),
    " ".join(
        f"Rapid Strike (Combat, p. {page}) and Ember Pool (Arcana, p. {page})" for page in range(60)
    ),
    "x" * MAX_QUESTION_CHARS,
]


def within_bounds(result: AskResult) -> None:
    """Every generated query, reasoning and answer of the turn honours its schema's bounds."""
    assert len(result.answer) <= MAX_ANSWER_CHARS
    for hop in result.hops:
        assert all(len(q) <= MAX_QUESTION_CHARS for q in hop.queries)
        if hop.decision is not None:
            assert all(len(q) <= MAX_QUERY_CHARS for q in hop.decision.new_queries)
            assert len(hop.decision.reasoning) <= MAX_REASONING_CHARS


@pytest.fixture(scope="module")
def pipelines(corpus_index: PassageIndex) -> dict[str, Pipeline]:
    steps = rule_steps()
    return {
        name: Pipeline(cls(corpus_index, steps, k=8), steps) for name, cls in STRATEGIES.items()
    }


@pytest.mark.parametrize(
    "question", PROBES, ids=["realistic", "unknown", "citations", "named", "max"]
)
def test_the_probed_questions_are_answered_by_every_strategy(
    pipelines: dict[str, Pipeline], question: str
) -> None:
    for name, pipeline in pipelines.items():
        result = asyncio.run(pipeline.ask(question))
        within_bounds(result)
        assert result.strategy == name


def test_a_cut_query_is_recorded_on_the_call_and_keeps_the_name_it_follows() -> None:
    words = [f"zorblax{i} quintessential{i} farrowmere{i}" for i in range(30)]
    question = " ".join(words)
    # encyclopaedic text (`links: names`): the passage names another passage's title
    keep = Document(
        passage_id="a/k",
        book_id="a",
        book_short="A",
        section="Zorblax",
        text=" ".join(words[:20]) + " near Moonfall Harbour.",
    )
    harbour = Document(
        passage_id="a/h", book_id="a", book_short="A", section="Moonfall Harbour", text="A port."
    )
    analyzer = RuleAnalyzer(links="names")
    analysis = asyncio.run(analyzer(question, [keep], [question], catalog=Catalog([keep, harbour])))
    assert analysis.usage is not None
    assert any("cut from" in note for note in analysis.usage.notes), analysis.usage.notes
    [query] = analysis.value.new_queries
    assert len(query) <= MAX_QUERY_CHARS and query.endswith(" Moonfall Harbour")


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
@given(question=QUESTIONS)
def test_random_questions_never_break_a_strategy(
    pipelines: dict[str, Pipeline], question: str
) -> None:
    if not question.strip():
        return
    for pipeline in pipelines.values():
        within_bounds(asyncio.run(pipeline.ask(question)))


@pytest.fixture(scope="module")
def api(pipelines: dict[str, Pipeline]) -> Iterator[TestClient]:
    with TestClient(
        create_app(pipelines["multi-hop"]),
        raise_server_exceptions=False,
        base_url="http://127.0.0.1",
    ) as client:
        yield client


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
@given(question=QUESTIONS | st.text(max_size=MAX_QUESTION_CHARS + 10))
def test_the_api_answers_any_question_without_a_500(api: TestClient, question: str) -> None:
    reply = api.post("/api/ask", json={"question": question})
    assert reply.status_code in (200, 422), reply.text
    if reply.status_code == 422:
        assert reply.json()["error"]
