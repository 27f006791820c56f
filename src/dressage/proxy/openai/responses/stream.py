"""Server-sent events of a streamed Responses call (``response.created`` ... ``response.completed``).

Text is streamed as the chat stream streams it (:class:`dressage.proxy.openai.streaming.ContentStream`:
only what is certainly content); reasoning and function calls follow as whole items once known.
After the step is recorded every item is closed with the recorded values, so ``output_item.done``
and ``response.completed`` carry exactly the Response a non-streamed call returns.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable, Iterator

from dressage.proxy.openai.streaming import KEEPALIVE, ContentStream, unsent_tail

__all__ = ["ResponseEvents", "stream_response", "replay_events"]


class ResponseEvents:
    """Frames events of one response, numbering them (``sequence_number``)."""

    def __init__(self) -> None:
        self.seq = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        return f"event: {kind}\ndata: {data}\n\n".encode("utf-8")


class _Items:
    """Output items as they are streamed: opened live, then closed (or sent whole) from the final Response."""

    def __init__(self, ev: ResponseEvents) -> None:
        self.ev = ev
        self.opened: dict[str, int] = {}  # item id -> output index
        self.sent_text = ""

    def _open(self, item: dict[str, Any], index: int) -> Iterator[bytes]:
        self.opened[item["id"]] = index
        shell = dict(item, status="in_progress")
        if item["type"] == "message":
            shell["content"] = []
        elif item["type"] == "function_call":
            shell["arguments"] = ""
        elif item["type"] == "reasoning":
            shell["content"] = []
        yield self.ev.event("response.output_item.added", output_index=index, item=shell)
        if item["type"] == "message":
            yield self.ev.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def text(self, item_id: str, index: int, delta: str) -> Iterator[bytes]:
        if item_id not in self.opened:
            yield from self._open({"id": item_id, "type": "message", "role": "assistant"}, index)
        self.sent_text += delta
        yield self.ev.event("response.output_text.delta", item_id=item_id, output_index=index, content_index=0,
                            delta=delta, logprobs=[])

    def whole(self, item: dict[str, Any], index: int, rest: str = "") -> Iterator[bytes]:
        """Open ``item`` unless it is open, send what its deltas still lack, and close it."""
        if item["id"] not in self.opened:
            yield from self._open(item, index)
        iid = item["id"]
        if item["type"] == "message":
            part = item["content"][0]
            if rest:
                yield self.ev.event("response.output_text.delta", item_id=iid, output_index=index, content_index=0,
                                    delta=rest, logprobs=[])
            yield self.ev.event("response.output_text.done", item_id=iid, output_index=index, content_index=0,
                                text=part["text"], logprobs=[])
            yield self.ev.event("response.content_part.done", item_id=iid, output_index=index, content_index=0,
                                part=part)
        elif item["type"] == "function_call":
            yield self.ev.event("response.function_call_arguments.delta", item_id=iid, output_index=index,
                                delta=item["arguments"])
            yield self.ev.event("response.function_call_arguments.done", item_id=iid, output_index=index,
                                name=item["name"], arguments=item["arguments"])
        elif item["type"] == "reasoning":
            for k, part in enumerate(item.get("content") or []):
                yield self.ev.event("response.reasoning_text.delta", item_id=iid, output_index=index, content_index=k,
                                    delta=part["text"])
                yield self.ev.event("response.reasoning_text.done", item_id=iid, output_index=index, content_index=k,
                                    text=part["text"])
        yield self.ev.event("response.output_item.done", output_index=index, item=item)


def _terminal(ev: ResponseEvents, response: dict[str, Any]) -> bytes:
    kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    return ev.event(kind, response=response)


async def stream_response(ev: ResponseEvents, skeleton: dict[str, Any], ids: tuple[str, str, str, str], parser: Any,
                          events: AsyncIterator[Any], finish: Callable[[dict[str, Any], bool], dict[str, Any]]
                          ) -> AsyncIterator[bytes]:
    """SSE frames of one streamed Responses call.

    ``ev`` numbers the events (a failure event may follow them); ``skeleton`` is the in-progress Response; ``ids`` its :func:`~dressage.proxy.openai.responses.protocol.item_ids`;
    ``events`` the call's (text so far, keep-alives, last the recorded chat completion, a dict);
    ``finish(completion, message_open)`` answers the final Response.
    """
    yield ev.event("response.created", response=skeleton)
    yield ev.event("response.in_progress", response=skeleton)
    items = _Items(ev)
    content = ContentStream(parser)
    _, rs_id, msg_id, _ = ids
    reasoning_item: dict[str, Any] | None = None
    completion = None
    async for event in events:
        if event is None:
            yield KEEPALIVE
        elif isinstance(event, str):
            for delta in content.feed(event):
                if "reasoning_content" in delta:
                    reasoning_item = {"id": rs_id, "type": "reasoning", "status": "completed", "summary": [],
                                      "content": [{"type": "reasoning_text", "text": delta["reasoning_content"]}]}
                    for frame in items.whole(reasoning_item, 0):
                        yield frame
                if "content" in delta:
                    for frame in items.text(msg_id, 1 if reasoning_item else 0, delta["content"]):
                        yield frame
        else:
            completion = event
    response = finish(completion, msg_id in items.opened)
    for index, item in enumerate(response["output"]):
        if item["id"] == rs_id and rs_id in items.opened:
            continue  # sent whole when its block closed
        rest = unsent_tail(item["content"][0]["text"], items.sent_text) if item["type"] == "message" else ""
        for frame in items.whole(item, index, rest):
            yield frame
    yield _terminal(ev, response)


def replay_events(response: dict[str, Any]) -> Iterator[bytes]:
    """A finished Response as a complete event stream (a retried turn that asks for a stream)."""
    ev = ResponseEvents()
    shell = dict(response, status="in_progress", output=[], usage=None, incomplete_details=None)
    yield ev.event("response.created", response=shell)
    yield ev.event("response.in_progress", response=shell)
    items = _Items(ev)
    for index, item in enumerate(response["output"]):
        rest = item["content"][0]["text"] if item["type"] == "message" else ""
        yield from items.whole(item, index, rest)
    yield _terminal(ev, response)
