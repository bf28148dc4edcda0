"""The startup bench section's table: medians of wall and CPU beside each target, load noted
(the measuring itself runs whole processes: `make bench startup`)."""

from __future__ import annotations

from experiments.perf.startup import Case, Timing, cases, markdown


def test_the_table_gives_medians_the_target_and_the_load() -> None:
    fast = Case("`fast`", ("true",), 3.0)
    slow = Case("`slow`", ("true",), 5.0, health="/health")
    table = markdown(
        [
            Timing(fast, wall=[1.0, 9.0, 2.0, 1.5, 1.2], cpu=[0.9, 1.0, 1.1, 0.8, 1.2]),
            Timing(slow, wall=[6.0, 5.5, 7.0, 6.5, 5.8], cpu=[3.0, 3.1, 2.9, 3.3, 3.2]),
        ],
        load=(4.2, 5.1),
    )
    assert "| `fast` | 1.50 | 1.00 | 1.00–9.00 | ≤ 3 s | yes |" in table
    assert "| `slow` | 6.00 | 3.10 | 5.50–7.00 | ≤ 5 s | no |" in table
    assert "4.2 before, 5.1 after" in table


def test_every_entry_point_of_the_issue_is_timed() -> None:
    commands = [" ".join(case.command[1:]) for case in cases("python")]
    assert "-m experiments.run strategy=multi-hopp" in commands
    assert "-m experiments.run --help" in commands
    assert any(c.startswith("-m caprag ask ") for c in commands)
    assert "-m caprag.api --port {port}" in commands
    assert any("AppTest" in c for c in commands)
    assert all(case.expect or case.health or "AppTest" in case.command[-1] for case in cases())
