"""What the harness measures is what users are served: an adaptive question asked through
`/api/ask` (power auto, the default settings) takes the rounds the harness row records, with
the same depths, decisions and confidences (one calibration, one notion of elapsed time)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hydra import compose, initialize_config_dir

from caprag.config import PROJECT_ROOT, load_settings
from caprag.serve.api import create_app
from caprag.serve.services import build_pipeline
from experiments.harness.run import run

pytestmark = pytest.mark.slow


def test_a_served_adaptive_answer_reproduces_the_harness_row(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "strategy=adaptive",
                "dataset=cross_book",
                "experiment.limit=4",
                "tracking.enabled=false",
                "experiment.cache=false",
                "experiment.progress=false",
                f"paths.store={store}",
                f"paths.journals={tmp_path / 'journals'}",
            ],
        )
    rows = run(cfg).rows
    assert any(len(row.hops) > 1 for row in rows), "some question must go deeper"
    settings = load_settings(
        retrieval_strategy="adaptive", chroma_dir=store, decision_log="off", k=8
    )
    with TestClient(create_app(build_pipeline(settings)), base_url="http://127.0.0.1") as client:
        for row in rows:
            served = client.post("/api/ask", json={"question": row.question, "power": "auto"})
            assert served.status_code == 200, served.text
            hops = served.json()["hops"]
            assert [(h["depth"], h["adaptive_decision"], h["confidence"]) for h in hops] == [
                (h.depth, h.adaptive_decision, h.confidence) for h in row.hops
            ], row.question
            cited = {source["passage_id"] for source in served.json()["sources"]}
            assert cited <= set(row.context_ids), row.question
