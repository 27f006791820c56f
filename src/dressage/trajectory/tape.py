"""Token tapes: the steps of one lineage share one token buffer instead of a copy each.

A multi-turn session's step ``k`` has a prompt that repeats every earlier token, so keeping each
step's prompt and full sequence as arrays of their own costs memory quadratic in the turns. A
:class:`Tape` holds a lineage's full sequence once; each step on it keeps read-only views
(``prompt_ids``, ``response_ids``, ``full_ids``) into it. A step that extends the tape's last
step writes only its new tokens; one that branches off an earlier step starts a tape of its own.
Messages are shared the same way: a step's chat history reuses its parent's message objects
where they are equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Tape", "place_on_tape", "share_messages", "share_tools"]

_MIN_SLACK = 256


class Tape:
    """One growing int32 buffer and the steps that view it (in order)."""

    __slots__ = ("buf", "used", "steps")

    def __init__(self, capacity: int) -> None:
        self.buf = np.empty(int(capacity), dtype=np.int32)
        self.used = 0
        self.steps: list[Any] = []

    def _reserve(self, needed: int) -> None:
        if needed <= self.buf.shape[0]:
            return
        new = np.empty(needed + max(needed // 4, _MIN_SLACK), dtype=np.int32)
        new[:self.used] = self.buf[:self.used]
        self.buf = new
        for step in self.steps:  # re-point the views so the old buffer is freed
            _bind(step, self)

    def seal(self) -> None:
        """Give back the slack kept for more turns (the lineage takes no more steps).

        The tape then lets go of its steps: each step still views the tape, but the tape no longer
        points back, so a forgotten session's steps and tokens are freed when the last reference
        goes rather than waiting for a full garbage collection of the cycle.
        """
        if self.buf.shape[0] > self.used:
            self.buf = self.buf[:self.used].copy()
            for step in self.steps:
                _bind(step, self)
        self.steps = []

    def extend(self, tokens: np.ndarray) -> None:
        end = self.used + int(tokens.shape[0])
        self._reserve(end)
        self.buf[self.used:end] = tokens
        self.used = end


def _view(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


def _bind(step: Any, tape: Tape) -> None:
    p, t = step.prompt_len, step.seq_len
    step.prompt_ids = _view(tape.buf[:p])
    step.response_ids = _view(tape.buf[p:t])
    step._full = _view(tape.buf[:t])
    step._tape = tape


def place_on_tape(step: Any, parent: Any | None) -> None:
    """Put ``step``'s tokens on its parent's tape when it extends the tape's end, else on a new one.

    The caller has checked that ``parent.full_ids`` is a prefix of ``step.prompt_ids``.
    """
    prompt, response = step.prompt_ids, step.response_ids
    tape = getattr(parent, "_tape", None) if parent is not None else None
    if tape is not None and tape.used == parent.seq_len:
        tape.extend(prompt[parent.seq_len:])
    else:
        total = int(prompt.shape[0] + response.shape[0])
        tape = Tape(total + max(total // 4, _MIN_SLACK))
        tape.extend(prompt)
    tape.extend(response)
    tape.steps.append(step)
    _bind(step, tape)


def share_messages(messages: Any, parent: Any | None) -> Any:
    """``messages`` with each leading message equal to the parent's history replaced by the parent's
    own object (the values are unchanged; only duplicate copies go)."""
    if parent is None or not isinstance(messages, list) or not isinstance(parent.messages, list):
        return messages
    pool = list(parent.messages)
    reply = parent.metadata.get("assistant_message") if isinstance(parent.metadata, dict) else None
    if reply is not None:
        pool.append(reply)
    out = list(messages)
    for i, (old, new) in enumerate(zip(pool, out)):
        if old is new:
            continue
        if type(old) is not type(new) or old != new:
            break
        out[i] = old
    return out


def share_tools(tools: Any, parent: Any | None) -> Any:
    """The parent's tool list object when ``tools`` equals it (agents resend the same schemas each turn)."""
    if parent is None or tools is None or tools is parent.tools:
        return tools
    return parent.tools if type(tools) is type(parent.tools) and tools == parent.tools else tools
