"""Per-call rules checked before anything is generated or recorded: context window and step limit.

``CallLimits`` clamps a call's new tokens to the context budget and rejects prompts that fill it.
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

    def max_new_tokens(self, requested: int | None, prompt_len: int) -> int:
        """min(request or default, --max-output-tokens, what the context window leaves)."""
        n = requested or self.config.default_max_new_tokens
        if self.config.max_output_tokens is not None:
            n = min(n, self.config.max_output_tokens)
        window = self.config.context_length
        if window is not None:
            if prompt_len >= window:
                raise ContextOverflowError(prompt_len, window)
            n = min(n, window - prompt_len)
        return n

    def check_call(self, session: Any) -> None:
        """A new call of ``session`` (raises if the session has used up its steps)."""
        limit = self.config.max_steps_per_session
        if limit is not None and len(session.steps) >= limit:
            raise StepLimitError(f"session {session.session_id} already has {len(session.steps)} steps, the maximum")
