"""The JSON API (`POST /api/ask`) and the chat page (`/`); `python -m caprag.api` serves both.

Every 4xx and 5xx answer is `{"error": "..."}`: validation (422), a cross-origin chat post (403),
a request addressed to a host name the server does not answer (421: DNS rebinding),
a body over CAPRAG_MAX_BODY_BYTES (413, refused unread), feedback on an unknown request (404), an
unusable model answer or a failed LLM endpoint (502), an LLM call over its time limit (504), a
request cut by CAPRAG_REQUEST_TIMEOUT_S before any passage was found (504, with its `request_id`
and `stop_reason` beside the error), anything unexpected (500, the exception's type and message,
never a traceback). A request cut after passages were found answers 200 with `timed_out` true,
the passages as sources and the cut step in `stop_reason`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from uuid import UUID

from fastapi import Depends, FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field, field_validator
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from caprag.config import PowerChoice, Settings, load_settings, parse_power
from caprag.errors import (
    CapragError,
    ConfigError,
    EmptyQuestionError,
    LLMTimeoutError,
    NoAnswerError,
    ThreadBusyError,
)
from caprag.schemas import CallUsage, Source
from caprag.secrets import install_log_redaction, redact
from caprag.serve import web
from caprag.serve.checkpoint import close_checkpointer, open_checkpointer
from caprag.serve.deadline import RequestTimeoutError
from caprag.serve.decision_log import DecisionRecord, PowerSource
from caprag.serve.progress import LISTENER, RoundBoard
from caprag.serve.services import (
    MAX_QUESTION_CHARS,
    AnswerStatus,
    AskResult,
    Pipeline,
    PowerError,
    UnknownRequestError,
    build_pipeline,
    decision_log_from_settings,
    retention_from_settings,
    validate_question,
)
from caprag.trace import HopTrace

STATIC = Path(__file__).parent / "static"


class AskRequest(BaseModel):
    """A question, and the conversation it continues (omit to start a new one)."""

    question: str = Field(max_length=MAX_QUESTION_CHARS, examples=["What does Rapid Strike do?"])
    thread_id: UUID | None = Field(None, description="A UUID; the server makes one when omitted.")
    power: PowerChoice | None = Field(
        default=None,
        description="Adaptive strategy only: auto (the strategy decides), or a depth 1-3 to force; "
        "omitted: the server's default (CAPRAG_POWER, fixed depth 2 unless set).",
    )

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        return validate_question(value)  # EmptyQuestionError is a ValueError: a 422

    @field_validator("power", mode="before")
    @classmethod
    def _not_a_bool(cls, value: object) -> object:
        if isinstance(value, bool):  # true would pass as the literal 1
            raise ValueError("power must not be a boolean")
        return value


class AskResponse(BaseModel):
    """The answer, its sources, the thread to continue, and what the turn did and cost."""

    answer: str
    sources: list[Source]
    thread_id: str
    question: str
    main_question: str
    strategy: str
    hop_count: int
    hops: list[HopTrace]
    usage: list[CallUsage] = Field(
        description="Every LLM step of the turn in order: rule or model, tokens, cost, and for a "
        "model call the messages exactly as sent and its reply."
    )
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None = Field(description="USD; null when a model's price is unknown.")
    latency_s: float
    request_id: str = Field(description="Send it to POST /api/feedback to rate this answer.")
    timed_out: bool = Field(
        description="The time limit cut a step: the sources are what was found by then."
    )
    stop_reason: str | None = Field(
        description="How retrieval stopped (the last round's decision), or timeout:<step>."
    )
    answer_status: AnswerStatus = Field(
        description="generated (retrieval finished in its limit); generated_after_cut "
        "(retrieval's limit cut it: the answer is from what was found by then); not_generated "
        "(no answer: the answer says why)."
    )
    decision_log: DecisionRecord | None = Field(
        description="What the decision log keeps of this request: rounds, steps, stop reason."
    )
    memory_expired: bool = Field(
        False, description="The thread sat idle past the memory TTL: this turn started afresh."
    )


class FeedbackRequest(BaseModel):
    """The user's verdict on one answer."""

    request_id: UUID = Field(description="The request_id of the answer (from /api/ask).")
    enough: bool = Field(strict=True, description="true: the answer was enough; false: not.")
    comment: str = Field("", max_length=2000, description="Optional words on what was missing.")


class FeedbackResponse(BaseModel):
    """The feedback as stored with the request's decision record."""

    request_id: str
    enough: bool
    comment: str
    created_at: str


def to_response(result: AskResult) -> AskResponse:
    """The API view of a turn: the result's fields the response names (`hop_count` included)."""
    return AskResponse.model_validate(result, from_attributes=True)


def _explain(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(x) for x in error["loc"] if x != "body")
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "json_invalid":
            where, message = "", "the request body is not valid JSON"
        elif where == "request_id" and error["type"] == "uuid_parsing":
            message = "request_id must be the UUID an answer came with"
        elif error["type"] == "uuid_parsing":
            message = "thread_id must be a UUID such as 123e4567-e89b-42d3-a456-426614174000"
        elif where == "comment" and error["type"] == "string_too_long":
            message = "the comment is longer than 2000 characters"
        elif error["type"] == "string_too_long":
            message = f"the question is longer than {MAX_QUESTION_CHARS} characters"
        elif where == "power":
            message = "power must be auto, 1, 2 or 3 (or omitted for the server's default)"
        elif where == "enough" and error["type"] != "missing":
            message = "enough must be true or false"
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


@dataclass
class Limits:
    """What the server accepts (from settings; defaults until the settings are read)."""

    max_body_bytes: int = 64 * 1024
    allowed_origins: frozenset[str] = frozenset()
    allowed_hosts: frozenset[str] = frozenset()
    """Host names (name, or name:port) served besides LOCAL_HOSTS (CAPRAG_ALLOWED_HOSTS)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        origins = (o.strip().rstrip("/").lower() for o in settings.allowed_origins.split(","))
        hosts = (h.strip().lower() for h in settings.allowed_hosts.split(","))
        return cls(
            settings.max_body_bytes,
            frozenset(o for o in origins if o),
            frozenset(h for h in hosts if h),
        )

    def update(self, other: Limits) -> None:
        """Take the values of `other` (the settings read at start-up)."""
        self.max_body_bytes = other.max_body_bytes
        self.allowed_origins = other.allowed_origins
        self.allowed_hosts = other.allowed_hosts


LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
"""Names the API answers to at its own port whatever the settings say."""
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def split_host(host: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header or URL netloc in lower case; None when it is malformed."""
    host = host.strip().lower()
    if host.startswith("["):  # an IPv6 literal: [::1] or [::1]:8000
        name, bracket, rest = host.partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        name, port = name + bracket, rest[1:] if rest else None
    elif host.count(":") == 1:
        name, port = host.split(":")
    else:
        name, port = host, None
        if ":" in host:
            return None
    if not name or (port is not None and not port.isdigit()):
        return None
    return name, int(port) if port is not None else None


def host_allowed(host: str, scheme: str, server_port: int | None, extra: frozenset[str]) -> bool:
    """Whether a request addressed to `host` is for this server: one of LOCAL_HOSTS at the port
    it listens on (no port: the scheme's default), or a CAPRAG_ALLOWED_HOSTS entry (name:port
    exactly, a bare name at any port). A rebound DNS name is none of these."""
    parsed = split_host(host)
    if parsed is None:
        return False
    name, port = parsed
    if name in extra or f"{name}:{port}" in extra:
        return True
    if name not in LOCAL_HOSTS:
        return False
    effective = port if port is not None else DEFAULT_PORTS.get(scheme)
    return server_port is None or effective == server_port


class HostGuard:
    """Answer 421 (`error` JSON) to a request whose Host is not this server's: a page on another
    name that rebinds its DNS to 127.0.0.1 must not reach the API, the chat or a conversation."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        server = scope.get("server")
        port = server[1] if server else None
        if not host_allowed(host, scope.get("scheme", "http"), port, self.limits.allowed_hosts):
            await send_error(
                send,
                421,
                f"host {host!r} is not served here (this server answers 127.0.0.1, localhost "
                "and [::1] at its port); CAPRAG_ALLOWED_HOSTS adds other names",
            )
            return
        await self.app(scope, receive, send)


async def send_error(send: Send, status: int, message: str) -> None:
    """Answer `{"error": message}` straight from ASGI (before the app has read anything)."""
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuse a request body over the limit with 413 before the app buffers it: at once by its
    Content-Length, or as soon as a chunked body's streamed bytes pass the limit."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        too_large = f"the request body is larger than {limit} bytes"
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await send_error(send, 400, "the Content-Length header is not a number")
                return
            if int(declared) > limit:
                await send_error(send, 413, too_large)
                return
        received = 0
        refused = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    if not started:
                        await send_error(send, 413, too_large)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 is the answer; the app's reply to the cut body is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise


def _endpoint(scheme: str, netloc: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) with the scheme's default port filled in; None when malformed."""
    parsed = split_host(netloc)
    if parsed is None:
        return None
    name, port = parsed
    scheme = scheme.lower()
    return scheme, name, port if port is not None else DEFAULT_PORTS.get(scheme)


def check_origin(request: Request) -> None:
    """Refuse a chat post from another site (403): its Origin must be this server exactly (the
    scheme, host and port the request was made to; the host already checked by HostGuard) or a
    CAPRAG_ALLOWED_ORIGINS entry. A post without Origin comes from a non-browser client (curl,
    scripts: browsers send Origin with every POST) and is let through."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    limits: Limits = request.app.state.limits
    host = request.headers.get("host", "")
    if origin.rstrip("/").lower() in limits.allowed_origins:
        return
    parts = urlsplit(origin)
    own = _endpoint(request.url.scheme, host)
    if (
        parts.scheme
        and parts.netloc
        and own is not None
        and _endpoint(parts.scheme, parts.netloc) == own
        and not parts.path.strip("/")
    ):
        return
    raise HTTPException(
        403,
        f"cross-origin post refused: Origin {origin} is not this server "
        f"({request.url.scheme}://{host}); CAPRAG_ALLOWED_ORIGINS lists other origins allowed "
        "to post to /chat",
    )


def _http_message(exc: HTTPException, request: Request) -> str:
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):
        return "the request body is not valid UTF-8"
    if exc.status_code == 400 and isinstance(cause, RecursionError):
        return "the request body is nested too deeply"
    if exc.status_code == 404:
        return f"not found: {request.url.path}"
    if exc.status_code == 405:
        headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
        allowed = headers.get("allow", "")
        return f"method {request.method} not allowed on {request.url.path} (allowed: {allowed})"
    return str(exc.detail)


def _status(exc: CapragError) -> int:
    if isinstance(exc, EmptyQuestionError | PowerError):
        return 422
    if isinstance(exc, RequestTimeoutError):
        return 504
    if isinstance(exc, UnknownRequestError):
        return 404
    if isinstance(exc, ThreadBusyError):
        return 409
    if isinstance(exc, LLMTimeoutError):
        return 504
    return 502


def create_app(pipeline: Pipeline | None = None, settings: Settings | None = None) -> FastAPI:
    """The app; without a pipeline one is built from the environment at start-up (and the limits
    are read from the settings then)."""
    state: dict[str, Pipeline] = {} if pipeline is None else {"pipeline": pipeline}
    limits = Limits.from_settings(settings) if settings is not None else Limits()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if "pipeline" not in state:
            read = load_settings()
            state["pipeline"] = build_pipeline(read)
            limits.update(Limits.from_settings(read))
        await state["pipeline"].open()
        yield
        await state["pipeline"].aclose()

    app = FastAPI(
        title="caprag",
        description="Ask the rulebooks; conversations continue on a thread id.",
        lifespan=lifespan,
    )
    app.state.limits = limits
    rounds = RoundBoard()
    app.add_middleware(BodyLimit, limits=limits)
    app.add_middleware(HostGuard, limits=limits)  # added last: runs first
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"error": _explain(exc)})

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code,
            content={"error": redact(_http_message(exc, request))},
            headers=exc.headers,
        )

    @app.exception_handler(CapragError)
    async def failed(_request: Request, exc: CapragError) -> JSONResponse:
        content: dict[str, Any] = {"error": redact(str(exc))}
        if isinstance(exc, RequestTimeoutError):
            content |= {"request_id": exc.request_id, "stop_reason": exc.stop_reason}
        return JSONResponse(status_code=_status(exc), content=content)

    @app.exception_handler(Exception)
    async def crashed(_request: Request, exc: Exception) -> JSONResponse:
        message = redact(f"internal error: {type(exc).__name__}: {exc}")
        return JSONResponse(status_code=500, content={"error": message})

    @app.post("/api/ask", response_model=AskResponse)
    async def ask(body: AskRequest) -> AskResponse:
        """Answer a question; reuse the returned thread_id for follow-ups (turns of one thread
        are answered one after another)."""
        thread = str(body.thread_id) if body.thread_id else None
        result = await ask_with_power(state["pipeline"], body.question, thread, body.power)
        if result.answer_error:
            raise NoAnswerError(f"the model gave no usable answer ({result.answer_error})")
        return to_response(result)

    @app.post(
        "/api/feedback",
        response_model=FeedbackResponse,
        responses={404: {"description": "No answer with this request_id is in the log."}},
    )
    async def feedback(body: FeedbackRequest) -> FeedbackResponse:
        """Say whether an answer was enough; stored with the request's decision record (a new
        post on the same request replaces the earlier one)."""
        request_id = str(body.request_id)
        stored = await state["pipeline"].feedback(request_id, body.enough, body.comment)
        if stored is None:
            raise UnknownRequestError(f"no answer with request_id {request_id} in the decision log")
        return FeedbackResponse(request_id=request_id, **stored.model_dump())

    @app.get("/", response_class=HTMLResponse)
    async def index(thread_id: UUID | None = None) -> str:
        """The chat page; `?thread_id=` continues that thread, showing its turns from memory."""
        current = state["pipeline"]
        thread = str(thread_id) if thread_id else None
        history = await current.conversation(thread) if thread else []
        return web.page(
            current.strategy.name,
            current.steps.backend,
            current.ladder,
            current.default_power,
            thread_id=thread,
            history=history,
        )

    @app.post("/chat", response_class=HTMLResponse, dependencies=[Depends(check_origin)])
    async def chat(
        question: Annotated[str, Form(max_length=MAX_QUESTION_CHARS)],
        thread_id: Annotated[UUID, Form()],
        power: Annotated[Literal["auto", "1", "2", "3"] | None, Form()] = None,
        progress_id: Annotated[UUID | None, Form()] = None,
    ) -> str:
        """One turn of the chat page, as an HTML fragment (same-origin posts only); no power:
        the server's default. With a `progress_id` its rounds can be polled while it runs."""
        chosen = parse_power(power)
        token = LISTENER.set(rounds.listener(str(progress_id))) if progress_id else None
        try:
            result = await ask_with_power(state["pipeline"], question, str(thread_id), chosen)
        finally:
            if token is not None:
                LISTENER.reset(token)
        return web.turn(result)

    @app.get("/chat/progress/{progress_id}", response_class=HTMLResponse)
    async def chat_progress(progress_id: UUID) -> str:
        """The rounds a running turn of the chat page has decided so far (polled by the page)."""
        return web.live_rounds(rounds.rounds(str(progress_id)), state["pipeline"].ladder)

    @app.post("/chat/feedback", response_class=HTMLResponse, dependencies=[Depends(check_origin)])
    async def chat_feedback(
        request_id: Annotated[UUID, Form()],
        enough: Annotated[Literal["true", "false"], Form()],
        comment: Annotated[str, Form(max_length=2000)] = "",
    ) -> str:
        """The chat page's enough / not enough control: store it, show it was recorded."""
        stored = await state["pipeline"].feedback(str(request_id), enough == "true", comment)
        if stored is None:
            raise UnknownRequestError(f"no answer with request_id {request_id} in the decision log")
        return web.feedback_recorded(str(request_id), stored)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness and which pipeline is serving: its strategy with the options it serves."""
        current = state["pipeline"]
        options = current.strategy.options.model_dump(mode="json", fallback=repr)
        return {
            "status": "ok",
            "strategy": current.strategy.name,
            "options": options,
            "llm": current.steps.backend,
        }

    return app


async def ask_with_power(
    pipeline: Pipeline, question: str, thread: str | None, requested: PowerChoice | None
) -> AskResult:
    """A served turn: the request's power, or the server's default when it chose none."""
    forced, _choice = pipeline.resolve_power(requested)
    source: PowerSource = "default" if requested is None else "request"
    return await pipeline.ask(question, thread, forced, power_source=source)


app = create_app()


def _port(value: str, source: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(f"{source}={value!r}: not a port number (1-65535)")
    return int(value)


async def _check_store(settings: Settings) -> None:
    """Open the conversation store once (tables, pruning), so a bad one fails before serving."""
    await close_checkpointer(
        await open_checkpointer(settings.checkpointer, retention_from_settings(settings))
    )


def main(argv: list[str] | None = None) -> int:
    """Serve the API and page with uvicorn (127.0.0.1 unless told otherwise). Settings, index,
    conversation store and decision log are checked first: a problem is one `error:` line and
    exit 2."""
    parser = argparse.ArgumentParser(prog="python -m caprag.api", description=main.__doc__)
    parser.add_argument("--host", default=None, help="default CAPRAG_HOST or 127.0.0.1")
    parser.add_argument("--port", default=None, help="default CAPRAG_PORT or 8000")
    args = parser.parse_args(argv)
    try:
        host = args.host or os.environ.get("CAPRAG_HOST", "127.0.0.1")
        if args.port is not None:
            port = _port(args.port, "--port")
        else:
            port = _port(os.environ.get("CAPRAG_PORT", "8000"), "CAPRAG_PORT")
        settings = load_settings()
        asyncio.run(_check_store(settings))
        check = decision_log_from_settings(settings)
        check.open()
        check.close()
        pipeline = build_pipeline(settings)
    except (CapragError, OSError) as exc:  # OSError: a corpus or store path that cannot be used
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    config = uvicorn.Config(create_app(pipeline, settings), host=host, port=port, log_level="info")
    install_log_redaction()  # after uvicorn configured its loggers: no key in any server log
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
