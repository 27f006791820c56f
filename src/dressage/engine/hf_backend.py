"""The ``transformers`` backend: a real random-weight MoE model answers ``/generate``.

The model is ``dressage.engine.moe``'s small ``Qwen3MoeForCausalLM`` (seeded, built on CPU, no
download) on the engine's tokenizer. A reply's tokens follow the seeded planner of the built-in
engine (readable words, a ``<think>`` block when the template is in thinking mode, ``<tool_call>``
blocks when tools are offered) as constrained decoding would steer them; every logprob and every
routed expert comes from one forward pass of the model over prompt + reply, the pass a trainer
repeats with Rollout Routing Replay. ``model_info`` reports the model's true shape, and the
context window is the model's ``max_position_embeddings`` (40,960 positions, as Qwen3's), which a
prompt longer than it gets a 400 for.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dressage.engine.config import EngineConfig
from dressage.engine.core import Engine, Generation
from dressage.engine.protocol import GenerateRequest
from dressage.errors import ConfigError
from dressage.tokenizer import Tokenizer

__all__ = ["TransformersEngine", "make_engine"]


class TransformersEngine(Engine):
    """An :class:`Engine` whose logprobs and routing are a real MoE model's."""

    def __init__(self, config: EngineConfig, tokenizer: Tokenizer | None = None, *, model: Any = None) -> None:
        from dressage.engine.moe import build_moe_model

        super().__init__(config, tokenizer)
        vocab = max(self.tokenizer.vocab_size, config.model.vocab_size)
        self.moe = model if model is not None else build_moe_model(config.model.name, vocab_size=vocab, seed=config.seed)
        # The window is the model's: a longer prompt is refused with a 400 naming it, never run.
        positions = int(self.moe.model.config.max_position_embeddings)
        if config.context_length > positions:
            self.config = dataclasses.replace(config, context_length=positions)
        spec = config.model
        if (spec.num_layers, spec.topk, spec.num_experts) != (self.moe.router.num_layers, self.moe.topk,
                                                              self.moe.num_experts):
            raise ConfigError(
                f"model preset {spec.name!r} is {spec.num_layers} layers x top-{spec.topk} of {spec.num_experts}, "
                f"the {self.moe.name} model is {self.moe.router.num_layers} x top-{self.moe.topk} of "
                f"{self.moe.num_experts}")

    @property
    def vocab_size(self) -> int:
        return self.moe.vocab_size

    def start(self, req: GenerateRequest) -> Generation:
        gen = super().start(req)
        ids = gen.draft.ids
        if len(ids) == 0:
            return gen
        full = np.concatenate((gen.prompt, ids)).astype(np.int64)
        scores = self.moe.score(full, len(gen.prompt))
        gen.draft = dataclasses.replace(gen.draft, logprobs=scores.logprobs.astype(np.float32))
        gen.routed = scores.routed_experts
        return gen


def make_engine(config: EngineConfig, tokenizer: Tokenizer | None = None) -> Engine:
    """The engine of ``config.backend``."""
    if config.backend == "transformers":
        return TransformersEngine(config, tokenizer)
    return Engine(config, tokenizer)

