"""The model's R3 shape and tokenizer, learnt from the engine rather than assumed.

SGLang's ``/model_info`` names the model (``model_path``, ``tokenizer_path``) but carries no
layer counts; those are in the model's Hugging Face ``config.json``: ``num_hidden_layers`` (SGLang
sends a routed-experts row for every hidden layer, dense ones included),
``num_experts_per_tok``, and ``n_routed_experts`` or ``num_experts``. The built-in engine puts
the same keys in its model info. Explicit overrides (``--num-layers`` / ``--topk`` /
``--num-experts``) win over both; a preset fills what is still unknown.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

from dressage.errors import ConfigError, EngineMismatchError
from dressage.fields.models import ModelSpec

__all__ = ["ShapeSource", "shape_from_config", "read_model_config", "discover_model_spec",
           "fetch_model_spec", "resolve_tokenizer", "context_window", "BYTE_TOKENIZER"]

BYTE_TOKENIZER = "byte"
"""The Proxy's built-in tokenizer; only the built-in engine speaks it."""


@dataclass(frozen=True, slots=True)
class ShapeSource:
    """Where each shape value came from (``override``, ``engine``, ``config.json``, ``preset``)."""

    num_layers: str
    topk: str
    num_experts: str

    def to_dict(self) -> dict[str, str]:
        return {"num_layers": self.num_layers, "topk": self.topk, "num_experts": self.num_experts}


def _positive(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def shape_from_config(cfg: Mapping[str, Any]) -> dict[str, int]:
    """Shape keys of a Hugging Face config (its ``text_config`` for multimodal models)."""
    if isinstance(cfg.get("text_config"), Mapping):
        cfg = {**cfg, **cfg["text_config"]}
    out: dict[str, int] = {}
    layers = _positive(cfg.get("num_hidden_layers"))
    if layers is not None:
        out["num_layers"] = layers
    topk = _positive(cfg.get("num_experts_per_tok")) or _positive(cfg.get("moe_topk"))
    if topk is not None:
        out["topk"] = topk
    experts = _positive(cfg.get("n_routed_experts")) or _positive(cfg.get("num_experts"))
    if experts is not None:
        out["num_experts"] = experts
    dense = cfg.get("first_k_dense_replace")
    if isinstance(dense, int) and not isinstance(dense, bool) and 0 <= dense <= out.get("num_layers", 0):
        out["dense_layers"] = dense
    vocab = _positive(cfg.get("vocab_size"))
    if vocab is not None:
        out["vocab_size"] = vocab
    return out


def context_window(info: Mapping[str, Any] | None, server_info: Mapping[str, Any] | None = None,
                   config: Mapping[str, Any] | None = None) -> int | None:
    """The prompt + reply tokens one call to this engine may use; ``None`` when it does not tell.

    The window is the first of: ``context_length`` / ``max_context_length`` in the model info,
    ``context_length`` in the server info (SGLang's ``--context-length``, ``None`` unless given),
    the model's ``max_position_embeddings`` (``config.json``, what SGLang derives its window from).
    SGLang's server info also tells what its KV cache holds (``max_total_num_tokens``) and the
    longest prompt it takes (``max_req_input_len``, one below the window it serves): a window
    beyond either is lowered to it.
    """
    info, server_info = dict(info or {}), dict(server_info or {})
    if config is None:
        config = read_model_config(info.get("model_path")) or {}
    if isinstance(config.get("text_config"), Mapping):
        config = {**config, **config["text_config"]}
    window = (_positive(info.get("context_length")) or _positive(info.get("max_context_length"))
              or _positive(server_info.get("context_length")) or _positive(config.get("max_position_embeddings")))
    bounds = [_positive(server_info.get("max_total_num_tokens"))]
    longest_prompt = _positive(server_info.get("max_req_input_len"))
    bounds.append(None if longest_prompt is None else longest_prompt + 1)
    for bound in bounds:
        if bound is not None:
            window = bound if window is None else min(window, bound)
    return window


def read_model_config(model_path: Any) -> dict[str, Any] | None:
    """``<model_path>/config.json`` when ``model_path`` is a readable local directory, else ``None``."""
    if not isinstance(model_path, str) or not model_path or not os.path.isdir(model_path):
        return None
    path = os.path.join(model_path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except OSError:
        return None
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return cfg


def discover_model_spec(info: Mapping[str, Any] | None, *, config: Mapping[str, Any] | None = None,
                        preset: ModelSpec | None = None, num_layers: int | None = None,
                        topk: int | None = None, num_experts: int | None = None,
                        name: str | None = None) -> tuple[ModelSpec, ShapeSource]:
    """The model shape the Proxy decodes R3 with, and where each number came from.

    ``info`` is the engine's model info; ``config`` its ``config.json`` (read from
    ``info["model_path"]`` when not given). Order: overrides, engine info, config, preset.
    Layers learnt from the engine or config are every hidden layer, so the spec they give has
    ``dense_layers=0`` and ``num_layers`` = the rows SGLang sends.
    """
    info = dict(info or {})
    if config is None:
        config = read_model_config(info.get("model_path"))
    from_engine = shape_from_config(info)
    from_config = shape_from_config(config or {})
    overrides = {"num_layers": num_layers, "topk": topk, "num_experts": num_experts}
    values: dict[str, int] = {}
    sources: dict[str, str] = {}
    for key, given in overrides.items():
        if given is not None:
            if _positive(given) is None:
                raise ConfigError(f"--{key.replace('_', '-')} must be a positive integer, got {given!r}")
            values[key], sources[key] = given, "override"
        elif key in from_engine:
            values[key], sources[key] = from_engine[key], "engine"
        elif key in from_config:
            values[key], sources[key] = from_config[key], "config.json"
        elif preset is not None:
            # A preset counts MoE layers; the engine sends every hidden layer.
            values[key] = preset.hidden_layers if key == "num_layers" else getattr(preset, key)
            sources[key] = "preset"
        else:
            raise ConfigError(
                f"the model's {key} is unknown: the engine's model info and config.json do not give it "
                f"(model_path {info.get('model_path')!r}); pass --{key.replace('_', '-')} or --model PRESET")
    vocab = from_engine.get("vocab_size") or from_config.get("vocab_size") or (preset.vocab_size if preset else None)
    label = name or (preset.name if preset is not None and set(sources.values()) == {"preset"} else None) \
        or str(info.get("model_path") or "engine-model")
    spec = ModelSpec(name=label, num_layers=values["num_layers"], topk=values["topk"],
                     num_experts=values["num_experts"], **({"vocab_size": vocab} if vocab else {}))
    return spec, ShapeSource(**sources)


async def fetch_model_spec(client: Any, **kwargs: Any) -> tuple[ModelSpec, ShapeSource, dict[str, Any]]:
    """:func:`discover_model_spec` from the engine's ``model_info()``; also returns that info."""
    info = await client.model_info()
    spec, source = discover_model_spec(info, **kwargs)
    return spec, source, info


def resolve_tokenizer(tokenizer: str | None, info: Mapping[str, Any] | None, *,
                      from_engine: bool = False) -> str:
    """The tokenizer the Proxy must use with this engine.

    A named tokenizer is kept. The byte tokenizer is only right for an engine that says it
    uses it (the built-in engine reports ``tokenizer_path: "byte"``); for any other engine the
    Proxy refuses to start, since byte ids sent to a real model are garbage, unless
    ``from_engine`` lets it take the engine's ``tokenizer_path`` (or ``model_path``).
    """
    if tokenizer not in (None, "", BYTE_TOKENIZER):
        return str(tokenizer)
    info = dict(info or {})
    engine_tok = info.get("tokenizer_path") or info.get("model_path")
    if engine_tok == BYTE_TOKENIZER:
        return BYTE_TOKENIZER
    if from_engine and isinstance(engine_tok, str) and engine_tok:
        return engine_tok
    raise EngineMismatchError(
        f"the engine serves {info.get('model_path')!r} with tokenizer {engine_tok!r}, but the Proxy would "
        "send it byte-tokenizer ids; start the Proxy with --tokenizer PATH (the model's tokenizer), or "
        "--tokenizer-from-engine to load the engine's tokenizer_path")


def with_shape(config: Any, spec: ModelSpec) -> Any:
    """A copy of a data-plane config (``model`` field) that decodes R3 with ``spec``."""
    return replace(config, model=spec)
