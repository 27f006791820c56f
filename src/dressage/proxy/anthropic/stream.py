"""Server-sent events of a streamed Messages call (``message_start`` ... ``message_stop``).

Text is streamed as the chat stream streams it (:class:`dressage.proxy.openai.streaming.ContentStream`:
only what is certainly content); a thinking block follows whole once its reasoning is closed, and
``tool_use`` blocks once the step is recorded, so the blocks a client accumulates are exactly the
Message a non-streamed call returns.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable, Iterator

from dressage.proxy.anthropic.protocol import THINKING_SIGNATURE, error_object
from dressage.proxy.openai.streaming import ContentStream, unsent_tail

__all__ = ["event", "error_event", "stream_message", "replay_message"]


def event(kind: str, **fields: Any) -> bytes:
    """One SSE frame: ``event: KIND`` and its JSON body (whose ``type`` is ``KIND``)."""
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"), ensure_ascii=False)
    return f"event: {kind}\ndata: {data}\n\n".encode("utf-8")


def error_event(status: int, message: str) -> bytes:
    """The ``error`` event that ends a stream whose call failed after the 200 status line."""
    body = error_object(status, message)
    return event("error", error=body["error"])


def _start(message: dict[str, Any]) -> bytes:
    shell = dict(message, content=[], stop_reason=None, stop_sequence=None,
                 usage=dict(message["usage"], output_tokens=0))
    return event("message_start", message=shell)


class _Blocks:
    """Content blocks as they are streamed: opened live, then closed (or sent whole) from the final Message."""

    def __init__(self) -> None:
        self.count = 0
        self.text_at: int | None = None
        self.sent_text = ""
        self.thinking_sent = False

    def thinking(self, text: str) -> Iterator[bytes]:
        index, self.count = self.count, self.count + 1
        self.thinking_sent = True
        yield event("content_block_start", index=index,
                    content_block={"type": "thinking", "thinking": "", "signature": ""})
        if text:
            yield event("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": text})
        yield event("content_block_delta", index=index,
                    delta={"type": "signature_delta", "signature": THINKING_SIGNATURE})
        yield event("content_block_stop", index=index)

    def text(self, delta: str) -> Iterator[bytes]:
        if self.text_at is None:
            self.text_at, self.count = self.count, self.count + 1
            yield event("content_block_start", index=self.text_at, content_block={"type": "text", "text": ""})
        if delta:
            self.sent_text += delta
            yield event("content_block_delta", index=self.text_at, delta={"type": "text_delta", "text": delta})

    def close_text(self, final: str | None) -> Iterator[bytes]:
        if final is not None:
            rest = unsent_tail(final, self.sent_text) if self.text_at is not None else final
            yield from self.text(rest)
        if self.text_at is not None:
            yield event("content_block_stop", index=self.text_at)
            self.text_at = None

    def tool_use(self, block: dict[str, Any]) -> Iterator[bytes]:
        index, self.count = self.count, self.count + 1
        yield event("content_block_start", index=index, content_block=dict(block, input={}))
        yield event("content_block_delta", index=index,
                    delta={"type": "input_json_delta",
                           "partial_json": json.dumps(block["input"], ensure_ascii=False)})
        yield event("content_block_stop", index=index)

    def finish(self, message: dict[str, Any]) -> Iterator[bytes]:
        """Send what the streamed blocks still lack of ``message``, in its block order."""
        text_done = False
        for block in message["content"]:
            if block["type"] == "thinking":
                if not self.thinking_sent:
                    yield from self.thinking(block["thinking"])
            elif block["type"] == "text":
                yield from self.close_text(block["text"])
                text_done = True
            elif block["type"] == "tool_use":
                if not text_done:
                    yield from self.close_text(None)  # opened live, its text went with the tool call's
                    text_done = True
                yield from self.tool_use(block)
        if not text_done:
            yield from self.close_text(None)


def _end(message: dict[str, Any]) -> Iterator[bytes]:
    yield event("message_delta", delta={"stop_reason": message["stop_reason"],
                                        "stop_sequence": message["stop_sequence"]},
                usage={"output_tokens": message["usage"]["output_tokens"]})
    yield event("message_stop")


_DONE = object()
"""No event at all (an events iterator that ended at once)."""


async def stream_message(skeleton: dict[str, Any], parser: Any, events: AsyncIterator[Any],
                         finish: Callable[[dict[str, Any]], dict[str, Any]]) -> AsyncIterator[bytes]:
    """SSE frames of one streamed Messages call.

    ``skeleton`` is the Message before generation (id, model, usage with its input tokens);
    ``events`` the call's (reply text so far, keep-alives, last the recorded chat completion, a dict);
    ``finish(completion)`` answers the final Message. ``message_start`` waits for the call's first event (the
    engine's first text, or a keep-alive while a pause holds the call): a call the engine refuses before
    then raises, so the agent gets a plain error status rather than a 200 stream carrying the error.
    """
    events = aiter(events)
    first = await anext(events, _DONE)
    yield _start(skeleton)
    yield event("ping")
    blocks = _Blocks()
    content = ContentStream(parser)
    completion = None

    async def all_events() -> AsyncIterator[Any]:
        if first is not _DONE:
            yield first
        async for rest in events:
            yield rest

    async for item in all_events():
        if item is None:
            yield event("ping")  # Anthropic's own keep-alive
        elif isinstance(item, str):
            for delta in content.feed(item):
                if "reasoning_content" in delta and blocks.text_at is None:
                    for frame in blocks.thinking(delta["reasoning_content"]):
                        yield frame
                if "content" in delta:
                    for frame in blocks.text(delta["content"]):
                        yield frame
        else:
            completion = item
    message = finish(completion)
    for frame in blocks.finish(message):
        yield frame
    for frame in _end(message):
        yield frame


def replay_message(message: dict[str, Any]) -> Iterator[bytes]:
    """A finished Message as a complete event stream (a retried turn that asks for a stream)."""
    yield _start(message)
    yield from _Blocks().finish(message)
    yield from _end(message)
