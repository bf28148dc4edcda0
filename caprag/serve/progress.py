"""Live progress of a turn: each retrieval round, reported the moment it is decided.

A strategy calls `caprag.trace.report_round(hop)` after deciding a round; whoever started the
turn may listen by setting `LISTENER` for it (a context variable, so concurrent turns never see
each other's rounds). The chat page does: it names a progress id with its question and polls
`GET /chat/progress/{id}` while the answer is being made, so each adaptive round (depth,
confidence, "going deeper…") shows while it runs, not after the answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from caprag.serve.decision_log import Round
from caprag.trace import ROUND_LISTENER, HopTrace

LISTENER = ROUND_LISTENER
"""Called with every round the current turn decides (None: nobody listens)."""


class RoundBoard:
    """The rounds of recent turns by progress id, for the page to poll; at most `keep` turns are
    held (the oldest dropped first), so a page that never polls costs nothing lasting."""

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep
        self._rounds: OrderedDict[str, list[Round]] = OrderedDict()

    def listener(self, progress_id: str) -> Callable[[HopTrace], None]:
        """A listener that records the turn's rounds under its id (the turn starts empty), each
        as the decision log keeps it: a snapshot, so later changes to the hop do not show."""
        self._rounds[progress_id] = []
        self._rounds.move_to_end(progress_id)
        while len(self._rounds) > self.keep:
            self._rounds.popitem(last=False)

        def add(hop: HopTrace) -> None:
            kept = self._rounds.get(progress_id)
            if kept is not None:
                kept.append(Round.model_validate(hop, from_attributes=True))

        return add

    def rounds(self, progress_id: str) -> list[Round] | None:
        """The rounds reported so far (None: no turn of that id is held)."""
        kept = self._rounds.get(progress_id)
        return None if kept is None else list(kept)
