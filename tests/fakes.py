"""Test doubles: a scripted chat model and a local OpenAI-protocol server (the client path)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, PrivateAttr

from caprag.errors import StructuredOutputError
from caprag.llm import StructuredClient, build_openai_client
from caprag.schemas import Document
from caprag.steps import Steps, build_steps, rule_steps
from caprag.steps.analyze import RuleAnalyzer
from caprag.steps.generate import RuleGenerator
from experiments.perf.openai_stub import answer as stub_answer
from experiments.perf.openai_stub import fill, fill_schema, send_json

FLURRY = Document(
    passage_id="fighting/flurry",
    book_id="fighting",
    book_short="Fighting",
    section="Flurry",
    page=4,
    text="Second attack at -4, modified by Old Soldier (Gifts, p. 7).",
)
"""A passage with an unresolved cross-reference, for step and prompt tests."""


class ScriptedChatModel(BaseChatModel):
    """Replies in order, or by the first key found in the prompt. A dict/model reply becomes a
    tool call named after the bound schema, so `with_structured_output` parses it for real."""

    replies: list[Any] = []
    by_substring: dict[str, Any] = {}
    repeat_last: bool = False
    _calls: list[list[BaseMessage]] = PrivateAttr(default_factory=list)
    _tool_name: str | None = PrivateAttr(default=None)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def calls(self) -> list[list[BaseMessage]]:
        """Every prompt the model received."""
        return self._calls

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        self._tool_name = convert_to_openai_tool(tools[0])["function"]["name"]
        return self

    def _pick(self, prompt: str) -> Any:
        for key, reply in self.by_substring.items():
            if key in prompt:
                return reply
        index = len(self._calls) - 1
        if index < len(self.replies):
            return self.replies[index]
        if self.repeat_last and self.replies:
            return self.replies[-1]
        raise AssertionError(f"ScriptedChatModel has no reply for call {index + 1}: {prompt[:200]}")

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._calls.append(messages)
        reply = self._pick("\n".join(str(m.content) for m in messages))
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, BaseModel):
            reply = reply.model_dump()
        if isinstance(reply, dict):
            message = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": self._tool_name or "tool",
                        "args": reply,
                        "id": f"call_{len(self._calls)}",
                    }
                ],
            )
        else:
            message = AIMessage(content=str(reply))
        return ChatResult(generations=[ChatGeneration(message=message)])


class OpenAIStub:
    """A chat-completions server on 127.0.0.1 with scripted replies; records every request body.

    A reply is {"args": {...}} (a tool call to the requested function), {"content": "text"},
    {"fill_schema": "text"} (JSON mode: an object fitting the JSON schema written in the prompt),
    {"fill_tool": "text"} (a tool call whose arguments fit the requested function's schema),
    {"auto": True} (experiments.perf.openai_stub's reply to whatever the request asks for),
    {"status": 500} (an HTTP error), {"status": 401, "echo_key": True} (an error whose message
    repeats the request's bearer key, as some providers do), {"malformed": "text"} (tool-call
    arguments that are not JSON), {"empty_choices": True} (a completion with `choices: []`),
    {"cut_body": reply} (that reply's HTTP body cut in half) or {"hang": True} (no answer until
    the stub stops); "finish": "length" marks a reply the output cap cut.
    """

    def __init__(
        self, replies: Sequence[dict[str, Any]] = (), default: dict[str, Any] | None = None
    ):
        self.replies = list(replies)
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub._lock:
                    stub.requests.append(body)
                    reply = stub.replies.pop(0) if stub.replies else stub.default
                if reply is not None and reply.get("hang"):
                    stub.stopped.wait(60)
                    return
                if reply is not None and "cut_body" in reply:
                    # The HTTP body itself cut short (a proxy or server dying mid-reply).
                    whole = json.dumps(stub._answer(body, reply["cut_body"])[1]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(whole) // 2))
                    self.end_headers()
                    self.wfile.write(whole[: len(whole) // 2])
                    return
                status, payload = stub._answer(body, reply)
                if reply is not None and reply.get("echo_key"):
                    said = f"Incorrect API key provided: {self.headers.get('authorization', '')}"
                    payload = {"error": {"message": said, "type": "invalid_request_error"}}
                send_json(self, status, payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """The /v1 URL to give the OpenAI client."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def _answer(
        self, body: dict[str, Any], reply: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        if reply is None:
            return 500, {"error": {"message": "stub has no scripted reply", "type": "server_error"}}
        if "status" in reply:
            return int(reply["status"]), {
                "error": {"message": "scripted failure", "type": "server_error"}
            }
        if reply.get("auto"):
            return 200, stub_answer(body)
        if reply.get("empty_choices"):
            return 200, {"id": "chatcmpl-stub", "object": "chat.completion", "choices": []}
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if reply.get("fill_schema"):
            prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
            message["content"] = json.dumps(fill_schema(prompt, str(reply["fill_schema"])))
        elif "content" in reply:
            message["content"] = reply["content"]
        else:
            function = body.get("tools", [{}])[0].get("function", {})
            name = function.get("name", "tool")
            if "fill_tool" in reply:  # arguments filling the requested function's schema
                args = fill(function.get("parameters", {}), str(reply["fill_tool"]))
                arguments = json.dumps(args)
            else:
                arguments = (
                    reply["malformed"] if "malformed" in reply else json.dumps(reply["args"])
                )
            message["tool_calls"] = [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ]
        usage = reply.get("usage", {"prompt_tokens": 42, "completion_tokens": 7})
        usage = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return 200, {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "stub"),
            "choices": [
                {"index": 0, "message": message, "finish_reason": reply.get("finish", "stop")}
            ],
            "usage": usage,
        }

    def __enter__(self) -> OpenAIStub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()


def serve(
    replies: Sequence[dict[str, Any]] = (), default: dict[str, Any] | None = None
) -> Iterator[OpenAIStub]:
    """Run an OpenAIStub for the duration of a fixture."""
    with OpenAIStub(replies, default) as stub:
        yield stub


def openai_steps(model: str = "gpt-4o-mini", **client: Any) -> Steps:
    """Every step by the model behind an OpenAI-compatible endpoint."""
    return build_steps(build_openai_client(model, **client))


def scripted_steps(chat: BaseChatModel, parse_attempts: int = 3, **choices: str) -> Steps:
    """Every step (or those chosen llm in `choices`) by a scripted chat model through the real
    structured-call client."""
    client = StructuredClient(chat, "scripted", parse_attempts=parse_attempts)
    return build_steps(client, choices=choices)


class HangingAnalyzer(RuleAnalyzer):
    """The rule analyzer, except that questions naming `hang_on` hang and those naming
    `garble_on` get an unparseable reply: for failure-isolation tests."""

    def __init__(self, hang_on: str, garble_on: str) -> None:
        super().__init__()
        self.hang_on = hang_on.lower()
        self.garble_on = garble_on.lower()

    async def __call__(self, question: str, documents: Any, searched: Any) -> Any:
        if self.hang_on in question.lower():
            await asyncio.sleep(3600)
        if self.garble_on in question.lower():
            raise StructuredOutputError("SufficiencyDecision", "reply was not JSON: 'Sure!'", 3)
        return await super().__call__(question, documents, searched)


def flaky_steps(hang_on: str = "torch", garble_on: str = "stamina", **_group: Any) -> Steps:
    """The rule steps with a hanging / garbling analyzer (as `llm._target_`)."""
    return dataclasses.replace(rule_steps(), analyze=HangingAnalyzer(hang_on, garble_on))


class SlowGenerator(RuleGenerator):
    """The rule generator, every answer taking `delay_s`."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def __call__(self, question: str, documents: Any, history: Any = ()) -> Any:
        await asyncio.sleep(self.delay_s)
        return await super().__call__(question, documents, history)


def slow_steps(delay_s: float = 1.0, **_group: Any) -> Steps:
    """The rule steps with a slow generator: a run long enough to kill (as `llm._target_`)."""
    return dataclasses.replace(rule_steps(), generate=SlowGenerator(delay_s))


class ManualClock:
    """A clock that moves only when told: budgets tested in scripted steps, never in real time."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds

    async def bounded(self, awaitable: Any, seconds: float) -> Any:
        """Run to the end, then time out if the clock moved past `seconds` meanwhile."""
        start = self.time
        result = await awaitable
        if self.time - start > seconds:
            raise TimeoutError
        return result
