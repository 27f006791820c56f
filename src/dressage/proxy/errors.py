"""Errors of the Proxy's agent-facing rules, each with the stable OpenAI ``code`` it answers with.

Hierarchy (under :mod:`dressage.errors`)::

    DressageError
    ├── ContextOverflowError        the prompt alone fills the context window   400 context_overflow
    ├── SessionIdError              a session header that names no session      400 invalid_session_id
    │   └── MissingSessionIdError   no X-Session-Id / X-SMG-Routing-Key header  400 missing_session_id
    ├── TrajectoryError
    │   ├── SessionStateError
    │   │   └── StepLimitError      the session reached its maximum of steps    409 max_steps_exceeded
    │   └── WeightVersionChangedError  weights changed mid-trajectory, partial rollout off
    │                                                                           409 weight_version_changed
    └── EngineError
        └── EngineUnavailable
            └── NoHealthyEngineError   every engine failed its health check     503 no_healthy_engine
"""

from __future__ import annotations

from dressage.errors import DressageError, EngineUnavailable, SessionStateError, TrajectoryError

__all__ = ["ContextOverflowError", "SessionIdError", "MissingSessionIdError", "StepLimitError", "WeightVersionChangedError",
           "NoHealthyEngineError"]


class ContextOverflowError(DressageError, ValueError):
    """The prompt already reaches the context window: no token could be generated."""

    code = "context_overflow"

    def __init__(self, prompt_tokens: int, context_window: int) -> None:
        self.prompt_tokens, self.context_window = int(prompt_tokens), int(context_window)
        super().__init__(f"the prompt has {self.prompt_tokens} tokens and the context window is "
                         f"{self.context_window}: no room for a reply; compress or shorten the conversation")


class SessionIdError(DressageError, ValueError):
    """A session header that cannot name a session (too long, control characters)."""

    code = "invalid_session_id"


class MissingSessionIdError(SessionIdError):
    """A header-identified call without a session header."""

    code = "missing_session_id"


class StepLimitError(SessionStateError):
    """The session already holds its maximum number of steps."""

    code = "max_steps_exceeded"


class WeightVersionChangedError(TrajectoryError):
    """The policy's weight version changed inside one trajectory while partial rollout is off."""

    code = "weight_version_changed"


class NoHealthyEngineError(EngineUnavailable):
    """Every configured engine is out of the pool."""

    code = "no_healthy_engine"
