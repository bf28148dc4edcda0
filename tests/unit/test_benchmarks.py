"""Benchmark files as datasets: shared passage ids, gold ids, sets per type, modes, errors."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from caprag.config import PROJECT_ROOT
from caprag.errors import ConfigError
from experiments.harness.benchmarks import load_benchmark, passage_id, pool_notice
from experiments.harness.data import BookCorpus, load_dataset
from experiments.results.questions import DatasetError

BENCHMARKS = PROJECT_ROOT / "datasets" / "benchmarks"
SHARED = {"title": "Glasgow", "text": "Glasgow is the largest city in Scotland."}
ID = re.compile(r"^tiny/[a-z0-9-]+-[0-9a-f]{8}$")


def para(title: str, text: str) -> dict[str, str]:
    return {"title": title, "text": text}


def record(qid: str, qtype: str, supporting: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    return {
        "id": qid,
        "question": f"question {qid}?",
        "answer": f"answer {qid}",
        "answer_aliases": [f"alias {qid}"],
        "type": qtype,
        "multihop": len(supporting) > 1,
        "hops": len(supporting),
        "answerable": True,
        "supporting": supporting,
        "distractors": [para(f"Noise {qid}", f"Unrelated text of {qid}."), SHARED],
        "source": "tiny",
        "extra": {},
        **extra,
    }


RECORDS = [
    record("q1", "bridge", [para("Alpha Band", "Alpha Band formed in Glasgow."), SHARED]),
    record("q2", "comparison", [para("Beta", "Beta was born in 1950."), para("Gamma", "G.")]),
    record("q3", "bridge", [para("Delta", "Delta is a river."), para("Alpha Band", "Other.")]),
    record("q4", "comparison", [para("Beta", "Beta was born in 1950."), para("Eps", "Eps.")]),
    record("q5", "bridge", [], hops=0, answerable=False),
]


def write(path: Path, rows: list[dict[str, Any]] | list[str]) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write(tmp_path / "tiny.jsonl", RECORDS)


def test_passage_ids_are_stable_and_shared_across_questions(tiny: Path) -> None:
    first = load_benchmark("tiny", tiny)
    again = load_benchmark("tiny", tiny, mode="distractor", limit=1)
    assert first.books is not None and again.books is not None
    ids = [p.passage_id for p in first.books[0].passages]
    assert ids == [p.passage_id for p in again.books[0].passages]
    assert all(ID.match(pid) for pid in ids) and len(ids) == len(set(ids))
    digest = hashlib.sha1(b"GlasgowGlasgow is the largest city in Scotland.").hexdigest()[:8]
    assert passage_id("tiny", SHARED["title"], SHARED["text"]) == f"tiny/glasgow-{digest}"
    # Glasgow is in every question; Beta's paragraph is gold in q2 and q4: one passage each.
    assert ids.count(f"tiny/glasgow-{digest}") == 1
    beta = passage_id("tiny", "Beta", "Beta was born in 1950.")
    golds = {c.id: c.turns[0].gold_passages for c in first.cases}
    assert golds["q2"][0] == golds["q4"][0] == beta
    # Same title, different text: two passages.
    alpha = [p for p in first.books[0].passages if p.section == "Alpha Band"]
    assert len(alpha) == 2 and alpha[0].passage_id != alpha[1].passage_id
    distinct = {
        (p["title"], p["text"]) for r in RECORDS for p in [*r["supporting"], *r["distractors"]]
    }
    assert len(ids) == len(distinct)


def test_questions_carry_gold_ids_answers_and_type_sets(tiny: Path) -> None:
    data = load_benchmark("tiny", tiny)
    case = data.cases[0]
    question = case.turns[0]
    assert (case.id, case.set, question.set) == ("q1", "tiny:bridge", "tiny:bridge")
    assert question.gold_passages == [
        passage_id("tiny", "Alpha Band", "Alpha Band formed in Glasgow."),
        passage_id("tiny", "Glasgow", SHARED["text"]),
    ]
    assert question.hops == 2 and question.books == ["tiny"] and question.query_type == "factual"
    assert question.answer == question.reference == "answer q1"
    assert question.answer_aliases == ["alias q1"]
    assert [c.set for c in data.cases] == [
        "tiny:bridge",
        "tiny:comparison",
        "tiny:bridge",
        "tiny:comparison",
        "tiny:bridge",
    ]
    unanswerable = data.cases[-1].turns[0]
    assert (
        unanswerable.gold_passages == [] and unanswerable.hops == 0 and not unanswerable.answerable
    )


def test_pooled_has_no_scope_and_distractor_scopes_each_question(tiny: Path) -> None:
    pooled = load_benchmark("tiny", tiny)
    distractor = load_benchmark("tiny", tiny, mode="distractor")
    assert all(c.scope is None for c in pooled.cases)
    assert pooled.books is not None and distractor.books is not None
    assert pooled.books[0].content_hash == distractor.books[0].content_hash
    q1 = distractor.cases[0]
    assert q1.scope == (
        passage_id("tiny", "Alpha Band", "Alpha Band formed in Glasgow."),
        passage_id("tiny", "Glasgow", SHARED["text"]),
        passage_id("tiny", "Noise q1", "Unrelated text of q1."),
    )  # Glasgow is both gold and distractor: listed once
    for case in distractor.cases:
        assert case.scope is not None
        assert set(case.turns[0].gold_passages) <= set(case.scope)
    assert distractor.cases[-1].scope == (
        passage_id("tiny", "Noise q5", "Unrelated text of q5."),
        passage_id("tiny", "Glasgow", SHARED["text"]),
    )


def test_limits_and_types_choose_questions_not_the_corpus(tiny: Path) -> None:
    full = load_benchmark("tiny", tiny)
    assert [c.id for c in load_benchmark("tiny", tiny, limit=2).cases] == ["q1", "q2"]
    per_set = load_benchmark("tiny", tiny, limit_per_set=1)
    assert [c.id for c in per_set.cases] == ["q1", "q2"]
    assert [c.id for c in load_benchmark("tiny", tiny, limit_per_set=2).cases] == [
        "q1",
        "q2",
        "q3",
        "q4",
    ]
    bridge = load_benchmark("tiny", tiny, types=["bridge"], limit_per_set=2)
    assert [c.id for c in bridge.cases] == ["q1", "q3"]
    assert load_benchmark("tiny", tiny, types="comparison").questions == 2
    assert full.books is not None and bridge.books is not None
    assert bridge.books[0].content_hash == full.books[0].content_hash
    assert len(bridge.books[0].passages) == len(full.books[0].passages)
    with pytest.raises(
        ConfigError, match=r"unknown question type.*nope.*known: bridge, comparison"
    ):
        load_benchmark("tiny", tiny, types=["nope"])


def test_content_hash_follows_the_paragraphs_not_the_file(tiny: Path, tmp_path: Path) -> None:
    def book_hash(path: Path) -> str:
        books = load_benchmark("tiny", path).books
        assert books is not None
        return books[0].content_hash

    changed = json.loads(json.dumps(RECORDS))
    changed[3]["distractors"][0]["text"] = "A changed paragraph."
    assert book_hash(tiny) == book_hash(tiny)
    assert book_hash(write(tmp_path / "moved.jsonl", RECORDS)) == book_hash(tiny)
    assert book_hash(write(tmp_path / "changed.jsonl", changed)) != book_hash(tiny)


def test_index_overrides_give_benchmarks_their_own_store(tiny: Path, tmp_path: Path) -> None:
    data = load_benchmark("tiny", tiny)
    overrides = data.index_overrides(tmp_path / "store")
    assert overrides["store"] == str(tmp_path / "store" / "bench-tiny")
    assert isinstance(overrides["books"], BookCorpus) and list(overrides["books"]) == data.books
    curated = load_dataset("single_book", ["single_book"], limit=1)
    assert curated.books is None and curated.index_overrides(tmp_path) == {}
    assert all(case.scope is None for case in curated.cases)


def test_bad_line_and_missing_field_name_file_and_line(tmp_path: Path) -> None:
    good = json.dumps(RECORDS[0])
    path = write(tmp_path / "broken.jsonl", [good, "", good[:-5]])
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(path))}:3: not valid JSON"):
        load_benchmark("tiny", path)
    missing = {k: v for k, v in RECORDS[1].items() if k != "answer"}
    write(path, [good, json.dumps(missing)])
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(path))}:2: answer: Field required"):
        load_benchmark("tiny", path)
    untitled = record("q9", "bridge", [{"text": "No title."}])
    write(path, [good, good.replace('"q1"', '"q0"'), json.dumps(untitled)])
    with pytest.raises(DatasetError, match=r":3: supporting\.0\.title: Field required"):
        load_benchmark("tiny", path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (record("q1", "bridge", [para("A", "a.")], hops=2), "hops is 2 but there are 1 supporting"),
        (record("q1", "bridge", []), "answerable is true but supporting is empty"),
        (record("q1", "bad type", [para("A", "a.")]), "type: String should match pattern"),
        (record("q1", "bridge", [para("A", "")]), "supporting.0.text: String should have at least"),
        (record("q9", "bridge", [para("A", "a.")], answerable="yes"), "answerable: Input should"),
    ],
)
def test_inconsistent_records_are_rejected(
    tmp_path: Path, row: dict[str, Any], message: str
) -> None:
    path = write(tmp_path / "bad.jsonl", [RECORDS[1], row])
    with pytest.raises(DatasetError, match=rf"bad\.jsonl:2: {re.escape(message)}"):
        load_benchmark("tiny", path)


def test_repeated_id_and_too_many_hops_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "dup.jsonl", [RECORDS[0], RECORDS[1], RECORDS[0]])
    with pytest.raises(DatasetError, match=r"dup\.jsonl:3: id 'q1' repeats line 1"):
        load_benchmark("tiny", path)
    six = record("q6", "bridge", [para(f"P{i}", f"text {i}") for i in range(6)])
    write(path, [RECORDS[0], six])
    # A bad line past the limit still fails: the whole file is checked.
    with pytest.raises(DatasetError, match=r"dup\.jsonl:2: hops: Input should be less than"):
        load_benchmark("tiny", path, limit=1)


def test_bad_arguments_fail_with_a_clear_message(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown benchmark mode 'open'; allowed: pooled"):
        load_benchmark("tiny", tiny, mode="open")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="benchmark name 'Tiny Set' is its book id"):
        load_benchmark("Tiny Set", tiny)
    with pytest.raises(ConfigError, match=r"set dataset\.path=FILE"):
        load_benchmark("tiny", "")
    with pytest.raises(FileNotFoundError, match=r"no-such\.jsonl does not exist"):
        load_benchmark("tiny", tmp_path / "no-such.jsonl")


@pytest.mark.parametrize(
    ("name", "file", "sets", "passages"),
    [
        ("hotpotqa", "hotpotqa_dev_distractor.jsonl", {"bridge": 173, "comparison": 79}, 2478),
        ("squad", "squad_v1.1_dev_single.jsonl", {"single": 300}, 726),
    ],
)
def test_shipped_benchmarks_load_in_both_modes(
    name: str, file: str, sets: dict[str, int], passages: int
) -> None:
    pooled = load_benchmark(name, BENCHMARKS / file)
    distractor = load_benchmark(name, BENCHMARKS / file, mode="distractor")
    assert pooled.books is not None
    book = pooled.books[0]
    assert len(book.passages) == passages and book.meta.book_id == name
    counts: dict[str, int] = {}
    for case in pooled.cases:
        counts[case.set] = counts.get(case.set, 0) + 1
    assert counts == {f"{name}:{t}": n for t, n in sets.items()}
    ids = {p.passage_id for p in book.passages}
    for case in distractor.cases:
        gold = case.turns[0].gold_passages
        assert case.scope is not None and set(gold) <= set(case.scope) <= ids
        assert len(gold) == (2 if name == "hotpotqa" else 1)


@pytest.mark.parametrize("member", ["hotpotqa", "squad", "jsonl"])
def test_dataset_configs_switch_mode_and_limits(member: str) -> None:
    overrides = [
        f"dataset={member}",
        "dataset.mode=distractor",
        "experiment.limit_per_set=2",
    ]
    if member == "jsonl":
        overrides += [f"dataset.path={BENCHMARKS / 'hotpotqa_dev_distractor.jsonl'}"]
        overrides += ["dataset.name=mybench"]
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    data = instantiate(cfg.dataset)
    assert data.books and all(case.scope for case in data.cases)
    per_set: dict[str, int] = {}
    for case in data.cases:
        per_set[case.set] = per_set.get(case.set, 0) + 1
    assert set(per_set.values()) == {2}
    assert data.index_overrides("/s")["store"] == f"/s/bench-{cfg.dataset.name}"


def test_jsonl_config_requires_a_path() -> None:
    from omegaconf.errors import MissingMandatoryValue

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["dataset=jsonl"])
    with pytest.raises(MissingMandatoryValue, match=r"dataset\.path"):
        instantiate(cfg.dataset)


def test_a_benchmark_run_says_its_pool_and_embedding_estimate_before_ingesting() -> None:
    path = BENCHMARKS / "hotpotqa_dev_distractor.jsonl"
    pooled = load_benchmark("hotpotqa", path, limit=10)
    text = pool_notice(pooled, "dense", "minilm")
    assert "10 question(s) over a pool of 2,478 paragraphs" in text
    assert "about 41 s" in text  # 2,478 / 60 paragraphs per second
    assert "dataset.mode=distractor searches only each question's own paragraphs" in text
    lexical = pool_notice(load_benchmark("hotpotqa", path, mode="distractor", limit=10), "bm25")
    assert "bm25 embeds nothing" in lexical and "dataset.mode=pooled searches all" in lexical
