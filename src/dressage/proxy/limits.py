"""Per-call rules checked before anything is generated or recorded: context window, step limit, versions.

``CallLimits`` clamps a call's new tokens to the context budget and rejects prompts that fill it;
with partial rollout off it also holds each session to the weight version it started under.
"""

from __future__ import annotations

from typing import Any, Iterable

from dressage.errors import ContextOverflowError, StepLimitError, WeightVersionChangedError
from dressage.proxy.config import ProxyServerConfig

__all__ = ["CallLimits"]


class CallLimits:
    def __init__(self, config: ProxyServerConfig) -> None:
        self.config = config
        self._versions: dict[str, int] = {}

    def max_new_tokens(self, requested: int | None, prompt_len: int) -> int:
        """min(request or default, --max-output-tokens, what the context window leaves)."""
        n = requested or self.config.default_max_tokens
        if self.config.max_output_tokens is not None:
            n = min(n, self.config.max_output_tokens)
        window = self.config.context_window
        if window is not None:
            if prompt_len >= window:
                raise ContextOverflowError(prompt_len, window)
            n = min(n, window - prompt_len)
        return n

    def check_call(self, session: Any, version: int) -> None:
        """A new call of ``session`` under policy ``version`` (raises if it may not run)."""
        limit = self.config.max_steps_per_session
        if limit is not None and len(session.steps) >= limit:
            raise StepLimitError(f"session {session.session_id} already has {len(session.steps)} steps, the maximum")
        self.check_versions(session.session_id, (version,))

    def check_versions(self, session_id: str, versions: Iterable[int]) -> None:
        """Tokens of ``versions`` may join the session (always true with partial rollout)."""
        first = self._versions.get(session_id)
        if self.config.partial_rollout or first is None:
            return
        for v in versions:
            if int(v) != first:
                raise WeightVersionChangedError(
                    f"session {session_id} started under weight version {first} and the policy is now at "
                    f"version {int(v)}; with partial rollout off a trajectory keeps one version "
                    "(finalize it, or start the Proxy with --partial-rollout)")

    def recorded(self, session_id: str, first_version: int) -> None:
        self._versions.setdefault(session_id, int(first_version))

    def forget(self, session_id: str) -> None:
        self._versions.pop(session_id, None)
