"""The harness settings schema: a key a closed group does not know fails in one line with "did
you mean", from a composed config and from the command line's overrides (the CLI's exit 2 and
every bad value's message: tests/reliability/test_harness_inputs.py)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from caprag.config import PROJECT_ROOT
from caprag.errors import ConfigError
from experiments.harness.settings import check_override_keys, check_settings


def composed(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "+experiment.concurency=8",
            "experiment.concurency=8 is not allowed: experiment has no setting 'concurency'; "
            "did you mean 'concurrency'?",
        ),
        (
            "+pipeline.history_pair=3",
            "pipeline.history_pair=3 is not allowed: pipeline has no setting 'history_pair'; "
            "did you mean 'history_pairs'?",
        ),
        (
            "+tracking.trace=false",
            "tracking.trace=false is not allowed: tracking has no setting 'trace'; "
            "did you mean 'traces'?",
        ),
        (
            "+tracking.colour=red",
            "tracking.colour='red' is not allowed: tracking has no setting 'colour'; "
            "known keys: enabled, experiment_name, retries, timeout_s, traces, uri",
        ),
    ],
)
def test_an_unknown_key_in_a_composed_config_names_the_closest_one(
    override: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_settings(composed(override))
    assert str(info.value) == message


def test_an_unknown_key_on_the_command_line_names_the_closest_one() -> None:
    with pytest.raises(ConfigError) as info:
        check_override_keys(["strategy=multi-hop", "experiment.repeets=3", "retriever.k=4"])
    assert str(info.value) == (
        "experiment.repeets=3 is not allowed: experiment has no setting 'repeets'; "
        "did you mean 'repeats'?"
    )


def test_known_keys_groups_and_open_sections_pass_the_override_check() -> None:
    check_override_keys(
        [
            "strategy=adaptive",
            "experiment.concurrency=8",
            "+experiment.metric_modules=[m]",  # added with +: the schema checks it after compose
            "strategy.anything=1",  # a strategy's own keys are its class's arguments
            "paths.corpus=/tmp/books",
            "hydra.job.chdir=true",
        ]
    )


@pytest.mark.parametrize(
    "overrides",
    [
        (),
        ("strategy=adaptive",),
        ("llm=openai", "judge=openai"),
        ("experiment=smoke",),
        ("experiment=compare",),
        ("retriever=dense",),
        ("experiment.workers=3", "experiment.limit_per_set={single_book:2}"),
        ("++llm._target_=tests.fakes.flaky_steps",),
    ],
)
def test_the_shipped_configs_pass_the_schema(overrides: tuple[str, ...]) -> None:
    check_settings(composed(*overrides))
