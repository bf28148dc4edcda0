"""Official benchmark files converted to the benchmark schema and loaded by the project's loader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from caprag.config import PROJECT_ROOT
from experiments.cli.import_benchmark import ImportFailed, convert, main
from experiments.harness.benchmarks import load_benchmark, passage_id
from experiments.harness.run import run

OFFICIAL = Path(__file__).parents[1] / "fixtures" / "official"
HOTPOTQA = OFFICIAL / "hotpotqa_dev_distractor.json"
MUSIQUE = OFFICIAL / "musique_ans_dev.jsonl"
TWOWIKI = OFFICIAL / "2wikimultihopqa_dev.json"
MHR_CORPUS = OFFICIAL / "multihop_rag_corpus.json"
MHR_QUERIES = OFFICIAL / "multihop_rag_queries.json"
SHIPPED = PROJECT_ROOT / "datasets" / "benchmarks" / "hotpotqa_dev_distractor.jsonl"


def imported(tmp: Path, *args: str) -> list[dict[str, Any]]:
    out = tmp / "out.jsonl"
    assert main([*args, "-o", str(out)]) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def titles(paragraphs: list[dict[str, Any]]) -> list[str]:
    return [p["title"] for p in paragraphs]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "experiments.import_benchmark", *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=600,
    )


def test_hotpotqa_gold_is_the_paragraphs_named_by_the_supporting_facts(tmp_path: Path) -> None:
    records = imported(tmp_path, "hotpotqa", str(HOTPOTQA))
    assert [r["type"] for r in records] == ["bridge", "comparison", "bridge"]
    first = records[0]
    # In order of first appearance in supporting_facts, not in context order.
    assert titles(first["supporting"]) == ["Brasswick Lantern Festival", "Harrowmere"]
    assert titles(first["distractors"]) == ["Oller Valley Railway", "Kettleby"]
    harrowmere = first["supporting"][1]
    assert harrowmere["support_sent_ids"] == [1, 2]
    assert harrowmere["text"] == "".join(harrowmere["sentences"])
    assert harrowmere["text"].startswith("Harrowmere is a market town in the northern vale. It")
    assert (first["hops"], first["answerable"], first["answer"]) == (2, True, "the Oller")
    assert first["extra"]["level"] == "medium" and records[1]["answer"] == "yes"


def test_hotpotqa_import_reproduces_the_shipped_sample(tmp_path: Path) -> None:
    """Official records rebuilt from the shipped sample convert back to the same paragraphs."""
    shipped = [json.loads(line) for line in SHIPPED.read_text(encoding="utf-8").splitlines()[:6]]
    official = []
    for record in shipped:
        support = [(p["title"], i) for p in record["supporting"] for i in p["support_sent_ids"]]
        context = [[p["title"], p["sentences"]] for p in record["supporting"]]
        context += [[p["title"], [p["text"]]] for p in record["distractors"]]
        official.append(
            {
                "_id": record["id"],
                "question": record["question"],
                "answer": record["answer"],
                "type": record["type"],
                "level": record["extra"]["level"],
                "supporting_facts": [list(fact) for fact in support],
                "context": context[::-1],  # the order of the context must not matter
            }
        )
    source = tmp_path / "hotpot_dev_distractor_v1.json"
    source.write_text(json.dumps(official), encoding="utf-8")
    records = imported(tmp_path, "hotpotqa", str(source))
    for mine, theirs in zip(records, shipped, strict=True):
        assert mine["supporting"] == theirs["supporting"]
        assert {passage_id("b", p["title"], p["text"]) for p in mine["distractors"]} == {
            passage_id("b", p["title"], p["text"]) for p in theirs["distractors"]
        }
        keys = ("id", "question", "answer", "type", "hops", "answerable")
        assert {k: mine[k] for k in keys} == {k: theirs[k] for k in keys}
        assert mine["source"] == "hotpot_dev_distractor_v1"  # the official file's name


def test_musique_hop_type_hop_order_and_unanswerable(tmp_path: Path) -> None:
    records = imported(tmp_path, "musique", str(MUSIQUE))
    assert [r["type"] for r in records] == ["2hop", "3hop", "2hop"]
    two, three, none = records
    assert titles(two["supporting"]) == ["Vell Pass", "Estria"]
    assert two["answer_aliases"] == ["Korvath City"]
    # Hop order follows the decomposition's paragraph_support_idx, not the paragraph order.
    assert titles(three["supporting"]) == ["Marrow Fair", "The Quiet Engines", "Greyline Records"]
    assert (three["hops"], three["extra"]["shape"]) == (3, "3hop1")
    assert titles(three["distractors"]) == ["Fenwick Hall"]
    # answerable false: the schema's unanswerable form (no gold paragraph, no gold answer).
    assert (none["answerable"], none["supporting"], none["answer"]) == (False, [], "")
    assert len(none["distractors"]) == 3
    assert none["extra"]["answer_of_the_answerable_twin"] == "Korvath"


def test_2wikimultihopqa_types_and_spaced_sentences(tmp_path: Path) -> None:
    records = imported(tmp_path, "2wikimultihopqa", str(TWOWIKI))
    assert [r["type"] for r in records] == ["comparison", "compositional", "bridge_comparison"]
    bridge = records[2]
    assert titles(bridge["supporting"]) == [
        "Lantern Road",
        "Mara Quill",
        "The Copper Bell",
        "Hal Brennan",
    ]
    assert bridge["hops"] == 4 and titles(bridge["distractors"]) == ["Quill Island"]
    assert bridge["supporting"][0]["text"] == (
        "Lantern Road is a 1964 road film. It was directed by Mara Quill."
    )
    assert bridge["extra"]["evidences"][2] == ["Mara Quill", "date of birth", "1930"]


def test_multihop_rag_gold_articles_by_url_or_title(tmp_path: Path) -> None:
    records = imported(
        tmp_path,
        "multihop-rag",
        str(MHR_QUERIES),
        "--corpus",
        str(MHR_CORPUS),
        "--distractors",
        "1",
    )
    corpus = json.loads(MHR_CORPUS.read_text(encoding="utf-8"))
    assert [r["type"] for r in records] == [
        "inference_query",
        "comparison_query",
        "temporal_query",
        "null_query",
    ]
    assert [r["id"] for r in records] == ["q00001", "q00002", "q00003", "q00004"]
    first, comparison, _, null = records
    assert first["supporting"] == [
        {"title": corpus[0]["title"], "text": corpus[0]["body"]},
        {"title": corpus[1]["title"], "text": corpus[1]["body"]},
    ]
    # The first evidence has no url (matched by title); two facts from one article: one gold.
    assert titles(comparison["supporting"]) == [corpus[2]["title"], corpus[3]["title"]]
    assert (null["answerable"], null["supporting"], null["hops"]) == (False, [], 0)
    # Every article is in the file, so the pooled index is the whole corpus.
    everywhere = {p["title"] for r in records for p in [*r["supporting"], *r["distractors"]]}
    assert everywhere == {a["title"] for a in corpus}
    assert all(len(r["distractors"]) >= 1 for r in records)


@pytest.mark.parametrize(
    ("args", "types"),
    [
        (["hotpotqa", str(HOTPOTQA)], {"bridge", "comparison"}),
        (["musique", str(MUSIQUE)], {"2hop", "3hop"}),
        (["2wikimultihopqa", str(TWOWIKI)], {"comparison", "compositional", "bridge_comparison"}),
        (
            ["multihop-rag", str(MHR_QUERIES), "--corpus", str(MHR_CORPUS)],
            {"inference_query", "comparison_query", "temporal_query", "null_query"},
        ),
    ],
)
def test_the_output_loads_through_the_benchmark_loader(
    args: list[str], types: set[str], tmp_path: Path
) -> None:
    records = imported(tmp_path, *args)
    for mode in ("pooled", "distractor"):
        dataset = load_benchmark("imported", tmp_path / "out.jsonl", mode=mode)
        assert [c.id for c in dataset.cases] == [r["id"] for r in records]
        assert {c.set for c in dataset.cases} == {f"imported:{t}" for t in types}
        assert dataset.books is not None
        passages = {p.passage_id for p in dataset.books[0].passages}
        for case, record in zip(dataset.cases, records, strict=True):
            question = case.turns[0]
            expected = [passage_id("imported", p["title"], p["text"]) for p in record["supporting"]]
            assert question.gold_passages == (expected if record["answerable"] else [])
            assert set(question.gold_passages) <= passages
            if mode == "distractor":
                assert case.scope is not None and set(question.gold_passages) <= set(case.scope)


def write(tmp: Path, name: str, data: object) -> Path:
    path = tmp / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def hotpot_with(tmp: Path, **changes: object) -> Path:
    records = json.loads(HOTPOTQA.read_text(encoding="utf-8"))
    records[1].update(changes)
    return write(tmp, "hotpot.json", records)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"question": 7},
            "record 2: field 'question': expected a non-empty string, found a number",
        ),
        ({"type": "yes-no"}, "record 2: field 'type': expected one of bridge, comparison"),
        ({"context": [["Low Orchard", "one sentence"]]}, "record 2: field 'context[0]': expected"),
        ({"supporting_facts": [["Low Orchard"]]}, "field 'supporting_facts[0]': expected [title,"),
    ],
)
def test_a_bad_record_names_file_record_and_field(
    changes: dict[str, object], message: str, tmp_path: Path
) -> None:
    path = hotpot_with(tmp_path, **changes)
    with pytest.raises(ImportFailed, match=r"^.+$") as caught:
        convert("hotpotqa", path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_bad_records_in_the_other_formats(tmp_path: Path) -> None:
    lines = MUSIQUE.read_text(encoding="utf-8").splitlines()
    second = json.loads(lines[1])
    second["paragraphs"][2]["is_supporting"] = "no"
    path = tmp_path / "musique.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(second), lines[2]]) + "\n", encoding="utf-8")
    with pytest.raises(ImportFailed) as caught:
        convert("musique", path)
    assert str(caught.value) == (
        f"{path}: record 2: field 'paragraphs[2].is_supporting': "
        "expected true or false, found a string"
    )
    queries = json.loads(MHR_QUERIES.read_text(encoding="utf-8"))
    queries[0]["evidence_list"][1].update(url="https://nowhere.example/x", title="Unknown")
    path = write(tmp_path, "queries.json", queries)
    with pytest.raises(ImportFailed, match=r"record 1: field 'evidence_list\[1\]': expected an "):
        convert("multihop-rag", path, corpus=MHR_CORPUS)


def test_skipped_records_are_counted_by_reason(tmp_path: Path) -> None:
    records = json.loads(HOTPOTQA.read_text(encoding="utf-8"))
    records[0]["supporting_facts"] = [["Not In Context", 0]]
    records.append(dict(records[1]))  # a repeated id
    path = write(tmp_path, "hotpot.json", records)
    out, summary = convert("hotpotqa", path)
    assert [r["id"] for r in out] == [records[1]["_id"], records[2]["_id"]]
    assert (summary.read, summary.written) == (4, 2)
    assert summary.skipped == {"no supporting paragraph in the context": 1, "repeated id": 1}
    lines = summary.lines(tmp_path / "out.jsonl")
    assert (
        "skipped: 2 (no supporting paragraph in the context: 1, first record 1 (id "
        f"{records[0]['_id']}); repeated id: 1, first record 4 (id {records[1]['_id']}))"
    ) in lines
    assert "question types: bridge 1, comparison 1" in lines


def test_cli_writes_a_summary_and_overwrites_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "musique.jsonl"
    for _ in range(2):
        done = run_cli("musique", str(MUSIQUE), "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert "records read: 3" in done.stdout and "question types: 2hop 2, 3hop 1" in done.stdout
        assert "unanswerable: 1" in done.stdout
        assert len(out.read_text(encoding="utf-8").splitlines()) == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["musique.jsonl"]


def test_limit_converts_the_first_usable_records(tmp_path: Path) -> None:
    records = imported(tmp_path, "2wikimultihopqa", str(TWOWIKI), "--limit", "2")
    assert [r["type"] for r in records] == ["comparison", "compositional"]
    done = run_cli("hotpotqa", str(HOTPOTQA), "--limit", "0", "-o", str(tmp_path / "x.jsonl"))
    assert done.returncode == 2 and "--limit must be at least 1" in done.stderr


def test_cli_errors_are_one_line_and_leave_the_output_alone(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("the previous import\n", encoding="utf-8")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"_id": "a",\n  "question": }]', encoding="utf-8")
    bad = hotpot_with(tmp_path, answer=None)
    cases = [
        (["hotpotqa", str(broken)], f"error: {broken}: line 2, column 15: not valid JSON"),
        (["hotpotqa", str(bad)], f"error: {bad}: record 2: field 'answer': expected a string"),
        (["musique", str(HOTPOTQA)], f"error: {HOTPOTQA}: line 1: expected one JSON object"),
        (["hotpotqa", str(MUSIQUE)], f"error: {MUSIQUE}: line 2, column 1: not valid JSON"),
        (["hotpotqa", str(tmp_path / "none.json")], "error: "),
        (["multihop-rag", str(MHR_QUERIES)], "error: multihop-rag needs --corpus"),
    ]
    for args, start in cases:
        done = run_cli(*args, "-o", str(out))
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith(start), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert out.read_text(encoding="utf-8") == "the previous import\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.slow
def test_an_imported_file_runs_through_the_harness(tmp_path: Path) -> None:
    out = tmp_path / "musique.jsonl"
    assert main(["musique", str(MUSIQUE), "-o", str(out)]) == 0
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "dataset=jsonl",
                f"dataset.path={out}",
                "dataset.name=musique",
                "retriever=wordllama",
                "tracking.enabled=false",
                "experiment.limit=2",
                "experiment.progress=false",
                "experiment.ragas=false",
                f"paths.store={tmp_path / 'store'}",
                f"paths.cache={tmp_path / 'llm-cache.sqlite'}",
                f"paths.journals={tmp_path / 'journals'}",
            ],
        )
    result = run(cfg)
    assert result.summary["questions"] == 2 and result.summary["failed"] == 0
    assert {r.set for r in result.rows} == {"musique:2hop", "musique:3hop"}
    assert all("recall_at_k" in r.values for r in result.rows)
    assert (tmp_path / "store" / "bench-musique").is_dir()
