"""Retrieval strategies behind one interface, and the registry that names them.

A strategy of your own is a RetrievalStrategy subclass with a `name`, registered once:
`register_strategy(MyStrategy)` (or as a class decorator). RETRIEVAL_STRATEGY, the harness's
`strategy=NAME` and the dashboard's Ask page then offer it.
"""

from typing import TypeVar

from caprag.registry import Registry
from caprag.strategies.adaptive import AdaptiveDepthStrategy
from caprag.strategies.base import DocumentPool, RetrievalStrategy, Retriever
from caprag.strategies.ircot import IRCoTStrategy
from caprag.strategies.iter_retgen import IterRetGenStrategy
from caprag.strategies.multi_hop import MultiHopStrategy
from caprag.strategies.multi_question import MultiQuestionStrategy
from caprag.strategies.self_ask import SelfAskStrategy
from caprag.strategies.single import SingleQueryStrategy

STRATEGIES: Registry[type[RetrievalStrategy]] = Registry("strategy")
"""Every strategy by its name (RETRIEVAL_STRATEGY, Hydra's `strategy=`)."""


S = TypeVar("S", bound=type[RetrievalStrategy])


def register_strategy(cls: S) -> S:
    """Register a strategy class under its `name`; returns the class (usable as a decorator)."""
    STRATEGIES.register(cls.name, cls)
    return cls


register_strategy(SingleQueryStrategy)
register_strategy(MultiQuestionStrategy)
register_strategy(MultiHopStrategy)
register_strategy(AdaptiveDepthStrategy)
# The published baselines (docs/baselines.md): IRCoT, Self-Ask, Iter-RetGen.
register_strategy(IRCoTStrategy)
register_strategy(SelfAskStrategy)
register_strategy(IterRetGenStrategy)

__all__ = [
    "STRATEGIES",
    "AdaptiveDepthStrategy",
    "DocumentPool",
    "IRCoTStrategy",
    "IterRetGenStrategy",
    "MultiHopStrategy",
    "MultiQuestionStrategy",
    "RetrievalStrategy",
    "Retriever",
    "SelfAskStrategy",
    "SingleQueryStrategy",
    "register_strategy",
]
