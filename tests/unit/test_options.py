"""Every option of every registered strategy is declared once (`caprag.options`), and a bad
value for any of them is refused in one line (key, value, what is allowed) through each door a
user sets it by: the constructor, the harness's composed config, and the environment the API
serves from. The CLI's exit 2 before anything is built: tests/reliability/test_harness_inputs.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from caprag.config import PROJECT_ROOT
from caprag.errors import ConfigError
from caprag.options import BUILT_IN, TARGETS, StrategyOptions, markdown
from caprag.retrieval.base import Retriever
from caprag.steps import rule_steps
from caprag.strategies import STRATEGIES, RetrievalStrategy
from experiments.harness.groups import strategy_node
from experiments.harness.settings import check_settings
from tests.unit.test_settings_schema import composed

BAD = "bogus"
"""A value no option allows: a word where every option wants a number, a flag, a list, a
mapping, one of a few words or a saved calibration's name."""

OPTIONS = [
    (name, option)
    for name, cls in sorted(STRATEGIES.items())
    for option in cls.Options.model_fields
]


class NoRetriever:
    """A retriever the option checks never reach."""

    k = 8

    def search(self, query: str, k: int | None = None) -> list[Any]:
        raise AssertionError("an option check searched")


def one_line(error: pytest.ExceptionInfo[ConfigError], key: str, value: str) -> str:
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{key}={value} is not allowed: expected "), message
    return message


def test_every_registered_strategy_declares_its_options_where_the_light_catalogue_says() -> None:
    for name, cls in STRATEGIES.items():
        assert issubclass(cls.Options, StrategyOptions)
        if name in BUILT_IN:
            assert BUILT_IN[name] is cls.Options and cls.Options.strategy == name
            assert TARGETS[f"caprag.strategies.{cls.__name__}"] is cls.Options
    assert set(BUILT_IN) <= set(STRATEGIES)


def test_the_hydra_groups_hold_the_models_defaults() -> None:
    for name, cls in STRATEGIES.items():
        node = OmegaConf.to_container(composed(f"strategy={name}").strategy, resolve=True)
        assert isinstance(node, dict)
        options = {k: v for k, v in node.items() if not k.startswith("_")}
        assert options == cls.Options.node(), name
        assert node["_target_"] == strategy_node(cls)["_target_"].replace(
            cls.__module__, "caprag.strategies"
        )


@pytest.mark.parametrize(("name", "option"), OPTIONS)
def test_a_bad_option_is_one_line_from_the_constructor(name: str, option: str) -> None:
    cls: type[RetrievalStrategy] = STRATEGIES.choose(name)
    retriever: Retriever = NoRetriever()  # type: ignore[assignment]
    with pytest.raises(ConfigError) as error:
        cls(retriever, rule_steps(), 8, **{option: BAD})
    one_line(error, f"{name}.{option}", repr(BAD))


@pytest.mark.parametrize(("name", "option"), OPTIONS)
def test_a_bad_option_is_one_line_from_the_harness_config(name: str, option: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_settings(composed(f"strategy={name}", f"strategy.{option}={BAD}"))
    one_line(error, f"strategy.{option}", repr(BAD))


@pytest.mark.parametrize(("name", "option"), OPTIONS)
def test_a_bad_option_is_one_line_from_its_environment_variable(name: str, option: str) -> None:
    cls = STRATEGIES.choose(name)
    variable = cls.Options.env_name(option, name)
    with pytest.raises(ConfigError) as error:
        cls.served_options({variable: BAD})
    one_line(error, variable, repr(BAD))


def test_each_variable_sets_one_option_of_one_strategy() -> None:
    names = [
        cls.Options.env_name(o, n)
        for n, cls in STRATEGIES.items()
        for o in cls.Options.model_fields
    ]
    assert len(names) == len(set(names))
    served = {
        name: cls.served_options({"CAPRAG_MAX_HOPS": "5", "CAPRAG_ITER_RETGEN_ROUNDS": "2"})
        for name, cls in STRATEGIES.items()
    }
    assert served["multi-hop"]["max_hops"] == 5  # its older name, kept for it alone
    assert served["iter-retgen"]["rounds"] == 2
    assert served["ircot"]["max_steps"] == 3 and served["self-ask"]["max_follow_ups"] == 2


def test_options_that_must_fit_together_say_how() -> None:
    with pytest.raises(ConfigError) as error:
        check_settings(
            composed("strategy=adaptive", "strategy.depth_chunks=[5,15]", "strategy.power=3")
        )
    assert str(error.value) == (
        "strategy.power=3 is not allowed: expected auto or a whole number from 1 to 2"
    )
    with pytest.raises(ConfigError) as error:
        check_settings(composed("strategy=multi-hop", "+strategy.max_hop=2"))
    assert str(error.value) == (
        "strategy.max_hop=2 is not allowed: multi-hop has no option 'max_hop' (its options: "
        "max_hops, follow_k, analyze_k, expand_first_hop, n_subquestions)"
    )


def test_the_docs_list_every_option_as_the_models_declare_it() -> None:
    page = Path(PROJECT_ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    assert page == markdown(), (
        "docs/options.md is stale: run python -m caprag.options docs/options.md"
    )
