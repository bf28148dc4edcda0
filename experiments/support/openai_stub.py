"""A local OpenAI-protocol chat-completions server: one stub for tests and benchmarks.

`python -m experiments.openai_stub --port 0 --latency 0.2` prints its base URL and serves until
killed (GET <base>/stats counts its requests); `with StubServer(latency_s=0.2) as stub:` runs it
in a thread. Unscripted (the default), a request with `tools` gets a tool call whose arguments
fill the requested function's JSON schema, a `json_object` request gets an object filling the
schema written after "JSON Schema:" in the prompt (RAGAS), anything else gets plain text; strings
come from the last user message, so replies are deterministic. A test gives a script instead
(`StubServer([{"status": 500}, {"args": {...}}], default=None)`): replies in order, of the kinds
`respond` lists (errors, cut bodies, hangs, malformed tool calls...). Each request waits
`latency_s` in its own thread, so concurrent requests overlap like a real server's.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from statistics import NormalDist
from typing import Any

REPLY_WORDS = 12
REPLY_CHARS = 200
"""Words (and at most characters) of the last user message a generated string keeps."""

_QUESTION = re.compile(r"question:\s*(.+)", re.IGNORECASE)


def fill(node: Mapping[str, Any], text: str, defs: Mapping[str, Any] | None = None) -> Any:
    """A value fitting the JSON schema `node`: strings are `text`, booleans True, arrays one item.

    Follows `$ref` into `defs` (the root's `$defs`), takes the first non-null `anyOf`/`oneOf`
    branch, the first `enum` value or the `const`, clamps numbers to minimum/maximum and honours
    minItems/maxItems and minLength/maxLength.
    """
    defs = defs if defs is not None else node.get("$defs", node.get("definitions", {}))
    if "$ref" in node:
        return fill(defs[str(node["$ref"]).split("/")[-1]], text, defs)
    if "const" in node:
        return node["const"]
    if node.get("enum"):
        return node["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in node:
            options = [o for o in node[key] if o.get("type") != "null"] or node[key]
            return fill(options[0], text, defs)
    if "allOf" in node:
        merged: dict[str, Any] = {}
        for part in node["allOf"]:
            part = defs[str(part["$ref"]).split("/")[-1]] if "$ref" in part else part
            merged = {**merged, **part}
        return fill(merged, text, defs)
    kind = node.get("type", "object" if "properties" in node else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {key: fill(sub, text, defs) for key, sub in node.get("properties", {}).items()}
    if kind == "array":
        count = max(1, int(node.get("minItems", 1)))
        count = min(count, int(node.get("maxItems", count)))
        items = node.get("items", {"type": "string"})
        values = [fill(items, text, defs) for _ in range(count)]
        if count > 1 and all(isinstance(v, str) for v in values):
            values = [f"{v} {n}" if n else v for n, v in enumerate(values)]
        return values
    if kind in ("integer", "number"):
        return _clamp(node, 1 if kind == "integer" else 1.0)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    value = text[: int(node["maxLength"])] if "maxLength" in node else text
    return value.ljust(int(node.get("minLength", 0)), ".")


def _clamp(node: Mapping[str, Any], value: float) -> float:
    """`value` if it fits the node's (exclusive) minimum/maximum, else a value that does."""
    low, high = node.get("minimum"), node.get("maximum")
    low_ex, high_ex = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if isinstance(value, int):
        low = low if low is not None else None if low_ex is None else math.floor(low_ex) + 1
        high = high if high is not None else None if high_ex is None else math.ceil(high_ex) - 1
        value = value if low is None else max(value, low)
        return value if high is None else min(value, high)
    fits = (
        (low is None or value >= low)
        and (high is None or value <= high)
        and (low_ex is None or value > low_ex)
        and (high_ex is None or value < high_ex)
    )
    if fits:
        return value
    lower = low if low is not None else low_ex
    upper = high if high is not None else high_ex
    if lower is not None and upper is not None:
        return float((lower + upper) / 2)
    if lower is not None:
        return float(lower if low is not None else lower + 1)
    if upper is not None:
        return float(upper if high is not None else upper - 1)
    return value


def fill_schema(prompt: str, text: str) -> Any:
    """An object that fits the JSON schema RAGAS writes into its prompt after 'JSON Schema:'."""
    marker = prompt.find("JSON Schema:")
    if marker < 0:
        return {}
    start = prompt.index("{", marker)
    schema, _ = json.JSONDecoder().raw_decode(prompt[start:])
    return fill(schema, text)


def reply_text(messages: list[dict[str, Any]]) -> str:
    """The first words of the last user message, after its 'Question:' label when it has one."""
    users = [m for m in messages if m.get("role") == "user"] or messages
    content = _content(users[-1]) if users else ""
    asked = _QUESTION.findall(content)
    words = (asked[-1] if asked else content).split()
    return " ".join(words[:REPLY_WORDS])[:REPLY_CHARS] or "stub reply"


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def answer(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat.completion object the stub returns for a request body (the `auto` reply)."""
    messages = list(body.get("messages", []))
    text = reply_text(messages)
    message: dict[str, Any] = {"role": "assistant", "content": None}
    tools = [t for t in body.get("tools", []) if t.get("type", "function") == "function"]
    response_format = body.get("response_format") or {}
    if tools and body.get("tool_choice") != "none":
        forced = body.get("tool_choice")
        name = forced.get("function", {}).get("name") if isinstance(forced, dict) else None
        tool = next((t for t in tools if t["function"]["name"] == name), tools[0])["function"]
        schema = tool.get("parameters") or {"type": "object", "properties": {}}
        completion = json.dumps(fill(schema, text))
        message["tool_calls"] = [_tool_call("call_stub", tool["name"], completion)]
        finish = "tool_calls"
    elif response_format.get("type") == "json_object":
        prompt = "\n".join(_content(m) for m in messages)
        completion = json.dumps(fill_schema(prompt, text))
        message["content"] = completion
        finish = "stop"
    elif response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema", {}).get("schema", {})
        completion = json.dumps(fill(schema, text))
        message["content"] = completion
        finish = "stop"
    else:
        completion = text
        message["content"] = completion
        finish = "stop"
    prompt_tokens = sum(len(_content(m).split()) for m in messages)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max(1, len(completion.split()))}
    return _completion(body, message, finish, usage, created=int(time.time()))


Reply = Mapping[str, Any]
"""One scripted reply: a dict of one of the kinds listed in `respond`."""

AUTO: Reply = {"auto": True}
"""The reply that answers whatever the request asks for (`answer`)."""

SCRIPTED_USAGE = {"prompt_tokens": 42, "completion_tokens": 7}
"""The usage a scripted reply reports unless it says its own."""

HOLD_S = 600.0
"""The longest a held request waits for the others: a hang guard, never a deadline."""


@dataclass(frozen=True)
class Response:
    """What the stub sends back for one request, and how it delivers it."""

    status: int = 200
    payload: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    cut: bool = False
    """Send only the first half of the body (a proxy or server dying mid-reply)."""
    hang: bool = False
    """Send nothing: the request waits until the stub stops."""


def respond(body: Mapping[str, Any], reply: Reply | None, authorization: str = "") -> Response:
    """The response to one request under one reply.

    Kinds of reply: {"auto": True} (`answer`: whatever the request asks for);
    {"args": {...}} (a tool call to the requested function with these arguments);
    {"fill_tool": "text"} (a tool call whose arguments fill the requested function's schema);
    {"malformed": "text"} (tool-call arguments that are not JSON); {"content": "text"};
    {"fill_schema": "text"} (JSON mode: an object fitting the JSON schema written in the prompt);
    {"empty_choices": True} (a completion with `choices: []`); {"status": 500} (an HTTP error;
    "echo_key": True makes its message repeat the request's bearer key, as some providers do;
    "retry_after": seconds adds that header); {"cut_body": reply} (that reply's body cut in half);
    {"hang": True} (no answer until the stub stops). "finish": "length" marks a reply the output
    cap cut; "usage": {"prompt_tokens": n, "completion_tokens": m} replaces the reported usage.
    None (a script run out with no default) is a 500 saying so.
    """
    if reply is None:
        return Response(500, _error("stub has no scripted reply", "server_error"))
    if reply.get("hang"):
        return Response(hang=True)
    if "cut_body" in reply:
        return dataclasses.replace(respond(body, reply["cut_body"], authorization), cut=True)
    if "status" in reply:
        said = "scripted failure"
        if reply.get("echo_key"):
            said = f"Incorrect API key provided: {authorization}"
        headers = {"retry-after": str(reply["retry_after"])} if "retry_after" in reply else {}
        kind = "invalid_request_error" if reply.get("echo_key") else "server_error"
        return Response(int(reply["status"]), _error(said, kind), headers)
    if reply.get("auto"):
        return Response(200, answer(body))
    if reply.get("empty_choices"):
        return Response(200, {"id": "chatcmpl-stub", "object": "chat.completion", "choices": []})
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if reply.get("fill_schema"):
        prompt = "\n".join(_content(m) for m in body.get("messages", []))
        message["content"] = json.dumps(fill_schema(prompt, str(reply["fill_schema"])))
    elif "content" in reply:
        message["content"] = reply["content"]
    else:
        function = body.get("tools", [{}])[0].get("function", {})
        if "fill_tool" in reply:
            arguments = json.dumps(fill(function.get("parameters", {}), str(reply["fill_tool"])))
        elif "malformed" in reply:
            arguments = str(reply["malformed"])
        else:
            arguments = json.dumps(reply["args"])
        message["tool_calls"] = [_tool_call("call_1", function.get("name", "tool"), arguments)]
    usage = dict(reply.get("usage", SCRIPTED_USAGE))
    return Response(200, _completion(body, message, reply.get("finish", "stop"), usage))


def _tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _completion(
    body: Mapping[str, Any],
    message: dict[str, Any],
    finish: str,
    usage: Mapping[str, int],
    created: int = 0,
) -> dict[str, Any]:
    total = usage["prompt_tokens"] + usage["completion_tokens"]
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": created,
        "model": body.get("model", "stub"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {**usage, "total_tokens": total},
    }


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


@dataclass(frozen=True)
class LatencyProfile:
    """A provider's latency: each reply's time drawn from a log-normal with median `p50_s` and
    95th percentile `p95_s`, of which the first `first_byte_s` pass before the status line and
    headers are sent. A request's draw is a function of the seed, its messages and how often those
    messages came before, so a rerun of the same questions meets the same latencies whatever order
    its requests arrive in (traces on and off, 16 or 64 in flight)."""

    p50_s: float
    p95_s: float
    first_byte_s: float = 0.0
    seed: int = 0

    def draw(self, key: str, occurrence: int) -> float:
        """Seconds for the `occurrence`-th request (0-based) whose messages are `key`."""
        digest = hashlib.sha256(f"{self.seed}/{key}/{occurrence}".encode()).digest()
        uniform = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
        spread = self.p95_s / self.p50_s if self.p95_s > self.p50_s else 1.0
        sigma = math.log(spread) / NormalDist().inv_cdf(0.95)
        return max(self.first_byte_s, self.p50_s * math.exp(sigma * NormalDist().inv_cdf(uniform)))


def request_key(messages: Iterable[Mapping[str, Any]]) -> str:
    """What identifies a request for its latency draw: its messages' roles and texts."""
    return json.dumps([(m.get("role"), _content(m)) for m in messages], sort_keys=True)


PROVIDER = LatencyProfile(p50_s=0.8, p95_s=3.0, seed=7)
"""`--provider`: a hosted model's latency for a structured reply."""
PROVIDER_FAULTS_EVERY = 50
"""`--provider`: every 50th request (2 %) answered at once with a 429 and `Retry-After: 1`."""


@dataclass(frozen=True)
class Faults:
    """A provider's refusals among replies the script does not give: every `rate_limit_every`-th
    request a 429 with `Retry-After: retry_after_s`, and every `burst_every`-th request starts
    `burst_length` 500s in a row (0: never)."""

    rate_limit_every: int = 0
    retry_after_s: float = 1.0
    burst_every: int = 0
    burst_length: int = 3

    def reply(self, number: int) -> Reply | None:
        """The fault for the `number`-th request (1-based), or None."""
        in_burst = self.burst_every and (number - 1) % self.burst_every < self.burst_length
        if in_burst and number > self.burst_length:  # the first requests go through
            return {"status": 500}
        if self.rate_limit_every and number % self.rate_limit_every == 0:
            return {"status": 429, "retry_after": self.retry_after_s}
        return None


class StubServer:
    """The stub on 127.0.0.1 in a background thread; counts requests and keeps their bodies.

    Requests take the `script`'s replies in order, then `default` (the auto reply unless given;
    None: a 500 for any request the script did not foresee). Each request waits `latency_s`
    (in its own thread, so concurrent requests overlap like a real server's), or until the stub
    stops. What a request gets is decided in two places a later change can grow: `respond`
    (the reply kinds) and `delay_s` (the latency of one request).
    """

    def __init__(
        self,
        script: Iterable[Reply] = (),
        default: Reply | None = AUTO,
        *,
        latency_s: float = 0.0,
        port: int = 0,
        hold_until: int = 0,
        hold_s: float = HOLD_S,
        on_request: Callable[[Mapping[str, Any]], None] | None = None,
        profile: LatencyProfile | None = None,
        faults: Faults | None = None,
    ) -> None:
        self.script: deque[Reply] = deque(script)
        """Replies still to give, in order."""
        self.default = default
        """The reply once the script has run out."""
        self.latency_s = latency_s
        """Seconds each request waits before it is answered."""
        self.hold_until = hold_until
        """Hold every request until this many are in flight at once (0: do not hold): shows
        that a client overlaps its requests without measuring time."""
        self.hold_s = hold_s
        """The longest a request is held (a hang guard); after one hold runs out no other is
        held."""
        self.on_request = on_request
        """Called in the request's thread before its reply is sent (after `latency_s`): a test
        moves its own clock there, so a scripted latency costs no real time."""
        self.profile = profile
        """Latency per reply drawn from a provider's profile (replaces `latency_s`)."""
        self.seen: dict[str, int] = {}
        """With `profile`: how often each request's messages came (its next draw)."""
        self.faults = faults
        """429s and bursts of 500s among the replies the script does not give."""
        self.log: list[dict[str, Any]] = []
        """Every chat completion: arrival (monotonic s), its body (JSON), status, Retry-After,
        the usage it reported; with `profile`, its messages' key and the seconds drawn for it."""
        self.in_flight = 0
        self.max_in_flight = 0
        """The most chat completions being answered at one moment."""
        self._held_out = False
        self.requests = 0
        """Chat completions received since start or the last reset()."""
        self.bodies: list[dict[str, Any]] = []
        """Their request bodies, in arrival order."""
        self.stopped = threading.Event()
        """Set when the stub stops: ends latencies, holds and hanging replies."""
        self._lock = threading.Condition()
        self.server = ThreadingHTTPServer(
            ("127.0.0.1", port), _handler(self), bind_and_activate=False
        )
        self.server.daemon_threads = True
        self.server.request_queue_size = 128  # the default backlog of 5 refuses bursts
        self.server.server_bind()
        self.server.server_activate()
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The /v1 URL to give an OpenAI client (OPENAI_BASE_URL)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def reset(self) -> None:
        """Forget the requests counted so far."""
        with self._lock:
            self.requests = 0
            self.bodies = []

    def take(self, body: dict[str, Any]) -> Reply | None:
        """Count one chat completion and pick its reply (thread-safe: bodies and replies keep
        one order)."""
        with self._lock:
            self.requests += 1
            self.bodies.append(body)
            if self.script:
                return self.script.popleft()
            fault = self.faults.reply(self.requests) if self.faults is not None else None
            return fault if fault is not None else self.default

    def record(
        self, response: Response, arrived: float, body: Mapping[str, Any], seconds: float = 0.0
    ) -> None:
        """Keep one answered request in `log` (what a provider's bill and limits rest on)."""
        payload = response.payload if isinstance(response.payload, dict) else {}
        entry = {
            "arrived": arrived,
            "body": json.dumps(body, sort_keys=True),
            "status": response.status,
            "retry_after": response.headers.get("retry-after"),
            "usage": payload.get("usage"),
        }
        if self.profile is not None:
            entry["key"] = request_key(body.get("messages", []))
            entry["seconds"] = seconds if response.status == 200 else 0.0
        with self._lock:
            self.log.append(entry)

    def delay_s(self, body: Mapping[str, Any]) -> float:
        """Seconds this request waits before its answer is sent."""
        if self.profile is None:
            return self.latency_s
        key = request_key(body.get("messages", []))
        with self._lock:
            occurrence = self.seen.get(key, 0)
            self.seen[key] = occurrence + 1
        return self.profile.draw(key, occurrence)

    def enter(self) -> None:
        """One more request in flight; with `hold_until`, wait for the others to arrive."""
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._lock.notify_all()
            if self.hold_until and not self._held_out:
                arrived = self._lock.wait_for(
                    lambda: self.max_in_flight >= self.hold_until or self.stopped.is_set(),
                    timeout=self.hold_s,
                )
                self._held_out = self._held_out or not arrived

    def leave(self) -> None:
        """One request answered."""
        with self._lock:
            self.in_flight -= 1

    def start(self) -> StubServer:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release every waiting request, stop serving and close the socket."""
        self.stopped.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join()
            self._thread = None
        self.server.server_close()

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
    """Answer a request with a JSON body."""
    send(handler, Response(status, payload))


def send(handler: BaseHTTPRequestHandler, response: Response) -> None:
    """Write a response: its status, headers and JSON body (half of it when cut)."""
    data = json.dumps(response.payload).encode()
    if response.cut:
        data = data[: len(data) // 2]
    handler.send_response(response.status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    for name, value in response.headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)


def send_slowly(
    handler: BaseHTTPRequestHandler, response: Response, body_after_s: float, stop: threading.Event
) -> None:
    """Write the status line and headers now and the body `body_after_s` later (a slow first
    byte is waited before this is called)."""
    data = json.dumps(response.payload).encode()
    handler.send_response(response.status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    for name, value in response.headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.flush()
    if body_after_s > 0:
        stop.wait(body_after_s)
    handler.wfile.write(data)


def _handler(stub: StubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
        disable_nagle_algorithm = True  # headers and body go out at once (no 40 ms ACK wait)

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: Any) -> None:
            send_json(self, status, payload)

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
            elif self.path.rstrip("/") in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            elif self.path.rstrip("/").endswith("/stats"):  # for a stub in another process
                self._send(200, {"requests": stub.requests, "latency_s": stub.latency_s})
            elif self.path.rstrip("/").endswith("/served"):  # the latencies drawn, in order
                with stub._lock:
                    served = [{k: v for k, v in e.items() if k != "body"} for e in stub.log]
                self._send(200, {"served": served})
            elif self.path.rstrip("/").endswith("/restart_draws"):  # a rerun meets the same draws
                with stub._lock:
                    stub.seen.clear()
                    count = len(stub.log)
                self._send(200, {"served": count})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError as exc:
                self._send(400, {"error": {"message": f"body is not JSON: {exc}"}})
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            if body.get("stream"):
                self._send(400, {"error": {"message": "the stub does not stream"}})
                return
            arrived = time.monotonic()
            reply = stub.take(body)
            response = respond(body, reply, self.headers.get("authorization", ""))
            stub.enter()
            try:
                delay = stub.delay_s(body)
                if stub.profile is not None and response.status == 200:
                    stub.record(response, arrived, body, delay)
                    stub.stopped.wait(stub.profile.first_byte_s)
                    send_slowly(self, response, delay - stub.profile.first_byte_s, stub.stopped)
                    return
                if stub.profile is not None or stub.faults is not None:
                    stub.record(response, arrived, body)
                if delay > 0 and not (stub.profile is not None and response.status != 200):
                    stub.stopped.wait(delay)
                if stub.on_request is not None:
                    stub.on_request(body)
                if response.hang:
                    stub.stopped.wait()
                    self.close_connection = True
                    return
                send(self, response)
            finally:
                stub.leave()

    return Handler


def main(argv: list[str] | None = None) -> int:
    """Print the base URL, then serve until killed."""
    parser = argparse.ArgumentParser(prog="python -m experiments.openai_stub", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument(
        "--provider",
        action="store_true",
        help="a provider's latency instead: log-normal p50 0.8 s, p95 3 s; every 50th request "
        "(2%%) a 429 with Retry-After: 1",
    )
    parser.add_argument("--seed", type=int, default=PROVIDER.seed, help="seed of --provider")
    args = parser.parse_args(argv)
    provider = dataclasses.replace(PROVIDER, seed=args.seed) if args.provider else None
    faults = Faults(rate_limit_every=PROVIDER_FAULTS_EVERY) if args.provider else None
    stub = StubServer(latency_s=args.latency, port=args.port, profile=provider, faults=faults)
    print(stub.base_url, flush=True)
    try:
        stub.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stub.server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
