"""Step `analyze` (multi-hop): do the gathered passages answer the question, what to search next.

Rule: a pure function (`decide`), testable alone. 1. When no gathered passage is about the
question, there is nothing to follow: stop. 2. When one gathered passage covers the question
(misses fewer than 2 or 25 % of its terms) it answers it: sufficient, unless the sentence that
answers defers to a citation not gathered yet (then only that citation). 3. Otherwise follow, in
one hop, the unresolved citations of the passages the question is about (a rulebook option,
`citations`: all of them when most of the question is missing, else those cited in a sentence
about the question) and the bridge names those passages mention that the corpus has a passage
about (`bridge_names`: names linked to the index's catalog of titles), each as the question with
the name. LLM: the ANALYZE prompt. Both are held to the same contract: at most `max_queries` new
queries per hop (an LLM reply with more is cut, and the cut is noted on the call). If the LLM's
reply never parses, the analysis says sufficient (multi-hop stops with what it has) and the call
is recorded with its error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from caprag.llm.budget import model_limits
from caprag.llm.budget import prompt_values as budget_values
from caprag.llm.client import StepFailedError, StructuredClient
from caprag.llm.prompt import Prompt, format_passages
from caprag.retrieval.catalog import Catalog
from caprag.schemas import MAX_QUERIES, MAX_QUERY_CHARS, Document
from caprag.steps.base import NEUTRAL, RuleStep, StepResult, Wording, fit
from caprag.steps.expand import cap
from caprag.text import (
    DEFAULT_LIBRARY,
    Reference,
    names,
    references,
    searchable,
    sentences,
    terms,
)

ANALYZE = Prompt(
    name="analyze",
    version="analyze-v4",
    system=(
        "You decide whether passages retrieved from {library} are enough to answer a question.\n"
        "1. Look for cross-references inside the passages whose target is not among them, such as "
        "'see Powers, p. 100' or 'modified by Rapid Strike (Combat, p. 41)'. Each unresolved one "
        "that matters for the question becomes a targeted query that keeps the citation, e.g. "
        "'Rapid Strike (Combat, p. 41)'.\n"
        "2. Look for parts of the question that no passage covers; each becomes a query.\n"
        "Set sufficient=true only when nothing important is missing. Give at most {max_queries} "
        "new_queries of at most {new_queries_chars} characters each, none that was already "
        "searched, and one sentence of reasoning (at most {reasoning_chars} characters)."
    ),
    user="Question: {question}\n\nAlready searched:\n{searched}\n\nPassages:\n{passages}",
)


MAX_REASONING_CHARS = 2000


class SufficiencyDecision(BaseModel):
    """Whether the gathered passages answer the question, and what to search next if not."""

    sufficient: bool = Field(
        description="True when the passages answer every part of the question."
    )
    new_queries: list[str] = Field(
        default_factory=list,
        max_length=MAX_QUERIES,
        description="Targeted searches for unresolved cross-references or missing parts.",
        json_schema_extra={"items": {"type": "string", "maxLength": MAX_QUERY_CHARS}, "budget": 2},
    )
    reasoning: str = Field(
        default="", max_length=MAX_REASONING_CHARS, description="One sentence why."
    )

    @field_validator("new_queries")
    @classmethod
    def _bounded(cls, value: list[str]) -> list[str]:
        for query in value:
            if len(query) > MAX_QUERY_CHARS:
                raise ValueError(f"a query is longer than {MAX_QUERY_CHARS} characters")
        return [q.strip() for q in value if q.strip()]


MAX_NEW_QUERIES = 3
FOLLOW_FROM_TOP = 2
Links = Literal["citations", "names"]
LINKS: tuple[Links, ...] = ("citations", "names")
"""How a corpus links its passages: by citations written in the text (the rulebooks) or by
naming what another passage is about (encyclopaedic articles)."""
ABOUT_MIN_TERMS = 2
ABOUT_MIN_SHARE = 0.25
"""A gathered passage is about the question when it holds at least this many of its terms and
this share of them; when none is, nothing is followed (see `about_nothing`)."""
MISSING_MIN_TERMS = 2
MISSING_MIN_SHARE = 0.25
"""A question has a missing part when the passage that covers most of it leaves out at least
this many of its terms and this share of them; otherwise that passage answers it and the analysis
is sufficient after the hop (pointers and names in the passages are not followed)."""
MOSTLY_MISSING_TERMS = 4
MOSTLY_MISSING_SHARE = 0.4
"""When that passage leaves out this much of the question, the answer lies elsewhere and every
pointer of the passages the question is about is followed; with less missing, only pointers whose
citing sentence is about the question (see `pointer_is_relevant`)."""


def is_resolved(reference: Reference, documents: Sequence[Document]) -> bool:
    """A reference is resolved when a gathered passage is its target (same book, name or page)."""
    for doc in documents:
        if doc.book_short.lower() != reference.short.lower():
            continue
        if reference.name and doc.section.lower() == reference.name.lower():
            return True
        if not reference.name and doc.page == reference.page:
            return True
    return False


def relevance(question_terms: set[str], doc: Document) -> float:
    """Share of the question's terms a passage contains (its heading counts twice)."""
    if not question_terms:
        return 0.0
    body = set(terms(doc.text))
    head = set(terms(doc.section))
    return (len(question_terms & body) + len(question_terms & head)) / len(question_terms)


def _cited(doc: Document) -> list[tuple[Reference, set[str]]]:
    """Each reference in a passage with the terms of the sentence that makes it."""
    found: list[tuple[Reference, set[str]]] = []
    for sentence in sentences(doc.text):
        words = set(terms(sentence))
        found += [(reference, words) for reference in references(sentence)]
    return found


def unresolved_references(
    question: str, documents: Sequence[Document], read: Sequence[Document] = ()
) -> list[Reference]:
    """References to follow, best first (`read`: passages read earlier that are not among the
    documents; a reference they resolve is not followed again).

    1. The passages the question is about (most of its terms) are the sources; every unresolved
       reference they make is a candidate, ranked by how much its sentence shares with the question.
    2. Targets of their references that are already gathered are followed in turn (chains across
       books), but only where the citing sentence shares a term with the question.
    """
    wanted = set(terms(question))
    ranked = sorted(documents, key=lambda d: (-relevance(wanted, d), -d.score, d.passage_id))
    sources = [doc for doc in ranked[:FOLLOW_FROM_TOP] if relevance(wanted, doc) > 0]
    candidates: list[tuple[int, int, Reference]] = []
    chained: list[Document] = []
    known = [*documents, *(doc for doc in read if doc not in documents)]
    for doc in sources:
        for reference, words in _cited(doc):
            targets = [d for d in known if is_resolved(reference, [d])]
            if targets:
                chained += [t for t in targets if t not in sources and t not in chained]
            else:
                candidates.append((0, -len(wanted & words), reference))
    for doc in chained:
        for reference, words in _cited(doc):
            shared = len(wanted & words)
            if shared and not is_resolved(reference, known):
                candidates.append((1, -shared, reference))
    found: list[Reference] = []
    for _tier, _shared, reference in sorted(candidates, key=lambda c: (c[0], c[1])):
        if reference not in found:
            found.append(reference)
    return found


def covering_passage(question: str, documents: Sequence[Document]) -> Document | None:
    """The passage that contains the most of the question's terms (the first on a tie)."""
    wanted = set(terms(question))
    best: Document | None = None
    best_count = 0
    for doc in documents:
        count = len(wanted & (set(terms(doc.text)) | set(terms(doc.section))))
        if count > best_count:
            best, best_count = doc, count
    return best


def missing_part(question: str, documents: Sequence[Document]) -> list[str]:
    """Question terms that the passage covering most of the question does not contain."""
    best = covering_passage(question, documents)
    words = set() if best is None else set(terms(best.text)) | set(terms(best.section))
    return [t for t in dict.fromkeys(terms(question)) if t not in words]


def answering_sentences(question: str, documents: Sequence[Document]) -> list[str]:
    """The sentences of the covering passage that share the most terms with the question."""
    best = covering_passage(question, documents)
    if best is None:
        return []
    wanted = set(terms(question))
    cited = [(len(wanted & set(terms(s))), s) for s in sentences(best.text)]
    top = max((shared for shared, _ in cited), default=0)
    return [sentence for shared, sentence in cited if shared == top and top > 0]


def answer_pointers(
    question: str, documents: Sequence[Document], read: Sequence[Document] = ()
) -> list[Reference]:
    """Unresolved citations in the answering sentence of the covering passage: the answer itself
    is qualified elsewhere ('a penalty of 4, modified by Old Soldier (Gifts, p. 7)'), so the
    covering passage alone does not answer."""
    found: list[Reference] = []
    for sentence in answering_sentences(question, documents):
        found += [r for r in references(sentence) if not is_resolved(r, [*documents, *read])]
    return list(dict.fromkeys(found))


def has_missing_part(
    question: str, missing: Sequence[str], terms_min: int, share_min: float
) -> bool:
    """At least `terms_min` of the question's terms, and `share_min` of them, are missing."""
    share = len(missing) / max(len(set(terms(question))), 1)
    return len(missing) >= terms_min and share >= share_min


def pointer_is_relevant(question: str, reference: Reference, documents: Sequence[Document]) -> bool:
    """A pointer is about the question when a sentence citing it shares a question term beyond
    the citing passage's own heading and the pointer's own name (those say what the passage and
    the target are called, not what the question asks of them)."""
    wanted = set(terms(question)) - set(terms(reference.name))
    for doc in documents:
        for cited, words in _cited(doc):
            if cited == reference and (wanted & words) - set(terms(doc.section)):
                return True
    return False


def uncovered_terms(question: str, documents: Sequence[Document]) -> list[str]:
    """Question terms that no gathered passage contains."""
    covered: set[str] = set()
    for doc in documents:
        covered.update(terms(doc.text))
        covered.update(terms(doc.section))
    return [t for t in dict.fromkeys(terms(question)) if t not in covered]


def sources_of(question: str, documents: Sequence[Document]) -> list[Document]:
    """The passages the question is about: the FOLLOW_FROM_TOP that hold the most of its terms."""
    wanted = set(terms(question))
    ranked = sorted(documents, key=lambda d: (-relevance(wanted, d), -d.score, d.passage_id))
    return [doc for doc in ranked[:FOLLOW_FROM_TOP] if relevance(wanted, doc) > 0]


def linked_names(
    question: str,
    ranked: Sequence[tuple[int, str]],
    documents: Sequence[Document],
    catalog: Catalog | None,
) -> list[str]:
    """The names of the sentences (each with its rank) that the question does not name and the
    catalog links to a passage not gathered yet, in the sentences' order."""
    if catalog is None:
        return []
    wanted = set(terms(question))
    asked = question.lower()
    gathered = {doc.passage_id for doc in documents}
    candidates: list[tuple[int, int, str]] = []
    for rank, sentence in ranked:
        for found in names(sentence):
            for name in (found, found.partition(" ")[2]):  # 'See Rapid Strike' opens a line
                linked = catalog.passages(name) if name else []
                if not linked or name.lower() in asked or set(terms(name)) <= wanted:
                    continue
                if not set(linked) <= gathered:  # already read: nothing to bridge to
                    candidates.append((rank, len(candidates), name))
                break
    return list(dict.fromkeys(name for *_order, name in sorted(candidates)))


def bridge_names(
    question: str, documents: Sequence[Document], catalog: Catalog | None
) -> list[str]:
    """Names the passages the question is about mention, the question does not, and the corpus
    has a passage about that was not gathered yet: the bridge to what the first search could not
    reach ('the woman who portrayed Corliss Archer' -> 'Shirley Temple').

    Names are read as `caprag.text.names` reads them and linked to the catalog of titles; a name
    the corpus has no passage about leads nowhere and is not followed. Ranked by how many terms
    the sentence naming it shares with the question, then by the passage's rank.
    """
    wanted = set(terms(question))
    ranked: list[tuple[int, int, str]] = []
    for rank, doc in enumerate(sources_of(question, documents)):
        for sentence in sentences(doc.text):
            shared = len(wanted & set(terms(sentence)))
            if shared:
                ranked.append((-shared, rank, sentence))
    ordered = [(position, s) for position, (*_key, s) in enumerate(sorted(ranked))]
    return linked_names(question, ordered, documents, catalog)


def question_names(question: str, catalog: Catalog | None) -> list[str]:
    """Names the question itself gives that the corpus has a passage about, not read yet: a
    question that names two things ('DC Talk or Manchester Orchestra?', 'Rapid Strike with Old
    Soldier') needs each one's passage, and one search for the whole question may find only the
    first."""
    if catalog is None:
        return []
    found: list[str] = []
    for sentence in sentences(question) or [question]:
        for name in names(f"x {sentence}"):  # no name opens the sentence: 'x' does
            if catalog.passages(name) and name not in found:
                found.append(name)
    return found


def answer_bridges(
    question: str, documents: Sequence[Document], catalog: Catalog | None
) -> list[str]:
    """Linked names in the answering sentence of the covering passage: it covers the question's
    words, but the fact it gives is about another passage of the corpus ('born in Hoosick,
    Rensselaer County' with a passage on Hoosick)."""
    ranked = list(enumerate(answering_sentences(question, documents)))
    return linked_names(question, ranked, documents, catalog)


def about_nothing(question: str, documents: Sequence[Document]) -> bool:
    """No gathered passage holds more than one of the question's terms (or a share below
    ABOUT_MIN_SHARE of them): retrieval found nothing the question is about, so following what
    those passages mention cannot lead to an answer (an unanswerable question stops here)."""
    wanted = set(terms(question))
    best = covering_passage(question, documents)
    if not wanted or best is None:
        return True
    held = len(wanted & (set(terms(best.text)) | set(terms(best.section))))
    return held < ABOUT_MIN_TERMS or held / len(wanted) < ABOUT_MIN_SHARE


def follow_up(question: str, target: str, notes: list[str] | None = None) -> str:
    """A follow-up query keeps the question's context: the question with the name or reference
    it follows (a name alone finds passages that mention it for any reason). Within the
    schema's MAX_QUERY_CHARS, a long question is cut, never the name it follows (noted)."""
    room = MAX_QUERY_CHARS - len(target) - 1
    if room < 1:
        return fit(target, MAX_QUERY_CHARS, "a query", notes)
    return f"{fit(question, room, 'the question in a follow-up query', notes)} {target}"


def decide(
    question: str,
    documents: Sequence[Document],
    searched: Sequence[str] = (),
    notes: list[str] | None = None,
    *,
    catalog: Catalog | None = None,
    links: Links = "citations",
) -> SufficiencyDecision:
    """Offline decision: stop when nothing gathered is about the question, or when a passage
    covers it (and its answering sentence defers to nothing); else follow, in one hop, the
    unresolved citations the question needs (`citations`: a corpus that cites like the
    rulebooks, '(Combat, p. 41)') or the bridge names the catalog links to a passage, as
    `links` says the corpus links its passages.

    However long the question, every query and the reasoning stay within the schema's bounds:
    what is cut is said in `notes`."""
    asked = {q.strip().lower() for q in searched}
    queries: list[str] = []
    reasons: list[str] = []
    read = catalog.read_documents() if catalog is not None else []
    # 1. Nothing retrieved is about the question: there is no thread to follow.
    if about_nothing(question, documents):
        reasoning = "no gathered passage is about the question: nothing to follow"
        return SufficiencyDecision(sufficient=False, new_queries=[], reasoning=reasoning)
    # 2. A passage that covers (nearly) the whole question answers it: stop after this hop.
    gap = missing_part(question, documents)
    if not has_missing_part(question, gap, MISSING_MIN_TERMS, MISSING_MIN_SHARE):
        if links == "citations":
            pointers = [r.query() for r in answer_pointers(question, documents, read)]
        else:
            names_ = answer_bridges(question, documents, catalog)
            pointers = [follow_up(question, name, notes) for name in names_]
        pointers = searchable(pointers, [question, *searched], notes)[:MAX_NEW_QUERIES]
        if pointers:
            reasoning = "the answering sentence points to: " + ", ".join(pointers)
        else:
            reasoning = "the passage the question is about covers it" + (
                f" (all but: {', '.join(gap)})" if gap else ""
            )
        reasoning = fit(reasoning, MAX_REASONING_CHARS, "the reasoning", notes)
        pointers = [fit(q, MAX_QUERY_CHARS, "a query", notes) for q in pointers]
        return SufficiencyDecision(
            sufficient=not pointers, new_queries=pointers, reasoning=reasoning
        )
    # 3. Citations the question needs: all when most of it is missing, else those cited about it.
    refs = unresolved_references(question, documents, read) if links == "citations" else []
    if not has_missing_part(question, gap, MOSTLY_MISSING_TERMS, MOSTLY_MISSING_SHARE):
        refs = [r for r in refs if pointer_is_relevant(question, r, documents)]
    for reference in refs:
        query = reference.query()
        if query.lower() not in asked and query not in queries:
            queries.append(query)
    if refs:
        reasons.append(
            "unresolved references: " + ", ".join(r.query() for r in refs[:MAX_NEW_QUERIES])
        )
    # 4. Names the passages mention that the corpus has a passage about (several in one hop).
    linked = bridge_names(question, documents, catalog) if links == "names" else []
    bridges = [name for name in linked if follow_up(question, name).lower() not in asked][
        : max(0, MAX_NEW_QUERIES - len(queries))
    ]
    if bridges:
        reasons.append("named by the passages, not gathered yet: " + ", ".join(bridges))
        queries += [follow_up(question, name, notes) for name in bridges]
    queries = searchable(queries, [question, *searched], notes)
    queries = [fit(q, MAX_QUERY_CHARS, "a query", notes) for q in queries[:MAX_NEW_QUERIES]]
    if not queries:
        reasons.append("nothing left to follow: every reference is resolved or already searched")
    reasoning = fit("; ".join(reasons), MAX_REASONING_CHARS, "the reasoning", notes)
    return SufficiencyDecision(sufficient=not queries, new_queries=queries, reasoning=reasoning)


def prompt_values(
    question: str,
    documents: Sequence[Document],
    searched: Sequence[str],
    max_queries: int,
    output_cap: int | None = None,
    library: str = DEFAULT_LIBRARY,
) -> dict[str, str]:
    """The ANALYZE prompt's arguments, with the lengths of the decision's schema fitted to
    `output_cap` (None: the schema's own bounds); fewer queries are asked for than
    `max_queries` when the cap holds fewer."""
    items = model_limits(SufficiencyDecision, output_cap)["new_queries"].items
    return {
        "question": question,
        "library": library,
        "searched": "\n".join(searched) or "(nothing)",
        "passages": format_passages(documents),
        "max_queries": str(min(max_queries, items) if items is not None else max_queries),
        **budget_values(SufficiencyDecision, output_cap, ANALYZE.fields),
    }


class RuleAnalyzer(RuleStep):
    """The sufficiency rule (`decide`). `links`: how the corpus links its passages, a property of
    the corpus chosen per dataset: `citations` (the bundled rulebooks: '(Combat, p. 41)') or
    `names` (encyclopaedic text: a name that is another passage's title)."""

    max_queries = MAX_NEW_QUERIES

    def __init__(
        self,
        price_model: str = "gpt-4o-mini",
        *,
        links: Links = "citations",
        wording: Wording = NEUTRAL,
    ) -> None:
        super().__init__(price_model, wording)
        if links not in LINKS:
            raise ValueError(f"links={links!r}: use one of {', '.join(LINKS)}")
        self.links = links

    async def __call__(
        self,
        question: str,
        documents: Sequence[Document],
        searched: Sequence[str],
        catalog: Catalog | None = None,
    ) -> StepResult[SufficiencyDecision]:
        t0 = time.perf_counter()
        notes: list[str] = []
        decision = decide(question, documents, searched, notes, catalog=catalog, links=self.links)
        values = prompt_values(
            question, documents, searched, self.max_queries, library=self.wording.library
        )
        out = decision.model_dump_json()
        result = self.costed("analyze", ANALYZE, decision, out, t0, **values)
        assert result.usage is not None
        return StepResult(decision, result.usage.model_copy(update={"notes": notes}))


class LLMAnalyzer:
    """The model's sufficiency decision, held to at most `max_queries` new queries."""

    kind = "llm"

    def __init__(
        self,
        client: StructuredClient,
        max_queries: int = MAX_NEW_QUERIES,
        wording: Wording = NEUTRAL,
    ) -> None:
        self.client = client
        self.model = client.model
        self.max_queries = max_queries
        self.wording = wording

    async def __call__(
        self,
        question: str,
        documents: Sequence[Document],
        searched: Sequence[str],
        catalog: Catalog | None = None,
    ) -> StepResult[SufficiencyDecision]:
        """The model reads the passages itself (`catalog` is for the rule)."""
        values = prompt_values(
            question,
            documents,
            searched,
            self.max_queries,
            self.client.max_output_tokens,
            library=self.wording.library,
        )
        try:
            decision, usage = await self.client.structured(
                "analyze", ANALYZE, SufficiencyDecision, **values
            )
        except StepFailedError as failed:
            stop = SufficiencyDecision(
                sufficient=True,
                new_queries=[],
                reasoning=f"the analyzer's reply could not be used ({failed.detail[:200]}): "
                "stopping with what was found",
            )
            return StepResult(value=stop, usage=failed.usage)
        notes: list[str] = list(usage.notes)
        queries = cap(decision.new_queries, self.max_queries, notes)
        decision = decision.model_copy(update={"new_queries": queries})
        return StepResult(value=decision, usage=usage.model_copy(update={"notes": notes}))
