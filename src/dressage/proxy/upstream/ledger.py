"""What a finalize answers, kept: the ledger of finalize answers and the turn count it reports.

- **Idempotent finalize**: the answer of a finalize is kept; a repeat (a client retry) gets the
  same answer without finalizing twice, also after the session was read and drained.
- **Turns**: a session's steps and its agent turns (``X-Turn-Id`` scopes) are counted apart.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable

__all__ = ["FinalizeLedger", "count_turns"]


class FinalizeLedger:
    """Finalize answers by session id, the newest ``capacity`` kept (a repeat is answered from here)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = int(capacity)
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, session_id: str) -> dict[str, Any] | None:
        return self._answers.get(session_id)

    def put(self, session_id: str, answer: dict[str, Any]) -> None:
        self._answers[session_id] = answer
        self._answers.move_to_end(session_id)
        while len(self._answers) > self.capacity:
            self._answers.popitem(last=False)

    def drop(self, session_id: str) -> None:
        self._answers.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._answers)


def count_turns(steps: Iterable[Any]) -> int:
    """Agent turns among ``steps``: distinct ``turn_id`` scopes; a call without one is its own turn.

    A call is counted once however many steps it recorded: the ``n > 1`` choices of one chat call
    are sibling steps, each with its ``sample_index``, and only the first choice (index 0) counts.
    """
    turns: set[str] = set()
    loose = 0
    for st in steps:
        meta = getattr(st, "metadata", None) or {}
        tid = meta.get("turn_id")
        if tid is not None:
            turns.add(str(tid))
        elif not meta.get("sample_index"):  # absent (n = 1) or 0: the call's first choice
            loose += 1
    return len(turns) + loose
