"""Every strategy's options, declared once: default, bounds and a one-line doc in one model.

A strategy's `Options` model is what its constructor checks and reads, what Hydra's
`strategy=NAME` group holds (`experiments.harness.groups` puts the defaults in the ConfigStore),
what the harness checks before anything is built, what the API reads from the environment
(`CAPRAG_<STRATEGY>_<OPTION>`, one name per option of one strategy) and what `docs/options.md`
lists (`python -m caprag.options` writes it). A bad value anywhere is one line naming the key, the
value and what is allowed.

The built-in strategies' models live here, in the core, and not beside their strategies: the
settings check and a Hydra command that fails on a typo import only pydantic, not the strategies'
LangChain and LangGraph. A plugin strategy declares its own (`Options = MyOptions` on the class).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, InstanceOf, ValidationError, model_validator
from pydantic_core import PydanticCustomError, PydanticUndefined

from caprag.calibration import Calibration, calibration_names
from caprag.clock import Clock
from caprag.errors import OptionError

CROSS = "options_across"
"""The error type of a check across options; its context names the key and what is allowed."""


def whole(minimum: int, meaning: str, default: Any = PydanticUndefined) -> Any:
    """A whole number of at least `minimum` (no default unless given)."""
    return Field(
        default, ge=minimum, description=f"a whole number of at least {minimum} ({meaning})"
    )


def above_zero(meaning: str, default: Any = PydanticUndefined) -> Any:
    """A number above 0."""
    return Field(default, gt=0, allow_inf_nan=False, description=f"a number above 0 ({meaning})")


def at_least_zero(meaning: str, default: Any = PydanticUndefined) -> Any:
    """A number of at least 0."""
    return Field(default, ge=0, allow_inf_nan=False, description=f"a number at least 0 ({meaning})")


def flag(meaning: str, default: Any = PydanticUndefined) -> Any:
    """true or false."""
    return Field(default, description=f"true or false ({meaning})")


def across(key: str, allowed: str) -> PydanticCustomError:
    """A check across options that failed, reported on `key`."""
    return PydanticCustomError(CROSS, "{key} is not allowed", {"key": key, "allowed": allowed})


def shown(value: Any) -> str:
    """A value as the user wrote it in a config or the environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def not_allowed_line(key: str, value: Any, allowed: str) -> str:
    """`KEY=VALUE is not allowed: expected ALLOWED`: how every bad setting is reported."""
    return f"{key}={shown(value)} is not allowed: expected {allowed}"


class StrategyOptions(BaseModel):
    """A strategy's options (none for the base): subclass it with one field per option."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: ClassVar[str] = ""
    """The strategy's registered name: the environment variables' prefix."""
    legacy_env: ClassVar[Mapping[str, str]] = {}
    """Older environment names still read for an option (each meant this option only)."""

    @classmethod
    def env_name(cls, option: str, strategy: str | None = None) -> str:
        """`CAPRAG_MULTI_HOP_MAX_HOPS`: the one environment variable of one option of one
        strategy (`strategy`: a subclass's name, when it keeps the options of its parent)."""
        prefix = (strategy or cls.strategy).upper().replace("-", "_")
        return f"CAPRAG_{prefix}_{option.upper()}"

    @classmethod
    def check(
        cls,
        values: Mapping[str, Any],
        where: str = "",
        *,
        strict: bool = False,
        strategy: str | None = None,
    ) -> Self:
        """The options, checked; OptionError of one line (key, value, what is allowed) for the
        first that is wrong. `where` prefixes the keys (`strategy.rounds`); `strict` refuses '3'
        for 3 (a config file's types); `strategy` names the strategy (default: the model's)."""
        try:
            return cls.model_validate(dict(values), strict=strict)
        except ValidationError as exc:
            named = {o: f"{where}.{o}" if where else o for o in values}
            raise cls._one_line(exc, values, named, strategy) from None

    @classmethod
    def _one_line(
        cls,
        error: ValidationError,
        values: Mapping[str, Any],
        named: Mapping[str, str],
        strategy: str | None,
    ) -> OptionError:
        """The first problem, on the key the user wrote (`named`: option -> that key)."""
        item = error.errors()[0]
        ctx = item.get("ctx") or {}
        option = str(ctx["key"] if item["type"] == CROSS else item["loc"][0] if item["loc"] else "")
        key = named.get(option, option)
        value = values.get(option)
        if item["type"] == "extra_forbidden":
            known = ", ".join(cls.model_fields) or "none"
            return OptionError(
                f"{key}={shown(value)} is not allowed: {strategy or cls.strategy} has no "
                f"option {option!r} (its options: {known})"
            )
        if item["type"] == CROSS:
            allowed = str(ctx["allowed"])
        else:
            field = cls.model_fields.get(option)
            allowed = (field.description if field else None) or "a valid value"
        return OptionError(not_allowed_line(key, value, allowed))

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, strategy: str | None = None
    ) -> Self:
        """The options the environment sets (`CAPRAG_<STRATEGY>_<OPTION>`, then an option's
        older name), the rest at their defaults; OptionError naming the variable."""
        environ = os.environ if environ is None else environ
        strategy = strategy or cls.strategy
        legacy = cls.legacy_env if strategy == cls.strategy else {}
        values: dict[str, Any] = {}
        named: dict[str, str] = {}
        for option in cls.model_fields:
            names = (cls.env_name(option, strategy), legacy.get(option))
            name = next((n for n in names if n and n in environ), None)
            if name is not None:
                values[option], named[option] = _parsed(environ[name]), name
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            named.update((o, cls.env_name(o, strategy)) for o in cls.model_fields if o not in named)
            raise cls._one_line(exc, values, named, strategy) from None

    @classmethod
    def node(cls) -> dict[str, Any]:
        """The defaults as a Hydra group holds them (plain data)."""
        return cls().model_dump(mode="json")

    @classmethod
    def rows(cls) -> list[tuple[str, str, str, str]]:
        """(option, default, allowed, environment variable) for the docs."""
        defaults = cls.node()
        return [
            (name, shown(defaults[name]), field.description or "", cls.env_name(name))
            for name, field in cls.model_fields.items()
        ]


def _parsed(text: str) -> Any:
    """An environment value: JSON for a mapping or a list, None for null, else the text
    (pydantic converts it to the option's type)."""
    stripped = text.strip()
    if stripped.lower() == "null":
        return None
    if stripped[:1] in ("{", "["):
        try:
            return json.loads(stripped)
        except ValueError:
            return text
    return text


class SingleOptions(StrategyOptions):
    """One search with the (rewritten) question: no options."""

    strategy = "single"


class MultiQuestionOptions(StrategyOptions):
    strategy = "multi-question"

    n_subquestions: Annotated[int, whole(1, "sub-questions the expand step writes", 3)]


class MultiHopOptions(StrategyOptions):
    strategy = "multi-hop"
    legacy_env = {"max_hops": "CAPRAG_MAX_HOPS", "expand_first_hop": "CAPRAG_EXPAND_FIRST_HOP"}

    max_hops: Annotated[int, whole(1, "searches in all: the question's, then one per hop", 3)]
    follow_k: Annotated[
        int, whole(1, "new passages kept per follow-up query; the budget k stays fixed", 1)
    ]
    analyze_k: Annotated[int, whole(1, "passages the analyzer reads per hop", 5)]
    expand_first_hop: Annotated[bool, flag("also search the question's expansion on hop 1", False)]
    n_subquestions: Annotated[int, whole(1, "sub-questions of that expansion", 3)]


class IRCoTOptions(StrategyOptions):
    strategy = "ircot"

    max_steps: Annotated[
        int, whole(1, "searches in all: the question's, then one per reasoning sentence", 3)
    ]
    follow_k: Annotated[int, whole(1, "new passages a sentence's search adds to the context", 2)]
    reason_k: Annotated[int, whole(1, "passages the reasoner reads per step", 5)]


class SelfAskOptions(StrategyOptions):
    strategy = "self-ask"

    max_follow_ups: Annotated[
        int, whole(1, "follow-up questions at most; with the question's, searches - 1", 2)
    ]
    follow_k: Annotated[int, whole(1, "new passages a follow-up's search adds to the context", 2)]
    answer_k: Annotated[int, whole(1, "passages an intermediate answer reads", 3)]


class IterRetGenOptions(StrategyOptions):
    strategy = "iter-retgen"

    rounds: Annotated[int, whole(1, "retrieve-then-generate rounds, one search each", 3)]


QueryType = Literal["factual", "operational", "decision", "strategic"]
ClockChoice = Literal["searches", "wall"]


class QueryProfile(BaseModel):
    """How sure retrieval must be for a query type, and the depth it starts at."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    depth: Annotated[int, Field(ge=1, le=3)]


DEFAULT_PROFILES: dict[QueryType, QueryProfile] = {
    "factual": QueryProfile(threshold=0.9, depth=1),
    "operational": QueryProfile(threshold=0.7, depth=1),
    "decision": QueryProfile(threshold=0.85, depth=2),
    "strategic": QueryProfile(threshold=0.9, depth=3),
}
DEFAULT_DEPTH_CHUNKS = (5, 15, 30)


class AdaptiveOptions(StrategyOptions):
    """Adaptive depth's thresholds, ladder and budgets (`conf/strategy/adaptive.yaml` says how
    they work together)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    strategy = "adaptive"
    legacy_env = {
        "depth_chunks": "CAPRAG_DEPTH_CHUNKS",
        "calibration": "CAPRAG_CALIBRATION",
        "clock": "CAPRAG_ADAPTIVE_CLOCK",
    }

    query_types: Annotated[
        dict[QueryType, QueryProfile],
        Field(
            default_factory=lambda: dict(DEFAULT_PROFILES),
            description="a mapping of factual, operational, decision or strategic to "
            "{threshold: at least 0, depth: 1-3} (the confidence that stops, above 1 never; "
            "the depth to start at)",
        ),
    ]
    depth_chunks: Annotated[
        list[Annotated[int, Field(ge=1)]],
        Field(
            default_factory=lambda: list(DEFAULT_DEPTH_CHUNKS),
            min_length=1,
            max_length=3,
            description="1 to 3 whole numbers of at least 1, such as 5,15,30 (passages handed on "
            "at depth 1, 2, 3)",
        ),
    ]
    power: Annotated[
        Literal["auto", 1, 2, 3],
        Field(description="auto, 1, 2 or 3 (force one retrieval at that depth)"),
    ] = "auto"
    max_depth: Annotated[
        int | None,
        Field(
            ge=1,
            description="a whole number from 1 to the ladder's length, or null for the ladder's "
            "length (the deepest depth)",
        ),
    ] = None
    max_iterations: Annotated[int, whole(1, "searches in all", 3)]
    max_chunks: Annotated[int, whole(1, "passages gathered in all", 50)]
    max_context_tokens: Annotated[
        int, whole(1, "tokens of the passages handed to generation", 10_000)
    ]
    max_cost_usd: Annotated[
        float | None,
        Field(
            gt=0,
            allow_inf_nan=False,
            description="a number above 0, or null for no limit (USD the retrieval steps may "
            "spend in one turn)",
        ),
    ] = None
    timeout_s: Annotated[
        float,
        above_zero(
            "seconds the retrieval may take from classification on; the first search always "
            "completes",
            5.0,
        ),
    ]
    clock: Annotated[
        ClockChoice | InstanceOf[Clock] | Callable[[], Clock],
        Field(
            description="searches or wall (what the timeout counts: searches costing "
            "seconds_per_search each, the same on any machine, or wall seconds)"
        ),
    ] = "searches"
    seconds_per_search: Annotated[
        float,
        at_least_zero("what each search after the first costs the timeout, clock=searches", 1.0),
    ]
    calibration: Annotated[
        str | InstanceOf[Calibration] | dict[str, Any] | None,
        Field(
            description="auto (the dataset's choice; served: none), none (the weighted heuristic "
            "as it is) or a saved calibration's name (caprag/calibrations/)"
        ),
    ] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _ladder_text(cls, data: Any) -> Any:
        """depth_chunks as the environment writes it: 5,15,30."""
        if isinstance(data, dict) and isinstance(data.get("depth_chunks"), str):
            parts = data["depth_chunks"].replace(",", " ").split()
            if parts and all(p.isdigit() for p in parts):
                data = {**data, "depth_chunks": [int(p) for p in parts]}
        if isinstance(data, dict) and isinstance(data.get("power"), str):
            power = data["power"].strip().lower()
            data = {**data, "power": int(power) if power.isdigit() else power}
        return data

    @model_validator(mode="after")
    def _fits_together(self) -> Self:
        deepest = len(self.depth_chunks)
        if self.max_depth is not None and self.max_depth > deepest:
            raise across("max_depth", f"a whole number from 1 to {deepest} (one per depth_chunks)")
        if self.power != "auto" and self.power > self.deepest:
            raise across("power", f"auto or a whole number from 1 to {self.deepest}")
        if isinstance(self.calibration, str) and self.calibration not in (
            "auto",
            *calibration_names(),
        ):
            raise across("calibration", "auto or one of " + ", ".join(calibration_names()))
        return self

    @property
    def deepest(self) -> int:
        """The deepest depth a turn may reach: max_depth, else the ladder's length."""
        return self.max_depth or len(self.depth_chunks)


BUILT_IN: dict[str, type[StrategyOptions]] = {
    options.strategy: options
    for options in (
        SingleOptions,
        MultiQuestionOptions,
        MultiHopOptions,
        AdaptiveOptions,
        IRCoTOptions,
        SelfAskOptions,
        IterRetGenOptions,
    )
}
"""The built-in strategies' options by strategy name (the classes point at the same models)."""
TARGETS: dict[str, type[StrategyOptions]] = {
    "caprag.strategies.SingleQueryStrategy": SingleOptions,
    "caprag.strategies.MultiQuestionStrategy": MultiQuestionOptions,
    "caprag.strategies.MultiHopStrategy": MultiHopOptions,
    "caprag.strategies.AdaptiveDepthStrategy": AdaptiveOptions,
    "caprag.strategies.IRCoTStrategy": IRCoTOptions,
    "caprag.strategies.SelfAskStrategy": SelfAskOptions,
    "caprag.strategies.IterRetGenStrategy": IterRetGenOptions,
}
"""The built-in options by the `_target_` of their Hydra group, so that the harness checks a
strategy's options without importing the strategies (tests/unit/test_options.py holds it equal
to the classes' own `Options`)."""


def markdown(models: Mapping[str, type[StrategyOptions]] | None = None) -> str:
    """docs/options.md: every option of every strategy, from the models."""
    lines = [
        "# Strategy options",
        "",
        "Written by `python -m caprag.options` from the strategies' option models "
        "(`caprag/options.py`): do not edit by hand.",
        "",
        "Each option is set in the harness as `strategy.OPTION=VALUE` (`conf/strategy/NAME.yaml` "
        "takes its defaults from the model) and for the API, the CLI and the dashboard by its "
        "own environment variable, which means that option of that strategy only. A bad value "
        "anywhere is refused in one line naming the key, the value and what is allowed.",
    ]
    for name, model in (models or BUILT_IN).items():
        lines += ["", f"## {name}", ""]
        rows = model.rows()
        if not rows:
            lines.append("No options.")
            continue
        lines += ["| option | default | allowed | environment |", "|---|---|---|---|"]
        for option, default, allowed, env in rows:
            names = " or ".join(f"`{n}`" for n in (env, model.legacy_env.get(option)) if n)
            lines.append(f"| `{option}` | `{default}` | {allowed} | {names} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m caprag.options [FILE]: the docs page
    text = markdown()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
