"""The config group members the registries add: a registered retriever or strategy without a
yaml in conf/ is still choosable as `retriever=NAME` / `strategy=NAME`, as a structured config
node in Hydra's ConfigStore (the yaml, where there is one, says more: comments, tuned values).

The registries are watched, not imported: the modules that hold them import LangChain, LangGraph
and Chroma, which a command that fails on a typo'd override never needs (every built-in member
has a yaml; a plugin's registers when CAPRAG_PLUGINS imports it, before Hydra composes)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore

from caprag import registry
from caprag.config import PROJECT_ROOT

if TYPE_CHECKING:
    from caprag.strategies import RetrievalStrategy

CONF = PROJECT_ROOT / "conf"
DEFAULT_K = 8
"""retriever.k of a node: the fixed passage budget every conf/retriever/ yaml sets."""


def retriever_node(name: str) -> dict[str, Any]:
    """`retriever=NAME`: that kind's index, built by build_index over the configured corpus."""
    return {
        "k": DEFAULT_K,
        "index": {
            "_target_": "experiments.harness.build.build_index",
            "corpus": "${paths.corpus}",
            "store": "${paths.store}",
            "kind": name,
        },
    }


def strategy_node(cls: type[RetrievalStrategy]) -> dict[str, Any]:
    """`strategy=NAME`: the class, given its retriever, steps and k by the harness, with its
    options' defaults (its `Options` model) to override."""
    target = {"_target_": f"{cls.__module__}.{cls.__qualname__}", "_partial_": True}
    return {**target, **cls.Options.node()}


def _offer(group: str, name: str, node: dict[str, Any]) -> None:
    if not (CONF / group / f"{name}.yaml").exists():
        ConfigStore.instance().store(group=group, name=name, node=node)


@functools.cache
def offer_registered() -> None:
    """Put every registered retriever and strategy without a yaml into its group, now and
    whenever one is registered later (once per process)."""
    registry.watch("retriever", lambda name, _kind: _offer("retriever", name, retriever_node(name)))
    registry.watch("strategy", lambda name, cls: _offer("strategy", name, strategy_node(cls)))  # type: ignore[arg-type]
