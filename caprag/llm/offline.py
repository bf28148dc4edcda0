"""The offline backend: deterministic, non-neural, no key, no network; an honest baseline.

Expansion by entities and keywords, sufficiency by unresolved references and uncovered terms,
extractive answers that cite passages, rewrite by carrying entities of earlier turns.
Usage is counted by rendering the same versioned prompts an LLM would get and tokenizing them,
priced at a reference model, so strategies can be compared on cost offline.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import TypeVar

from caprag import analyzer
from caprag.classify import classify_question
from caprag.confidence import heuristic_confidence
from caprag.llm.base import LLM, History, LLMResult, format_history, format_passages
from caprag.llm.usage import count_tokens, price
from caprag.prompts import ANALYZE, ASSESS, CLASSIFY, EXPAND, GENERATE, REWRITE, Prompt
from caprag.schemas import (
    MAX_QUERIES,
    CallUsage,
    ConfidenceAssessment,
    Document,
    GeneratedAnswer,
    QueryClass,
    SufficiencyDecision,
)
from caprag.text import entities, references, sentences, terms

T = TypeVar("T")
REFUSAL = "The rulebooks do not say."
MIN_ANSWER_OVERLAP = 0.4
ROW_KEY_BONUS = 0.3
QUESTION_WORDS = frozenset({"what's", "it's", "i'm", "i've", "how's", "where's", "who's"})
PRONOUNS = re.compile(r"\b(it|its|it's|they|them|their|he|she|him|her)\b", re.I)


class OfflineLLM(LLM):
    """Deterministic stand-in for an LLM; same inputs always give the same outputs."""

    backend = "offline"

    def __init__(self, price_model: str = "gpt-4o-mini") -> None:
        self.model = "offline"
        self.price_model = price_model

    def _result(
        self, step: str, prompt: Prompt, prompt_text: str, value: T, out: str, t0: float
    ) -> LLMResult[T]:
        prompt_tokens = count_tokens(prompt_text)
        completion_tokens = count_tokens(out)
        usage = CallUsage(
            step=step,
            model=self.model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=price(self.price_model, prompt_tokens, completion_tokens),
            latency_s=time.perf_counter() - t0,
            counted="tokenizer",
            prompt_version=prompt.version,
        )
        return LLMResult(value=value, usage=usage)

    async def expand(self, question: str, n: int) -> LLMResult[list[str]]:
        """Sub-questions: one per named rule in the question, then the bare keywords."""
        t0 = time.perf_counter()
        subs = [name for name in entities(question) if name.lower() != question.lower()]
        keywords = " ".join(dict.fromkeys(terms(question)))
        if keywords and keywords not in subs:
            subs.append(keywords)
        subs = subs[:n]
        text = EXPAND.text(question=question, n=str(n))
        return self._result("expand", EXPAND, text, subs, "\n".join(subs), t0)

    async def analyze(
        self, question: str, documents: Sequence[Document], searched: Sequence[str]
    ) -> LLMResult[SufficiencyDecision]:
        """Unresolved cross-references and uncovered question terms become new queries."""
        t0 = time.perf_counter()
        decision = analyzer.decide(question, documents, searched)
        text = ANALYZE.text(
            question=question,
            searched="\n".join(searched),
            passages=format_passages(documents),
            max_queries=str(analyzer.MAX_NEW_QUERIES),
        )
        return self._result("analyze", ANALYZE, text, decision, decision.model_dump_json(), t0)

    async def generate(
        self, question: str, documents: Sequence[Document], history: History = ()
    ) -> LLMResult[GeneratedAnswer]:
        """Extract the best sentence, and the best one of a passage it cross-references."""
        t0 = time.perf_counter()
        answer = extract_answer(question, documents)
        text = GENERATE.text(
            question=question,
            passages=format_passages(documents),
            history=format_history(history) + "\n\n" if history else "",
        )
        return self._result("generate", GENERATE, text, answer, answer.model_dump_json(), t0)

    async def rewrite(self, question: str, history: History) -> LLMResult[str]:
        """Replace pronouns (or add the topic) with the most recent named rule of the history."""
        t0 = time.perf_counter()
        standalone = rewrite_with_history(question, history)
        text = REWRITE.text(question=question, history=format_history(history))
        return self._result("rewrite", REWRITE, text, standalone, standalone, t0)

    async def classify(self, question: str) -> LLMResult[QueryClass]:
        """Phrase rules (caprag.classify): procedure, choice and plan wording."""
        t0 = time.perf_counter()
        value = classify_question(question)
        text = CLASSIFY.text(question=question)
        return self._result("classify", CLASSIFY, text, value, value.model_dump_json(), t0)

    async def assess(
        self, question: str, documents: Sequence[Document]
    ) -> LLMResult[ConfidenceAssessment]:
        """The heuristic confidence (caprag.confidence), costed as if the prompt had been sent."""
        t0 = time.perf_counter()
        value = heuristic_confidence(question, documents).assessment()
        text = ASSESS.text(
            question=question,
            passages=format_passages(documents),
            max_missing=str(MAX_QUERIES),
        )
        return self._result("assess", ASSESS, text, value, value.model_dump_json(), t0)


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


def extract_answer(question: str, documents: Sequence[Document]) -> GeneratedAnswer:
    """The best-matching sentence, plus the best sentence of a passage it points to."""
    wanted = set(terms(question))
    scored = sorted(
        ((*_best_sentence(wanted, doc), index) for index, doc in enumerate(documents)),
        key=lambda item: (-item[0], item[2]),
    )
    if not scored or scored[0][0] < MIN_ANSWER_OVERLAP:
        return GeneratedAnswer(answer=REFUSAL, source_ids=[])
    _, sentence, index = scored[0]
    first = documents[index]
    parts = [f"{sentence} [{first.passage_id}]"]
    sources = [first.passage_id]
    for reference in references(first.text):
        target = next(
            (
                d
                for d in documents
                if analyzer.is_resolved(reference, [d]) and d.passage_id not in sources
            ),
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
    return GeneratedAnswer(answer=" ".join(parts), source_ids=sources)


def conversation_topic(questions: Sequence[str]) -> str:
    """The rule the conversation is about: named by its first question that names one, a
    multi-word name (a gift, spell or creature) before a single capitalised word."""
    for question in questions:
        names = [e for e in entities(question) if len(e) > 2 and e.lower() not in QUESTION_WORDS]
        if names:
            longer = [n for n in names if " " in n or "-" in n]
            return (longer or names)[0]
    return ""


def rewrite_with_history(question: str, history: History) -> str:
    """Deterministic rewrite: resolve a pronoun or an elliptical question to the last named rule."""
    if not history:
        return question
    topic = conversation_topic([q for q, _a in history])
    if not topic or topic.lower() in question.lower():
        return question
    if PRONOUNS.search(question):
        return PRONOUNS.sub(topic, question, count=1)
    if entities(question):
        return question
    trimmed = question.rstrip(" ?")
    trimmed = re.sub(r"^(and|also|so|what about)\s+", "", trimmed, flags=re.I)
    return f"{trimmed} for {topic}?"
