"""Adaptive stops where deeper search does not pay: top-k agreement, calibrated confidence, and a
timeout that counts searches in harness runs (results independent of machine load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import caprag.clock
from caprag.calibration import Calibration, load_calibration
from caprag.config import PROJECT_ROOT
from caprag.schemas import Document
from caprag.state import GraphState
from caprag.steps import rule_steps
from caprag.steps.assess import heuristic_confidence, score_margin
from caprag.strategies import AdaptiveDepthStrategy
from caprag.strategies.adaptive import (
    Budget,
    Progress,
    SearchClock,
    decide,
)
from experiments.scoring import calibration as calib
from tests.conftest import FIXTURE_BOOKS
from tests.fakes import ManualClock, MemoryRetriever, ScriptedChatModel, scripted_steps

IMPOSSIBLE = "What colour is the dragon's hoard in the moon palace?"
SIMPLE = "How long does a torch burn?"
CALIBRATIONS = PROJECT_ROOT / "caprag" / "calibrations"


def doc(pid: str, score: float = 0.5) -> Document:
    return Document(passage_id=pid, book_id=pid.split("/")[0], text=f"text of {pid}", score=score)


async def run(strategy: AdaptiveDepthStrategy, question: str) -> Any:
    return await strategy.execute(GraphState(main_question=question))


# 1. The stop rule: threshold, nothing new, budgets.


def test_a_round_that_adds_nothing_stops_below_the_threshold_but_never_above_it() -> None:
    budget = Budget()
    low = Progress(0.5, 0.9, depth=2, iteration=2, chunks=15, trimmed=False, elapsed_s=0.0)
    assert decide(low, budget) == "increase_depth"
    stale = Progress(
        0.5, 0.9, depth=2, iteration=2, chunks=15, trimmed=False, elapsed_s=0.0, nothing_new=True
    )
    assert decide(stale, budget) == "no_new_evidence"
    sure = Progress(
        0.95, 0.9, depth=2, iteration=2, chunks=15, trimmed=False, elapsed_s=0.0, nothing_new=True
    )
    assert decide(sure, budget) == "sufficient"


class ReorderingRetriever:
    """A retriever whose every search, whatever it asks, brings passages not seen before."""

    def __init__(self) -> None:
        self.calls = 0

    def search(self, query: str, k: int) -> list[Document]:
        self.calls += 1
        return [doc(f"round{self.calls}/{i}", score=0.9 - i / 100) for i in range(k)]


class SameRetriever:
    """A retriever that answers every search with the same five passages."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def search(self, query: str, k: int) -> list[Document]:
        self.queries.append(query)
        return [doc(f"same/{i}", score=0.5 - i / 100) for i in range(5)][:k]


async def test_deeper_rounds_go_on_while_they_find_new_passages_and_have_something_to_ask() -> None:
    strategy = AdaptiveDepthStrategy(ReorderingRetriever(), rule_steps(), clock=ManualClock())
    state = await run(strategy, IMPOSSIBLE)
    assert [(h.adaptive_decision, len(h.queries)) for h in state.hops] == [
        ("increase_depth", 1),  # the question
        ("increase_depth", 1),  # its expansion: new passages, still short of the threshold
        ("no_new_evidence", 0),  # nothing left to ask that was not asked: the trace says so
    ]


async def test_a_deeper_round_searches_a_new_query_and_stops_when_it_adds_nothing() -> None:
    same = SameRetriever()
    state = await run(AdaptiveDepthStrategy(same, rule_steps(), clock=ManualClock()), IMPOSSIBLE)
    assert [(h.depth, h.adaptive_decision) for h in state.hops] == [
        (1, "increase_depth"),
        (2, "no_new_evidence"),
    ]
    first, *deeper = same.queries
    assert deeper and all(q != first for q in deeper)  # never the same query searched deeper


# 2. Retrieval signals and the calibration.


def test_score_margin_measures_how_far_the_ranking_fell() -> None:
    assert score_margin([doc("a/1", 0.8), doc("a/2", 0.6), doc("a/3", 0.2)]) == pytest.approx(0.75)
    assert score_margin([doc("a/1", 0.8)]) == 0.0
    assert score_margin([doc("a/1", 0.0), doc("a/2", -0.1)]) == 0.0


def test_signals_measured_from_the_retrieval() -> None:
    flurry = Document(
        passage_id="fighting/flurry",
        book_id="fighting",
        book_short="Fighting",
        section="Flurry",
        text="The second attack of a Flurry suffers a penalty, modified by Old Soldier "
        "(Gifts, p. 7).",
        score=0.6,
    )
    other = Document(passage_id="misc/x", book_id="misc", text="Unrelated lore.", score=0.3)
    signals = heuristic_confidence(
        "What penalty does the second attack of a Flurry suffer?", [flurry, other]
    )
    assert signals.coverage == 1.0
    assert signals.open_references == pytest.approx(1 / 3)
    assert signals.margin == pytest.approx(0.5)
    assert signals.log_passages == pytest.approx(np.log(2))


def test_calibration_is_a_logistic_model_of_named_signals() -> None:
    calibration = Calibration(intercept=-1.0, weights={"coverage": 2.0})
    assert calibration.probability({"coverage": 0.5}) == pytest.approx(0.5)
    assert calibration.probability({"coverage": 1.0}) == pytest.approx(1 / (1 + np.exp(-1.0)))
    with pytest.raises(ValueError, match="unknown signals \\['colour'\\]"):
        Calibration(intercept=0.0, weights={"colour": 1.0})
    with pytest.raises(KeyError, match="coverage"):
        calibration.probability({"margin": 1.0})
    assert Calibration.from_config({}) is None
    assert Calibration.from_config(None) is None


@pytest.mark.parametrize("name", ["none", *sorted(p.stem for p in CALIBRATIONS.glob("*.yaml"))])
def test_every_saved_calibration_composes_into_the_strategy(name: str) -> None:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["strategy=adaptive", f"strategy.calibration={name}"])
    strategy = instantiate(cfg.strategy)(retriever=None, steps=rule_steps(), k=8)
    if name == "none":
        assert strategy.calibration is None
    else:
        assert strategy.calibration is not None and strategy.calibration.fitted_on
        assert strategy.calibration == load_calibration(name)


class Fixed:
    """A calibration stand-in with one answer, to steer the loop."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.seen: list[dict[str, float]] = []

    def probability(self, signals: dict[str, float]) -> float:
        self.seen.append(signals)
        return self.value


async def test_calibrated_confidence_is_what_meets_the_threshold(
    books: MemoryRetriever,
) -> None:
    calibration = Calibration(intercept=-3.0, weights={"coverage": 1.0, "log_passages": 0.5})
    strategy = AdaptiveDepthStrategy(
        books, rule_steps(), clock=ManualClock(), calibration=calibration
    )
    state = await run(strategy, SIMPLE)
    first = state.hops[0]
    signals = first.confidence_signals
    assert signals is not None
    raw = heuristic_confidence(SIMPLE, state.questions[0].context[:5]).confidence
    assert signals["heuristic"] == pytest.approx(raw, abs=1e-4)
    assert first.confidence == pytest.approx(calibration.probability(signals), abs=1e-4)
    assert first.confidence is not None and first.confidence < 0.9  # it had to go deeper
    assert first.adaptive_decision == "increase_depth"

    sure = AdaptiveDepthStrategy(books, rule_steps(), clock=ManualClock())
    sure.calibration = Fixed(0.95)  # type: ignore[assignment]
    [hop] = (await run(sure, IMPOSSIBLE)).hops
    assert (hop.confidence, hop.adaptive_decision) == (0.95, "sufficient")


async def test_an_llm_self_assessment_is_not_recalibrated(books: MemoryRetriever) -> None:
    from caprag.steps.assess import ConfidenceAssessment
    from caprag.steps.classify import QueryClass

    chat = ScriptedChatModel(
        replies=[
            QueryClass(query_type="factual", reasoning="one fact"),
            ConfidenceAssessment(confidence=0.93, reasoning="r"),
        ]
    )
    calibration = Fixed(0.1)
    strategy = AdaptiveDepthStrategy(books, scripted_steps(chat), clock=ManualClock())
    strategy.calibration = calibration  # type: ignore[assignment]
    [hop] = (await run(strategy, SIMPLE)).hops
    assert (hop.confidence, hop.adaptive_decision) == (0.93, "sufficient")
    assert calibration.seen == []


def test_fit_learns_the_signal_that_predicts_success_and_is_judged_elsewhere() -> None:
    rng = np.random.default_rng(0)

    def frame(n: int) -> pd.DataFrame:
        coverage = rng.uniform(0, 1, n)
        success = (rng.uniform(0, 1, n) < coverage).astype(float)
        return pd.DataFrame(
            {
                "coverage": coverage,
                "margin": rng.uniform(0, 1, n),
                "log_passages": np.log(rng.choice([5, 15, 30], n)),
                "heuristic": rng.uniform(0, 1, n),
                "success": success,
            }
        )

    fitted = calib.fit(frame(2000), name="synthetic")
    assert fitted.weights["coverage"] > 2.0
    assert abs(fitted.weights["margin"]) < 0.5 and abs(fitted.weights["log_passages"]) < 0.5
    judged = calib.judge(fitted, frame(1000))
    assert judged["ece"] < 0.05 and judged["auc"] > 0.7
    assert judged["auc_uncalibrated"] == pytest.approx(0.5, abs=0.06)  # noise scores at chance
    with pytest.raises(ValueError, match="not a heuristic signal"):
        calib.fit(frame(10), features=("colour",))


def test_saved_calibration_round_trips(tmp_path: Path) -> None:
    calibration = Calibration(intercept=-1.5, weights={"coverage": 2.0}, fitted_on="x")
    calib.save(calibration, tmp_path / "x.yaml", "a note\non two lines")
    text = (tmp_path / "x.yaml").read_text()
    assert text.startswith("# a note\n# on two lines\n")
    import yaml

    assert Calibration.from_config(yaml.safe_load(text)) == calibration


# 3. Harness runs do not depend on machine load.


class BusyMachine:
    """`time` as caprag.clock sees it on a loaded machine: every reading 100 s after the last."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        self.t += 100.0
        return self.t


def harness_strategy(index: MemoryRetriever, tmp: Path) -> AdaptiveDepthStrategy:
    """The adaptive strategy exactly as `experiments.harness.run` builds it from conf/."""
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=["strategy=adaptive", f"paths.corpus={FIXTURE_BOOKS}", f"paths.store={tmp}"],
        )
    calibration = cfg.dataset.calibration  # what `auto` resolves to, as build_components does
    strategy = instantiate(cfg.strategy, calibration=calibration)(
        retriever=index, steps=rule_steps(), k=int(cfg.retriever.k)
    )
    assert isinstance(strategy, AdaptiveDepthStrategy)
    return strategy


def outcome(state: Any) -> list[tuple[Any, ...]]:
    return [
        (h.depth, h.chunks, h.confidence, h.adaptive_decision, [r.passage_id for r in h.documents])
        for h in state.hops
    ] + [tuple(d.passage_id for d in state.context)]


QUESTIONS = (IMPOSSIBLE, SIMPLE, "What penalty does the second attack of a Flurry suffer?")


async def test_harness_results_are_identical_on_a_busy_machine(
    books: MemoryRetriever, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    strategy = harness_strategy(books, tmp_path)
    idle = [outcome(await run(strategy, q)) for q in QUESTIONS]
    assert any(len(result) > 2 for result in idle)  # some question searched deeper
    monkeypatch.setattr(caprag.clock, "time", BusyMachine())
    busy = [outcome(await run(strategy, q)) for q in QUESTIONS]
    assert busy == idle
    # The wall clock under the same load cuts the deeper search off: the case the harness avoids.
    wall = AdaptiveDepthStrategy(
        books, rule_steps(), calibration=strategy.calibration, clock="wall"
    )
    cut = await run(wall, IMPOSSIBLE)
    assert cut.hops[-1].adaptive_decision == "budget_exhausted:timeout"


async def test_the_search_clock_still_enforces_the_timeout(books: MemoryRetriever) -> None:
    strategy = AdaptiveDepthStrategy(
        books,
        rule_steps(),
        timeout_s=0.5,
        clock=lambda: SearchClock(seconds_per_search=1.0),
    )
    for _ in range(2):  # a new count per turn: the second turn is not charged the first's
        state = await run(strategy, IMPOSSIBLE)
        assert [h.adaptive_decision for h in state.hops] == [
            "increase_depth",  # the first search always completes
            "budget_exhausted:timeout",  # the deeper one is charged 1 s of a 0.5 s budget
        ]
    with pytest.raises(ValueError, match="must not be negative"):
        SearchClock(seconds_per_search=-1.0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("strategy.calibration=nonesuch", "calibration='nonesuch' is not allowed: expected auto"),
        ("strategy.clock=sundial", "clock='sundial' is not allowed: expected searches or wall"),
        ("strategy.seconds_per_search=-1", "seconds_per_search=-1 is not allowed: expected a"),
    ],
)
def test_bad_adaptive_settings_fail_with_a_clear_error(override: str, message: str) -> None:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["strategy=adaptive", override])
    with pytest.raises(ValueError, match=message):
        instantiate(cfg.strategy)(retriever=None, steps=rule_steps(), k=8)
