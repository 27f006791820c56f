"""MemoryBenchConfig: one ``dressage bench memory`` run (rollout shape, cluster sizes, dtypes, sampling).

Two presets: ``small`` (a check, about 40 s per dtype) and ``full`` (the largest run that stays well
inside a 24 GiB machine). Every field is also a command-line flag; values are validated here, once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dressage.errors import ConfigError
from dressage.fields import R3_DTYPES, ModelSpec, check_dtype_holds_experts, get_model

__all__ = ["MemoryBenchConfig", "PRESETS", "PLACEMENTS"]

PLACEMENTS = ("spread", "local")
PROXY_DEPLOYMENTS = ("process", "ray")
GiB = 1 << 30


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")


def _fraction(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"--{name.replace('_', '-')} must be a number in [0, 1], got {value!r}")


@dataclass(kw_only=True, slots=True)
class MemoryBenchConfig:
    """What one memory benchmark measures: the same GRPO-style loop without TQ and with TQ, per dtype."""

    preset: str = "small"
    """Name of the preset the values came from (recorded in the JSON)."""
    model: ModelSpec = field(default_factory=lambda: get_model("qwen3.6-35b-a3b"))
    """Model shape: R3 records ``num_layers x topk`` expert ids per token."""
    dtypes: tuple[str, ...] = ("int32", "uint16", "uint8")
    """R3 storage dtypes; each gets its own pair of runs (w/o TQ, w/ TQ) at that dtype."""
    num_rollouts: int = 3
    """Rollout -> train iterations per run (accumulate, then release, each time)."""
    rollout_batch_size: int = 8
    """Prompts per rollout."""
    n_samples_per_prompt: int = 4
    """Trajectories per prompt (a GRPO group)."""
    context_length: int = 4096
    """The agents' context window; they compress their history (a new Segment) near it."""
    max_turns: int = 4
    """Model calls per session."""
    max_tokens: int = 512
    """max_tokens per call."""
    mean_response_tokens: int = 384
    """Mean reply length of the built-in engine."""
    tool_call_rate: float = 0.4
    """Share of replies that are tool calls."""
    retry_rate: float = 0.1
    """Share of turns an agent retries (a branch, so Segments share a prefix)."""
    concurrency: int = 32
    """Agent sessions in flight at once."""
    dp_size: int = 4
    """Trainer readers (DP ranks) on node 1; the RolloutManager ray.puts one shard per rank."""
    object_store_bytes: int = 2 * GiB
    """Object store size of each simulated node."""
    unit_memory_budget: int = 8 * GiB
    """In-memory budget of each StorageUnit (above it a unit would spill)."""
    placement: str = "spread"
    """``spread``: the Proxy writes without node preference, so keys spread evenly over the StorageUnits
    (the seed's sharding); ``local``: it prefers the master's own StorageUnit."""
    proxy_deployment: str = "process"
    """``process``: the Proxy is its own process outside Ray and the RolloutManager drains finished
    trajectories over its ``POST /trajectory/read`` (the seed's deployment); ``ray``: the Proxy is a Ray
    actor that pushes each finalized session to the RolloutManager actor."""
    read_groups: int = 1
    """Prompt groups per trajectory read (process deployment): what one answer holds on both sides."""
    malloc_mmap_threshold: int = 128 * 1024
    """``MALLOC_MMAP_THRESHOLD_`` for every process of the cluster (0: glibc's dynamic default)."""
    interval_s: float = 0.15
    """Memory sampling period."""
    host_memory_bytes: int = 24 * GiB
    """Host memory drawn as a threshold on the peak-vs-batch plot (this machine's by default)."""
    batch_sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    """Rollout batch sizes of the projected peak-vs-batch plot (the seed's Figure 5 shape)."""
    seed: int = 0
    progress: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.model, str):
            self.model = get_model(self.model)
        if not self.dtypes:
            raise ConfigError("--dtypes needs at least one of int32, uint16, uint8")
        self.dtypes = tuple(dict.fromkeys(self.dtypes))
        for d in self.dtypes:
            if d not in R3_DTYPES:
                raise ConfigError(f"--dtypes: unknown dtype {d!r} (choose from {', '.join(R3_DTYPES)})")
            try:
                check_dtype_holds_experts(self.model.num_experts, d)
            except ConfigError as exc:
                raise ConfigError(f"--dtypes: {exc}") from None
        for name in ("num_rollouts", "rollout_batch_size", "n_samples_per_prompt", "context_length", "max_turns",
                     "max_tokens", "mean_response_tokens", "concurrency", "dp_size", "object_store_bytes",
                     "unit_memory_budget", "host_memory_bytes"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.malloc_mmap_threshold, bool) or not isinstance(self.malloc_mmap_threshold, int) \
                or not 0 <= self.malloc_mmap_threshold <= 32 * (1 << 20):
            raise ConfigError(f"--malloc-mmap-threshold must be 0..32 MiB in bytes, got {self.malloc_mmap_threshold!r}")
        _fraction("tool_call_rate", self.tool_call_rate)
        _fraction("retry_rate", self.retry_rate)
        if self.proxy_deployment not in PROXY_DEPLOYMENTS:
            raise ConfigError(f"--proxy-deployment must be one of {', '.join(PROXY_DEPLOYMENTS)}, "
                              f"got {self.proxy_deployment!r}")
        _positive_int("read_groups", self.read_groups)
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"--placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if isinstance(self.interval_s, bool) or not isinstance(self.interval_s, (int, float)) \
                or not 0.02 <= self.interval_s <= 5.0:
            raise ConfigError(f"--interval-s must be between 0.02 and 5 seconds, got {self.interval_s!r}")
        # The agents compress at 80% of the window: a reply must fit below that.
        if self.max_tokens >= int(self.context_length * 0.8):
            raise ConfigError(f"--max-tokens ({self.max_tokens}) must be below 80% of --context-length "
                              f"({self.context_length})")
        if not self.batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0
                                       for b in self.batch_sizes):
            raise ConfigError(f"--batch-sizes must be positive integers, got {self.batch_sizes!r}")

    @property
    def trajectories(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def headline_dtype(self) -> str:
        """The dtype of the JSON's top-level pair: uint8 when measured (the issue's target), else the last."""
        return "uint8" if "uint8" in self.dtypes else self.dtypes[-1]

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "MemoryBenchConfig":
        if name not in PRESETS:
            raise ConfigError(f"--preset must be one of {', '.join(PRESETS)}, got {name!r}")
        values = {**PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}}
        return cls(preset=name, **values)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        m = self.model
        out["model"] = {"name": m.name, "num_layers": m.num_layers, "topk": m.topk, "num_experts": m.num_experts}
        out["dtypes"] = list(self.dtypes)
        out["batch_sizes"] = list(self.batch_sizes)
        out["trajectories"] = self.trajectories
        return out


# small: a check (about 40 s per dtype, mostly cluster start-up). full: ~1.3M Segment tokens a rollout (256
# trajectories); w/o TQ at int32 the machine then holds about four copies of R3 (Proxy, RolloutManager,
# both object stores), ~7 GiB with Ray itself, well inside 24 GiB.
PRESETS: dict[str, dict[str, Any]] = {
    "small": dict(num_rollouts=2, rollout_batch_size=4, n_samples_per_prompt=4, context_length=4096,
                  max_turns=3, max_tokens=512, mean_response_tokens=384, concurrency=16, dp_size=2,
                  object_store_bytes=1 * GiB, unit_memory_budget=2 * GiB),
    "full": dict(num_rollouts=3, rollout_batch_size=32, n_samples_per_prompt=8, context_length=8192,
                 max_turns=6, max_tokens=1024, mean_response_tokens=768, concurrency=16, dp_size=4,
                 object_store_bytes=4 * GiB, unit_memory_budget=6 * GiB),
}
