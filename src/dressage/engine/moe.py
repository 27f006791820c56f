"""A real MoE model on CPU: a small random-weight ``Qwen3MoeForCausalLM`` and routing replay.

``build_moe_model`` makes the model of a JSON config shipped in ``dressage/engine/models`` (seeded:
the same config and seed give the same weights bit for bit; nothing is downloaded). Weights are
float64, so that a forward pass gives the same log-probabilities whether it covers one call or a
whole multi-turn Segment (reported as float32). Attention is torch's fused causal
``scaled_dot_product_attention`` (no ``T x T`` score matrix is held) and log-probabilities are taken
a block of positions at a time, so a 32K-token prompt runs in well under a GiB of activations.

:class:`RouterControl` takes over every layer's router: it records the top-k expert ids per token
per layer (what an engine returns as ``routed_experts``), or forces the experts to given ids
(Rollout Routing Replay) while the routing weights still come from the model's own router
probabilities at those experts. ``score`` runs one forward pass and returns both.

``torch`` and ``transformers`` are needed (the ``hf`` extra); they are imported when a model is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dressage.errors import ConfigError, FieldShapeError

__all__ = ["MoEModel", "build_moe_model", "MOE_CONFIGS", "RouterControl", "Scores"]

_DIR = Path(__file__).with_name("models")
_LOGIT_ROWS = 512
MOE_CONFIGS = tuple(sorted(p.stem for p in _DIR.glob("*.json")))


def _imports() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigError("the transformers backend needs torch and transformers (pip install 'dressage[hf]')") from exc
    return torch, transformers


class RouterControl:
    """Records or forces the top-k experts of every MoE layer of a Qwen3-MoE model."""

    def __init__(self, model: Any) -> None:
        torch, _ = _imports()
        self._torch = torch
        self.gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        if not self.gates:
            raise ConfigError("the model has no routed MoE layers")
        if not all(hasattr(g, "top_k") and hasattr(g, "weight") for g in self.gates):
            raise ConfigError("this transformers version's Qwen3-MoE router is not the top-k router module "
                              "routing replay drives (transformers >= 5.24 has it)")
        self.forced: Any = None          # LongTensor [T, layers, topk] or None
        self.recorded: list[Any] = []
        for i, gate in enumerate(self.gates):
            gate.forward = self._make_forward(i, gate)

    @property
    def num_layers(self) -> int:
        return len(self.gates)

    def _make_forward(self, layer: int, gate: Any) -> Any:
        torch = self._torch

        def forward(hidden_states: Any) -> tuple[Any, Any, Any]:
            hidden = hidden_states.reshape(-1, gate.hidden_dim)
            logits = torch.nn.functional.linear(hidden, gate.weight)
            probs = torch.softmax(logits, dim=-1)  # in the model's dtype (float64 here)
            if self.forced is None:
                _, idx = torch.topk(probs, gate.top_k, dim=-1)
            else:
                idx = self.forced[:, layer, :]
            top = probs.gather(-1, idx)
            if gate.norm_topk_prob:
                top = top / top.sum(dim=-1, keepdim=True)
            self.recorded.append(idx)
            return logits, top.to(logits.dtype), idx

        return forward


@dataclass(slots=True)
class Scores:
    """One forward pass over ``tokens[:-1]``."""

    routed_experts: np.ndarray
    """int32 ``[len(tokens) - 1, layers, topk]``: the experts each position was routed to."""
    logprobs: np.ndarray
    """float64 log-probabilities of ``tokens[score_from:]`` given what precedes each."""


class MoEModel:
    """A built model with its router control; ``score`` is the one forward pass both sides use."""

    def __init__(self, name: str, model: Any, config: dict[str, Any]) -> None:
        self.name = name
        self.model = model
        self.config = config
        self.router = RouterControl(model)
        self.num_experts = int(config["num_experts"])
        self.topk = int(config["num_experts_per_tok"])
        self.vocab_size = int(model.config.vocab_size)

    def score(self, tokens: Any, score_from: int, *, routed_experts: Any = None) -> Scores:
        """Routing of every position of ``tokens[:-1]`` and logprobs of ``tokens[score_from:]``.

        With ``routed_experts`` (``[len(tokens) - 1, layers, topk]``) the experts are forced to those ids.
        """
        torch = self.router._torch
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or len(ids) < 2 or not 0 < score_from < len(ids):
            raise FieldShapeError(f"score needs >= 2 tokens and 0 < score_from < {len(ids)}, got {score_from}")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise FieldShapeError(f"token ids outside [0, {self.vocab_size})")
        n = len(ids) - 1
        if routed_experts is not None:
            forced = np.asarray(routed_experts)
            want = (n, self.router.num_layers, self.topk)
            if forced.shape != want:
                raise FieldShapeError(f"routed_experts has shape {list(forced.shape)}, expected {list(want)}")
            if forced.size and (forced.min() < 0 or forced.max() >= self.num_experts):
                raise FieldShapeError(f"routed expert ids outside [0, {self.num_experts})")
            self.router.forced = torch.from_numpy(forced.astype(np.int64))
        self.router.recorded = []
        try:
            with torch.no_grad():
                inp = torch.from_numpy(ids[:-1]).unsqueeze(0)
                hidden = self.model.model(input_ids=inp).last_hidden_state[0][score_from - 1:]
                target = torch.from_numpy(ids[score_from:]).unsqueeze(1)
                # Vocabulary-wide logits a block of positions at a time: each row's value does not
                # depend on the block, and a long reply never holds [reply, vocab] at once.
                picked = torch.cat([
                    torch.log_softmax(self.model.lm_head(hidden[i:i + _LOGIT_ROWS]), dim=-1)
                    .gather(1, target[i:i + _LOGIT_ROWS])[:, 0]
                    for i in range(0, hidden.shape[0], _LOGIT_ROWS)])
            rows = torch.stack(self.router.recorded, dim=1)
        finally:
            self.router.forced = None
            self.router.recorded = []
        return Scores(rows.numpy().astype(np.int32), picked.numpy().astype(np.float64))

    def perturbed(self, scale: float, seed: int = 1) -> "MoEModel":
        """A copy whose weights moved by ``scale`` x N(0, 1) noise (a trainer one update later)."""
        torch = self.router._torch
        model = build_moe_model(self.name, vocab_size=self.vocab_size, seed=int(self.config["seed"])).model
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
        return MoEModel(self.name, model, self.config)


def build_moe_model(name: str = "tiny-qwen3-moe", *, vocab_size: int, seed: int | None = None) -> MoEModel:
    """The model of ``dressage/engine/models/<name>.json`` with random weights from ``seed``."""
    torch, transformers = _imports()
    path = _DIR / f"{name}.json"
    if not path.is_file():
        raise ConfigError(f"unknown MoE model {name!r}; known: {', '.join(MOE_CONFIGS)}")
    raw = json.loads(path.read_text())
    cfg = dict(raw)
    cfg["seed"] = int(raw.get("seed", 0) if seed is None else seed)
    router_std = float(cfg.pop("router_init_std", cfg["initializer_range"]))
    seed_value = cfg.pop("seed")
    config = transformers.Qwen3MoeConfig(vocab_size=int(vocab_size), **cfg)
    # The plain per-expert loop runs in float64 on any CPU. Attention is torch's fused causal kernel:
    # eager attention holds a float64 [heads, T, T] score matrix (and its softmax), 20 GB at 17K tokens.
    config._experts_implementation = "eager"
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed_value)
    model = transformers.Qwen3MoeForCausalLM(config).to(torch.float64).eval()
    gen = torch.Generator().manual_seed(seed_value + 1)
    with torch.no_grad():
        # Spread-out router weights, so that routing depends on the token and its context.
        for layer in model.model.layers:
            gate = layer.mlp.gate
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=gen, dtype=gate.weight.dtype) * router_std)
    return MoEModel(name, model, {**cfg, "seed": seed_value})
