"""Every harness setting checked against what it allows, before anything is built or run.

One pydantic schema of the settings (`Settings`): each field says what it allows in its
description, and a bad value becomes one line naming the key, the value and that description; a
key the schema does not know gets "did you mean" from the keys it does.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from caprag.errors import ConfigError
from caprag.options import (
    TARGETS,
    StrategyOptions,
    above_zero,
    at_least_zero,
    flag,
    not_allowed_line,
    shown,
    whole,
)
from caprag.text import DEFAULT_REFUSAL

URI_FORMS = (
    "sqlite:///PATH, file:PATH, a plain folder path, http(s)://HOST[:PORT], "
    "postgresql|mysql|mssql://USER@HOST/DB or databricks"
)

DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
"""SQLAlchemy stores MLflow opens (with or without a driver: postgresql+psycopg2://...)."""

WORKERS_AUTO = "auto"
"""experiment.workers=auto (experiments.harness.workers.AUTO: that module is not imported here)."""

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")

NOT_ALLOWED = "not_allowed"
"""The error type of a check across fields; its context holds key, value and allowed."""


def whole_or_null(minimum: int, null: str, meaning: str) -> Any:
    """A whole number of at least `minimum`, or null (meaning `null`)."""
    allowed = f"a whole number of at least {minimum} or null for {null} ({meaning})"
    return Field(ge=minimum, description=allowed)


class Section(BaseModel):
    """A group of settings: strict types (no 'yes' for true, no '3' for 3)."""

    model_config = ConfigDict(strict=True, extra="allow")


class Closed(Section):
    """A group whose every key the schema knows: another key is a typo."""

    model_config = ConfigDict(strict=True, extra="forbid")


class Index(Section):
    chunk_chars: Annotated[int | None, whole(1, "characters per embedded chunk")] = None


class Retriever(Section):
    k: Annotated[int, whole(1, "passages handed to generation")]
    index: Index | None = None


class Experiment(Closed):
    name: Annotated[str | int, Field(description="a run name")] = "default"
    concurrency: Annotated[int, whole(1, "questions in flight at once")] = 4
    workers: Annotated[
        Literal["auto"] | Annotated[int, Field(ge=1)],
        Field(
            description="auto or a whole number of at least 1 (processes that answer the questions)"
        ),
    ] = "auto"
    limit: Annotated[int | None, whole_or_null(1, "every case", "run the first N cases")] = None
    limit_per_set: Annotated[
        Annotated[int, Field(ge=1)] | dict[str, Annotated[int, Field(ge=1)]] | None,
        Field(
            description="a whole number of at least 1 or null for every case (the first N cases "
            "of each set, or per set {single_book: 3, follow_up: 1})",
            json_schema_extra={
                "each": "a whole number of at least 1 (the first N cases of that set)"
            },
        ),
    ] = None
    question_timeout_s: Annotated[float, above_zero("seconds one question may take")] = 120.0
    progress: Annotated[bool, flag("show a progress bar")] = True
    ragas: Annotated[bool, flag("compute the offline RAGAS metrics")] = True
    tags: Annotated[dict[str, Any], Field(description="a mapping of tag names to values")] = {}
    cache: Annotated[bool, flag("answer identical LLM calls from paths.cache")] = True
    resume: Annotated[
        str | int | None,
        Field(description="auto, never or the RUN_ID of an unfinished run"),
    ] = "auto"
    dry_run: Annotated[bool, flag("estimate the cost and ask nothing")] = False
    dry_run_sample: Annotated[int, whole(1, "questions the dry run asks offline")] = 8
    repeats: Annotated[int, whole(1, "times every question is run")] = 1
    seed: Annotated[int, Field(description="a whole number (the LLM seed of the first repeat)")] = 0
    metric_modules: Annotated[
        list[str] | None, Field(description="a list of module names that register metrics")
    ] = None

    @model_validator(mode="after")
    def _resume_names_something(self) -> Experiment:
        if self.resume is not None and not str(self.resume).strip():
            raise not_allowed(
                "experiment.resume", self.resume, "auto, never or the RUN_ID of an unfinished run"
            )
        return self


class Pipeline(Closed):
    rewrite: Annotated[bool, flag("rewrite follow-ups into standalone questions")] = True
    history_pairs: Annotated[int, whole(0, "question/answer pairs the steps see")] = 20
    refusal: Annotated[
        str,
        Field(
            min_length=1,
            max_length=200,
            description="a sentence of 1 to 200 characters (the generator's answer when the "
            "passages hold none)",
        ),
    ] = DEFAULT_REFUSAL


class Tracking(Closed):
    enabled: Annotated[bool, flag("log the run to MLflow")] = True
    uri: Annotated[str | None, Field(description=URI_FORMS)] = None
    experiment_name: Annotated[
        str | None, Field(description="a non-empty MLflow experiment name")
    ] = "caprag"
    traces: Annotated[bool, flag("one MLflow trace per question")] = True
    retries: Annotated[int, whole(0, "retries of a failed request to an MLflow server")] = 3
    timeout_s: Annotated[float, above_zero("seconds one request to an MLflow server may take")] = 10

    @model_validator(mode="after")
    def _named_when_enabled(self) -> Tracking:
        name = self.experiment_name
        if self.enabled and (name is None or not name.strip()):
            raise not_allowed(
                "tracking.experiment_name", name, "a non-empty MLflow experiment name"
            )
        return self


class Client(Section):
    """The client settings of an LLM backend."""

    timeout_s: Annotated[float, above_zero("seconds one LLM call may take")] = 30.0
    max_retries: Annotated[int, whole(0, "retries of a failed call")] = 3
    parse_attempts: Annotated[int, whole(1, "tries to get a parseable reply")] = 3
    max_output_tokens: Annotated[int, whole(1, "the output cap of one reply")] = 512
    temperature: Annotated[float, at_least_zero("the sampling temperature")] = 0.0


class Llm(Section):
    client: Client | None = None


class Judge(Section):
    max_output_tokens: Annotated[
        int | None,
        whole_or_null(1, "the server's default", "the output cap of one judge reply"),
    ] = None


class Settings(Section):
    """The harness settings `run` reads, as one schema."""

    retriever: Retriever
    experiment: Experiment
    pipeline: Pipeline
    tracking: Tracking
    strategy: dict[str, Any]
    llm: Llm
    judge: Judge | None = None


SECTIONS = ("retriever", "experiment", "pipeline", "tracking", "strategy", "llm", "judge")


def not_allowed(key: str, value: Any, allowed: str) -> PydanticCustomError:
    """A check across fields that failed, as pydantic reports it (key, value, allowed kept)."""
    return PydanticCustomError(
        NOT_ALLOWED, "{key} is not allowed", {"key": key, "value": value, "allowed": allowed}
    )


def _bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(not_allowed_line(key, value, allowed))


def _section_data(cfg: DictConfig) -> dict[str, Any]:
    """The checked sections as plain data (interpolations resolved); an llm group built by its
    own `_target_` has no client settings to check."""
    data: dict[str, Any] = {}
    for name in SECTIONS:
        node = OmegaConf.select(cfg, name, default=None)
        data[name] = (
            OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        )
    llm = data.get("llm")
    if isinstance(llm, dict) and "_target_" in llm:
        data["llm"] = {k: v for k, v in llm.items() if k != "client"}
    return data


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The schema class a field holds (also inside `X | None`), else None."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _locate(loc: Sequence[int | str], data: Any) -> tuple[list[str], Any, Any, bool]:
    """Follow an error's location through the schema and the data: (key path, value there, the
    field it belongs to, whether the last step is a key the schema does not know)."""
    model: type[BaseModel] | None = Settings
    field = None
    path: list[str] = []
    value = data
    for step in loc:
        if model is not None and isinstance(step, str):
            if step not in model.model_fields:
                path.append(step)
                value = value.get(step) if isinstance(value, Mapping) else None
                return path, value, model, True
            field = model.model_fields[step]
            model = _model_of(field.annotation)
        elif isinstance(step, int) and isinstance(value, list):
            break  # an element of a list: the list is named and shown whole
        elif not (isinstance(value, Mapping) and step in value):
            continue  # the member of a union pydantic tried (`int`, `dict[str,...]`)
        path.append(str(step))
        value = value[step] if isinstance(value, Mapping) else None
    return path, value, field, False


def _did_you_mean(name: str, model: type[BaseModel]) -> str:
    known = sorted(model.model_fields)
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    return "known keys: " + ", ".join(known)


def _one_line(error: ValidationError, data: dict[str, Any]) -> ConfigError:
    """The error a user acts on: the deepest key of the first setting that failed."""
    best: tuple[list[str], Any, Any, bool] | None = None
    for item in error.errors():
        if item["type"] == NOT_ALLOWED:
            ctx = item.get("ctx") or {}
            return _bad(ctx["key"], ctx["value"], ctx["allowed"])
        found = _locate(item["loc"], data)
        if best is None or (best[0][:1] == found[0][:1] and len(found[0]) > len(best[0])):
            best = found
    assert best is not None
    path, value, field, unknown = best
    key = ".".join(path)
    if unknown:
        section = ".".join(path[:-1])
        return ConfigError(
            f"{key}={shown(value)} is not allowed: {section} has no setting {path[-1]!r}; "
            + _did_you_mean(path[-1], field)
        )
    allowed = field.description if field is not None else None
    extra = field.json_schema_extra if field is not None else None
    if isinstance(extra, dict) and isinstance(extra.get("each"), str) and len(path) > 2:
        allowed = extra["each"]  # an entry of a mapping (limit_per_set.single_book)
    return _bad(key, value, allowed or "a valid value")


def check_override_keys(overrides: Sequence[str]) -> None:
    """Command-line overrides of keys a closed group (experiment, pipeline, tracking) does not
    have, as one line with "did you mean", before Hydra refuses them without a suggestion."""
    for override in overrides:
        key, equals, value = override.partition("=")
        section, dot, name = key.partition(".")
        field = Settings.model_fields.get(section) if dot else None
        model = _model_of(field.annotation) if field is not None else None
        if (
            equals
            and model is not None
            and issubclass(model, Closed)
            and "." not in name
            and name not in model.model_fields
        ):
            raise ConfigError(
                f"{key}={value} is not allowed: {section} has no setting {name!r}; "
                + _did_you_mean(name, model)
            )


def options_model(target: str) -> tuple[type[StrategyOptions], str]:
    """The options model of the strategy a `_target_` names, and the strategy's name: a
    built-in's from the light catalogue (`caprag.options.TARGETS`), another's from its class (a
    plugin, imported already)."""
    if target in TARGETS:
        return TARGETS[target], TARGETS[target].strategy
    cls = get_class(target)
    options = getattr(cls, "Options", StrategyOptions)
    return options, str(getattr(cls, "name", target))


def check_strategy_options(strategy: Mapping[str, Any]) -> None:
    """The chosen strategy's options against its model, as a config file types them (strict:
    no '3' for 3); the `_target_`-style keys are Hydra's. One-line ConfigError."""
    target = strategy.get("_target_")
    if not isinstance(target, str):
        return  # not a strategy Hydra builds (the error comes when it is built)
    options = {k: v for k, v in strategy.items() if not k.startswith("_")}
    model, name = options_model(target)
    model.check(options, "strategy", strict=True, strategy=name)


def check_tracking_uri(cfg: DictConfig) -> None:
    """The MLflow store URI has a form MLflow can open, before MLflow is asked to open it."""
    configured = OmegaConf.select(cfg, "tracking.uri", default=None)
    key, value = "tracking.uri", configured
    if configured is None:
        key, value = "MLFLOW_TRACKING_URI", os.environ.get("MLFLOW_TRACKING_URI")
    if value is None:
        return  # the project's SQLite file
    if not isinstance(value, str) or not value.strip():
        raise _bad(key, value, URI_FORMS)
    scheme = SCHEME.match(value)
    name = scheme.group(1).lower() if scheme else ""
    fine = (
        not scheme  # a plain path
        or (name == "sqlite" and value.startswith("sqlite:///") and len(value) > len("sqlite:///"))
        or (name == "file" and len(value) > len("file:"))
        or (name in ("http", "https") and len(value.split("://", 1)[-1].strip("/")) > 0)
        or (name.split("+")[0] in DATABASE_SCHEMES and "://" in value)
        or (name == "databricks")
    )
    if not fine or (name in ("http", "https") and "://" not in value):
        raise _bad(key, value, URI_FORMS)


def check_settings(cfg: DictConfig) -> None:
    """Every harness setting against what it allows, before anything is built or run.

    Raises ConfigError naming the key, its value and what is allowed (one line).
    """
    data = _section_data(cfg)
    try:
        Settings.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, data) from None
    check_strategy_options(data["strategy"])
    if data["tracking"].get("enabled"):
        check_tracking_uri(cfg)
