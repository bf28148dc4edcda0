"""The published baselines as strategies (IRCoT, Self-Ask, Iter-RetGen): their rule and scripted
LLM implementations on an in-memory bridge corpus, the prompts exactly as sent, the budget they
hand on, and their choice from Hydra and from the settings."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from caprag.config import PROJECT_ROOT, load_settings
from caprag.llm.prompt import as_sent
from caprag.registry import ROLES
from caprag.schemas import Document
from caprag.serve.services import build_strategy, steps_from_settings
from caprag.state import GraphState
from caprag.steps import Steps, Wording, rule_steps
from caprag.steps.ask import ASK, next_turn, subjects
from caprag.steps.generate import GENERATE, GeneratedAnswer
from caprag.steps.reason import REASON, next_thought
from caprag.strategies import (
    STRATEGIES,
    IRCoTStrategy,
    IterRetGenStrategy,
    RetrievalStrategy,
    SelfAskStrategy,
    SingleQueryStrategy,
)
from tests.fakes import MemoryRetriever, ScriptedChatModel, scripted_steps

BASELINES = {"ircot": IRCoTStrategy, "self-ask": SelfAskStrategy, "iter-retgen": IterRetGenStrategy}
QUESTION = "Where was the designer of Alder Lodge born?"


def page(section: str, text: str) -> Document:
    slug = section.lower().replace(" ", "-")
    return Document(
        passage_id=f"wiki/{slug}", book_id="wiki", book_short="Wiki", section=section, text=text
    )


ALDER = page(
    "Alder Lodge", "Alder Lodge is a hotel designed by Ruth Weiss. It stands in the hills."
)
BIRCH = page("Birch Lodge", "Birch Lodge was a hut in the valley.")
WEISS = page("Ruth Weiss", "Ruth Weiss was an architect. She was born in Graz.")
CEDAR = page("Cedar Hall", "Cedar Hall is a concert hall.")


@pytest.fixture
def wiki() -> MemoryRetriever:
    """A bridge question's corpus: the question's words reach Alder Lodge (and Birch Lodge), not
    Ruth Weiss, whom only the Alder Lodge passage names."""
    return MemoryRetriever([ALDER, BIRCH, WEISS, CEDAR])


def only_llm(chat: ScriptedChatModel, *roles: str) -> Steps:
    """The scripted model for `roles`, every other step by its rule."""
    choices = {role: "rule" for role in ROLES} | dict.fromkeys(roles, "llm")
    return scripted_steps(chat, **choices)


async def run(strategy: RetrievalStrategy, question: str = QUESTION) -> GraphState:
    return await strategy.execute(GraphState(question=question, main_question=question))


def ids(state: GraphState) -> list[str]:
    return [d.passage_id for d in state.context]


def calls_by_step(state: GraphState) -> Counter[str]:
    return Counter(u.step for hop in state.hops for u in hop.usage)


async def test_a_single_search_misses_the_bridge(wiki: MemoryRetriever) -> None:
    state = await run(SingleQueryStrategy(wiki, rule_steps(), k=2))
    assert ids(state) == ["wiki/alder-lodge", "wiki/birch-lodge"]


# --- IRCoT -----------------------------------------------------------------------------------


async def test_ircot_rule_searches_with_its_reasoning_sentence_and_reaches_the_bridge(
    wiki: MemoryRetriever,
) -> None:
    state = await run(IRCoTStrategy(wiki, rule_steps(), k=2))
    first_thought = "Alder Lodge is a hotel designed by Ruth Weiss."
    assert [h.queries for h in state.hops][:2] == [[QUESTION], [first_thought]]
    assert state.hops[0].reasoning == [first_thought]
    assert ids(state) == ["wiki/alder-lodge", "wiki/ruth-weiss"]  # k = 2 handed on
    assert state.hops[1].reasoning == ["Ruth Weiss: She was born in Graz."]
    assert calls_by_step(state) == {"reason": 2}  # max_steps - 1: none after the last search


def test_ircot_rule_thought_is_what_the_question_still_lacks() -> None:
    # The question's terms are covered, and the name it brought in is spoken of twice: answered.
    thought = next_thought("Where was Ruth Weiss born?", [WEISS], ["Ruth Weiss was an architect."])
    assert thought.sentence == "Ruth Weiss: She was born in Graz."
    assert thought.answer == thought.sentence
    # Nothing read adds anything lacking: no sentence, the chain stops.
    assert next_thought("Where was Ruth Weiss born?", [CEDAR], []).sentence == ""


async def test_ircot_llm_prompt_as_sent_and_stops_on_the_answer(wiki: MemoryRetriever) -> None:
    chat = ScriptedChatModel(
        replies=[
            {"sentence": "Alder Lodge was designed by Ruth Weiss.", "answer": ""},
            {"sentence": "Ruth Weiss was born in Graz. So the answer is: Graz.", "answer": "Graz"},
        ]
    )
    state = await run(IRCoTStrategy(wiki, only_llm(chat, "reasoner"), k=2, max_steps=4))
    assert [h.queries for h in state.hops] == [
        [QUESTION],
        ["Alder Lodge was designed by Ruth Weiss."],
    ]
    assert state.hops[1].reasoning == [
        "Ruth Weiss was born in Graz. So the answer is: Graz.",
        "So the answer is: Graz",
    ]
    assert len(chat.calls) == 2
    assert as_sent(chat.calls[1]) == [
        {"role": "system", "content": REASON.system},
        {
            "role": "user",
            "content": "Title: Alder Lodge\n"
            + ALDER.text
            + "\n\nTitle: Ruth Weiss\n"
            + WEISS.text
            + f"\n\nQ: {QUESTION}\nA: Alder Lodge was designed by Ruth Weiss.",
        },
    ]
    assert "Q: Where was the architect of Alder Lodge born?" in REASON.system  # the example
    usage = [u for hop in state.hops for u in hop.usage]
    assert [u.step for u in usage] == ["reason", "reason"] and all(u.messages for u in usage)


# --- Self-Ask --------------------------------------------------------------------------------


def test_self_ask_rule_follow_ups_come_from_the_question_then_the_bridge() -> None:
    assert subjects(QUESTION) == ["Alder Lodge"]
    assert next_turn(QUESTION, []).follow_up == "Alder Lodge"
    asked = [("Alder Lodge", "Alder Lodge is a hotel designed by Ruth Weiss. [wiki/alder-lodge]")]
    assert next_turn(QUESTION, asked).follow_up == "Ruth Weiss designer born"
    done = [*asked, ("Ruth Weiss designer born", "She was born in Graz.")]
    turn = next_turn(QUESTION, done)
    assert turn.follow_up == "Graz alder lodge"  # every new name is asked about in turn
    final = next_turn(QUESTION, [("Alder Lodge", "It stands in the hills.")])
    assert final.follow_up == "" and final.final_answer == "It stands in the hills."


async def test_self_ask_rule_answers_each_follow_up_from_its_own_search(
    wiki: MemoryRetriever,
) -> None:
    state = await run(SelfAskStrategy(wiki, rule_steps(), k=2))
    assert [h.queries for h in state.hops] == [
        [QUESTION],
        ["Alder Lodge"],
        ["Ruth Weiss designer born"],
    ]
    assert state.hops[1].reasoning == [
        "Follow up: Alder Lodge",
        "Intermediate answer: Alder Lodge is a hotel designed by Ruth Weiss.",
    ]
    assert "wiki/ruth-weiss" in ids(state) and len(state.context) == 2
    assert calls_by_step(state) == {"ask": 3, "generate": 2}  # the bound: max_llm_calls
    assert dict(calls_by_step(state)) == SelfAskStrategy(wiki, rule_steps()).max_llm_calls()


async def test_self_ask_llm_prompt_as_sent_and_final_answer_in_the_trace(
    wiki: MemoryRetriever,
) -> None:
    chat = ScriptedChatModel(
        replies=[
            {"follow_up": "Who designed Alder Lodge?", "final_answer": ""},
            {"follow_up": "", "final_answer": "Graz"},
        ]
    )
    answers = ScriptedChatModel(replies=[GeneratedAnswer(answer="Ruth Weiss")])
    steps = dataclasses.replace(
        only_llm(chat, "asker"), generate=only_llm(answers, "generator").generate
    )
    state = await run(SelfAskStrategy(wiki, steps, k=2))
    assert [h.queries for h in state.hops] == [[QUESTION], ["Who designed Alder Lodge?"]]
    assert state.hops[1].reasoning == [
        "Follow up: Who designed Alder Lodge?",
        "Intermediate answer: Ruth Weiss",
        "So the final answer is: Graz",
    ]
    assert as_sent(chat.calls[1]) == [
        {"role": "system", "content": ASK.system},
        {
            "role": "user",
            "content": f"Question: {QUESTION}\nAre follow up questions needed here: Yes.\n"
            "Follow up: Who designed Alder Lodge?\nIntermediate answer: Ruth Weiss\n",
        },
    ]
    # The intermediate answer was generated from the follow-up's own search, not the question.
    answer_prompt = as_sent(answers.calls[0])[1]["content"]
    assert answer_prompt.startswith("Question: Who designed Alder Lodge?")
    assert GENERATE.version and calls_by_step(state) == {"ask": 2, "generate": 1}


# --- Iter-RetGen -----------------------------------------------------------------------------


async def test_iter_retgen_rule_searches_the_question_with_the_last_answer(
    wiki: MemoryRetriever,
) -> None:
    state = await run(IterRetGenStrategy(wiki, rule_steps(), k=2, rounds=2))
    draft = "Alder Lodge is a hotel designed by Ruth Weiss."
    assert [h.queries for h in state.hops] == [[QUESTION], [f"{QUESTION} {draft}"]]
    assert state.hops[0].reasoning == [draft]  # the cited id is not searched
    assert ids(state) == ["wiki/alder-lodge", "wiki/ruth-weiss"]  # the last round's k
    assert calls_by_step(state) == {"generate": 1}


async def test_iter_retgen_llm_drafts_as_sent(wiki: MemoryRetriever) -> None:
    chat = ScriptedChatModel(
        replies=[
            GeneratedAnswer(answer="Ruth Weiss designed it.", source_ids=["wiki/alder-lodge"]),
            GeneratedAnswer(answer="Graz", source_ids=["wiki/ruth-weiss"]),
        ]
    )
    state = await run(IterRetGenStrategy(wiki, only_llm(chat, "generator"), k=2, rounds=3))
    assert [h.queries[0] for h in state.hops] == [
        QUESTION,
        f"{QUESTION} Ruth Weiss designed it.",
        f"{QUESTION} Graz",
    ]
    assert len(chat.calls) == 2 and calls_by_step(state) == {"generate": 2}
    system, user = as_sent(chat.calls[1])
    assert system["content"] == GENERATE.render(**_generate_values())[0].content
    assert user["content"].startswith(f"Question: {QUESTION}\n\nPassages:\n[wiki/")


def _generate_values() -> dict[str, str]:
    from caprag.steps.generate import prompt_values

    return prompt_values(QUESTION, [ALDER], ())


# --- every baseline ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BASELINES))
@pytest.mark.parametrize("k", [1, 2, 3])
async def test_every_baseline_hands_on_at_most_k_and_stays_in_its_call_bound(
    name: str, k: int, wiki: MemoryRetriever, books: MemoryRetriever
) -> None:
    for retriever, question in ((wiki, QUESTION), (books, "What does Flurry cost?")):
        strategy = STRATEGIES[name](retriever, rule_steps(), k=k)
        state = await run(strategy, question)
        assert 1 <= len(state.context) <= k
        assert len({d.content_hash for d in state.context}) == len(state.context)
        bound = strategy.max_llm_calls() or {}
        for step, calls in calls_by_step(state).items():
            assert calls <= bound[step], (step, calls, bound)
        assert all(u.prompt_tokens > 0 for hop in state.hops for u in hop.usage)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_composes_from_hydra(name: str, wiki: MemoryRetriever) -> None:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"strategy={name}", "reasoner=rule", "asker=llm"])
    assert cfg.reasoner == "rule" and cfg.asker == "llm"  # a step role key each
    strategy = instantiate(cfg.strategy)(retriever=wiki, steps=rule_steps(), k=4)
    assert type(strategy) is BASELINES[name] and strategy.name == name


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_is_chosen_from_the_settings(
    name: str, wiki: MemoryRetriever, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRIEVAL_STRATEGY", name)
    for variable in ("CAPRAG_IRCOT_MAX_STEPS", "CAPRAG_ITER_RETGEN_ROUNDS"):
        monkeypatch.setenv(variable, "4")
    monkeypatch.setenv("CAPRAG_SELF_ASK_MAX_FOLLOW_UPS", "3")
    monkeypatch.setenv("CAPRAG_MAX_HOPS", "9")  # multi-hop's: no other strategy reads it
    monkeypatch.setenv("CAPRAG_K", "5")
    settings = load_settings()
    strategy = build_strategy(name, wiki, steps_from_settings(settings), settings)
    assert type(strategy) is BASELINES[name] and strategy.k == 5
    bound = {"ircot": {"reason": 3}, "self-ask": {"ask": 4, "generate": 3}}
    assert strategy.max_llm_calls() == bound.get(name, {"generate": 3})


def test_a_baseline_step_is_chosen_rule_or_llm_from_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CAPRAG_LLM", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("CAPRAG_REASONER", "rule")
    steps = steps_from_settings(load_settings())
    assert steps.kinds()["reasoner"] == "rule" and steps.kinds()["asker"] == "llm"


def test_the_worst_case_counts_a_baselines_own_generations_beside_the_pipelines() -> None:
    from experiments.harness.dryrun import CostEstimate, StepCost

    steps = {"generate": StepCost(calls=1, prompt_tokens=100, max_prompt_tokens=100)}
    estimate = CostEstimate(
        strategy="iter-retgen",
        model="gpt-4o-mini",
        questions=10,
        follow_ups=0,
        sampled=1,
        steps=steps,
        worst_calls=IterRetGenStrategy(MemoryRetriever([]), rule_steps()).max_llm_calls(),
        output_cap=50,
    )
    assert estimate.worst_calls_total() == 30  # 2 drafts + the answer, per question
    assert estimate.worst_tokens() == (3 * 100 * 10, 30 * 50)


@pytest.mark.parametrize("name", ["self-ask", "iter-retgen"])
async def test_an_unusable_intermediate_answer_is_recorded_and_the_loop_goes_on(
    name: str, wiki: MemoryRetriever
) -> None:
    chat = ScriptedChatModel(replies=["Sure! Here is the answer."], repeat_last=True)
    steps = dataclasses.replace(
        rule_steps(), generate=scripted_steps(chat, parse_attempts=1, generator="llm").generate
    )
    state = await run(STRATEGIES[name](wiki, steps, k=2))
    failed = [u for hop in state.hops for u in hop.usage if u.step == "generate"]
    assert failed and all(u.error for u in failed)  # each kept, with its error
    assert len(state.hops) >= 2 and 1 <= len(state.context) <= 2


# --- A refusal is never searched --------------------------------------------------------------

UNANSWERABLE = "What tax does the Moon Guild charge on lanterns?"
"""No passage of the corpus is about it: every draft and intermediate answer refuses."""


def every_query(state: GraphState) -> list[str]:
    return [query for hop in state.hops for query in hop.queries]


@pytest.mark.parametrize("refusal", ["The sources do not say.", "Nothing here on that."])
async def test_iter_retgen_never_searches_a_refusal(wiki: MemoryRetriever, refusal: str) -> None:
    """A rule draft that found nothing, and a model's refusal in any wording (its flag): the
    next round searches the question alone."""
    worded = rule_steps(wording=Wording(refusal=refusal))
    chat = ScriptedChatModel(
        replies=[GeneratedAnswer(answer=f"Sorry: {refusal}", refused=True)], repeat_last=True
    )
    for steps in (worded, only_llm(chat, "generator")):
        state = await run(IterRetGenStrategy(wiki, steps, k=2, rounds=3), UNANSWERABLE)
        assert every_query(state) == [UNANSWERABLE] * 3
        assert all(h.reasoning and h.reasoning[0].startswith("(refused)") for h in state.hops[:2])


async def test_self_ask_never_asks_on_from_a_refusal(wiki: MemoryRetriever) -> None:
    """The intermediate answers refuse: no follow-up is built from their words, the transcript
    says there was no answer, and no final answer is composed from a refusal."""
    asker = ScriptedChatModel(
        replies=[
            {"follow_up": "Who runs the Moon Guild?", "final_answer": ""},
            {"follow_up": "", "final_answer": "unknown"},
        ]
    )
    answers = ScriptedChatModel(
        replies=[GeneratedAnswer(answer="No passage says.", refused=True)], repeat_last=True
    )
    steps = dataclasses.replace(
        only_llm(asker, "asker"), generate=only_llm(answers, "generator").generate
    )
    state = await run(SelfAskStrategy(wiki, steps, k=2), UNANSWERABLE)
    assert every_query(state) == [UNANSWERABLE, "Who runs the Moon Guild?"]
    assert "Intermediate answer: (no answer)" in as_sent(asker.calls[1])[1]["content"]
    rule = await run(SelfAskStrategy(wiki, rule_steps(), k=2), UNANSWERABLE)
    refusal = rule_steps().generate.wording.refusal  # type: ignore[attr-defined]
    assert not any(refusal.lower() in q.lower() for q in every_query(rule))
    assert not any("say" in q.lower().split() for q in every_query(rule))
