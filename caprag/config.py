"""Settings from the environment, validated at start-up."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from caprag.errors import ConfigError, MissingAPIKeyError
from caprag.registry import ROLES, check_known, load_plugins
from caprag.text import DEFAULT_REFUSAL

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BUNDLED_CORPUS = PROJECT_ROOT / "datasets" / "books"

LLMName = Literal["offline", "openai"]
StructuredMethod = Literal["function_calling", "json_schema", "json_mode"]
StepChoice = Literal["auto", "rule", "llm"]
PowerChoice = Literal["auto", 1, 2, 3]
"""Adaptive depth of a served turn: automatic, or forced to depth 1, 2 or 3."""
CHECKPOINTER_KINDS = ("memory", "sqlite")
"""Where conversations are kept: `memory`, or `sqlite:PATH` (`caprag.serve.checkpoint`)."""
SCHEMES = ("http", "https")
NAMESPACE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$")


def check_spec(spec: str) -> tuple[str, str]:
    """The kind and target of a checkpointer spec; ConfigError naming the choices if unknown."""
    kind, _, target = spec.partition(":")
    if kind not in CHECKPOINTER_KINDS:
        allowed = ", ".join(f"{k}{':PATH' if k == 'sqlite' else ''}" for k in CHECKPOINTER_KINDS)
        raise ConfigError(f"unknown checkpointer {spec!r}; allowed: {allowed}")
    if kind == "sqlite" and not target:
        raise ConfigError("CAPRAG_CHECKPOINTER=sqlite:PATH needs a file path, e.g. sqlite:chat.db")
    return kind, target


@dataclass(frozen=True)
class ServerAddress:
    """Where a Chroma server is and which namespace (collection-name prefix) a store uses
    (CAPRAG_CHROMA_URL; `caprag.retrieval.chroma_server` connects to it)."""

    url: str
    host: str
    port: int
    ssl: bool
    namespace: str

    @classmethod
    def parse(cls, url: str) -> ServerAddress:
        """Read `http(s)://HOST:PORT[/NAMESPACE[/MORE]]`; ConfigError naming what is wrong."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in SCHEMES or not parts.hostname:
            raise ConfigError(f"Chroma server {url!r}: expected http://HOST:PORT[/NAMESPACE]")
        try:
            port = parts.port or (443 if parts.scheme.lower() == "https" else 8000)
        except ValueError:
            raise ConfigError(f"Chroma server {url!r}: the port is not a number") from None
        segments = [s for s in parts.path.split("/") if s]
        for segment in segments:
            if not NAMESPACE.match(segment):
                raise ConfigError(
                    f"Chroma server {url!r}: namespace {segment!r} may only hold letters, digits,"
                    " '.', '_' and '-'"
                )
        return cls(url, parts.hostname, port, parts.scheme.lower() == "https", ".".join(segments))

    def collection(self, name: str) -> str:
        """The server-side name of one of this store's collections."""
        return f"{self.namespace}.{name}" if self.namespace else name

    def start_hint(self) -> str:
        """What to run so that this address answers."""
        return (
            f"start one with `chroma run --path DIR --host {self.host} --port {self.port}` (the "
            "`chroma` command comes with the chromadb package), or point retriever.index.store / "
            "CAPRAG_CHROMA_URL at a running server"
        )


POWER_LABELS: dict[int, str] = {1: "quick", 2: "balanced", 3: "deep"}
"""What each forced power is called beside its number, on the page, the CLI and the dashboard."""


def power_label(power: PowerChoice | int | str | None) -> str:
    """'2 (balanced)', 'auto', or '' for none: a power as every view writes it."""
    if power is None:
        return ""
    text = str(power)
    name = POWER_LABELS.get(int(text)) if text.isdigit() else None
    return f"{text} ({name})" if name else text


def parse_power(text: str | None) -> PowerChoice | None:
    """A power as a form or command line gives it ('auto', '1'-'3'; None: not chosen)."""
    if text is None:
        return None
    if text == "auto":
        return "auto"
    number = int(text)
    if number not in (1, 2, 3):
        raise ValueError(f"power must be auto, 1, 2 or 3, not {text!r}")
    return number  # type: ignore[return-value]


def _step(role: str) -> Any:
    """A per-step choice read from CAPRAG_<ROLE> (auto: the LLM when CAPRAG_LLM=openai)."""
    env = f"CAPRAG_{role.upper()}"
    return Field("auto", validation_alias=AliasChoices(env, role))


class SettingsFields(BaseSettings):
    """Everything the pipeline reads from the environment (names documented in the README). The
    step roles come on top: `Settings` is this with a CAPRAG_<ROLE> field per role of
    caprag.registry.ROLES."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    retrieval_strategy: str = Field(
        "multi-hop",
        validation_alias=AliasChoices("RETRIEVAL_STRATEGY", "retrieval_strategy"),
        description="A registered strategy (caprag.strategies.STRATEGIES): multi-hop, "
        "multi-question, single, adaptive, or one a plugin adds.",
    )
    llm: LLMName = Field("offline", validation_alias=AliasChoices("CAPRAG_LLM", "llm"))
    model: str = Field("gpt-4o-mini", validation_alias=AliasChoices("CAPRAG_MODEL", "model"))
    rewrite_model: str | None = Field(
        None,
        validation_alias=AliasChoices("CAPRAG_REWRITE_MODEL", "rewrite_model"),
        description="Model of the rewrite step; unset: the same as CAPRAG_MODEL.",
    )
    price_model: str = Field(
        "gpt-4o-mini",
        validation_alias=AliasChoices("CAPRAG_PRICE_MODEL", "price_model"),
        description="Model whose prices estimate the cost of offline calls.",
    )
    openai_api_key: str | None = Field(
        None, validation_alias=AliasChoices("OPENAI_API_KEY", "openai_api_key")
    )
    openai_base_url: str | None = Field(
        None, validation_alias=AliasChoices("OPENAI_BASE_URL", "openai_base_url")
    )
    structured_output: StructuredMethod = Field(
        "function_calling",
        validation_alias=AliasChoices("CAPRAG_STRUCTURED_OUTPUT", "structured_output"),
    )
    corpus: Path = Field(BUNDLED_CORPUS, validation_alias=AliasChoices("CAPRAG_CORPUS", "corpus"))
    chroma_dir: Path = Field(
        Path(".caprag/chroma"), validation_alias=AliasChoices("CAPRAG_CHROMA_DIR", "chroma_dir")
    )
    chroma_url: str | None = Field(
        None,
        validation_alias=AliasChoices("CAPRAG_CHROMA_URL", "chroma_url"),
        description="A Chroma server, http://HOST:PORT[/NAMESPACE], used instead of the folder.",
    )
    embedding: str = Field(
        "minilm",
        validation_alias=AliasChoices("CAPRAG_EMBEDDING", "embedding"),
        description="A registered embedding model (caprag.retrieval.embeddings.EMBEDDERS): minilm, "
        "wordllama.",
    )
    retriever: str = Field(
        "dense",
        validation_alias=AliasChoices("CAPRAG_RETRIEVER", "retriever"),
        description="A registered retriever kind (caprag.retrieval.retrievers.RETRIEVERS): dense "
        "(embeddings), bm25 (lexical), hybrid (the two fused by RRF), or one a plugin adds.",
    )
    k: int = Field(8, ge=1, le=100, validation_alias=AliasChoices("CAPRAG_K", "k"))
    checkpointer: str = Field(
        "memory",
        validation_alias=AliasChoices("CAPRAG_CHECKPOINTER", "checkpointer"),
        description="'memory' or 'sqlite:PATH' for conversations that survive restarts.",
    )
    memory_ttl_s: float = Field(
        6 * 3600.0,
        gt=0,
        validation_alias=AliasChoices("CAPRAG_MEMORY_TTL_S", "memory_ttl_s"),
        description="A conversation held in memory is dropped after this many idle seconds.",
    )
    memory_max_threads: int = Field(
        1000,
        ge=1,
        validation_alias=AliasChoices("CAPRAG_MEMORY_MAX_THREADS", "memory_max_threads"),
        description="At most this many conversations in memory (least recently used dropped).",
    )
    sqlite_ttl_days: float = Field(
        30.0,
        gt=0,
        validation_alias=AliasChoices("CAPRAG_SQLITE_TTL_DAYS", "sqlite_ttl_days"),
        description="A conversation in a SQLite store is deleted after this many idle days.",
    )
    prune_interval_s: float = Field(
        3600.0,
        gt=0,
        validation_alias=AliasChoices("CAPRAG_PRUNE_INTERVAL_S", "prune_interval_s"),
        description="How often a SQLite store looks for idle conversations (and at start-up).",
    )
    llm_timeout_s: float = Field(
        30.0,
        gt=0,
        validation_alias=AliasChoices("CAPRAG_LLM_TIMEOUT_S", "llm_timeout_s"),
        description="Time limit of one LLM request; a turn that exceeds it answers 504.",
    )
    max_body_bytes: int = Field(
        64 * 1024,
        ge=1024,
        validation_alias=AliasChoices("CAPRAG_MAX_BODY_BYTES", "max_body_bytes"),
        description="Largest request body the API reads; larger ones get 413 unread.",
    )
    allowed_origins: str = Field(
        "",
        validation_alias=AliasChoices("CAPRAG_ALLOWED_ORIGINS", "allowed_origins"),
        description="Comma-separated origins besides the server's own that may post to /chat.",
    )
    allowed_hosts: str = Field(
        "",
        validation_alias=AliasChoices("CAPRAG_ALLOWED_HOSTS", "allowed_hosts"),
        description="Comma-separated host names (name or name:port) the API answers besides "
        "127.0.0.1, localhost and [::1] at its own port.",
    )
    request_timeout_s: float | Literal["off"] | None = Field(
        None,
        validation_alias=AliasChoices("CAPRAG_REQUEST_TIMEOUT_S", "request_timeout_s"),
        description="Limit of a served turn's retrieval (waiting for the thread, rewrite, every "
        "search and retrieval step); unset: the strategy's own (adaptive 5 s, the others their "
        "LLM-call bound at a hosted model's p95); 'off': none.",
    )
    generation_timeout_s: float = Field(
        5.0,
        gt=0,
        validation_alias=AliasChoices("CAPRAG_GENERATION_TIMEOUT_S", "generation_timeout_s"),
        description="Allowance of a served turn's generation, counted from the end of retrieval "
        "(one call at a hosted model's p95 of 3 s + 2 s margin).",
    )
    power: PowerChoice = Field(
        2,
        validation_alias=AliasChoices("CAPRAG_POWER", "power"),
        description="Adaptive depth when a request chooses none: auto, or a fixed depth 1-3.",
    )
    links: Literal["citations", "names"] = Field(
        "citations",
        validation_alias=AliasChoices("CAPRAG_LINKS", "links"),
        description="How the corpus links its passages, which the rule steps follow: citations "
        "('(Combat, p. 41)', the bundled books) or names (another passage's title).",
    )
    library: str | None = Field(
        None,
        validation_alias=AliasChoices("CAPRAG_LIBRARY", "library"),
        description="What the steps' prompts call the corpus (e.g. 'the Cinderwake rulebooks'); "
        "unset: from its books' titles (the words they all start with, else 'the library').",
    )
    refusal: str = Field(
        DEFAULT_REFUSAL,
        min_length=1,
        max_length=200,
        validation_alias=AliasChoices("CAPRAG_REFUSAL", "refusal"),
        description="What the generator answers when the passages hold no answer.",
    )
    decision_log: Path | Literal["off"] = Field(
        Path(".caprag/decisions.db"),
        validation_alias=AliasChoices("CAPRAG_DECISION_LOG", "decision_log"),
        description="SQLite file of the live decision log and feedback ('off': kept in memory).",
    )

    @field_validator("retrieval_strategy")
    @classmethod
    def _registered_strategy(cls, value: str) -> str:
        return check_known("strategy", value)

    @field_validator("retriever")
    @classmethod
    def _registered_retriever(cls, value: str) -> str:
        return check_known("retriever", value)

    @field_validator("embedding")
    @classmethod
    def _registered_embedding(cls, value: str) -> str:
        return check_known("embedding model", value)

    @field_validator("request_timeout_s", mode="before")
    @classmethod
    def _timeout_off(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "off":
            return "off"
        return value

    @field_validator("request_timeout_s")
    @classmethod
    def _timeout_positive(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, float) and value <= 0:
            raise ValueError("the limit must be above 0 seconds (or 'off')")
        return value

    @field_validator("power", mode="before")
    @classmethod
    def _power_number(cls, value: Any) -> Any:
        text = str(value).strip().lower()
        return int(text) if text.isdigit() else text

    @field_validator("chroma_url")
    @classmethod
    def _server_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            ServerAddress.parse(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def store(self) -> Path | str:
        """Where the index lives: the Chroma server CAPRAG_CHROMA_URL, else CAPRAG_CHROMA_DIR."""
        return self.chroma_url or self.chroma_dir

    @field_validator("checkpointer")
    @classmethod
    def _known_checkpointer(cls, value: str) -> str:
        try:
            check_spec(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _key_for_openai(self) -> SettingsFields:
        chosen = [role for role in ROLES if getattr(self, role) == "llm"]
        if chosen and self.llm != "openai":
            raise ConfigError(
                f"CAPRAG_{chosen[0].upper()}=llm needs a language model: set CAPRAG_LLM=openai"
            )
        if self.llm == "openai" and not self.openai_api_key:
            raise MissingAPIKeyError(
                "CAPRAG_LLM=openai needs an API key: set OPENAI_API_KEY (any value for a local "
                "server that ignores it) and OPENAI_BASE_URL for a non-OpenAI endpoint"
            )
        return self


if TYPE_CHECKING:  # the role fields are made at run time; code reads them with getattr
    Settings = SettingsFields
else:
    Settings = create_model(
        "Settings",
        __base__=SettingsFields,
        __module__=__name__,
        __doc__=SettingsFields.__doc__,
        **{role: (StepChoice, _step(role)) for role in ROLES},
    )


def _env_name(field: str, info: FieldInfo) -> str:
    alias = info.validation_alias
    if isinstance(alias, AliasChoices) and isinstance(alias.choices[0], str):
        return alias.choices[0]
    return field


ENV_NAMES: dict[str, str] = {
    field: _env_name(field, info) for field, info in Settings.model_fields.items()
}
"""Each setting's environment variable (the first name its alias accepts): what error messages
call it."""


def load_settings(**overrides: object) -> Settings:
    """Read and validate settings; raise ConfigError naming the variable and allowed values.
    The CAPRAG_PLUGINS modules are imported first: their retrievers and strategies are allowed."""
    load_plugins()
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            name = ENV_NAMES.get(field, field)
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{name}={error.get('input')!r}: {message}")
        raise ConfigError("invalid settings: " + "; ".join(problems)) from None
    except ConfigError:
        raise
