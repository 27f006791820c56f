"""The engines a Proxy talks to, and the start-up check against what they serve.

:func:`engine_clients` makes one client per configured engine (a :class:`RouterClient` behind
``--router``, the engine API key on every call); :func:`engine_pool` puts them in the pool (a router
in ``discovery`` mode gives the pool of its workers). :func:`check_router_r3` refuses a ``data_path``
router that drops the R3 fields. :func:`check_engine` compares each engine's model
info (``/model_info`` or ``/get_model_info``, plus the model's ``config.json`` when the Proxy can
read it) with the Proxy's ``--model`` and tokenizer before anything is served:

- **Shape** (only with R3 on: R3 rows are decoded with it): layers, top-k and experts the engine
  tells must fit the preset. A preset's layer count may be its MoE layers or every hidden layer
  (SGLang sends a row for each, dense ones included); when the engine sends every hidden layer
  the Proxy decodes that many rows. ``--num-layers`` / ``--topk`` / ``--num-experts`` override.
- **Tokenizer**: a Proxy on the byte tokenizer refuses an engine that serves a real model, or
  takes the engine's ``tokenizer_path`` with ``--tokenizer-from-engine``.
- **Context window**: what the engines tell (model info, ``/get_server_info``, ``config.json``; see
  :func:`~dressage.proxy.engines.model_shape.context_window`), the smallest of them, so that a
  prompt no engine can take is refused by the Proxy before any stream opens.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dressage.errors import EngineError, EngineMismatchError, EngineNotSglangError, EngineUnavailable
from dressage.fields.models import ModelSpec
from dressage.proxy.engines.model_shape import ShapeSource, context_window, discover_model_spec, read_model_config, \
    resolve_tokenizer, shape_from_config
from dressage.proxy.engines.discovery import RouterDiscovery
from dressage.proxy.engines.pool import EnginePool
from dressage.proxy.engines.private_loop import run_on_private_loop
from dressage.proxy.engines.router_client import RouterClient
from dressage.proxy.engines.sglang_client import SGLangClient

__all__ = ["engine_clients", "engine_pool", "fetch_engine_infos", "check_engine", "check_router_r3", "EngineCheck"]

INFO_TIMEOUT_S = 30.0


def engine_clients(engines: Any, *, transport: Any = None) -> list[SGLangClient]:
    """One client per engine URL of ``engines`` (an EnginesConfig)."""
    cls = RouterClient if engines.router else SGLangClient
    kw = {} if transport is None else {"transport": transport}
    return [cls(url, timeout=engines.request_timeout_s, api_key=engines.engine_api_key,
                max_answer_bytes=engines.max_answer_bytes, **kw) for url in engines.urls]


def engine_pool(engines: Any, clients: Sequence[Any]) -> EnginePool:
    """The pool over ``clients``; one router in ``discovery`` mode gives a pool of the workers it lists
    (listed once here, then refreshed with the health checks)."""
    kw = {"failures_to_remove": engines.health_check_failures}
    if engines.router_mode == "discovery" and len(clients) == 1 and getattr(clients[0], "is_router", False):
        discovery = RouterDiscovery(clients[0])
        pool = EnginePool([], discovery=discovery, **kw)
        pool.sync(discovery.list_blocking())
        return pool
    return EnginePool(clients, **kw)


@dataclass(frozen=True, slots=True)
class EngineCheck:
    """What the check settled: the model spec R3 is decoded with, where its numbers came from,
    and the tokenizer to load."""

    model: ModelSpec
    source: ShapeSource | None
    """``None`` when the shape was not checked (R3 off and no overrides)."""
    tokenizer: str
    model_path: str | None = None
    """The first engine's ``model_path`` (what it serves: the parsers' default follows its name)."""
    context_length: int | None = None
    """The smallest context window the engines tell (``None``: none tells one)."""

    def describe(self) -> str:
        m = self.model
        where = "" if self.source is None else " from " + ", ".join(
            f"{k}: {v}" for k, v in self.source.to_dict().items())
        window = "" if self.context_length is None else f", context window {self.context_length} tokens"
        return (f"model {m.name} ({m.num_layers} R3 layers, top-{m.topk} of {m.num_experts}{where}), "
                f"tokenizer {self.tokenizer}{window}")


def fetch_engine_infos(engines: Any, *, transport: Any = None, timeout_s: float = INFO_TIMEOUT_S,
                       wait_s: float = 0.0, retry_s: float = 0.5) -> list[dict[str, Any]]:
    """Each engine's model info, asked on a private loop (the Proxy's own loop is not running yet).

    Its ``server_info`` key holds the engine's ``/get_server_info`` answer (``{}`` when it has none:
    a router may not forward it), where SGLang tells its context window.

    An engine that cannot be reached (or answers 5xx) is asked again for up to ``wait_s``: it may
    still be loading. Raises :class:`EngineUnavailable` naming the engine and the cause when one
    does not answer.
    """
    async def info_of(client: SGLangClient) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            try:
                return await client.model_info(timeout=timeout_s)
            except EngineUnavailable:
                if asyncio.get_running_loop().time() + retry_s > deadline:
                    raise
                await asyncio.sleep(retry_s)

    async def ask() -> list[dict[str, Any]]:
        out = []
        for url in engines.urls:
            # The model info comes from a worker; a router forwards it.
            client = SGLangClient(url, timeout=timeout_s, api_key=engines.engine_api_key,
                                  max_answer_bytes=engines.max_answer_bytes,
                                  **({} if transport is None else {"transport": transport}))
            try:
                info = await info_of(client)
                try:
                    info["server_info"] = await client.server_info(timeout=timeout_s)
                except EngineError:
                    info["server_info"] = {}
                out.append(info)
            except EngineNotSglangError as exc:  # one line: what answered, not the page it sent
                raise EngineNotSglangError(f"--engine-url: {exc}; point it at an SGLang server or router, or pass "
                                           "--skip-engine-check to start without this check") from None
            except EngineError as exc:
                raise EngineUnavailable(
                    f"the engine at {url} did not answer its model info: {exc}. Start the engine first (or point "
                    "--engine-url at it), or pass --skip-engine-check to start without this check") from exc
            finally:
                await client.close()
        return out

    return run_on_private_loop(ask, name="dressage-engine-check")


def check_router_r3(config: Any, *, transport: Any = None, timeout_s: float = INFO_TIMEOUT_S) -> None:
    """With R3 on behind a ``data_path`` router, send one tiny ``/generate`` through it and refuse to
    start (:class:`EngineMismatchError`) when the answer has no ``meta_info.routed_experts``: the
    router rebuilt the body without ``return_routed_experts``. No-op in every other setting."""
    engines = config.engines
    if not (engines.router and engines.router_mode == "data_path" and config.data_plane.use_rollout_routing_replay):
        return

    async def ask() -> Any:
        client = SGLangClient(engines.urls[0], timeout=timeout_s, api_key=engines.engine_api_key,
                              **({} if transport is None else {"transport": transport}))
        try:
            return await client.generate([1, 2, 3], {"max_new_tokens": 1, "temperature": 0.0},
                                         return_routed_experts=True, routed_experts_start_len=0)
        finally:
            await client.close()

    try:
        answer = run_on_private_loop(ask, name="dressage-router-r3-check")
    except EngineError as exc:
        raise EngineUnavailable(f"the R3 check through the router {engines.urls[0]} failed: {exc}") from exc
    meta = answer.get("meta_info")
    if not isinstance(meta, Mapping) or meta.get("routed_experts") is None:
        raise EngineMismatchError(
            f"R3 is on, but a /generate through the router {engines.urls[0]} came back without "
            "meta_info.routed_experts: the router dropped return_routed_experts from the request (sglang-router "
            "rebuilds /generate bodies). Use --router-mode discovery (the Proxy sends /generate to the workers "
            "itself), or turn R3 off")


def _engine_shape(info: Mapping[str, Any]) -> dict[str, int]:
    shape = shape_from_config(read_model_config(info.get("model_path")) or {})
    shape.update(shape_from_config(info))  # what the engine itself says wins over its config.json
    return shape


def _compare(url: str, info: Mapping[str, Any], preset: ModelSpec, shape: Mapping[str, int],
             overridden: set[str]) -> list[str]:
    wrong = []
    layers = shape.get("num_layers")
    if "num_layers" not in overridden and layers is not None and layers not in (preset.num_layers, preset.hidden_layers):
        counted = f"{preset.num_layers}" if not preset.dense_layers else \
            f"{preset.num_layers} MoE + {preset.dense_layers} dense = {preset.hidden_layers}"
        wrong.append(f"layers {layers} (the model's) vs {counted} (the preset's)")
    for key in ("topk", "num_experts"):
        if key not in overridden and key in shape and shape[key] != getattr(preset, key):
            wrong.append(f"{key} {shape[key]} (the model's) vs {getattr(preset, key)} (the preset's)")
    return wrong


def check_engine(config: Any, infos: Sequence[Mapping[str, Any]], urls: Sequence[str] | None = None) -> EngineCheck:
    """Check a ProxyConfig against its engines' model infos (one per engine, in order)."""
    urls = list(urls if urls is not None else config.engines.urls)
    dp = config.data_plane
    preset = dp.model
    overrides = {"num_layers": config.num_layers, "topk": config.topk, "num_experts": config.num_experts}
    overridden = {k for k, v in overrides.items() if v is not None}
    tokenizers = {resolve_tokenizer(config.tokenizer, info, from_engine=config.tokenizer_from_engine)
                  for info in infos}
    if len(tokenizers) > 1:
        raise EngineMismatchError(f"the engines name different tokenizers {sorted(tokenizers)}; give --tokenizer")
    tokenizer = tokenizers.pop() if tokenizers else config.tokenizer
    served = next((str(i["model_path"]) for i in infos if i.get("model_path")), None)
    windows = [w for w in (context_window(info, info.get("server_info")) for info in infos) if w is not None]
    window = min(windows) if windows else None
    if not dp.use_rollout_routing_replay and not overridden:
        return EngineCheck(preset, None, tokenizer, served, window)
    model, source = preset, None
    for url, info in zip(urls, infos):
        shape = _engine_shape(info)
        wrong = _compare(url, info, preset, shape, overridden)
        if wrong:
            raise EngineMismatchError(
                f"the engine at {url} serves {info.get('model_path')!r}, whose shape does not fit the Proxy's "
                f"--model {preset.name}: {'; '.join(wrong)}. Pass the --model preset of that model, or "
                "--num-layers / --topk / --num-experts to give its shape")
        spec, src = discover_model_spec(info, config=read_model_config(info.get("model_path")) or {}, preset=preset,
                                        name=preset.name, **overrides)
        if not overridden and spec.num_layers == preset.num_layers:
            spec = preset  # the engine sends the preset's rows: keep the preset as it is
        if model is not preset and (spec.num_layers, spec.topk, spec.num_experts) != \
                (model.num_layers, model.topk, model.num_experts):
            raise EngineMismatchError(f"the engines serve different model shapes: {model} and {spec} ({url})")
        model, source = spec, src
    return EngineCheck(model, source, tokenizer, served, window)
