"""Per-call rules checked before anything is generated or recorded: context window and step limit.

``CallLimits`` clamps a call's new tokens to the context budget and rejects prompts that leave no room
for a reply, before any engine request (so a streamed call gets a plain 400, not an error inside a 200).
The weight-version rule (one version per trajectory with partial rollout off) is
:class:`dressage.proxy.recording.weights.WeightVersions`'.
"""

from __future__ import annotations

from typing import Any

from dressage.errors import ContextOverflowError, StepLimitError
from dressage.proxy.config import LimitsConfig

__all__ = ["CallLimits"]


class CallLimits:
    def __init__(self, config: LimitsConfig) -> None:
        self.config = config

    def max_new_tokens(self, requested: int | None, prompt_len: int) -> int | None:
        """min(request or --default-max-tokens, --max-output-tokens, what the context window leaves);
        with ``dynamic_max_tokens`` off the window only refuses a prompt that fills it.

        What the window leaves is ``window - prompt - 1``: SGLang refuses a call whose prompt plus
        ``max_new_tokens`` reaches its context length. ``None`` (nothing asked, no default, no cap,
        no window known): the caller sends no ``max_new_tokens`` and the engine's default applies.
        """
        n = requested or self.config.default_max_new_tokens
        cap = self.config.max_output_tokens
        if cap is not None:
            n = cap if n is None else min(n, cap)
        window = self.config.context_length
        if window is not None:
            room = window - prompt_len - 1
            if room < 1:
                raise ContextOverflowError(prompt_len, window)
            if self.config.dynamic_max_tokens:
                n = room if n is None else min(n, room)
        return n

    def sampling(self, requested: int | None, prompt_len: int) -> dict[str, Any]:
        """A call's ``max_new_tokens`` (left out: the engine's default) and, when the Proxy sets one,
        its default ``temperature``: the request's own sampling parameters go over these."""
        n = self.max_new_tokens(requested, prompt_len)
        out: dict[str, Any] = {} if n is None else {"max_new_tokens": n}
        if self.config.default_temperature is not None:
            out["temperature"] = float(self.config.default_temperature)
        return out

    def check_call(self, session: Any) -> None:
        """A new call of ``session`` (raises if the session has used up its steps)."""
        limit = self.config.max_steps_per_session
        if limit is not None and len(session.steps) >= limit:
            raise StepLimitError(f"session {session.session_id} already has {len(session.steps)} steps, the maximum")
