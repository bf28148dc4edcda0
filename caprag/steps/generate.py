"""Step `generate`: answer from the passages only, naming the passages used.

Rule: extract the best-matching sentence, and the best sentence of a passage it cross-references.
LLM: the GENERATE prompt; source ids not among the passages are dropped (and noted). A reply that
never parses fails the question (there is no answer to fall back to), with the call's usage.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from pydantic import BaseModel, Field

from caprag.llm.budget import prompt_values as lengths
from caprag.llm.client import StructuredClient
from caprag.llm.prompt import History, Prompt, format_history, format_passages
from caprag.schemas import Document
from caprag.steps.analyze import is_resolved
from caprag.steps.base import NEUTRAL, RuleStep, StepResult, Wording, fit
from caprag.text import DEFAULT_REFUSAL, references, sentences, terms

MIN_ANSWER_OVERLAP = 0.4
ROW_KEY_BONUS = 0.3

GENERATE = Prompt(
    name="generate",
    version="generate-v4",
    system=(
        "Answer the question about {library} using only the passages given. Follow the "
        "cross-references between passages when they change the answer. Be brief and give the "
        "numbers: the answer is at most {answer_chars} characters. If the passages do not "
        "contain the answer, set refused to true and answer exactly: '{refusal}' List in "
        "source_ids the ids of the passages you used (at most {source_ids_items})."
    ),
    user="{history}Question: {question}\n\nPassages:\n{passages}{confidence}",
)


MAX_ANSWER_CHARS = 4000
MAX_SOURCE_ID_CHARS = 200


class GeneratedAnswer(BaseModel):
    """What the generator returns: the answer text, the passage ids it relied on, and whether it
    refused (the passages hold no answer): the flag the scorer, the strategies and the pages
    read, whatever the refusal's wording."""

    answer: str = Field(max_length=MAX_ANSWER_CHARS, json_schema_extra={"budget": 3})
    source_ids: list[str] = Field(
        default_factory=list,
        max_length=20,
        json_schema_extra={"items": {"type": "string", "maxLength": MAX_SOURCE_ID_CHARS}},
    )
    refused: bool = Field(
        default=False, description="True when the passages do not contain the answer."
    )


Confidence = tuple[float, float]
"""Retrieval's confidence in the passages and the threshold the question needs (adaptive)."""


def confidence_note(confidence: Confidence | None) -> str:
    """What the generator is told about retrieval's confidence ('' when there is none): below the
    threshold, it is asked to say the answer may be incomplete."""
    if confidence is None:
        return ""
    value, threshold = confidence
    note = f"\n\nRetrieval confidence: {value:.2f} (this question needs {threshold:.2f})."
    if value < threshold:
        note += " It is below the threshold: say that the answer may be incomplete."
    return note


def below_threshold(confidence: Confidence | None) -> str:
    """The sentence an answer ends with when retrieval stayed below its threshold ('' if not)."""
    if confidence is None or confidence[0] >= confidence[1]:
        return ""
    return (
        f"(Retrieval confidence {confidence[0]:.2f} is below the {confidence[1]:.2f} this question "
        "needs: the answer may be incomplete.)"
    )


def prompt_values(
    question: str,
    documents: Sequence[Document],
    history: History,
    confidence: Confidence | None = None,
    output_cap: int | None = None,
    wording: Wording = NEUTRAL,
) -> dict[str, str]:
    """The GENERATE prompt's arguments (earlier turns first, when there are any; retrieval's
    confidence last, when the strategy rated it), with the lengths of the answer's schema
    fitted to `output_cap` (None: the schema's own bounds)."""
    return {
        "question": question,
        "passages": format_passages(documents),
        "history": format_history(history) + "\n\n" if history else "",
        "library": wording.library,
        "refusal": wording.refusal,
        "confidence": confidence_note(confidence),
        **lengths(GeneratedAnswer, output_cap, GENERATE.fields),
    }


def _row_key(row: str) -> str:
    """First cell of a table row (after the header prefix added by `sentences`)."""
    cells = [c.strip() for c in row.split("|") if c.strip()]
    header_width = row.count("|") // 2
    data = cells[header_width - 1 :] if header_width > 1 else cells
    return data[0].lower() if data else ""


def _best_sentence(wanted: set[str], doc: Document) -> tuple[float, str]:
    best = (0.0, "")
    head = set(terms(doc.section))
    for sentence in sentences(doc.text):
        words = set(terms(sentence))
        score = len(wanted & (words | head)) / max(len(wanted), 1)
        if re.search(r"\d", sentence):
            score += 0.05
        if sentence.startswith("|"):
            key = _row_key(sentence)
            if key and key in wanted:
                score += ROW_KEY_BONUS
        if score > best[0]:
            best = (score, sentence)
    return best


def extract_answer(
    question: str, documents: Sequence[Document], refusal: str = DEFAULT_REFUSAL
) -> GeneratedAnswer:
    """The best-matching sentence, plus the best sentence of a passage it points to; the
    refusal (flagged) when no sentence matches the question well enough."""
    wanted = set(terms(question))
    scored = sorted(
        ((*_best_sentence(wanted, doc), index) for index, doc in enumerate(documents)),
        key=lambda item: (-item[0], item[2]),
    )
    if not scored or scored[0][0] < MIN_ANSWER_OVERLAP:
        return GeneratedAnswer(answer=refusal, source_ids=[], refused=True)
    _, sentence, index = scored[0]
    first = documents[index]
    parts = [f"{sentence} [{first.passage_id}]"]
    sources = [first.passage_id]
    for reference in references(first.text):
        target = next(
            (d for d in documents if is_resolved(reference, [d]) and d.passage_id not in sources),
            None,
        )
        if target is None:
            continue
        _, follow = _best_sentence(wanted | set(terms(sentence)), target)
        if follow:
            parts.append(f"{follow} [{target.passage_id}]")
            sources.append(target.passage_id)
        if len(sources) >= 3:
            break
    # A corpus without sentence ends can make one "sentence" a whole chapter.
    return GeneratedAnswer(
        answer=fit(" ".join(parts), MAX_ANSWER_CHARS, "the answer"), source_ids=sources
    )


class RuleGenerator(RuleStep):
    """The extractive answer (`extract_answer`)."""

    async def __call__(
        self,
        question: str,
        documents: Sequence[Document],
        history: History = (),
        confidence: Confidence | None = None,
    ) -> StepResult[GeneratedAnswer]:
        t0 = time.perf_counter()
        answer = extract_answer(question, documents, self.wording.refusal)
        caveat = below_threshold(confidence)
        if caveat and not answer.refused:
            text = fit(f"{answer.answer} {caveat}", MAX_ANSWER_CHARS, "the answer")
            answer = answer.model_copy(update={"answer": text})
        values = prompt_values(question, documents, history, confidence, wording=self.wording)
        return self.costed("generate", GENERATE, answer, answer.model_dump_json(), t0, **values)


class LLMGenerator:
    """The model's answer; cited ids that are not among the passages are dropped."""

    kind = "llm"

    def __init__(self, client: StructuredClient, wording: Wording = NEUTRAL) -> None:
        self.client = client
        self.model = client.model
        self.wording = wording

    async def __call__(
        self,
        question: str,
        documents: Sequence[Document],
        history: History = (),
        confidence: Confidence | None = None,
    ) -> StepResult[GeneratedAnswer]:
        values = prompt_values(
            question, documents, history, confidence, self.client.max_output_tokens, self.wording
        )
        answer, usage = await self.client.structured(
            "generate", GENERATE, GeneratedAnswer, **values
        )
        known = {d.passage_id for d in documents}
        unknown = [i for i in answer.source_ids if i not in known]
        notes = list(usage.notes) + (
            [f"cited ids not among the passages dropped: {', '.join(unknown)}"] if unknown else []
        )
        # the model's flag, or the refusal it was asked to give word for word (a model that
        # does not fill the flag): either way a refusal, whatever else the answer says
        refused = answer.refused or " ".join(answer.answer.split()) == self.wording.refusal
        answer = answer.model_copy(
            update={"source_ids": [i for i in answer.source_ids if i in known], "refused": refused}
        )
        return StepResult(value=answer, usage=usage.model_copy(update={"notes": notes}))
