"""Debian's chromium under Playwright, as every browser test launches it."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
]  # fmt: skip


def launch_chromium(playwright: Any) -> Any:
    """Headless chromium from /usr/bin (skipped only where it is not installed)."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
