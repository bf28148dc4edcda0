"""Adaptive depth on the fixture books (in memory, term overlap): classification, confidence,
deepening, budgets, power."""

from __future__ import annotations

from typing import Any

import pytest

from caprag.schemas import Document
from caprag.serve.services import Pipeline
from caprag.state import GraphState
from caprag.steps import rule_steps
from caprag.steps.assess import WEIGHTS, ConfidenceAssessment, heuristic_confidence
from caprag.steps.classify import QueryClass, classify_question
from caprag.strategies import STRATEGIES, AdaptiveDepthStrategy
from caprag.strategies.adaptive import Budget, Progress, decide
from tests.fakes import ManualClock, MemoryRetriever, ScriptedChatModel, scripted_steps

SIMPLE = "How long does a torch burn?"
CROSS_REF = "What penalty does the second attack of a Flurry suffer?"
CROSS_REF_UNSEEN = "How many attacks does a Flurry give in one turn?"
"""Its words reach the Flurry passage, and the Old Soldier passage it cites only by one word
("turn"): a term-overlap search finds Old Soldier at depth 2, not at depth 1."""
IMPOSSIBLE = "What colour is the dragon's hoard in the moon palace?"
SMALL_LADDER = (2, 4, 8)
"""The fixture corpus has 12 passages: the default 5/15/30 ladder reads all of it at depth 2."""


async def run(strategy: AdaptiveDepthStrategy, question: str, power: int | None = None) -> Any:
    return await strategy.execute(GraphState(main_question=question, power=power))


def adaptive(index: Any, **options: Any) -> AdaptiveDepthStrategy:
    """The strategy on a clock that never moves by itself: no result depends on machine load."""
    options.setdefault("clock", ManualClock())
    return AdaptiveDepthStrategy(index, rule_steps(), **options)


# 1. Classification rules, alone.


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        (SIMPLE, "factual"),
        ("What does Night Eyes cost?", "factual"),
        ("How do I resolve a charge?", "operational"),
        ("What are the steps of the resting procedure?", "operational"),
        ("Can I dodge after a Flurry?", "decision"),
        ("Is it allowed to swim in armor?", "decision"),
        ("Which is better against arrows, a Shield Wall or dodging?", "decision"),
        ("Should my fighter take Old Soldier?", "decision"),
        ("What is the best way to build a fighter around Flurry?", "strategic"),
        ("Plan a strategy to optimize stamina on a long march.", "strategic"),
        ("How can I combine Flurry and Old Soldier?", "strategic"),
    ],
)
def test_classification_rules(question: str, expected: str) -> None:
    decided = classify_question(question)
    assert decided.query_type == expected
    assert decided.reasoning


def test_how_can_i_is_a_procedure_not_a_permission_question() -> None:
    assert classify_question("How can I recover stamina points?").query_type == "operational"


# 2. Heuristic confidence, alone.


def doc(pid: str, text: str, *, section: str = "", edition: int = 1, **meta: Any) -> Document:
    book = pid.split("/")[0]
    short = meta.pop("short", book.title())
    return Document(
        passage_id=pid,
        book_id=book,
        book_short=short,
        section=section,
        text=text,
        edition=edition,
        **meta,
    )


def test_heuristic_confidence_weights_its_four_signals() -> None:
    docs = [
        doc("basics/torches", "A torch burns for one hour.", section="Torches"),
        doc("fighting/dodge", "Dodging adds 3 to defence."),
        doc("gifts/eyes", "Night Eyes sees in starlight."),
    ]
    signals = heuristic_confidence(SIMPLE, docs)
    assert {name: signals.as_dict()[name] for name in WEIGHTS} == {
        "relevance": 1.0,
        "recency": 1.0,
        "diversity": 1.0,
        "completeness": 1.0,
    }
    assert signals.confidence == 1.0
    one_book = heuristic_confidence(SIMPLE, docs[:1])
    assert one_book.diversity == pytest.approx(1 / 3)
    assert one_book.confidence == pytest.approx(0.4 + 0.2 + 0.2 / 3 + 0.2, abs=1e-4)


def test_no_documents_means_no_confidence() -> None:
    signals = heuristic_confidence(SIMPLE, [])
    assert signals.confidence == 0.0
    assert signals.missing_info == ["not found: torch, burn"]


def test_unresolved_cross_reference_lowers_completeness() -> None:
    flurry = doc(
        "fighting/flurry",
        "The second attack suffers a penalty of 4, modified by Old Soldier (Gifts, p. 7).",
        section="Flurry",
    )
    gift = doc("gifts/old-soldier", "Halve any penalty for a second blow.", section="Old Soldier")
    alone = heuristic_confidence(CROSS_REF, [flurry])
    assert alone.unresolved == ("Old Soldier (Gifts, p. 7)",)
    assert alone.completeness == pytest.approx(0.75)
    assert alone.missing_info[0] == "Old Soldier (Gifts, p. 7)"
    followed = heuristic_confidence(CROSS_REF, [flurry, gift])
    assert followed.unresolved == () and followed.completeness == 1.0
    assert followed.confidence > alone.confidence


def test_a_superseded_edition_lowers_recency() -> None:
    old = doc("core1/torch", "A torch burns one hour.", section="Torches", edition=1, short="Core")
    new = doc("core2/torch", "A torch burns two hours.", section="Torches", edition=2, short="Core")
    other = doc("gifts/eyes", "Night Eyes.", section="Night Eyes", edition=1)
    assert heuristic_confidence(SIMPLE, [new, other]).recency == 1.0
    assert heuristic_confidence(SIMPLE, [old, new, other]).recency == pytest.approx(2 / 3)


# 3. The stop rule, alone.


def progress(**changes: Any) -> Progress:
    base: dict[str, Any] = {
        "confidence": 0.5,
        "threshold": 0.9,
        "depth": 1,
        "iteration": 1,
        "chunks": 5,
        "trimmed": False,
        "elapsed_s": 0.1,
    }
    return Progress(**{**base, **changes})


def test_stop_rule_names_the_first_budget_reached() -> None:
    budget = Budget()
    assert decide(progress(), budget) == "increase_depth"
    assert decide(progress(confidence=0.9), budget) == "sufficient"
    assert decide(progress(forced=True), budget) == "forced_depth"
    assert decide(progress(timed_out=True, forced=True), budget) == "budget_exhausted:timeout"
    assert decide(progress(depth=3, iteration=3), budget) == "budget_exhausted:depth"
    assert decide(progress(iteration=3), budget) == "budget_exhausted:iterations"
    assert decide(progress(chunks=50), budget) == "budget_exhausted:chunks"
    assert decide(progress(trimmed=True), budget) == "budget_exhausted:tokens"
    assert decide(progress(cost_usd=1.0), budget) == "increase_depth"  # no cost budget set
    priced = Budget(max_cost_usd=0.001)
    assert decide(progress(cost_usd=0.0009), priced) == "increase_depth"
    assert decide(progress(cost_usd=0.001), priced) == "budget_exhausted:cost"
    assert decide(progress(trimmed=True, cost_usd=0.01), priced) == "budget_exhausted:tokens"
    assert decide(progress(elapsed_s=5.0), budget) == "budget_exhausted:timeout"


# 4. The strategy on the fixture corpus.


def test_adaptive_is_registered_and_selectable(monkeypatch: pytest.MonkeyPatch) -> None:
    from caprag.config import load_settings
    from caprag.serve.services import build_strategy, steps_from_settings

    assert STRATEGIES["adaptive"] is AdaptiveDepthStrategy
    monkeypatch.setenv("RETRIEVAL_STRATEGY", "adaptive")
    settings = load_settings()
    llm = steps_from_settings(settings)
    built = build_strategy(settings.retrieval_strategy, NoRetriever(), llm, settings)
    assert isinstance(built, AdaptiveDepthStrategy)


class NoRetriever:
    def search(self, query: str, k: int) -> list[Document]:
        return []


async def test_simple_factual_question_stops_at_depth_one(books: MemoryRetriever) -> None:
    state = await run(adaptive(books), SIMPLE)
    [hop] = state.hops
    assert (hop.query_type, hop.depth, hop.adaptive_decision) == ("factual", 1, "sufficient")
    assert hop.threshold == 0.9 and hop.confidence is not None and hop.confidence >= 0.9
    assert hop.chunks == len(state.context) == 5
    assert state.context[0].passage_id == "basics/torches"
    assert [u.step for u in hop.usage] == ["classify"]  # heuristic confidence costs no call
    assert hop.context_tokens and hop.warning is None and hop.hint is None


async def test_cross_reference_makes_it_search_deeper(books: MemoryRetriever) -> None:
    state = await run(adaptive(books, depth_chunks=SMALL_LADDER), CROSS_REF_UNSEEN)
    assert len(state.hops) > 1
    first, last = state.hops[0], state.hops[-1]
    assert first.adaptive_decision == "increase_depth"
    assert first.missing_info == ["Old Soldier (Gifts, p. 7)"]
    assert [h.depth for h in state.hops] == list(range(1, len(state.hops) + 1))
    assert last.confidence is not None
    assert last.confidence >= 0.85 or last.depth == 3
    assert {"fighting/flurry", "gifts/old-soldier"} <= {d.passage_id for d in state.context}
    assert [h.chunks for h in state.hops] == list(SMALL_LADDER[: len(state.hops)])


async def test_impossible_question_stops_when_nothing_new_is_left_to_search_with_a_warning(
    books: MemoryRetriever,
) -> None:
    state = await run(adaptive(books), IMPOSSIBLE)
    assert [(h.depth, h.adaptive_decision) for h in state.hops] == [
        (1, "increase_depth"),
        (2, "increase_depth"),  # the expansion of the question brought passages not read
        (3, "no_new_evidence"),  # nothing unresolved, the expansion already searched
    ]
    assert state.hops[1].queries != state.hops[0].queries and state.hops[2].queries == []
    last = state.hops[-1]
    assert last.warning is not None and "added no new passage" in last.warning
    assert all(h.warning is None for h in state.hops[:-1])


@pytest.mark.parametrize(
    ("options", "reason", "hops"),
    [
        ({"max_depth": 2}, "depth", 2),
        ({"max_iterations": 2}, "iterations", 2),
        ({"max_chunks": 8}, "chunks", 2),
        ({"max_context_tokens": 150}, "tokens", 1),
    ],
)
async def test_each_budget_stops_the_loop_with_its_own_reason(
    books: MemoryRetriever, options: dict[str, Any], reason: str, hops: int
) -> None:
    state = await run(adaptive(books, **options), IMPOSSIBLE)
    assert len(state.hops) == hops
    last = state.hops[-1]
    assert last.adaptive_decision == f"budget_exhausted:{reason}"
    assert last.warning is not None
    if reason == "depth":
        assert "maximum depth 2 reached" in last.warning
    if reason == "chunks":
        assert last.chunks == 8 == len(state.context)
    if reason == "tokens":
        assert last.context_tokens is not None and last.context_tokens <= 150
        assert 1 <= len(state.context) < 5


class SlowDeepRetriever:
    """The fixture index, where a search deeper than `fast_k` moves the clock by `delay_s`."""

    def __init__(
        self, index: MemoryRetriever, fast_k: int, delay_s: float, clock: ManualClock
    ) -> None:
        self.index = index
        self.fast_k = fast_k
        self.delay_s = delay_s
        self.clock = clock

    def search(self, query: str, k: int) -> list[Document]:
        if k > self.fast_k:
            self.clock.advance(self.delay_s)
        return self.index.search(query, k)


async def test_timeout_keeps_what_was_found_in_time(books: MemoryRetriever) -> None:
    clock = ManualClock()
    slow = SlowDeepRetriever(books, fast_k=5, delay_s=3.0, clock=clock)
    strategy = adaptive(slow, timeout_s=1.0, clock=clock)
    state = await run(strategy, IMPOSSIBLE)  # the depth-2 search alone takes 3 s of the 1 s
    assert [h.adaptive_decision for h in state.hops] == [
        "increase_depth",
        "budget_exhausted:timeout",
    ]
    assert state.hops[1].documents == [] and len(state.context) == 5
    assert state.hops[1].warning is not None and "timeout" in state.hops[1].warning


async def test_forced_power_searches_once_and_hints_when_short(
    books: MemoryRetriever,
) -> None:
    strategy = adaptive(books, depth_chunks=SMALL_LADDER, power=1)
    state = await run(strategy, CROSS_REF_UNSEEN)
    [hop] = state.hops
    assert (hop.depth, hop.adaptive_decision) == (1, "forced_depth")
    assert hop.confidence is not None and hop.threshold is not None
    assert hop.confidence < hop.threshold
    assert hop.hint is not None and "raise the power to 2" in hop.hint
    assert "or choose auto" in hop.hint  # auto deepens until confident: offered too

    deeper = await run(strategy, CROSS_REF_UNSEEN, power=2)  # the request's power wins
    [hop] = deeper.hops
    assert (hop.depth, hop.adaptive_decision, hop.hint) == (2, "forced_depth", None)


async def test_forced_power_applies_to_one_turn_only(books: MemoryRetriever) -> None:
    llm = rule_steps()
    pipeline = Pipeline(AdaptiveDepthStrategy(books, llm), llm)
    forced = await pipeline.ask(SIMPLE, "thread", power=3)
    assert [(h.depth, h.adaptive_decision) for h in forced.hops] == [(3, "forced_depth")]
    assert {u.step for u in forced.usage} == {"classify", "generate"}
    auto = await pipeline.ask(SIMPLE, "thread")
    assert [(h.depth, h.adaptive_decision) for h in auto.hops] == [(1, "sufficient")]


async def test_power_outside_the_depths_is_refused(books: MemoryRetriever) -> None:
    with pytest.raises(ValueError, match="power=4 is not allowed"):
        adaptive(books, power=4)
    with pytest.raises(ValueError, match="power must be"):
        await run(adaptive(books), SIMPLE, power=0)


# 5. LLM classification and self-assessment through structured output.


MISSING = ("Old Soldier", "Flurry penalty", "torch duration")
"""What each scripted self-assessment says is missing: a new item each round, a new search."""


def scripted(*confidences: float) -> ScriptedChatModel:
    return ScriptedChatModel(
        replies=[
            QueryClass(query_type="operational", reasoning="a procedure"),
            *(
                ConfidenceAssessment(
                    confidence=c, reasoning="r", missing_info=[MISSING[i % len(MISSING)]]
                )
                for i, c in enumerate(confidences)
            ),
        ]
    )


async def test_llm_confidence_drives_the_loop(books: MemoryRetriever) -> None:
    chat = scripted(0.3, 0.5, 0.8)
    strategy = AdaptiveDepthStrategy(books, scripted_steps(chat), clock=ManualClock())
    state = await run(strategy, CROSS_REF)
    assert [(h.depth, h.confidence, h.adaptive_decision) for h in state.hops] == [
        (1, 0.3, "increase_depth"),
        (2, 0.5, "increase_depth"),
        (3, 0.8, "sufficient"),
    ]
    assert state.hops[0].threshold == 0.7 and state.hops[0].query_type == "operational"
    assert [u.step for u in state.hops[0].usage] == ["classify", "assess"]
    assert state.hops[2].missing_info == ["torch duration"]
    assert state.hops[1].queries == [f"{CROSS_REF} Old Soldier"]  # the question and what it lacks
    assert "judge whether passages retrieved from the library" in str(chat.calls[1][0].content)


async def test_confidence_outside_zero_to_one_is_recorded_as_a_failed_call(
    books: MemoryRetriever,
) -> None:
    chat = ScriptedChatModel(
        replies=[{"query_type": "factual", "reasoning": ""}],
        by_substring={"judge whether": {"confidence": 1.5, "reasoning": "", "missing_info": []}},
    )
    steps = scripted_steps(chat, parse_attempts=2)
    strategy = AdaptiveDepthStrategy(books, steps, clock=ManualClock())
    state = await run(strategy, SIMPLE)
    assessed = [u for hop in state.hops for u in hop.usage if u.step == "assess"]
    assert len(assessed) == len(state.hops) >= 2  # confidence 0 after each: it deepened
    assert assessed[0].error and "less than or equal to 1" in assessed[0].error
    for usage in assessed:
        assert usage.attempts == 2 and usage.error
        assert usage.prompt_tokens > 0 and usage.messages and usage.reply
    assert {h.confidence for h in state.hops} == {0.0}
    assert state.hops[0].adaptive_decision == "increase_depth"


async def test_rule_and_llm_steps_mix_per_step(books: MemoryRetriever) -> None:
    chat = scripted(0.95)
    chat.replies = chat.replies[1:]  # the rule classifies: the model only assesses
    steps = scripted_steps(chat, classifier="rule", confidence="llm", generator="rule")
    assert steps.kinds()["classifier"] == "rule" and steps.kinds()["confidence"] == "llm"
    state = await run(AdaptiveDepthStrategy(books, steps, clock=ManualClock()), SIMPLE)
    [hop] = state.hops
    assert hop.query_type == "factual" and hop.confidence == 0.95
    assert [(u.step, u.model) for u in hop.usage] == [
        ("classify", "offline"),
        ("assess", "scripted"),
    ]
    assert len(chat.calls) == 1


async def test_rule_assess_is_the_free_heuristic(books: MemoryRetriever) -> None:
    docs = books.search(SIMPLE, 5)
    assessed = await rule_steps().assess(SIMPLE, docs)
    assert assessed.value.confidence == heuristic_confidence(SIMPLE, docs).confidence
    assert assessed.usage is None  # a heuristic signal, not a stand-in for a call
    assert assessed.signals == heuristic_confidence(SIMPLE, docs).as_dict()
    classified = await rule_steps().classify("Can I dodge after a Flurry?")
    assert classified.value.query_type == "decision"
    assert classified.usage is not None and classified.usage.prompt_version == "classify-v3"


def test_powers_are_named_quick_balanced_deep_beside_their_numbers() -> None:
    from caprag.config import power_label
    from caprag.serve.web import power_control

    assert [power_label(p) for p in ("auto", 1, 2, 3, None)] == [
        "auto", "1 (quick)", "2 (balanced)", "3 (deep)", "",
    ]  # fmt: skip
    select = power_control([5, 15, 30], 2)
    assert ">1 (quick)</option>" in select and ">3 (deep)</option>" in select
    assert '<option value="2" selected>2 (balanced) — default</option>' in select


async def test_each_round_is_reported_live_before_the_next_search(
    books: MemoryRetriever,
) -> None:
    from caprag.serve.progress import LISTENER, RoundBoard
    from caprag.serve.web import live_rounds

    seen_at_search: list[int] = []
    board = RoundBoard()
    listen = board.listener("turn")

    class Watched(MemoryRetriever):
        def search(self, query: str, k: int) -> list[Document]:
            seen_at_search.append(len(board.rounds("turn") or []))
            return super().search(query, k)

    token = LISTENER.set(listen)
    try:
        state = await run(
            adaptive(Watched(books.documents), depth_chunks=SMALL_LADDER), CROSS_REF_UNSEEN
        )
    finally:
        LISTENER.reset(token)
    reported = board.rounds("turn") or []
    assert [(r.round, r.decision) for r in reported] == [
        (h.hop, h.adaptive_decision) for h in state.hops
    ]
    assert seen_at_search[0] == 0 and seen_at_search[-1] == len(reported) - 1, (
        "round n is on the board before round n + 1 searches"
    )
    live = live_rounds(reported[:1], SMALL_LADDER)
    assert "round 1: depth 1/" in live and "→ going deeper…" in live and "(needs 90%)" in live


async def test_the_generator_is_told_the_confidence_and_says_when_it_is_low(
    books: MemoryRetriever,
) -> None:
    from caprag.steps.generate import GENERATE, RuleGenerator, prompt_values

    docs = books.search(CROSS_REF, 3)
    low = await RuleGenerator()(CROSS_REF, docs, (), confidence=(0.62, 0.9))
    assert low.value.answer.endswith(
        "(Retrieval confidence 0.62 is below the 0.90 this question needs: the answer may be "
        "incomplete.)"
    )
    high = await RuleGenerator()(CROSS_REF, docs, (), confidence=(0.95, 0.9))
    assert "incomplete" not in high.value.answer
    told = GENERATE.user.format(**prompt_values(CROSS_REF, docs, (), (0.62, 0.9)))
    assert (
        "Retrieval confidence: 0.62 (this question needs 0.90). It is below the threshold" in told
    )
    plain = GENERATE.user.format(**prompt_values(CROSS_REF, docs, ()))
    assert "Retrieval confidence" not in plain  # other strategies' prompts are as before

    llm = rule_steps()
    strategy = AdaptiveDepthStrategy(books, llm, depth_chunks=SMALL_LADDER, clock=ManualClock())
    turn = await Pipeline(strategy, llm).ask(CROSS_REF_UNSEEN, "thread", power=1)
    last = turn.hops[-1]
    assert last.confidence is not None and last.threshold is not None
    assert last.confidence < last.threshold
    assert turn.answer.endswith("the answer may be incomplete.)")  # the graph told the generator
