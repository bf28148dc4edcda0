"""The harness benchmark's instant LLM (overhead section: integration/test_bench_sections.py)."""

from __future__ import annotations

from caprag.schemas import Document
from experiments.support.fakes import instant_steps


async def test_instant_llm_gives_valid_replies_and_no_usage() -> None:
    llm = instant_steps()
    doc = Document(passage_id="core/torch", book_id="core", text="A torch burns for one hour.")
    answer = await llm.generate("How long does a torch burn?", [doc])
    assert answer.value.source_ids == ["core/torch"]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == answer.usage.completion_tokens == 0
    assert (await llm.analyze("q", [doc], ["q"])).value.sufficient is True
    assert (await llm.assess("q", [doc])).value.confidence == 1.0
