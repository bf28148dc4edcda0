"""The unit-test guard (tests/unit/conftest.py) fails what it must: a test that loads a heavy
module in a unit-only run, and a test that reaches the network even when the code swallowed the
error. Run in a pytest of its own, since this process has loaded the heavy modules already."""

from __future__ import annotations

import pytest

from caprag.config import PROJECT_ROOT

GUARDED = """
import socket


def test_pure():
    assert sum([1, 2]) == 3


def test_loads_an_encoder():
    import wordllama  # noqa: F401


def test_reaches_the_network():
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    except OSError:
        pass  # swallowed: the guard still fails the test
"""


def test_the_guard_fails_heavy_imports_and_network_use(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(PROJECT_ROOT))
    pytester.makeconftest("from tests.unit.conftest import *  # noqa: F403")
    pytester.makepyfile(test_guarded=GUARDED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*teardown of test_loads_an_encoder*",
            "*wordllama was imported (test_guarded.py::test_loads_an_encoder)*",
            "*teardown of test_reaches_the_network*",
            "*it used the network: socket.*127.0.0.1*",
        ]
    )
