"""What an endpoint makes of a chat call's reply: the seam :meth:`ChatServing.serve` answers through.

Chat Completions, Responses and Anthropic Messages run one chat call choreography (turns, retries,
recording); a :class:`ReplyShaper` is all that differs between them: the answer's shape, its stream,
how a retried turn is replayed and how a failed stream ends. :class:`ChatShaper` is chat's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Protocol

from dressage.errors import DressageError
from dressage.proxy.openai.chat.samples import call_id_prefix
from dressage.proxy.openai.streaming import (DONE, KEEPALIVE, ChunkWriter, error_payload, replay_chunks, sse,
                                             stream_completion)

if TYPE_CHECKING:
    from dressage.proxy.openai.chat.serving import ChatCall

__all__ = ["ReplyShaper", "ChatShaper", "ReplyEvents"]

ReplyEvents = AsyncIterator[str | None | dict[str, Any]]
"""A streamed call's events: the reply text so far (``str``, never a stop sequence), keep-alives
(``None``), last the recorded chat completion (``dict``); a buffered call sends no text."""


class ReplyShaper(Protocol):
    """How one endpoint answers a chat call; one per request (it may keep what the request asked)."""

    def answer(self, completion: dict[str, Any], call: "ChatCall | None" = None) -> dict[str, Any]:
        """The endpoint's answer to a recorded chat completion; ``call`` is the call that just recorded it
        (``None``: a retried turn replays a completion recorded before)."""
        ...

    def replay(self, answer: dict[str, Any]) -> Iterator[bytes]:
        """A finished answer as a complete stream (a retried turn that asks for a stream)."""
        ...

    def frames(self, call: "ChatCall", events: ReplyEvents) -> AsyncIterator[bytes]:
        """The stream of a call from its :data:`ReplyEvents`. The 200 goes with the first frame (see
        :func:`~dressage.proxy.openai.streaming.opened`): one sent before the engine answered makes
        every later failure an event of the stream."""
        ...

    def failed(self, call: "ChatCall", exc: DressageError) -> Iterator[bytes]:
        """The last frames of a stream whose call failed after its first frame."""
        ...


class ChatShaper:
    """Chat Completions: the completion itself, or its ``chat.completion.chunk`` stream."""

    def __init__(self, parser: Any, model: str, *, include_usage: bool) -> None:
        self.parser, self.model, self.include_usage = parser, model, include_usage

    # docstrings inherited from ReplyShaper
    def answer(self, completion: dict[str, Any], call: "ChatCall | None" = None) -> dict[str, Any]:
        return completion

    def replay(self, answer: dict[str, Any]) -> Iterator[bytes]:
        return replay_chunks(answer, include_usage=self.include_usage)

    async def frames(self, call: "ChatCall", events: ReplyEvents) -> AsyncIterator[bytes]:
        if call.buffered:  # every sample recorded (keep-alives meanwhile), then sent as one stream
            response = None
            async for event in events:
                if event is None:
                    yield KEEPALIVE
                else:
                    response = event
            for frame in self.replay(response):
                yield frame
            return
        writer = ChunkWriter(call.completion_id, self.model, call.created)
        async for frame in stream_completion(writer, self.parser, events, include_usage=self.include_usage,
                                             call_id_prefix=None if call.options.tool_mode == "none" else
                                             call_id_prefix(call.completion_id, 0), tools=call.tools):
            yield frame

    def failed(self, call: "ChatCall", exc: DressageError) -> Iterator[bytes]:
        yield sse(error_payload(exc))
        yield DONE
