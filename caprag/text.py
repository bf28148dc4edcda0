"""Small text tools shared by the offline backend and the metrics: terms, entities, references."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers him his how i if in into is it its itself just me more most my
    no nor not now of off on once only or other our out over own same she should so some such than
    that the their them then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your yours rule rules book
    books get gets give gives use used using much many does work works happen happens also may
    one two character characters player players page p tell say long far often""".split()
)
WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
CONNECTORS = {"of", "by", "a", "an", "the", "and", "in", "to", "on", "as"}


def stem(word: str) -> str:
    """A light stemmer: enough to match 'strikes'/'strike', 'costs'/'cost'."""
    for suffix in ("ies", "es", "s"):
        if len(word) > 4 and word.endswith(suffix) and not word.endswith("ss"):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def terms(text: str) -> list[str]:
    """Content terms of a text, lower-cased, stop words removed, lightly stemmed, in order."""
    return [
        stem(w)
        for w in WORD.findall(text.lower())
        if w not in STOPWORDS and (len(w) > 1 or w.isdigit())
    ]


def entities(text: str) -> list[str]:
    """Capitalised phrases that look like rule names ('Trained by a Veteran', 'Rapid Strike')."""
    tokens = re.findall(r"[A-Za-z][A-Za-z'-]*|\d+", text)
    found: list[str] = []
    current: list[str] = []
    for index, token in enumerate(tokens):
        capital = token[0].isupper()
        if capital and not (index == 0 and token.lower() in STOPWORDS):
            current.append(token)
            continue
        if current and token.lower() in CONNECTORS:
            after = index
            while after < len(tokens) and tokens[after].lower() in CONNECTORS:
                after += 1
            if after < len(tokens) and tokens[after][0].isupper():
                current.append(token)
                continue
        if current:
            found.append(" ".join(current))
        current = []
    if current:
        found.append(" ".join(current))
    seen: list[str] = []
    for phrase in found:
        if phrase.lower() not in STOPWORDS and phrase not in seen:
            seen.append(phrase)
    return seen


NAME_PIECE = re.compile(r"[A-Za-z][A-Za-z'’-]*\.?|\d+|[^\sA-Za-z\d]")
"""Words (with inner apostrophes and hyphens, an initial's period), numbers and single marks."""
NAME_CONNECTORS = frozenset({"of", "the", "de", "da", "von", "van", "du", "del", "la", "le", "for"})
"""Lower-case words inside a name ('Battle of Arras', 'Ludwig van Beethoven')."""
CALENDAR = frozenset(
    """january february march april may june july august september october november december
    monday tuesday wednesday thursday friday saturday sunday""".split()
)
MAX_NAME_CHARS = 80


def names(sentence: str) -> list[str]:
    """The proper names of one sentence, as a reader would underline them.

    A name is a run of capitalised words (lower-case connectors such as 'of' or 'van' inside it,
    numbers after it: 'Battle of Arras', 'Super Bowl 50'); any punctuation mark but an apostrophe,
    a hyphen or an initial's period ends it, so a list ('Bohemia, Sayville and Oakdale') gives one
    name per item. Not names: a lone capitalised word that opens the sentence (every sentence
    starts with a capital), phrases made only of stop words or calendar words ('March 1931'), and
    anything shorter than 3 or longer than MAX_NAME_CHARS characters.
    """
    pieces = NAME_PIECE.findall(sentence)
    runs: list[list[tuple[str, bool]]] = []
    current: list[tuple[str, bool]] = []
    opening = True
    for index, piece in enumerate(pieces):
        word = piece[0].isalpha()
        after = pieces[index + 1] if index + 1 < len(pieces) else ""
        if word and piece[0].isupper():
            current.append((piece, opening))
        elif current and (
            piece.isdigit() or (word and piece.lower() in NAME_CONNECTORS and after[:1].isupper())
        ):
            current.append((piece, False))
        else:
            if current:
                runs.append(current)
            current = []
        if word or piece.isdigit():
            opening = False
    if current:
        runs.append(current)
    found: list[str] = []
    for run in runs:
        words = [piece for piece, _ in run]
        opens = run[0][1]
        while words and words[0].lower() in STOPWORDS | NAME_CONNECTORS:
            words, opens = words[1:], False
        while words and words[-1].lower() in NAME_CONNECTORS:
            words = words[:-1]
        letters = [w for w in words if w[0].isalpha()]
        if not letters or (opens and len(words) == 1):
            continue
        if all(w.lower().rstrip(".") in CALENDAR | STOPWORDS for w in letters):
            continue
        name = " ".join(words).rstrip(".")
        name = name.removesuffix("'s").removesuffix("’s")
        if 3 <= len(name) <= MAX_NAME_CHARS and name not in found:
            found.append(name)
    return found


SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")


def sentences(text: str) -> list[str]:
    """Prose sentences, and table rows prefixed with their table's header row."""
    found: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        if lines and lines[0].startswith("|"):
            rows = [row for row in lines if not set(row) <= set("|-: ")]
            header = rows[0] if rows else ""
            found += [f"{header} {row}" for row in rows[1:]]
        elif lines:
            found += [s for s in SENTENCE.split(" ".join(" ".join(lines).split())) if s]
    return found


@dataclass(frozen=True)
class Reference:
    """A cross-reference: 'Rapid Strike (Combat, p. 41)' or 'see Combat, p. 41'."""

    name: str
    short: str
    page: int

    def query(self) -> str:
        """A targeted search that keeps the citation so the retriever can narrow to the book."""
        return (
            f"{self.name} ({self.short}, p. {self.page})"
            if self.name
            else (f"see {self.short}, p. {self.page}")
        )


def references(text: str) -> list[Reference]:
    """Every cross-reference in a text, with the rule name written before the citation if any."""
    found: list[Reference] = []
    for short, page, offset in iter_citations(text):
        before = text[max(0, offset - 80) : offset]
        name = ""
        if text[offset] == "(":
            names = entities(before.split(".")[-1].split(";")[-1])
            if names and before.rstrip().endswith(names[-1]):
                name = names[-1]
        reference = Reference(name=name, short=short, page=page)
        if reference not in found:
            found.append(reference)
    return found


CITATION = re.compile(
    r"\(\s*(?:see\s+)?([A-Z][\w' -]{1,40}?),\s*p\.\s*(\d+)\s*\)"
    r"|[Ss]ee\s+([A-Z][\w' -]{1,40}?),\s*p\.\s*(\d+)"
)


def iter_citations(text: str) -> Iterable[tuple[str, int, int]]:
    """Yield (book short name, page, offset) of each '(Short, p. N)' or 'see Short, p. N'."""
    for match in CITATION.finditer(text):
        short = match.group(1) or match.group(3)
        page = match.group(2) or match.group(4)
        yield short.strip(), int(page), match.start()


DEFAULT_LIBRARY = "the library"
"""What the steps call a corpus whose books share no name."""
DEFAULT_REFUSAL = "The sources do not say."
"""What the generator answers when the passages hold no answer (a setting: the harness's
`pipeline.refusal`, served CAPRAG_REFUSAL): it names no corpus, so it fits any."""


def library_name(titles: Sequence[str]) -> str:
    """What the steps' prompts call a corpus, from its books' titles: the words every title
    starts with ('Cinderwake Core Rules', 'Cinderwake Combat: ...' -> 'the Cinderwake books'),
    one book's own title, else `DEFAULT_LIBRARY`."""
    words = [title.replace(":", " ").split() for title in titles if title.strip()]
    if len(words) == 1:
        return f"the book '{' '.join(words[0])}'"
    shared: list[str] = []
    for column in zip(*words, strict=False):
        if any(word.lower() != column[0].lower() for word in column):
            break
        shared.append(column[0])
    while shared and shared[-1].lower() in CONNECTORS:
        shared.pop()
    if shared and shared[0].lower() == "the":
        shared = shared[1:]
    return f"the {' '.join(shared)} books" if shared else DEFAULT_LIBRARY


def junk_query(query: str, searched: Iterable[str] = ()) -> str | None:
    """Why a rule should not search this query, or None when it is worth a search: it is one
    word ('Considering', 'October': a word alone finds passages that mention it for any reason),
    it holds stop words only, or it was already searched in the question (case, spacing and
    punctuation aside)."""
    words = WORD.findall(query.lower())
    if len(words) < 2:
        return "one word" if words else "no words"
    if not terms(query):
        return "stop words only"
    key = " ".join(words)
    if any(" ".join(WORD.findall(done.lower())) == key for done in searched):
        return "already searched"
    return None


def searchable(
    queries: Iterable[str], searched: Iterable[str] = (), notes: list[str] | None = None
) -> list[str]:
    """The queries worth a search (`junk_query`), in order, each once; what is dropped, and why,
    is said in `notes`."""
    done = list(searched)
    kept: list[str] = []
    for query in queries:
        why = junk_query(query, [*done, *kept])
        if why is None:
            kept.append(query)
        elif notes is not None:
            notes.append(f"query {query!r} not searched: {why}")
    return kept
