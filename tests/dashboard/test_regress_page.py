"""The Regressions page through AppTest on two real harness runs: counts follow the filters,
rows carry links to both traces, and the filters are written to the URL."""

from __future__ import annotations

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from experiments.scoring import regressions as reg
from experiments.scoring.failures import TAGS
from tests.dashboard.conftest import Store
from tests.dashboard.test_app import open_page
from tests.dashboard.test_regress_browser import logged

PAGE = "views/regressions.py"


def shown_counts(at: AppTest) -> dict[str, int]:
    return {m.label: int(m.value) for m in at.metric}


def param(at: AppTest, name: str) -> list[str]:
    """A URL parameter's values (AppTest keeps a single value as a string)."""
    value = at.query_params[name]
    return value if isinstance(value, list) else [value]


def rows(at: AppTest) -> pd.DataFrame:
    """The per-question table (the one with a change column)."""
    return next(d.value for d in at.dataframe if "change" in d.value.columns)


def test_counts_follow_the_filters(harness_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = harness_store.runs["multi-hop"], harness_store.runs["multi-question"]
    at = open_page(PAGE, harness_store.uri, monkeypatch, selected_runs=[a, b])
    assert (at.selectbox(key="diff_a").value, at.selectbox(key="diff_b").value) == (a, b)
    frame = reg.compare(logged(harness_store.uri, a), logged(harness_store.uri, b), "recall_at_k")
    assert shown_counts(at) == reg.counts(frame)
    assert sum(shown_counts(at).values()) == len(frame) == len(rows(at))

    at.multiselect(key="reg_set").set_value(["cross_book"]).run()
    cross = reg.filtered(frame, sets=["cross_book"])
    assert shown_counts(at) == reg.counts(cross) and sum(reg.counts(cross).values()) < len(frame)
    types = sorted(cross["type"].unique())
    at.multiselect(key="reg_type").set_value(types[:1]).run()
    assert shown_counts(at) == reg.counts(reg.filtered(frame, ["cross_book"], types[:1]))
    table = rows(at)
    assert set(table["set"]) == {"cross_book"} and set(table["type"]) == set(types[:1])
    assert all(link.startswith(f"trace?run={a}&question=") for link in table["trace_a"])
    assert all(link.startswith(f"trace?run={b}&question=") for link in table["trace_b"])
    assert param(at, "set") == ["cross_book"] and param(at, "a") == [a]

    at.multiselect(key="reg_type").set_value([]).run()
    at.multiselect(key="reg_set").set_value([]).run()
    at.multiselect(key="reg_tag").set_value(list(TAGS)).run()
    tagged = reg.filtered(frame, tags=TAGS)
    assert shown_counts(at) == reg.counts(tagged)
    at.selectbox(key="reg_metric").set_value("f1").run()
    by_f1 = reg.filtered(
        reg.compare(logged(harness_store.uri, a), logged(harness_store.uri, b), "f1"), tags=TAGS
    )
    assert shown_counts(at) == reg.counts(by_f1)
    assert param(at, "metric") == ["f1"]
    assert not at.exception
