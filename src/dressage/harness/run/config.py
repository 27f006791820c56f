"""RunConfig: everything ``dressage run`` needs, validated once at the edge.

Its fields generate ``dressage run``'s own flags (:mod:`dressage.flags`): a field's docstring is
the flag's help and its default the flag's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dressage.errors import ConfigError
from dressage.dataplane import DataPlaneConfig
from dressage.flags import flag
from dressage.units import parse_count

__all__ = ["RunConfig", "ENGINES", "TRANSFORMERS_MODEL"]

ENGINES = ("builtin", "transformers")
TRANSFORMERS_MODEL = "tiny-qwen3-moe"
"""The model ``--engine transformers`` runs (the only one with weights in the package)."""


def count(text: str) -> int:
    """A token count as ``4K`` / ``32K`` / ``4096`` (argparse names this function in its errors)."""
    return parse_count(text, "--context-length")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """One ``dressage run``: rollout shape, the data plane and where things run."""

    data_plane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    """The seed's flags (R3, TQ, transfer params, dtype)."""
    transfer_queue: Any = None
    """TransferQueueConfig when TQ is on (``None``: embedded defaults)."""
    num_rollouts: int = 2
    """Rollout -> train iterations."""
    rollout_batch_size: int = 4
    """Prompts per rollout."""
    n_samples_per_prompt: int = 2
    """Sessions per prompt (a GRPO group)."""
    context_length: int = field(default=4096, metadata=flag(parse=count, metavar="TOKENS", default_text="4K"))
    """Context window of the agents, e.g. 4K, 32K: they compress their history before exceeding it."""
    dp_size: int = 2
    """Data-parallel ranks the batch is sharded over."""
    max_turns: int = 4
    """Model calls per agent session."""
    max_tokens: int = 128
    """max_tokens per call."""
    mean_response_tokens: int = 64
    """Mean reply length of the built-in engine."""
    tool_call_rate: float = 0.4
    """Share of engine replies that are tool calls when tools are offered."""
    retry_rate: float = 0.1
    """Share of turns an agent retries (a branch in the trajectory)."""
    concurrency: int = 64
    """Agent sessions in flight at once."""
    seed: int = 0
    """Seed of the prompts, the agents and the engine: the same seed gives the same samples digest."""
    engine: str = field(default="builtin", metadata=flag(choices=ENGINES))
    """Engine started when no --engine-url is given: ``builtin`` (no weights) or ``transformers``
    (a seeded random-weight tiny-qwen3-moe on CPU with the real Qwen3 tokenizer; with R3 on, the
    trainer replays each Sample's routing and checks that it reproduces the recorded logprobs)."""
    engine_url: str | None = field(default=None, metadata=flag(metavar="URL"))
    """An external SGLang server to use instead of starting an engine."""
    ray: bool = False
    """Run RolloutManager and trainer readers as Ray actors (TQ per its config)."""
    ray_address: str | None = field(default=None, metadata=flag(metavar="ADDR"))
    """Join this Ray cluster (implies --ray)."""
    progress: bool = field(default=True, metadata=flag(skip=True))
    """A progress bar on stderr (``--no-progress`` turns it off)."""

    def __post_init__(self) -> None:
        for key in ("num_rollouts", "rollout_batch_size", "n_samples_per_prompt", "context_length", "dp_size",
                    "max_turns", "max_tokens", "mean_response_tokens", "concurrency"):
            _positive(key, getattr(self, key))
        for key in ("tool_call_rate", "retry_rate"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ConfigError(f"{key} must be in [0, 1], got {v!r}")
        if self.max_tokens >= self.context_length:
            raise ConfigError(f"max_tokens ({self.max_tokens}) must be below context_length ({self.context_length})")
        if self.ray_address is not None:
            self.ray = True
        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.engine == "transformers":
            if self.engine_url is not None:
                raise ConfigError("--engine transformers starts its own engine; leave out --engine-url")
            if self.ray:
                raise ConfigError("--engine transformers replays routing in this process's trainer; "
                                  "leave out --ray")
            if self.data_plane.model.name != TRANSFORMERS_MODEL:
                raise ConfigError(f"--engine transformers runs {TRANSFORMERS_MODEL}, but the data plane "
                                  f"records the shape of {self.data_plane.model.name}")
