"""RunConfig: everything ``dressage run`` needs, validated once at the edge.

The tree (rollout shape, agents, inference engine, cluster, data plane, TransferQueue, report) is
``dressage run``'s flags and YAML (:mod:`dressage.flags`): a field's docstring is the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dressage.errors import ConfigError
from dressage.dataplane import DataPlaneConfig
from dressage.engine.config import BACKENDS
from dressage.fields.config import TRANSFORMERS_MODEL
from dressage.flags import flag
from dressage.tq.config import TransferQueueSelection
from dressage.units import parse_count

__all__ = ["RunConfig", "RolloutConfig", "AgentsConfig", "InferenceConfig", "ClusterConfig", "ReportConfig",
           "ENGINES"]

ENGINES = BACKENDS
"""The engines ``dressage run`` can start."""


def count(text: str) -> int:
    """A token count as ``4K`` / ``32K`` / ``4096`` (argparse names this function in its errors)."""
    return parse_count(text, "--context-length")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _rate(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be in [0, 1], got {value!r}")


@dataclass(kw_only=True, slots=True)
class RolloutConfig:
    """The shape of each rollout batch and of its training step."""

    num_rollouts: int = 2
    """Rollout -> train iterations."""
    rollout_batch_size: int = 4
    """Prompts per rollout."""
    n_samples_per_prompt: int = 2
    """Sessions per prompt (a GRPO group)."""
    dp_size: int = 2
    """Data-parallel ranks the batch is sharded over."""
    concurrency: int = 64
    """Agent sessions in flight at once."""

    def __post_init__(self) -> None:
        for key in ("num_rollouts", "rollout_batch_size", "n_samples_per_prompt", "dp_size", "concurrency"):
            _positive(f"rollout.{key}", getattr(self, key))


@dataclass(kw_only=True, slots=True)
class AgentsConfig:
    """The simulated agents: how long they talk, what each call asks for, how often they retry."""

    max_turns: int = 4
    """Model calls per agent session."""
    max_tokens: int = 128
    """max_tokens per call."""
    context_length: int = field(default=2560, metadata=flag(parse=count, metavar="TOKENS", default_text="2.5K"))
    """Context window of the agents (and of the engine started here), e.g. 2.5K, 32K: past 80% of it an
    agent replaces its history by a summary (a new Segment). The default makes the built-in engine's
    agents, whose first prompt is 1.4K to 1.7K byte tokens, compress within a few turns."""
    retry_rate: float = 0.1
    """Share of turns an agent retries (a branch in the trajectory)."""

    def __post_init__(self) -> None:
        for key in ("max_turns", "max_tokens", "context_length"):
            _positive(f"agents.{key}", getattr(self, key))
        _rate("agents.retry_rate", self.retry_rate)
        if self.max_tokens >= self.context_length:
            raise ConfigError(f"agents.max_tokens ({self.max_tokens}) must be below agents.context_length "
                              f"({self.context_length})")


@dataclass(kw_only=True, slots=True)
class InferenceConfig:
    """The engine the agents' calls reach: one started here, or an external SGLang server."""

    backend: str = field(default="builtin", metadata=flag("--engine", choices=ENGINES))
    """Engine started when no --engine-url is given: ``builtin`` (no weights) or ``transformers``
    (a seeded random-weight tiny-qwen3-moe on CPU with the real Qwen3 tokenizer; with R3 on, the
    trainer replays each Sample's routing and checks that it reproduces the recorded logprobs)."""
    engine_url: str | None = field(default=None, metadata=flag(metavar="URL"))
    """An external SGLang server to use instead of starting an engine."""
    mean_response_tokens: int = 64
    """Mean reply length of the built-in engine."""
    tool_call_rate: float = 0.4
    """Share of engine replies that are tool calls when tools are offered."""

    def __post_init__(self) -> None:
        if self.backend not in ENGINES:
            raise ConfigError(f"inference.backend must be one of {', '.join(ENGINES)}, got {self.backend!r}")
        _positive("inference.mean_response_tokens", self.mean_response_tokens)
        _rate("inference.tool_call_rate", self.tool_call_rate)
        if self.backend == "transformers" and self.engine_url is not None:
            raise ConfigError("--engine transformers starts its own engine; leave out --engine-url")


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """Where RolloutManager and the trainer readers run: this process, or Ray actors."""

    ray: bool = False
    """Run RolloutManager and trainer readers as Ray actors (TQ per its config)."""
    ray_address: str | None = field(default=None, metadata=flag(metavar="ADDR"))
    """Join this Ray cluster (implies --ray)."""

    def __post_init__(self) -> None:
        if self.ray_address is not None:
            self.ray = True


@dataclass(kw_only=True, slots=True)
class ReportConfig:
    """What ``dressage run`` shows and writes besides its verdict."""

    json: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Write the report as JSON (none: not written)."""
    html: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Write the session viewer of the last rollout, with the run's memory timeline and figures, as one
    self-contained HTML file (none: not written)."""
    figures: tuple[str, ...] = field(default=(), metadata=flag(metavar="PNG"))
    """PNG pictures to embed in the --html page (files that do not exist are left out)."""
    progress: bool = field(default=True, metadata=flag("--no-progress"))
    """A progress bar on stderr (only when stderr is a terminal)."""


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """One ``dressage run``: rollout shape, agents, engine, cluster, the data plane and the TransferQueue."""

    seed: int = 0
    """Seed of the prompts, the agents and the engine: the same seed gives the same samples digest."""
    compare_without_tq: bool = False
    """With TQ on, run the same seed again with TQ off; the verdict requires the same samples digest."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout batch shape."""
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    """The simulated agents."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """The inference engine."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """In-process or Ray."""
    data_plane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    """The seed's flags (R3, TQ, transfer params, dtype)."""
    transfer_queue: TransferQueueSelection = field(default_factory=TransferQueueSelection)
    """The TransferQueue deployment started when TQ is on (none: embedded defaults)."""
    report: ReportConfig = field(default_factory=ReportConfig)
    """Report output."""

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        if self.transfer_queue.spec is not None:
            raise ConfigError("transfer_queue.spec: dressage run starts its own TransferQueue; give its settings "
                              "as transfer_queue.config")
        if self.transfer_queue.spec_out is not None:
            raise ConfigError("transfer_queue.spec_out: dressage run trains in its own processes, which join its "
                              "TransferQueue without a file")
        if not self.data_plane.enable_transfer_queue:
            self.transfer_queue.require_enabled()
        if self.inference.backend == "transformers":
            if self.cluster.ray:
                raise ConfigError("--engine transformers replays routing in this process's trainer; "
                                  "leave out --ray")
            if self.data_plane.model.name != TRANSFORMERS_MODEL:
                raise ConfigError(f"--engine transformers runs {TRANSFORMERS_MODEL}, but the data plane "
                                  f"records the shape of {self.data_plane.model.name}")
