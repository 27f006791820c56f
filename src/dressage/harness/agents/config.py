"""``AgentConfig``: how each simulated agent behaves, validated once at the edge.

One config drives every session of a rollout; per-session variety comes from the seeded
decision stream of :mod:`dressage.harness.agents.policy`, never from timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from dressage.errors import ConfigError

__all__ = ["AgentConfig"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(key: str, value: object, low: int) -> None:
    if not _is_int(value) or value < low:  # type: ignore[operator]
        raise ConfigError(f"agents.{key} must be an integer >= {low}, got {value!r}")


def _check_fraction(key: str, value: object, *, low_open: bool = False) -> None:
    ok = _is_real(value) and (0.0 < value if low_open else 0.0 <= value) and value <= 1.0  # type: ignore[operator]
    if not ok:
        bounds = "(0, 1]" if low_open else "[0, 1]"
        raise ConfigError(f"agents.{key} must be a number in {bounds}, got {value!r}")


@dataclass(slots=True, kw_only=True)
class AgentConfig:
    """Behaviour of the agents that ``run_rollout`` drives through the Proxy."""

    max_turns: int = 8
    """Model calls per session (retries included); a session may end earlier on a full context."""
    tools: bool = True
    """Offer the built-in tools (calculator, lookup) and execute the calls the model makes."""
    retry_rate: float = 0.0
    """Chance per turn of re-sending an earlier turn's messages instead (the Proxy branches)."""
    context_length: int = 8192
    """The agent's context budget in tokens, as reported by ``usage`` (prompt + completion)."""
    compression: bool = True
    """Near ``context_length``, replace the history by [system, user summary] (a new Segment);
    without it the session ends there."""
    compression_threshold: float = 0.8
    """Share of ``context_length`` at which the history counts as near the limit."""
    temperature: float = 1.0
    """Sampling temperature sent with every call."""
    max_tokens: int = 256
    """Completion budget sent with every call; must leave room below ``context_length``."""
    seed: int = 0
    """Every decision of session (group, sample) is drawn from an RNG seeded by (seed, group, sample)."""
    model: str = "default"
    """Model name sent in each request (the Proxy serves one model)."""
    send_seed: bool = True
    """Send a per-call ``seed`` drawn from the decision stream (the Proxy passes it to the engine as
    ``sampling_seed``), so that a retried turn samples a different reply yet replays exactly."""
    request_timeout_s: float = 120.0
    """Time-out of one HTTP call to the Proxy (session endpoints and chat completions)."""

    def __post_init__(self) -> None:
        _check_int("max_turns", self.max_turns, 1)
        _check_int("context_length", self.context_length, 2)
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("seed", self.seed, 0)
        for key in ("tools", "compression", "send_seed"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"agents.{key} must be true or false, got {getattr(self, key)!r}")
        _check_fraction("retry_rate", self.retry_rate)
        _check_fraction("compression_threshold", self.compression_threshold, low_open=True)
        if not _is_real(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise ConfigError(f"agents.temperature must be a number in [0, 2], got {self.temperature!r}")
        if not _is_real(self.request_timeout_s) or self.request_timeout_s <= 0:
            raise ConfigError(f"agents.request_timeout_s must be > 0, got {self.request_timeout_s!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"agents.model must be a non-empty string, got {self.model!r}")
        if self.max_tokens >= self.compress_at:
            raise ConfigError(
                f"agents.max_tokens ({self.max_tokens}) must be below agents.context_length x "
                f"agents.compression_threshold ({self.compress_at}), or no reply fits the context"
            )

    def session_agent(self):
        """This config as a per-session agent of ``SlimeRollout`` (``async (ctx) -> reward``):
        :class:`dressage.harness.slime_agent.SimulatedAgent`."""
        from dressage.harness.slime_agent import SimulatedAgent

        return SimulatedAgent(self)

    @property
    def compress_at(self) -> int:
        """Tokens (prompt + completion) at which the history counts as near the limit."""
        return int(self.context_length * self.compression_threshold)
