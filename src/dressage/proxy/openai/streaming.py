"""OpenAI ``chat.completion.chunk`` server-sent events for streamed chat calls.

Content is streamed only where the parser is sure it is content (not the start of a tool-call
or reasoning block); the rest follows once the engine finished and the step was recorded, so the
deltas an agent accumulates add up to the recorded assistant message.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Iterable, Iterator

__all__ = ["error_body", "error_payload", "agent_message", "sse", "DONE", "KEEPALIVE", "HEARTBEAT", "ChunkWriter", "ContentStream", "stream_completion", "replay_chunks",
           "aiter_frames", "opened", "unsent_tail"]

log = logging.getLogger("dressage.proxy")

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
"""An SSE comment: clients ignore it, connections and read time-outs stay alive."""
HEARTBEAT = b": dressage-heartbeat\n\n"
"""The comment a quiet stream sends every ``server.stream_heartbeat_interval_s`` (upstream's words)."""


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_payload(exc: Any) -> dict[str, Any]:
    """The OpenAI error object of a Dressage error: its ``agent_message``, ``openai_type``, ``param`` and
    ``code`` (or class name), and its ``details`` when it carries some. Where the agent's message
    leaves out internals (an engine URL, say), the whole message goes to the Proxy's log."""
    code = getattr(exc, "code", None) or type(exc).__name__
    message = agent_message(exc)
    body = error_body(message, exc.openai_type, param=getattr(exc, "param", None), code=code)
    if getattr(exc, "details", None):
        body["error"]["details"] = exc.details
    if getattr(exc, "upstream_detail", False):
        # Upstream Dressage's shape beside ours: its harness reads ``detail.error``.
        body["detail"] = {"error": code, "message": message, **(getattr(exc, "details", None) or {})}
    return body


def agent_message(exc: Any) -> str:
    """What an agent is told of ``exc`` (see :attr:`dressage.errors.DressageError.agent_message`);
    the Proxy's log keeps the whole message when the two differ."""
    message = getattr(exc, "agent_message", None) or str(exc)
    if message != str(exc):
        log.warning("%s answered as %r: %s", type(exc).__name__, message, exc)
    return message


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


class ChunkWriter:
    """Frames deltas of one completion as SSE chunks (same id, created and model in each)."""

    def __init__(self, completion_id: str, model: str, created: int) -> None:
        self.completion_id, self.model, self.created = completion_id, model, int(created)

    def _base(self) -> dict[str, Any]:
        return {"id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None, *, index: int = 0,
              logprobs: dict[str, Any] | None = None) -> bytes:
        body = self._base()
        body["choices"] = [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}]
        return sse(body)

    def usage(self, usage: dict[str, Any]) -> bytes:
        # stream_options.include_usage: a last chunk with no choices and the call's usage.
        body = self._base()
        body["choices"] = []
        body["usage"] = usage
        return sse(body)


def _tool_call_deltas(calls: list[dict[str, Any]], first: int = 0) -> list[dict[str, Any]]:
    return [{"index": first + i, "id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for i, c in enumerate(calls)]


def unsent_tail(final: str, sent: str) -> str:
    """What a stream still owes of a reply's ``final`` text after it showed ``sent``: what was sent stays,
    the rest is added (the parser strips the text around tool calls, so ``sent`` may carry blanks ``final``
    lost); nothing when the two parted ways."""
    if final.startswith(sent):
        return final[len(sent):]
    if final.strip().startswith(sent.strip()):
        return final.strip()[len(sent.strip()):]
    return ""


class ContentStream:
    """Turns successive decoded texts of one reply into content / reasoning deltas, and, given the
    reply's ``call_id_prefix``, tool-call deltas for each call once it is complete."""

    def __init__(self, parser: Any, *, call_id_prefix: str | None = None, tools: Any = None) -> None:
        self.parser = parser
        self.sent_content = ""
        self.sent_reasoning = False
        self.call_id_prefix, self.tools = call_id_prefix, tools
        self.sent_calls: list[dict[str, Any]] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas that ``text`` (the whole reply decoded so far) makes certain."""
        reasoning, content = self.parser.stream_prefix(text)
        out: list[dict[str, Any]] = []
        if reasoning is not None and not self.sent_reasoning:
            self.sent_reasoning = True
            out.append({"reasoning_content": reasoning})
        if len(content) > len(self.sent_content) and content.startswith(self.sent_content):
            out.append({"content": content[len(self.sent_content):]})
            self.sent_content = content
        if self.call_id_prefix is not None:
            calls = self.parser.stream_calls(text, call_id_prefix=self.call_id_prefix, tools=self.tools)
            if len(calls) > len(self.sent_calls) and calls[:len(self.sent_calls)] == self.sent_calls:
                out.append({"tool_calls": _tool_call_deltas(calls[len(self.sent_calls):], len(self.sent_calls))})
                self.sent_calls = calls
        return out

    def finish(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """The deltas that complete the recorded ``message`` after what was already sent."""
        out: list[dict[str, Any]] = []
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not self.sent_reasoning:
            out.append({"reasoning_content": reasoning})
        rest = unsent_tail(message.get("content") or "", self.sent_content)
        if rest:
            out.append({"content": rest})
        calls = message.get("tool_calls") or []
        sent = len(self.sent_calls) if calls[:len(self.sent_calls)] == self.sent_calls else 0
        if calls[sent:]:
            out.append({"tool_calls": _tool_call_deltas(calls[sent:], sent)})
        return out


async def stream_completion(writer: ChunkWriter, parser: Any, events: AsyncIterator[Any], *,
                            include_usage: bool, call_id_prefix: str | None = None,
                            tools: Any = None) -> AsyncIterator[bytes]:
    """SSE frames of one streamed call.

    ``events`` are the call's: decoded text so far (``str``), keep-alives (``None``) and last the
    recorded chat completion (``dict``); the frames after it complete the message exactly as it was
    recorded. With ``call_id_prefix`` (the ids the reply's calls get) each tool call is sent as soon as
    it is complete.
    """
    content = ContentStream(parser, call_id_prefix=call_id_prefix, tools=tools)
    role = writer.chunk({"role": "assistant", "content": ""})
    response = None
    async for event in events:
        if role is not None:
            # Only once the engine answered (see opened): a refusal before it is a plain error status.
            yield role
            role = None
        if event is None:
            yield KEEPALIVE
        elif isinstance(event, str):
            for delta in content.feed(event):
                yield writer.chunk(delta)
        else:
            response = event
    choice = response["choices"][0]
    for delta in content.finish(choice["message"]):
        yield writer.chunk(delta)
    # The reply's token logprobs come whole with its last chunk (clients concatenate them).
    yield writer.chunk({}, choice["finish_reason"], logprobs=choice.get("logprobs"))
    if include_usage:
        yield writer.usage(response["usage"])
    yield DONE


def replay_chunks(response: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """A recorded (non-streamed) completion as a complete SSE stream: each choice in turn, by its index
    (a retried turn asking for stream, or a call whose replies are checked before they are shown)."""
    writer = ChunkWriter(response["id"], response["model"], response["created"])
    for choice in response["choices"]:
        index = choice.get("index", 0)
        yield writer.chunk({"role": "assistant", "content": ""}, index=index)
        for delta in ContentStream(_NoStream()).finish(choice["message"]):
            yield writer.chunk(delta, index=index)
        yield writer.chunk({}, choice["finish_reason"], index=index, logprobs=choice.get("logprobs"))
    if include_usage:
        yield writer.usage(response["usage"])
    yield DONE


class _NoStream:
    def stream_prefix(self, text: str) -> tuple[str | None, str]:
        return None, ""


async def opened(frames: AsyncIterator[bytes], heartbeat_s: float = 0.0) -> AsyncIterator[bytes]:
    """``frames`` once their first frame is there, which a streamed call sends only after the
    engine answered: a call the engine refuses (or that fails) before then raises here, so that the
    agent gets a plain error status instead of a 200 stream that carries the error.

    ``heartbeat_s`` > 0: whenever the stream has sent nothing for that long (a long prefill, a slow
    engine), a :data:`HEARTBEAT` comment goes out, so that idle time-outs in between do not cut it."""
    first = await frames.__anext__()

    async def resumed() -> AsyncIterator[bytes]:
        try:
            yield first
            async for frame in frames:
                yield frame
        finally:
            await frames.aclose()

    async def beating() -> AsyncIterator[bytes]:
        pending: asyncio.Future | None = None
        try:
            yield first
            while True:
                pending = asyncio.ensure_future(frames.__anext__())
                while not (await asyncio.wait({pending}, timeout=heartbeat_s))[0]:
                    yield HEARTBEAT
                try:
                    frame = pending.result()
                except StopAsyncIteration:
                    return
                finally:
                    pending = None
                yield frame
        finally:
            if pending is not None:  # the client left while a frame was awaited: stop that first
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await frames.aclose()

    return beating() if heartbeat_s > 0 else resumed()


async def aiter_frames(frames: Iterable[bytes]) -> AsyncIterator[bytes]:
    for frame in frames:
        yield frame
