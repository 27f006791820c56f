"""``EngineConfig``: everything the SGLang-protocol engine needs, validated once at the edge.

It is ``dressage engine serve``'s config tree: the settings and the ``model`` section
(:class:`dressage.fields.config.ModelConfig`) are its flags and YAML (:mod:`dressage.flags`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dressage.errors import ConfigError
from dressage.fields.config import DEFAULT_MODEL, TRANSFORMERS_MODEL, ModelConfig
from dressage.fields.models import ModelSpec
from dressage.flags import flag

__all__ = ["EngineConfig", "BACKENDS"]

BACKENDS = ("builtin", "transformers")


def _check_int(key: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"engine.{key} must be an integer >= {low}, got {value!r}")


@dataclass(slots=True, kw_only=True)
class EngineConfig:
    """Configuration of the built-in engine (``dressage engine serve``)."""

    host: str = "127.0.0.1"
    """Address to bind; loopback unless asked otherwise."""
    port: int = 30000
    """Port to bind; 0 picks a free one."""
    backend: str = field(default="builtin", metadata=flag(choices=BACKENDS))
    """``builtin`` (routing from prefix hashes, no weights) or ``transformers`` (a seeded random-weight
    MoE model on CPU, ``--model tiny-qwen3-moe``: logprobs and routed experts from its forward pass)."""
    model: ModelSpec = field(default_factory=ModelConfig, metadata=flag(section=ModelConfig))
    """Model shape: recorded MoE layers, top-k and expert count size the routed experts (a ModelConfig
    resolves to the preset it names, by default qwen3.6-35b-a3b, or tiny-qwen3-moe with the transformers backend)."""
    seed: int = 0
    """Output is a pure function of seed, prompt and sampling params."""
    tokenizer: str | None = None
    """'byte' (built in), 'qwen3', 'qwen3.5' / 'qwen3.6', or a local Hugging Face tokenizer folder;
    none: 'byte', or 'qwen3' with the transformers backend."""
    mean_response_tokens: int = 256
    """Mean of the drawn reply length (a reply longer than max_new_tokens finishes by length)."""
    default_max_new_tokens: int = 128
    """``max_new_tokens`` when a request leaves it out (SGLang's default)."""
    context_length: int = 262_144
    """Longest prompt + reply accepted, as the model's context window."""
    tool_call_rate: float = 0.0
    """Share of replies that are ``<tool_call>`` blocks when the prompt offers tools."""
    answer_tool_results: bool = False
    """Reply in prose when the prompt's last turn carries tool results: with ``tool_call_rate=1``
    every task is one tool round trip and then an answer, as an agent framework's loop expects."""
    token_delay_s: float = field(default=0.0, metadata=flag("--token-delay", metavar="SECONDS"))
    """Wall time per generated token, so that pause and abort can land mid-generation."""
    stream_interval: int = 8
    """Tokens between two streamed chunks."""
    incremental_streaming_output: bool = False
    """Streamed chunks carry only new tokens (SGLang's flag of the same name); cumulative otherwise."""
    prefix_cache_blocks: int = field(default=262_144, metadata=flag(flat=False))
    """Prefix-cache capacity in blocks of ``prefix_cache_block`` tokens (reported as cached_tokens)."""
    prefix_cache_block: int = field(default=16, metadata=flag(flat=False))
    """Granularity of the prefix cache in tokens."""
    weight_version: str = "default"
    """Reported in ``meta_info.weight_version``; changed by ``/update_weight_version``."""
    served_model_name: str | None = None
    """Name in ``/get_model_info``; the preset's name by default."""
    log_level: str = "warning"
    """uvicorn log level."""
    enable_return_routed_experts: bool = False
    """Accepted for SGLang compatibility; routed experts are always available."""

    def __post_init__(self) -> None:
        real = self.backend == "transformers"
        if isinstance(self.model, ModelConfig):
            self.model = self.model.spec(default=TRANSFORMERS_MODEL if real else DEFAULT_MODEL)
        if self.tokenizer is None:
            self.tokenizer = "qwen3" if real else "byte"
        if not isinstance(self.model, ModelSpec):
            raise ConfigError(f"engine.model must be a ModelSpec, got {type(self.model).__name__}")
        _check_int("seed", self.seed, 0)
        if self.backend not in BACKENDS:
            raise ConfigError(f"engine.backend must be 'builtin' or 'transformers', got {self.backend!r}")
        _check_int("port", self.port, 0)
        if self.port > 65535:
            raise ConfigError(f"engine.port must be <= 65535, got {self.port}")
        for key in ("mean_response_tokens", "context_length", "stream_interval",
                    "prefix_cache_block"):
            _check_int(key, getattr(self, key), 1)
        _check_int("default_max_new_tokens", self.default_max_new_tokens, 0)
        _check_int("prefix_cache_blocks", self.prefix_cache_blocks, 0)
        rate = self.tool_call_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
            raise ConfigError(f"engine.tool_call_rate must be in [0, 1], got {rate!r}")
        delay = self.token_delay_s
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise ConfigError(f"engine.token_delay_s must be >= 0, got {delay!r}")
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            raise ConfigError(f"engine.tokenizer must be 'byte' or a tokenizer path, got {self.tokenizer!r}")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"engine.host must be a host name or address, got {self.host!r}")
        if not isinstance(self.weight_version, str):
            raise ConfigError(f"engine.weight_version must be a string, got {self.weight_version!r}")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name
