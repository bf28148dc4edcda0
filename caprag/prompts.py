"""Prompts as named, versioned constants; the versions are logged with every run."""

from __future__ import annotations

from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage


@dataclass(frozen=True)
class Prompt:
    """A system + user message pair with {placeholders} and a version to log."""

    name: str
    version: str
    system: str
    user: str

    def render(self, **values: str) -> list[BaseMessage]:
        """Fill the placeholders and return chat messages."""
        return [SystemMessage(self.system), HumanMessage(self.user.format(**values))]

    def text(self, **values: str) -> str:
        """The rendered prompt as one string (for token counting)."""
        return self.system + "\n\n" + self.user.format(**values)


EXPAND = Prompt(
    name="expand",
    version="expand-v1",
    system=(
        "You help search a library of tabletop role-playing rulebooks. Break the user's question "
        "into at most {n} short, standalone search queries, one per rule, term or book the answer "
        "depends on. Do not repeat the original question. Return them in the field 'questions'."
    ),
    user="Question: {question}",
)

ANALYZE = Prompt(
    name="analyze",
    version="analyze-v1",
    system=(
        "You decide whether retrieved rulebook passages are enough to answer a question.\n"
        "1. Look for cross-references inside the passages whose target is not among them, such as "
        "'see Powers, p. 100' or 'modified by Rapid Strike (Combat, p. 41)'. Each unresolved one "
        "that matters for the question becomes a targeted query that keeps the citation, e.g. "
        "'Rapid Strike (Combat, p. 41)'.\n"
        "2. Look for parts of the question that no passage covers; each becomes a query.\n"
        "Set sufficient=true only when nothing important is missing. Give at most {max_queries} "
        "new_queries, none that was already searched, and one or two sentences of reasoning."
    ),
    user="Question: {question}\n\nAlready searched:\n{searched}\n\nPassages:\n{passages}",
)

GENERATE = Prompt(
    name="generate",
    version="generate-v1",
    system=(
        "Answer the question about the rulebooks using only the passages given. Follow the "
        "cross-references between passages when they change the answer. Be brief and give the "
        "numbers. If the passages do not contain the answer, answer exactly: "
        "'The rulebooks do not say.' List in source_ids the ids of the passages you used."
    ),
    user="{history}Question: {question}\n\nPassages:\n{passages}",
)

REWRITE = Prompt(
    name="rewrite",
    version="rewrite-v1",
    system=(
        "Given the conversation history and a follow-up question, rewrite the question to be a "
        "standalone question that captures all necessary context. If the question is already "
        "standalone, return it unchanged. Return ONLY the rewritten question, nothing else."
    ),
    user="Conversation history:\n{history}\n\nFollow-up question: {question}",
)

CLASSIFY = Prompt(
    name="classify",
    version="classify-v1",
    system=(
        "You sort questions about tabletop role-playing rulebooks by how much reading they need.\n"
        "- factual: asks for one fact, number or definition ('How long does a torch burn?').\n"
        "- operational: asks how to carry out a procedure, step by step ('How do I resolve a "
        "charge?').\n"
        "- decision: asks whether something is allowed, or to choose between options ('Can I "
        "dodge after a Flurry?', 'Is a charge or a flurry better here?').\n"
        "- strategic: asks to plan, build, combine or optimize across several rules ('What is "
        "the best way to build a fighter around Old Soldier?').\n"
        "Return query_type and one sentence of reasoning."
    ),
    user="Question: {question}",
)

ASSESS = Prompt(
    name="assess",
    version="assess-v1",
    system=(
        "You judge whether retrieved rulebook passages are enough to answer a question fully.\n"
        "Give a confidence from 0.0 (nothing useful) to 1.0 (every fact the answer needs is in "
        "the passages). Lower it for parts of the question no passage covers, for cross-references "
        "such as 'see Combat, p. 41' whose target passage is missing, and for passages from an "
        "older edition when a newer one is present. List what is missing in missing_info (at most "
        "{max_missing} short items) and give one or two sentences of reasoning."
    ),
    user="Question: {question}\n\nPassages:\n{passages}",
)

ALL_PROMPTS = (EXPAND, ANALYZE, GENERATE, REWRITE, CLASSIFY, ASSESS)


def prompt_versions() -> dict[str, str]:
    """Name → version of every prompt, for run metadata."""
    return {prompt.name: prompt.version for prompt in ALL_PROMPTS}
