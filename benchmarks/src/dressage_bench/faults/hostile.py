"""A hostile engine: SGLang's ``/generate`` answering with what a broken or malicious engine may send.

``HostileEngine.mode`` picks the answer of the next calls (set it between calls): token ids
outside the vocabulary or outside 32 bits, NaN / Infinity logprobs, a body that is not an object,
and for streamed calls a good first chunk followed by one that is not JSON or not SGLang's shape.
``ok`` answers well (two tokens, ``Hi``). The Proxy must answer each bad one with a typed 502 (a
streamed call: an SSE error event, then ``[DONE]``) and record nothing.

:data:`BOUND_MODES` are answers without end: one that declares :data:`HUGE_BYTES` (and sends zeros
until the reader leaves), one of that size sent chunked without a length, a streamed line that never
ends, and a stream of keep-alive comments only. The Proxy must cut each (a typed 502 for the sizes, a
504 for the keep-alives once its ``--request-timeout`` passed) holding no more than its cap.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from dressage.serving import UvicornServer

__all__ = ["HostileEngine", "MODES", "STREAM_MODES", "BOUND_MODES", "HUGE_BYTES"]

OK_IDS = [72, 105]  # "Hi" in the byte tokenizer

MODES = ("oov_token", "huge_token", "negative_token", "nan_logprob", "inf_logprob", "null_logprob", "not_object",
         "ids_disagree", "not_json", "positive_logprob", "tiny_logprob")
"""Bad non-streamed answers."""
STREAM_MODES = ("stream_not_json", "stream_not_object", "stream_bad_ids", "stream_nan", "stream_cut")
"""Bad streamed answers (each after one good chunk)."""
BOUND_MODES = ("huge_declared", "huge_chunked", "stream_huge_line", "stream_keepalive")
"""Answers without end (see the module's docstring)."""
HUGE_BYTES = 2 * 1024**3
"""What the unbounded answers declare or would send: 2 GiB."""
_PIECE = b" " * (1024 * 1024)


def _answer(ids: list[int], lps: list[Any], finish: str = "stop") -> dict[str, Any]:
    return {"text": "", "output_ids": ids,
            "meta_info": {"id": "hostile", "finish_reason": {"type": finish}, "prompt_tokens": 1,
                          "completion_tokens": len(ids),
                          "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}}


def _body(mode: str) -> Any:
    bad = {"oov_token": ([72, 100_000], [-0.1, -0.2]), "huge_token": ([72, 2**40], [-0.1, -0.2]),
           "negative_token": ([72, -5], [-0.1, -0.2]), "nan_logprob": (OK_IDS, [-0.1, float("nan")]),
           "inf_logprob": (OK_IDS, [float("-inf"), -0.2]), "null_logprob": (OK_IDS, [None, -0.2]),
           "positive_logprob": (OK_IDS, [-0.1, 0.5]), "tiny_logprob": (OK_IDS, [-0.1, -1e300])}
    if mode in bad:
        return _answer(*bad[mode])
    if mode == "not_object":
        return [1, 2, 3]
    if mode == "ids_disagree":
        out = _answer(OK_IDS, [-0.1, -0.2])
        out["output_ids"] = [72, 106]
        return out
    return _answer(OK_IDS, [-0.1, -0.2])


def _sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _stream(mode: str) -> list[bytes]:
    first = _answer(OK_IDS[:1], [-0.1], finish="")
    first["meta_info"]["finish_reason"] = None
    frames = [_sse(first)]
    if mode == "stream_not_json":
        frames.append(b"data: {not json\n\n")
    elif mode == "stream_not_object":
        frames.append(_sse([1, 2]))
    elif mode == "stream_bad_ids":
        frames.append(_sse({"output_ids": ["x"], "meta_info": {"finish_reason": {"type": "stop"}}}))
    elif mode == "stream_nan":
        frames.append(_sse(_answer(OK_IDS, [-0.1, float("nan")])))
    elif mode == "stream_cut":
        pass  # ends with no finished chunk
    else:
        frames.append(_sse(_answer(OK_IDS, [-0.1, -0.2])))
    if mode != "stream_cut":
        frames.append(b"data: [DONE]\n\n")
    return frames


async def _endless(first: bytes = b"", piece: bytes = _PIECE, pause_s: float = 0.0):
    """``first``, then ``piece`` after ``piece`` until :data:`HUGE_BYTES` were sent or the reader left."""
    yield first
    sent = len(first)
    while sent < HUGE_BYTES:
        if pause_s:
            await asyncio.sleep(pause_s)
        yield piece
        sent += len(piece)


def _unbounded(mode: str) -> Response:
    if mode == "huge_declared":
        return StreamingResponse(_endless(), media_type="application/json",
                                 headers={"content-length": str(HUGE_BYTES)})
    if mode == "huge_chunked":
        return StreamingResponse(_endless(b'{"text": "'), media_type="application/json")
    if mode == "stream_huge_line":
        return StreamingResponse(_endless(b'data: {"text": "'), media_type="text/event-stream")
    # keep-alive comments only, every 50 ms: each one is a line, none is an answer
    return StreamingResponse(_endless(piece=b": keep-alive\n\n", pause_s=0.05), media_type="text/event-stream")


def create_app(engine: "HostileEngine") -> Any:
    app = FastAPI()

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await request.json()
        engine.calls += 1
        if engine.mode in BOUND_MODES:
            return _unbounded(engine.mode)
        if body.get("stream"):
            async def frames():
                for frame in _stream(engine.mode):
                    yield frame
            return StreamingResponse(frames(), media_type="text/event-stream")
        if engine.mode == "not_json":
            return Response(b"<html>oops</html>", media_type="text/html")
        return Response(json.dumps(_body(engine.mode)).encode(), media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/abort_request")
    async def abort() -> dict[str, str]:
        return {"status": "ok"}

    return app


class HostileEngine(UvicornServer):
    """The hostile engine on loopback; ``mode`` is read by every call."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode, self.calls = mode, 0
        super().__init__(create_app(self), name="hostile-engine")
