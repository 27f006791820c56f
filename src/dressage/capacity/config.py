"""What a capacity question is made of: model shape, batch, Segments per trajectory, dtype, nodes.

:class:`CapacityConfig` is ``dressage capacity``'s config tree (:mod:`dressage.flags`): its settings take
the command line's text (``64K``, ``2TB``, ``1:0.6,2:0.4``) or numbers, and are validated and
normalised once, here; every error names the flag it came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from dressage.errors import ConfigError
from dressage.fields.config import ModelConfig
from dressage.fields.models import ModelSpec
from dressage.fields.r3 import DEFAULT_R3_DTYPE, check_dtype_holds_experts, r3_dtype
from dressage.flags import flag
from dressage.units import parse_bytes, parse_count

__all__ = ["CapacityConfig", "CapacityOutput", "parse_segments_distribution", "distribution_mean"]

# What the seed's field table implies for messages: 2.3% next to R3's 92.4%, with R3 at
# 40 x 8 x 4 = 1,280 bytes per token (Qwen3.6, int32), is 2.3 / 92.4 * 1280 = 31.9 B/token.
# Each StepRecord keeps the full chat history of its request, so the text is held many times.
DEFAULT_MESSAGE_BYTES_PER_TOKEN = 32.0
MIN_HOST_MEMORY_BYTES = 1 << 30  # below this a --host-memory value is a missing unit, not a machine
# Upper bounds no real batch comes near; past them the arithmetic overflows (a float to inf, then
# OverflowError) or the answer means nothing.
MAX_CONTEXT_TOKENS = 1 << 31
MAX_COUNT = 1 << 24          # prompts per batch, samples per prompt
MAX_NODES = 1 << 16
MAX_SEGMENTS = 1 << 20       # Segments per trajectory
MAX_MESSAGE_BYTES_PER_TOKEN = float(1 << 20)
MAX_HOST_MEMORY_BYTES = 1 << 50  # 1 PiB
_MAX = {"context_length": MAX_CONTEXT_TOKENS, "mean_segment_tokens": MAX_CONTEXT_TOKENS,
        "rollout_batch_size": MAX_COUNT, "n_samples_per_prompt": MAX_COUNT, "nodes": MAX_NODES,
        "mean_segments": MAX_SEGMENTS, "message_bytes_per_token": MAX_MESSAGE_BYTES_PER_TOKEN,
        "host_memory_bytes": MAX_HOST_MEMORY_BYTES}


def _flag(key: str) -> str:
    """The command-line flag of a setting: the name its field's metadata gives, else the key with dashes."""
    meta = next((f.metadata.get("flag") for f in fields(CapacityConfig) if f.name == key), None)
    return (meta or {}).get("name") or "--" + key.replace("_", "-")


def _whole(key: str, value: object) -> object:
    """A whole number from text (``512``, ``512.0``); other values are left to the checks below."""
    if not isinstance(value, str):
        return value
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{_flag(key)}: expected a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise ConfigError(f"{_flag(key)}: expected a whole number, got {value!r}")
    return int(number)


def _number(key: str, value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{_flag(key)}: expected a number, got {value!r}") from None


def _positive_int(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{_flag(key)} ({key}) must be a positive integer, got {value!r}")
    _at_most(key, value)


def _positive_number(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ConfigError(f"{_flag(key)} ({key}) must be a positive finite number, got {value!r}")
    _at_most(key, value)


def _at_most(key: str, value: float) -> None:
    hi = _MAX.get(key)
    if hi is not None and value > hi:
        got = f"{value:.3g}" if isinstance(value, float) or value >= 10**12 else str(value)
        raise ConfigError(f"{_flag(key)} ({key}) must be at most {int(hi)}, got {got}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityOutput:
    """What ``dressage capacity`` prints and writes."""

    json: bool = False
    """Print JSON instead of text."""
    plot: str | None = field(default=None, metadata=flag(metavar="FILE"))
    """Write a PNG of projected peak against batch size."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityConfig:
    """One rollout batch to size and project."""

    context_length: int = field(metadata=flag(parse=str, metavar="TOKENS"))
    """Context window in tokens: the upper bound of one Segment (65536, 64K, 256K)."""
    rollout_batch_size: int = field(metadata=flag(parse=str, metavar="N"))
    """Prompts per rollout batch."""
    n_samples_per_prompt: int = field(default=1, metadata=flag(parse=str, metavar="N"))
    """Trajectories sampled per prompt; trajectories = batch x samples (the seed's B)."""
    mean_segments: float | None = field(default=None, metadata=flag(parse=str, metavar="X"))
    """Average Segments per trajectory (the seed's X-bar; none: 1, or the mean of
    ``segments_distribution``); the context window does not bound it."""
    segments_distribution: str | None = field(default=None, metadata=flag(metavar="X:W,..."))
    """Segments per trajectory with weights, e.g. 1:0.6,2:0.3,3:0.1 (instead of ``mean_segments``)."""
    mean_segment_tokens: int | None = field(default=None, metadata=flag(parse=str, metavar="TOKENS"))
    """Average tokens per Segment; ``None`` means every Segment fills the context window."""
    message_bytes_per_token: float = field(default=DEFAULT_MESSAGE_BYTES_PER_TOKEN,
                                           metadata=flag(parse=str, metavar="BYTES"))
    """Bytes of chat messages held per Segment token (same in every representation)."""
    routed_experts_dtype: str = field(default=DEFAULT_R3_DTYPE, metadata=flag(metavar="DTYPE"))
    """R3 storage dtype: uint8, uint16 or int32 (``dressage.fields.R3_DTYPES``)."""
    nodes: int = field(default=1, metadata=flag(parse=str, metavar="N"))
    """TQ StorageUnits, one per node; R3 and logprobs spread over them evenly."""
    host_memory_bytes: int | None = field(default=None, metadata=flag("--host-memory", parse=str, metavar="SIZE"))
    """Host memory of the master node (2TB, 1.82TiB), for the largest batch that fits (at least 1 GiB:
    a bare number is bytes, so ``--host-memory 2`` is refused rather than read as 2 bytes)."""
    baseline: str | None = field(default=None, metadata=flag(metavar="FILE"))
    """Measured per-component peaks (memory benchmark JSON); none: the seed's figures."""
    model: ModelSpec = field(metadata=flag(section=ModelConfig))
    """Recorded MoE layers, routing top-k and expert count (a ModelConfig: a preset, or every shape
    field given)."""
    output: CapacityOutput = field(default_factory=CapacityOutput)
    """What is printed and written."""

    def __post_init__(self) -> None:
        def put(key: str, value: object) -> None:
            object.__setattr__(self, key, value)  # frozen: the text of a flag is normalised once, here

        if isinstance(self.model, ModelConfig):
            spec = self.model.spec()
            put("model", replace(spec, name=f"{spec.name} (modified)")
                if self.model.preset and self.model.overridden else spec)
        if isinstance(self.context_length, str):
            put("context_length", parse_count(self.context_length, "--context-length"))
        if isinstance(self.mean_segment_tokens, str):
            put("mean_segment_tokens", parse_count(self.mean_segment_tokens, "--mean-segment-tokens"))
        if isinstance(self.host_memory_bytes, str):
            put("host_memory_bytes", parse_bytes(self.host_memory_bytes, "--host-memory"))
        for key in ("rollout_batch_size", "n_samples_per_prompt", "nodes"):
            put(key, _whole(key, getattr(self, key)))
        for key in ("mean_segments", "message_bytes_per_token"):
            put(key, _number(key, getattr(self, key)))
        if self.segments_distribution is not None:
            if self.mean_segments is not None:
                raise ConfigError("--segments-distribution: not allowed with --mean-segments (give one)")
            put("mean_segments", distribution_mean(parse_segments_distribution(self.segments_distribution)))
        elif self.mean_segments is None:
            put("mean_segments", 1.0)
        if not isinstance(self.model, ModelSpec):
            raise ConfigError(f"--model (model) must be a ModelSpec, got {type(self.model).__name__}")
        for key in ("context_length", "rollout_batch_size", "n_samples_per_prompt", "nodes"):
            _positive_int(key, getattr(self, key))
        _positive_number("mean_segments", self.mean_segments)
        _positive_number("message_bytes_per_token", self.message_bytes_per_token)
        if self.mean_segment_tokens is not None:
            _positive_int("mean_segment_tokens", self.mean_segment_tokens)
            if self.mean_segment_tokens > self.context_length:
                raise ConfigError(
                    f"--mean-segment-tokens ({self.mean_segment_tokens}) exceeds --context-length "
                    f"({self.context_length}): a Segment is bounded by the context window"
                )
        if self.host_memory_bytes is not None:
            _positive_int("host_memory_bytes", self.host_memory_bytes)
            if self.host_memory_bytes < MIN_HOST_MEMORY_BYTES:
                raise ConfigError(
                    f"--host-memory: {self.host_memory_bytes} bytes is not a plausible master node "
                    f"(at least 1 GiB); give a unit, e.g. 2TB or 1.82TiB")
        try:
            r3_dtype(self.routed_experts_dtype)
            check_dtype_holds_experts(self.model.num_experts, self.routed_experts_dtype)
        except ConfigError as exc:
            raise ConfigError(f"--routed-experts-dtype: {exc}") from None

    @property
    def segment_tokens(self) -> int:
        """Tokens of an average Segment (the full context unless told otherwise)."""
        return self.context_length if self.mean_segment_tokens is None else self.mean_segment_tokens

    @property
    def trajectories(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def segments(self) -> int:
        """Active Segments of the batch: N_segment = sum_i X_i ~ B * X-bar (at least one)."""
        return max(1, round(self.trajectories * self.mean_segments))


def parse_segments_distribution(text: str, what: str = "--segments-distribution") -> dict[int, float]:
    """``"1:0.6,2:0.3,3:0.1"`` -> ``{1: 0.6, 2: 0.3, 3: 0.1}``: Segments per trajectory and their weight.

    Weights need not sum to one; they are normalised by :func:`distribution_mean`.
    """
    out: dict[int, float] = {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        count, sep, weight = part.partition(":")
        try:
            x, w = int(count), float(weight) if sep else 1.0
        except ValueError:
            raise ConfigError(f"{what}: cannot parse {part!r} (expected SEGMENTS:WEIGHT, e.g. 1:0.6,2:0.4)") from None
        if x <= 0 or not w >= 0 or w == float("inf"):
            raise ConfigError(f"{what}: {part!r} needs a positive Segment count and a finite weight >= 0")
        if x > MAX_SEGMENTS:
            raise ConfigError(f"{what}: {part!r}: at most {MAX_SEGMENTS} Segments per trajectory")
        if x in out:
            raise ConfigError(f"{what}: {x} Segments is given twice (in {text!r}); give each count once")
        out[x] = w
    if not out:
        raise ConfigError(f"{what}: empty distribution {text!r}")
    return out


def distribution_mean(dist: Mapping[int, float], what: str = "--segments-distribution") -> float:
    """Mean Segments per trajectory (X-bar) of a ``{segments: weight}`` distribution."""
    total = float(sum(dist.values()))
    if not total > 0:
        raise ConfigError(f"{what}: weights sum to zero")
    return sum(x * w for x, w in dist.items()) / total
