"""Every shell command in the README and docs/ still works, in a cheap form.

Each line of a ```bash block is checked without doing the long job it names:

- `make TARGET`: the target exists and its recipe expands (`make -n`, nothing runs);
- `python -m experiments.run OVERRIDES`: Hydra composes the config with those overrides (a
  sweep's first value of each list), so a wrong group, option or key fails here;
- any other `python -m MODULE [SUBCOMMAND]`: `--help` exits 0 (the module and its options exist);
- `uv sync ... --group G`: the group exists in pyproject.toml; `pytest PATH`: the path exists;
- anything else must be a documented placeholder (PLACEHOLDERS: why it is not run, and which test
  runs it for real), so a new kind of command fails until someone says how it is checked.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib

import pytest
from hydra import compose, initialize_config_dir

from caprag.config import PROJECT_ROOT
from experiments.harness import groups

pytestmark = pytest.mark.slow

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
SUBCOMMANDS = {"ask", "serve", "fit", "check", "build"}
PLACEHOLDERS = {
    "curl": "needs `make serve` running; tests/integration/test_api.py posts the same bodies",
}
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def shell_commands(text: str) -> list[str]:
    """The commands of every ```bash block: continuation lines joined, comments dropped."""
    commands: list[str] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if block is None and line.strip() in ("```bash", "```sh"):
                block = []
            elif block is not None:
                joined = re.sub(r"\\\n\s*", " ", "\n".join(block))
                commands += [c.strip() for c in joined.splitlines() if c.strip()]
                block = None
            continue
        if block is not None:
            block.append(line)
    return [c for c in commands if not c.startswith("#")]


def words(command: str) -> list[str]:
    """The command's words without its trailing comment, leading VAR=value and `uv run`."""
    parts = shlex.split(command, comments=True)
    while parts and ENV.match(parts[0]):
        parts.pop(0)
    if parts[:2] == ["uv", "run"]:
        parts = [p for p in parts[2:] if p != "--frozen"]
    return parts


ALL = [(doc.name, command) for doc in DOCS for command in shell_commands(doc.read_text())]


def test_the_docs_have_commands_and_the_readme_two_come_first() -> None:
    readme = shell_commands(DOCS[0].read_text())
    assert [words(c) for c in readme[:2]] == [["make", "run"], ["make", "test"]]
    assert len(ALL) > 40


@pytest.mark.parametrize(("doc", "command"), ALL, ids=[f"{d}:{c[:60]}" for d, c in ALL])
def test_command_is_checked_cheaply(doc: str, command: str) -> None:
    parts = words(command)
    program = parts[0]
    if program == "make":
        done = subprocess.run(
            ["make", "-n", *parts[1:]], cwd=PROJECT_ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{doc}: `{command}`: {done.stderr}"
    elif program == "python" and parts[1:3] == ["-m", "experiments.run"]:
        compose_overrides(parts[3:])
    elif program == "python" and parts[1] == "-m":
        help_exits_zero(parts[2], parts[3] if len(parts) > 3 else "")
    elif program == "uv" and parts[1] == "sync":
        group = parts[parts.index("--group") + 1]
        pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
        assert group in pyproject["dependency-groups"], f"{doc}: no dependency group {group}"
    elif program == "pytest":
        assert (PROJECT_ROOT / parts[1]).exists(), f"{doc}: `{command}`: no {parts[1]}"
    else:
        assert program in PLACEHOLDERS, f"{doc}: `{command}` is neither checked nor a placeholder"


def compose_overrides(arguments: list[str]) -> None:
    """Compose the harness config with the command's overrides (first value of a sweep list)."""
    overrides = []
    for argument in arguments:
        if argument == "-m" or argument.startswith("hydra/"):
            continue  # launcher choices are Hydra's own config, not the job's
        key, _, value = argument.partition("=")
        overrides.append(f"{key}={value.split(',')[0]}" if "," in value else argument)
    groups.offer_registered()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        compose("config", overrides=overrides)


_HELPED: dict[tuple[str, str], int] = {}


def help_exits_zero(module: str, first: str) -> None:
    """`python -m MODULE [SUBCOMMAND] --help` exits 0 (each pair run once per session)."""
    sub = first if first in SUBCOMMANDS else ""
    key = (module, sub)
    if key not in _HELPED:
        done = subprocess.run(
            [sys.executable, "-m", module, *([sub] if sub else []), "--help"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        _HELPED[key] = done.returncode
        assert done.returncode == 0, f"`python -m {module} {sub} --help`: {done.stderr[-2000:]}"
    assert _HELPED[key] == 0
