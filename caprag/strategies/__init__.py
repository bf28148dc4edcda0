"""Retrieval strategies behind one interface, and the registry that names them."""

from caprag.strategies.adaptive import AdaptiveDepthStrategy
from caprag.strategies.base import DocumentPool, RetrievalStrategy, Retriever
from caprag.strategies.multi_hop import MultiHopStrategy
from caprag.strategies.multi_question import MultiQuestionStrategy
from caprag.strategies.single import SingleQueryStrategy

STRATEGIES: dict[str, type[RetrievalStrategy]] = {
    cls.name: cls
    for cls in (SingleQueryStrategy, MultiQuestionStrategy, MultiHopStrategy, AdaptiveDepthStrategy)
}

__all__ = [
    "STRATEGIES",
    "AdaptiveDepthStrategy",
    "DocumentPool",
    "MultiHopStrategy",
    "MultiQuestionStrategy",
    "RetrievalStrategy",
    "Retriever",
    "SingleQueryStrategy",
]
