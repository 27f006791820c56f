"""Model shapes that size trajectory fields: recorded MoE layers, routing top-k, expert count.

Presets carry the public shapes of the models the seed measures. ``num_layers`` is the number
of layers whose routing R3 records. Presets count MoE layers, as the seed sizes R3; SGLang's
capture has a row for *every* hidden layer (dense ones stay zeros), so against a real engine the
Proxy records ``hidden_layers = num_layers + dense_layers`` rows per token (GLM-5.2: 75 MoE +
3 dense = 78), which it reads from the model's ``config.json`` (see
:mod:`dressage.proxy.engines.model_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dressage.errors import ConfigError

__all__ = ["ModelSpec", "MODEL_PRESETS", "get_model", "unknown_preset"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Shape of a MoE model as far as trajectory storage is concerned."""

    name: str
    num_layers: int
    """Layers recorded by R3 (one row of ``topk`` ids per layer per token)."""
    topk: int
    """Experts routed per token per layer."""
    num_experts: int
    """Routed experts per layer; ids are ``0..num_experts-1``."""
    vocab_size: int = 151_936
    """Token id range; sizes the built-in engine's output."""
    dense_layers: int = 0
    """Hidden layers without experts, not counted in ``num_layers`` (SGLang still sends their rows)."""

    def __post_init__(self) -> None:
        for key in ("num_layers", "topk", "num_experts", "vocab_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{key} must be a positive integer, got {value!r}")
        if not isinstance(self.dense_layers, int) or isinstance(self.dense_layers, bool) or self.dense_layers < 0:
            raise ConfigError(f"model.dense_layers must be a non-negative integer, got {self.dense_layers!r}")
        if self.topk > self.num_experts:
            raise ConfigError(f"model.topk ({self.topk}) exceeds model.num_experts ({self.num_experts})")

    @property
    def r3_ids_per_token(self) -> int:
        return self.num_layers * self.topk

    @property
    def hidden_layers(self) -> int:
        """Every hidden layer: the layer count of SGLang's routed-experts rows."""
        return self.num_layers + self.dense_layers


MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(name="qwen3.6-35b-a3b", num_layers=40, topk=8, num_experts=256),
        # 75 MoE layers (the seed's R3 sizing) after 3 dense ones: SGLang sends 78 rows per token.
        ModelSpec(name="glm-5.2-744b-a40b", num_layers=75, topk=8, num_experts=256, vocab_size=154_880,
                  dense_layers=3),
        ModelSpec(name="qwen3-next-80b-a3b", num_layers=48, topk=10, num_experts=512),
        # A toy shape for tests and quick demos.
        ModelSpec(name="tiny-moe", num_layers=4, topk=2, num_experts=16, vocab_size=512),
        # The random-weight Qwen3MoeForCausalLM of `dressage engine serve --backend transformers`
        # (dressage/engine/models/tiny-qwen3-moe.json), on the Qwen3 vocabulary.
        ModelSpec(name="tiny-qwen3-moe", num_layers=2, topk=2, num_experts=8, vocab_size=151_936),
    )
}


def unknown_preset(name: object, where: str = "model") -> ConfigError:
    """The error for a ``--model`` that names no preset (a Hugging Face id, say): it lists the presets
    and says how to give any other model's shape."""
    return ConfigError(f"{where}: unknown preset {name!r}; known presets: {', '.join(MODEL_PRESETS)}. "
                       "For another model, leave out --model and give its shape: --num-layers N --topk K "
                       "--num-experts E (MoE layers, experts routed per token, routed experts per layer; "
                       "dressage proxy serve, engine serve and capacity take them)")


def get_model(name: str) -> ModelSpec:
    try:
        return MODEL_PRESETS[name.lower()]
    except KeyError:
        raise unknown_preset(name) from None
