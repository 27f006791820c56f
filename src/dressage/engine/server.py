"""The engine's HTTP face: SGLang's endpoints on FastAPI, and ``EngineServer`` to run it.

``/generate`` (JSON or server-sent events), ``/abort_request`` (cuts in-flight generations at a
token boundary; they answer with their partial output and finish_reason ``abort``), ``/health``,
``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/flush_cache``,
``/get_weight_version``, ``/update_weight_version``, and SGLang's reply parsers ``/parse_function_call`` and
``/separate_reasoning`` when the server is handed the parsers (``reply_parsers``: the Proxy's, given by
whoever composes the engine). ``EngineServer.start_background()`` runs it in-process for tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from dressage.engine.config import EngineConfig
from dressage.engine.core import Engine, Generation
from dressage.engine.hf_backend import make_engine
from dressage.errors import EngineRequestError
from dressage.serving import UvicornServer

__all__ = ["create_app", "EngineServer"]


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _answer_bytes(out: dict[str, Any]) -> bytes:
    """JSON of one answer, splicing the base64 routed experts in instead of re-scanning them."""
    meta = out["meta_info"]
    b64 = meta.get("routed_experts")
    if not isinstance(b64, str):
        return _dumps(out)
    rest = {"text": out["text"], "output_ids": out["output_ids"],
            "meta_info": {k: v for k, v in meta.items() if k != "routed_experts"}}
    # meta_info is the last key and never empty, so the body ends with its "}}" closing braces;
    # base64 needs no JSON escaping.
    return _dumps(rest)[:-2] + b',"routed_experts":"' + b64.encode("ascii") + b'"}}'


def _sse(obj: Any) -> bytes:
    return b"data: " + (_answer_bytes(obj) if "meta_info" in obj else _dumps(obj)) + b"\n\n"


class _InFlight:
    """Abort events of the requests being generated, by rid."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}

    def add(self, rid: str) -> asyncio.Event:
        if rid in self.events:
            raise EngineRequestError(f"Duplicate request ID {rid!r}", status_code=400)
        ev = self.events[rid] = asyncio.Event()
        return ev

    def abort(self, rid: str | None, abort_all: bool) -> int:
        targets = list(self.events) if abort_all else ([rid] if rid in self.events else [])
        for r in targets:
            self.events[r].set()
        return len(targets)


def create_app(engine: Engine, reply_parsers: Any = None) -> FastAPI:
    """The FastAPI application serving ``engine`` with SGLang's routes.

    ``reply_parsers`` answers ``/parse_function_call`` and ``/separate_reasoning`` (an object with
    those two methods, body -> answer; :class:`dressage.proxy.parsers.ParseEndpoints`); without it
    both answer 404, as an SGLang server without parsers would not know the names asked for.
    """
    cfg = engine.config
    inflight = _InFlight()
    app = FastAPI(title="dressage engine (SGLang protocol)", docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.inflight = inflight

    def json_response(obj: Any, status: int = 200) -> Response:
        return Response(content=_dumps(obj), status_code=status, media_type="application/json")

    def error(status: int, message: str) -> Response:
        return json_response({"error": {"message": message}}, status)

    async def emit(gen: Generation, ev: asyncio.Event) -> dict[str, Any]:
        n, delay = gen.num_tokens, cfg.token_delay_s
        if delay <= 0 or n == 0:
            return engine.finish(gen, n, aborted=ev.is_set())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            await asyncio.wait_for(ev.wait(), timeout=n * delay)
        except asyncio.TimeoutError:
            return engine.finish(gen, n)
        return engine.finish(gen, min(n, int((loop.time() - t0) / delay)), aborted=True)

    async def stream(gen: Generation, ev: asyncio.Event) -> AsyncIterator[bytes]:
        try:
            loop = asyncio.get_running_loop()
            n, delay, step = gen.num_tokens, cfg.token_delay_s, cfg.stream_interval
            incremental = cfg.incremental_streaming_output
            t0, emitted, sent = loop.time(), 0, 0
            while emitted < n and not ev.is_set():
                target = min(n, emitted + step)
                if delay > 0:
                    try:
                        await asyncio.wait_for(ev.wait(), timeout=max(0.0, t0 + target * delay - loop.time()))
                    except asyncio.TimeoutError:
                        pass
                    if ev.is_set():
                        emitted = max(emitted, min(n, int((loop.time() - t0) / delay)))
                        break
                else:
                    await asyncio.sleep(0)  # let /abort_request and other requests in
                emitted = target
                if emitted < n:
                    yield _sse(engine.chunk(gen, emitted, sent if incremental else 0))
                    sent = emitted
            yield _sse(engine.finish(gen, emitted, aborted=ev.is_set(), since=sent if incremental else 0))
            yield b"data: [DONE]\n\n"
        finally:
            inflight.events.pop(gen.request.rid, None)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return error(400, f"the body is not valid JSON: {exc}")
        gens: list[Generation] = []
        events: list[asyncio.Event] = []
        try:
            reqs, batch = engine.parse(body)
            gens = [engine.start(r) for r in reqs]
            for g in gens:
                events.append(inflight.add(g.request.rid))
        except EngineRequestError as exc:
            for g in gens[:len(events)]:
                inflight.events.pop(g.request.rid, None)
            return error(exc.status_code or 400, str(exc))
        if gens[0].request.stream:
            return StreamingResponse(stream(gens[0], events[0]), media_type="text/event-stream")
        try:
            outs = await asyncio.gather(*(emit(g, e) for g, e in zip(gens, events)))
        finally:
            for g in gens:
                inflight.events.pop(g.request.rid, None)
        content = b"[" + b",".join(map(_answer_bytes, outs)) + b"]" if batch else _answer_bytes(outs[0])
        return Response(content=content, media_type="application/json")

    async def parse_route(request: Request, method: str) -> Response:
        if reply_parsers is None:
            return error(404, f"this engine serves no reply parsers ({method})")
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return error(400, f"the body is not valid JSON: {exc}")
        try:
            return json_response(getattr(reply_parsers, method)(body))
        except EngineRequestError as exc:
            return error(exc.status_code or 400, str(exc))

    @app.post("/parse_function_call")
    async def parse_function_call(request: Request) -> Response:
        return await parse_route(request, "parse_function_call")

    @app.post("/separate_reasoning")
    async def separate_reasoning(request: Request) -> Response:
        return await parse_route(request, "separate_reasoning")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError as exc:
            return error(400, f"the body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return error(400, "the /abort_request body must be a JSON object")
        inflight.abort(body.get("rid"), bool(body.get("abort_all", False)))
        return Response(status_code=200)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        probe = engine.parse({"input_ids": [0], "sampling_params": {"max_new_tokens": 1}})[0][0]
        engine.finish(engine.start(probe), 1)
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        return json_response(engine.model_info())

    @app.get("/get_server_info")
    async def get_server_info() -> Response:
        m = cfg.model
        info = {
            "model_path": cfg.model_name, "tokenizer_path": cfg.tokenizer, "served_model_name": cfg.model_name,
            "host": cfg.host, "port": cfg.port, "random_seed": cfg.seed, "context_length": cfg.context_length,
            "enable_return_routed_experts": True, "skip_tokenizer_init": False,
            "stream_interval": cfg.stream_interval, "incremental_streaming_output": cfg.incremental_streaming_output,
            "weight_version": engine.weight_version,
            "model_spec": dataclasses.asdict(m), "tool_call_rate": cfg.tool_call_rate,
            "token_delay_s": cfg.token_delay_s, "mean_response_tokens": cfg.mean_response_tokens,
            "internal_states": [{"num_running_reqs": len(inflight.events)}],
            "version": "dressage-engine",
        }
        return json_response(info)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        engine.flush_cache()
        return Response(content="Cache flushed.\n", status_code=200)

    @app.get("/get_weight_version")
    async def get_weight_version() -> Response:
        return json_response({"weight_version": engine.weight_version})

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return error(400, f"the body is not valid JSON: {exc}")
        new = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(new, str):
            return error(400, "new_version must be a string")
        if body.get("abort_all_requests"):
            inflight.abort(None, True)
        engine.weight_version = new
        return json_response({"success": True, "message": f"Weight version updated to {new}", "new_version": new})

    return app


class EngineServer(UvicornServer):
    """Runs the engine's app under uvicorn: blocking (``serve``) or on a thread (``start_background``)."""

    def __init__(self, config: EngineConfig | None = None, *, engine: Engine | None = None,
                 reply_parsers: Any = None) -> None:
        self.config = config or (engine.config if engine else EngineConfig())
        self.engine = engine or make_engine(self.config)
        super().__init__(create_app(self.engine, reply_parsers), host=self.config.host, port=self.config.port, name="engine",
                         log_level=self.config.log_level)
