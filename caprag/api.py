"""The JSON API (`POST /api/ask`) and the chat page (`/`); `python -m caprag.api` serves both."""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field, field_validator

from caprag import web
from caprag.errors import CapragError, EmptyQuestionError, NoAnswerError
from caprag.schemas import CallUsage, Source
from caprag.services import MAX_QUESTION_CHARS, AskResult, Pipeline, build_pipeline
from caprag.trace import HopTrace

STATIC = Path(__file__).parent / "static"


class AskRequest(BaseModel):
    """A question, and the conversation it continues (omit to start a new one)."""

    question: str = Field(max_length=MAX_QUESTION_CHARS, examples=["What does Rapid Strike do?"])
    thread_id: UUID | None = Field(None, description="A UUID; the server makes one when omitted.")
    power: Literal[1, 2, 3] | None = Field(
        None, description="Force the adaptive strategy's depth (1-3); omit for automatic depth."
    )

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the question is empty")
        return value.strip()


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
    cost_usd: float
    latency_s: float


def to_response(result: AskResult) -> AskResponse:
    """The API view of a turn."""
    return AskResponse(
        answer=result.answer,
        sources=result.sources,
        thread_id=result.thread_id,
        question=result.question,
        main_question=result.main_question,
        strategy=result.strategy,
        hop_count=result.hop_count,
        hops=result.hops,
        usage=result.usage,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cost_usd=result.cost_usd,
        latency_s=result.latency_s,
    )


def _explain(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(x) for x in error["loc"] if x != "body")
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "json_invalid":
            message = "the request body is not valid JSON"
        elif error["type"] == "uuid_parsing":
            message = "thread_id must be a UUID such as 123e4567-e89b-42d3-a456-426614174000"
        elif error["type"] == "string_too_long":
            message = f"the question is longer than {MAX_QUESTION_CHARS} characters"
        elif where == "power":
            message = "power must be 1, 2 or 3 (or omitted for automatic depth)"
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def create_app(pipeline: Pipeline | None = None) -> FastAPI:
    """The app; without a pipeline one is built from the environment at start-up."""
    state: dict[str, Pipeline] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state["pipeline"] = pipeline or build_pipeline()
        yield
        await state["pipeline"].aclose()

    app = FastAPI(
        title="caprag",
        description="Ask the rulebooks; conversations continue on a thread id.",
        lifespan=lifespan,
    )
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"error": _explain(exc)})

    @app.exception_handler(CapragError)
    async def failed(_request: Request, exc: CapragError) -> JSONResponse:
        code = 422 if isinstance(exc, EmptyQuestionError) else 502
        return JSONResponse(status_code=code, content={"error": str(exc)})

    @app.post("/api/ask", response_model=AskResponse)
    async def ask(body: AskRequest) -> AskResponse:
        """Answer a question; reuse the returned thread_id for follow-ups."""
        thread = str(body.thread_id) if body.thread_id else None
        result = await state["pipeline"].ask(body.question, thread, body.power)
        if result.answer_error:
            raise NoAnswerError(f"the model gave no usable answer ({result.answer_error})")
        return to_response(result)

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        """The chat page."""
        current = state["pipeline"]
        return web.page(current.strategy.name, current.steps.backend)

    @app.post("/chat", response_class=HTMLResponse)
    async def chat(
        question: Annotated[str, Form(max_length=MAX_QUESTION_CHARS)],
        thread_id: Annotated[UUID, Form()],
        power: Annotated[Literal["auto", "1", "2", "3"], Form()] = "auto",
    ) -> str:
        """One turn of the chat page, as an HTML fragment."""
        forced = None if power == "auto" else int(power)
        result = await state["pipeline"].ask(question, str(thread_id), forced)
        return web.turn(result)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness and which pipeline is serving."""
        current = state["pipeline"]
        return {"status": "ok", "strategy": current.strategy.name, "llm": current.steps.backend}

    return app


app = create_app()


def main(argv: list[str] | None = None) -> None:
    """Serve the API and page with uvicorn (127.0.0.1 unless told otherwise)."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m caprag.api", description=main.__doc__)
    parser.add_argument("--host", default=os.environ.get("CAPRAG_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("CAPRAG_PORT", "8000")))
    args = parser.parse_args(argv)
    uvicorn.run("caprag.api:app", host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
