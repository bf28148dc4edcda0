"""The passage store on a real Chroma server (`chroma run` on loopback), as sweep jobs share it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from caprag.config import PROJECT_ROOT
from caprag.errors import ConfigError, VectorStoreError
from caprag.retrieval.books import load_books
from caprag.retrieval.chroma_server import ServerAddress, ServerLock, ServerPassageIndex, connect
from caprag.retrieval.embeddings import Embedder, FloatArray, get_embedder
from experiments.harness.build import build_index
from experiments.harness.run import run
from tests.chroma_server import chroma_server, free_port, ingest_cli
from tests.conftest import FIXTURE_BOOKS
from tests.integration.test_harness import make_cfg

FIXTURE_IDS = ["basics", "fighting", "gifts"]
HANG_GUARD_S = 600.0
"""Only catches a hang; no test asserts how long anything takes."""


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `chroma run` for the session; each test keeps to its own namespace on it."""
    with chroma_server(tmp_path_factory.mktemp("chroma-server")) as url:
        yield url


@pytest.fixture
def books_dir(tmp_path: Path) -> Path:
    target = tmp_path / "books"
    shutil.copytree(FIXTURE_BOOKS, target)
    return target


class CountingEmbedder(Embedder):
    """The bundled WordLlama model, counting the texts it embeds (ingest work done)."""

    name = "wordllama"
    dimension = get_embedder("wordllama").dimension

    def __init__(self, on_embed: Callable[[], None] | None = None) -> None:
        self.inner = get_embedder("wordllama")
        self.texts = 0
        self.on_embed = on_embed

    def embed(self, texts: list[str]) -> FloatArray:
        if self.on_embed is not None:
            self.on_embed()
        self.texts += len(texts)
        return self.inner.embed(texts)


class FakeClock:
    """Wall-clock time a test moves: sleeping advances it at once."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.time = now

    def now(self) -> float:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.time += seconds


# ----- ingest: parents, hashes, incremental -------------------------------------------------


def test_ingest_on_server_keeps_parents_and_hashes_and_is_incremental(
    server: str, books_dir: Path
) -> None:
    store = f"{server}/incremental"
    # 1. The harness's own path: build_index opens the server store and ingests the corpus.
    index = build_index(books_dir, store, embedding="wordllama", progress=False)
    assert isinstance(index, ServerPassageIndex)
    books = {b.meta.book_id: b for b in load_books(books_dir)}
    manifest = index.manifest()
    assert sorted(manifest) == FIXTURE_IDS
    assert all(manifest[i]["hash"] == books[i].content_hash for i in FIXTURE_IDS)
    assert len(index.parents()) == 12
    children = index._collection.count()
    # 2. Another job (a fresh client) sees the same index, and a second ingest adds nothing.
    counting = CountingEmbedder()
    again = ServerPassageIndex(store, counting)
    second = again.ingest(load_books(books_dir), progress=False)
    assert second.added == [] and sorted(second.skipped) == FIXTURE_IDS
    assert counting.texts == 0 and again._collection.count() == children
    assert again.parents() == index.parents()
    # 3. A changed passage re-ingests its book alone; searches read the new text.
    gifts = books_dir / "gifts.md"
    gifts.write_text(gifts.read_text().replace("Costs 3 gift points.", "Costs 5 gift points."))
    third = again.ingest(load_books(books_dir), progress=False)
    assert third.added == ["gifts"] and sorted(third.skipped) == ["basics", "fighting"]
    assert counting.texts == third.children > 0
    assert again._collection.count() == children
    fresh = ServerPassageIndex(store, CountingEmbedder())
    assert "Costs 5 gift points." in fresh.parents()["gifts/silver-tongue"].text
    assert fresh.manifest()["gifts"]["hash"] == load_books(books_dir)[-1].content_hash
    assert fresh.search("persuade a merchant", 1)[0].passage_id == "gifts/silver-tongue"
    # 4. Pruning a removed book drops its children, parents and manifest entry on the server.
    (books_dir / "basics.md").unlink()
    assert fresh.ingest(load_books(books_dir), prune=True, progress=False).removed == ["basics"]
    assert sorted(ServerPassageIndex(store, CountingEmbedder()).manifest()) == ["fighting", "gifts"]
    assert not any(p.startswith("basics/") for p in fresh.parents())
    assert all(not d.passage_id.startswith("basics/") for d in fresh.search("torch", 5))


def test_namespaces_on_one_server_are_separate_indexes(server: str) -> None:
    one = build_index(FIXTURE_BOOKS, f"{server}/ns-one", embedding="wordllama", progress=False)
    two = ServerPassageIndex(f"{server}/ns-two", CountingEmbedder())
    assert len(one.parents()) == 12
    assert two.parents() == {} and two.manifest() == {} and two.search("torch", 3) == []


# ----- the harness on a server ----------------------------------------------------------------


@pytest.mark.slow
def test_harness_run_on_server_matches_local_store(server: str, tmp_path: Path) -> None:
    options = ("dataset=all", "strategy=multi-hop", "retriever.k=1")
    local_cfg = make_cfg(tmp_path / "local", *options)
    remote = f"{server}/harness"
    server_cfg = make_cfg(tmp_path / "server", *options, f"retriever.index.store={remote}")
    local = run(local_cfg)
    served = run(server_cfg)
    assert served.summary["failed"] == 0 and served.summary["questions"] == 9
    recall = local.mean("recall_at_k")
    assert recall is not None and recall < 1.0  # k=1 misses some gold passages
    assert served.mean("recall_at_k") == recall
    assert {r.question_id: r.context_ids for r in served.rows} == {
        r.question_id: r.context_ids for r in local.rows
    }
    # The server run read the server: its index is there and it made no local store.
    assert not (tmp_path / "server" / "store").exists()
    client = connect(ServerAddress.parse(remote))
    assert client.get_collection("harness.children-minilm-420").count() > 0
    assert client.get_collection("harness.parents-minilm-420").count() == 12


@pytest.mark.slow
def test_benchmark_on_server_gets_its_own_namespace_and_scoped_search(
    server: str, tmp_path: Path
) -> None:
    options = (
        "dataset=squad",
        "dataset.mode=distractor",
        "experiment.limit=6",
        "retriever=wordllama",
        "strategy=single",
        "retriever.k=1",
    )
    remote = f"{server}/bench"
    local = run(make_cfg(tmp_path / "local", *options))
    served = run(make_cfg(tmp_path / "server", *options, f"retriever.index.store={remote}"))
    assert served.summary["failed"] == 0 and served.summary["questions"] == 6
    assert {r.question_id: r.context_ids for r in served.rows} == {
        r.question_id: r.context_ids for r in local.rows
    }
    assert served.mean("recall_at_k") == local.mean("recall_at_k")
    names = [c.name for c in connect(ServerAddress.parse(remote)).list_collections()]
    assert any(
        n.startswith("bench.bench-") and n.endswith(".children-wordllama-420") for n in names
    )
    assert "bench.children-wordllama-420" not in names  # the rulebooks' index was not touched


# ----- concurrent jobs ------------------------------------------------------------------------

JOB = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from caprag.retrieval.books import load_books
    from caprag.retrieval.chroma_server import ServerPassageIndex, WallClock
    from caprag.retrieval.embeddings import get_embedder

    store, books, signals, me = sys.argv[1:5]
    signals = Path(signals)
    HANG_GUARD_S = 600


    class HoldingEmbedder:
        # The lease holder embeds; it keeps the lease until the other job has waited for it.
        name = "wordllama"

        def __init__(self):
            self.inner = get_embedder("wordllama")
            self.calls = 0

        def embed(self, texts):
            self.calls += 1
            deadline = time.monotonic() + HANG_GUARD_S
            while not any(signals.glob("*.waited")):
                if time.monotonic() > deadline:
                    raise SystemExit("the other job never waited for the lease")
                time.sleep(0.05)
            return self.inner.embed(texts)

        def embed_query(self, text):
            return self.inner.embed_query(text)


    class SignallingClock(WallClock):
        def sleep(self, seconds):
            (signals / f"{me}.waited").touch()
            super().sleep(min(seconds, 0.2))


    embedder = HoldingEmbedder()
    index = ServerPassageIndex(store, embedder, clock=SignallingClock())
    report = index.ingest(load_books(books), progress=False)
    print(json.dumps({
        "added": sorted(report.added),
        "skipped": sorted(report.skipped),
        "embed_calls": embedder.calls,
        "waits": index.lease.waits,
        "parents": sorted(index.parents()),
        "children": index._collection.count(),
    }))
    """
)


def test_two_jobs_ingesting_at_once_take_turns(server: str, tmp_path: Path) -> None:
    store = f"{server}/concurrent"
    signals = tmp_path / "signals"
    signals.mkdir()
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", JOB, store, str(FIXTURE_BOOKS), str(signals), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=PROJECT_ROOT,
            env=env,
        )
        for name in ("a", "b")
    ]
    outputs = [job.communicate(timeout=900) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], [err for _, err in outputs]
    reports = sorted(
        (json.loads(out.strip().splitlines()[-1]) for out, _ in outputs),
        key=lambda r: len(r["added"]),
    )
    waiter, ingester = reports
    # Exactly one job ingested; the other waited for it, then found every book done.
    assert ingester["added"] == FIXTURE_IDS and ingester["embed_calls"] > 0
    assert waiter["added"] == [] and waiter["skipped"] == FIXTURE_IDS
    assert waiter["embed_calls"] == 0 and waiter["waits"] >= 1
    # Both read the same index.
    assert waiter["parents"] == ingester["parents"] and len(waiter["parents"]) == 12
    assert waiter["children"] == ingester["children"] > 0


# ----- the lease ------------------------------------------------------------------------------


def lock(server: str, owner: str, clock: FakeClock, **options: Any) -> ServerLock:
    address = ServerAddress.parse(f"{server}/leases")
    defaults: dict[str, Any] = {"ttl_s": 60.0, "poll_s": 5.0, "wait_s": 3600.0, "heartbeat": False}
    return ServerLock(
        connect(address),
        address,
        "ingest-test",
        clock=clock,
        owner=owner,
        **{**defaults, **options},
    )


def test_stale_lease_is_taken_over_and_its_holder_told(server: str) -> None:
    clock = FakeClock()
    dead = lock(server, "job-a", clock)
    dead.acquire()  # job-a then dies: it never renews nor releases
    taker = lock(server, "job-b", clock)
    taker.acquire()
    assert taker.taken_over == "job-a"
    assert taker.waits == 12  # 60 s lease / 5 s polls: it waited until the lease expired
    with pytest.raises(VectorStoreError, match=r"lost the lock 'ingest-test'.*took it over"):
        dead.verify()
    dead.release()  # the late job giving up must not free its successor's lease
    late = lock(server, "job-c", clock, wait_s=30.0)
    with pytest.raises(VectorStoreError, match=r"waited 30s .*job-b still holds it") as error:
        late.acquire()
    assert f"{server}/leases" in str(error.value)
    assert late.waits == 6
    taker.renew()  # a live holder keeps its lease
    taker.release()
    after = lock(server, "job-d", clock)
    after.acquire()  # a released lease is taken at once, not taken over
    assert after.waits == 0 and after.taken_over is None
    after.release()


def test_heartbeat_keeps_a_live_holders_lease(server: str) -> None:
    clock = FakeClock()
    holder = lock(server, "job-live", clock, ttl_s=0.03, heartbeat=True)  # beats every 0.01 s
    holder.acquire()
    try:
        clock.sleep(3600.0)  # an hour passes: without renewal the lease would be stale
        deadline = time.monotonic() + HANG_GUARD_S
        while not any(lease["expires"] > clock.now() for _, lease in holder._generations()):
            assert time.monotonic() < deadline, "the heartbeat never renewed the lease"
            time.sleep(0.01)
        waiter = lock(server, "job-waiting", clock, wait_s=0.0)
        with pytest.raises(VectorStoreError, match="job-live still holds it"):
            waiter.acquire()  # renewed: not taken over
        assert waiter.taken_over is None
    finally:
        holder.release()


def test_ingest_that_lost_its_lease_fails_before_recording_books(server: str) -> None:
    store = f"{server}/lost-lease"
    clock = FakeClock()

    def stall_and_be_taken_over() -> None:
        if clock.time == 1_000_000.0:  # first batch: stall past the lease, another job takes it
            clock.sleep(61.0)
            address = ServerAddress.parse(store)
            ServerLock(
                connect(address),
                address,
                "ingest-wordllama-420",
                clock=clock,
                owner="successor",
                heartbeat=False,
            ).acquire()

    index = ServerPassageIndex(store, CountingEmbedder(stall_and_be_taken_over), clock=clock)
    with pytest.raises(VectorStoreError, match="lost the lock 'ingest-wordllama-420'"):
        index.ingest(load_books(FIXTURE_BOOKS), progress=False)
    assert index.manifest() == {}  # nothing recorded as done: the successor ingests it all


# ----- how users reach it: CLI settings and errors --------------------------------------------


def test_ingest_cli_uses_the_server_from_caprag_chroma_url(server: str, tmp_path: Path) -> None:
    env = {"CAPRAG_CHROMA_URL": f"{server}/cli", "CAPRAG_CHROMA_DIR": str(tmp_path / "unused")}
    first = ingest_cli(env)
    assert first.returncode == 0, first.stderr
    assert "ingested 3 book(s) (12 passages" in first.stdout
    assert "HTTP Request" not in first.stderr  # no log line per request to the server
    second = ingest_cli(env)
    assert "ingested 0 book(s)" in second.stdout and "skipped 3 unchanged" in second.stdout
    assert not (tmp_path / "unused").exists()


def test_served_answers_come_from_the_server(server: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "caprag", "ask", "What does Old Soldier cost?"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={
            **os.environ,
            "CAPRAG_CHROMA_URL": f"{server}/served",
            "CAPRAG_CHROMA_DIR": str(tmp_path / "unused"),
            "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
            "CAPRAG_EMBEDDING": "wordllama",
            "CAPRAG_CHECKPOINTER": f"sqlite:{tmp_path / 'chat.db'}",
        },
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "[gifts/old-soldier]" in done.stdout
    assert not (tmp_path / "unused").exists()
    served = ServerPassageIndex(f"{server}/served", CountingEmbedder())
    assert sorted(served.manifest()) == FIXTURE_IDS


def test_unreachable_server_names_the_url_and_what_to_start() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for module in ("caprag.retrieval.ingest", "caprag.serve.api"):
        done = subprocess.run(
            [sys.executable, "-m", module],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            env={**os.environ, "CAPRAG_CHROMA_URL": url, "CAPRAG_CORPUS": str(FIXTURE_BOOKS)},
            timeout=600,
        )
        assert done.returncode == 2, (module, done.stderr)
        assert f"error: cannot reach the Chroma server at {url}" in done.stderr
        assert "chroma run --path DIR --host 127.0.0.1" in done.stderr
        assert "Traceback" not in done.stderr
    with pytest.raises(VectorStoreError, match="chroma run"):
        build_index(FIXTURE_BOOKS, url, embedding="wordllama", progress=False)


def test_a_server_that_goes_away_is_a_clear_error(tmp_path: Path) -> None:
    with chroma_server(tmp_path) as url:
        index = build_index(FIXTURE_BOOKS, url, embedding="wordllama", progress=False)
        assert index.search("torch", 1)
    with pytest.raises(VectorStoreError, match=f"lost the Chroma server at {url}.*chroma run"):
        index.search("torch", 1)
    with pytest.raises(VectorStoreError, match=f"lost the Chroma server at {url}.*chroma run"):
        index.ingest(load_books(FIXTURE_BOOKS), progress=False)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CAPRAG_CHROMA_URL": "ftp://127.0.0.1:8000"}, "CAPRAG_CHROMA_URL='ftp://127.0.0.1:8000'"),
        ({"CAPRAG_CHROMA_URL": "http://127.0.0.1:80x"}, "the port is not a number"),
        ({"CAPRAG_CHROMA_URL": "http://127.0.0.1:9/a b"}, "namespace 'a b'"),
    ],
)
def test_bad_server_url_is_a_settings_error(env: dict[str, str], message: str) -> None:
    done = ingest_cli(env)
    assert done.returncode == 2 and message in done.stderr


def test_bm25_on_a_server_store_is_refused(server: str) -> None:
    done = ingest_cli({"CAPRAG_CHROMA_URL": server, "CAPRAG_RETRIEVER": "bm25"})
    assert done.returncode == 2
    assert "retriever kind=bm25 keeps its BM25 index in a store folder" in done.stderr
    with pytest.raises(ConfigError, match=f"not on the Chroma server {server}"):
        build_index(FIXTURE_BOOKS, server, kind="hybrid", progress=False)
