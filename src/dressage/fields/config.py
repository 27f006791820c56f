"""``ModelConfig``: a model shape as a command names it, a preset with any shape field overridden.

The one place a preset and ``num_layers`` / ``topk`` / ``num_experts`` / ``vocab_size`` overrides
become a :class:`ModelSpec` (``dressage engine serve``, ``dressage capacity``); it is the ``model``
section of their config trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dressage.errors import ConfigError
from dressage.fields.models import MODEL_PRESETS, ModelSpec, get_model, unknown_preset
from dressage.flags import flag

__all__ = ["ModelConfig", "DEFAULT_MODEL", "TRANSFORMERS_MODEL", "model_from_preset"]

DEFAULT_MODEL = "qwen3.6-35b-a3b"
"""The preset a command records when none is named (the seed's measured model)."""
TRANSFORMERS_MODEL = "tiny-qwen3-moe"
"""The model the engine's ``transformers`` backend runs (the only one with weights in the package)."""

SHAPE_FIELDS = ("num_layers", "topk", "num_experts", "vocab_size")


def model_from_preset(name: str = DEFAULT_MODEL, *, num_layers: int | None = None,
                      num_experts: int | None = None, topk: int | None = None,
                      vocab_size: int | None = None) -> ModelSpec:
    """A preset from :mod:`dressage.fields.models` with any of its shape fields overridden."""
    return ModelConfig(preset=name, num_layers=num_layers, num_experts=num_experts, topk=topk,
                       vocab_size=vocab_size).spec()


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Model shape: a preset, and any of its shape fields overridden."""

    preset: str | None = field(default=None, metadata=flag("--model", metavar="NAME"))
    """Model preset (one of ``dressage.fields.MODEL_PRESETS``); none: the command's default, or
    every shape field given (a custom shape)."""
    num_layers: int | None = field(default=None, metadata=flag(metavar="N"))
    """Recorded MoE layers (overrides the preset)."""
    topk: int | None = field(default=None, metadata=flag(metavar="K"))
    """Experts routed per token per layer (overrides the preset)."""
    num_experts: int | None = field(default=None, metadata=flag(metavar="N"))
    """Routed experts per layer (overrides the preset)."""
    vocab_size: int | None = field(default=None, metadata=flag(metavar="N"))
    """Vocabulary size (overrides the preset)."""

    def __post_init__(self) -> None:
        if self.preset is not None and (not isinstance(self.preset, str) or self.preset.lower() not in MODEL_PRESETS):
            raise unknown_preset(self.preset, "model.preset (--model)")
        for key in SHAPE_FIELDS:
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigError(f"model.{key} (--{key.replace('_', '-')}) must be a positive integer, got {value!r}")

    @property
    def overridden(self) -> tuple[str, ...]:
        """The shape fields given."""
        return tuple(k for k in SHAPE_FIELDS if getattr(self, k) is not None)

    def spec(self, default: str | None = None) -> ModelSpec:
        """The shape: ``preset`` (else ``default``) with the overrides; with neither, a ``custom``
        shape from ``num_layers``, ``topk`` and ``num_experts``."""
        name = self.preset or default
        overrides = {k: getattr(self, k) for k in self.overridden}
        if name is None:
            missing = [k for k in ("num_layers", "topk", "num_experts") if k not in overrides]
            if missing:
                raise ConfigError("model: a preset (--model) or all of --num-layers, --topk, --num-experts is "
                                  "required (missing: " + ", ".join("--" + k.replace("_", "-") for k in missing) + ")")
            return ModelSpec(name="custom", **overrides)
        base = get_model(name)
        return replace(base, **overrides) if overrides else base

    @classmethod
    def of(cls, spec: ModelSpec) -> "ModelConfig":
        """The config that gives ``spec`` back (a preset's name with its shape written out)."""
        preset = spec.name if spec.name.lower() in MODEL_PRESETS else None
        return cls(preset=preset, num_layers=spec.num_layers, topk=spec.topk, num_experts=spec.num_experts,
                   vocab_size=spec.vocab_size)
