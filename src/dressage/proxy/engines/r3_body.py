"""A ``/generate`` answer read piece by piece, its R3 routing decoded as it arrives, handed up as an array.

An SGLang answer with routing is mostly one JSON string, ``meta_info.routed_experts`` (base64 of
int32 ids: about 13 MiB for 8K tokens of a 40-layer, top-8 model). Read whole, the body, its parsed
string and the decoded rows are alive together, for every answer in flight. :class:`GenerateBodyReader`
keeps the rest of the body and hands the string's characters to a
:class:`~dressage.fields.r3_stream.RoutedExpertsStream` as they come, which holds only the ids in the
storage dtype; in the kept text the string's place holds a placeholder, and the rest is parsed as
before (:mod:`dressage.proxy.fastjson`). The parsed answer comes out with ``meta_info.routed_experts``
an array in the storage dtype (:func:`decode_answer_routing`), which
:func:`~dressage.fields.sglang.decode_generate_response` checks and takes as it is.

The string is the first ``"routed_experts"`` key, its opening quote not escaped, followed by optional
whitespace, a colon, optional whitespace and a string. Its place is checked after the parse: the
placeholder must be exactly ``meta_info.routed_experts`` of the parsed answer. Anything else is parsed
from the original body rebuilt exactly (the stream gives back the characters it took), and its string,
if any, is then decoded whole by the same decoder: a placeholder anywhere else (the key found elsewhere
first, or a duplicate key that wins), a backslash in the string (a JSON escape: base64 has none), text
the stream gives up on (not plain base64), a body that ends inside the string or that is not JSON. So
every answer parses to what it parsed to before, with the same errors.
"""

from __future__ import annotations

import secrets
from typing import Any

from dressage.errors import WireFormatError
from dressage.fields.r3_stream import RoutedExpertsSpec, RoutedExpertsStream, decode_routed_experts_string
from dressage.fields.sglang import cut_keeps_nothing
from dressage.proxy import fastjson

__all__ = ["GenerateBodyReader", "PLACEHOLDER", "decode_answer_routing"]

_KEY = b'"routed_experts"'
_WS = b" \t\n\r"
_BACKSLASH = 0x5C
PLACEHOLDER = "dressage-r3-" + secrets.token_hex(16)
"""What the kept text holds in the string's place: random per process, so no answer holds it."""
_PLACEHOLDER = PLACEHOLDER.encode("ascii")

_SEARCH, _SPAN, _DONE, _PLAIN = range(4)


class GenerateBodyReader:
    """One answer: :meth:`feed` each piece of the body, then :meth:`result` (the parsed answer)."""

    __slots__ = ("spec", "_buf", "_state", "_scan", "_span_at", "_stream")

    def __init__(self, spec: RoutedExpertsSpec) -> None:
        self.spec = spec
        self._buf = bytearray()     # the body without the string's characters
        self._state = _SEARCH
        self._scan = 0              # where the key search goes on in _buf
        self._span_at = 0           # where the string's characters were (the placeholder is)
        self._stream: RoutedExpertsStream | None = None

    @property
    def streamed(self) -> bool:
        """Whether the string is being (or was) decoded on the fly."""
        return self._state in (_SPAN, _DONE)

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        if self._state == _SPAN:
            self._feed_span(chunk if type(chunk) is bytes else bytes(chunk))
            return
        self._buf += chunk
        if self._state == _SEARCH:
            self._search()

    def _search(self) -> None:
        buf = self._buf
        while True:
            i = buf.find(_KEY, self._scan)
            if i < 0:
                self._scan = max(self._scan, len(buf) - len(_KEY) + 1)
                return
            j = i
            while j > 0 and buf[j - 1] == _BACKSLASH:
                j -= 1
            if (i - j) % 2:  # an escaped quote: inside a string
                self._scan = i + 1
                continue
            k = _skip_ws(buf, i + len(_KEY))
            if k < len(buf) and buf[k] == 0x3A:  # ':'
                k = _skip_ws(buf, k + 1)
                if k < len(buf) and buf[k] != 0x22:  # not a string: some other value
                    self._scan = i + 1
                    continue
            elif k < len(buf):  # not a key
                self._scan = i + 1
                continue
            if k >= len(buf):
                self._scan = i  # wait for more of the body
                return
            with memoryview(buf) as view:  # one copy of the rest (a slice of buf would be a second)
                rest = bytes(view[k + 1:])
            del buf[k + 1:]
            self._span_at = k + 1
            self._stream = RoutedExpertsStream(self.spec)
            self._state = _SPAN
            self._feed_span(rest)
            return

    def _feed_span(self, data: bytes) -> None:
        stream = self._stream
        q = data.find(b'"')
        end = len(data) if q < 0 else q
        if data.find(b"\\", 0, end) != -1:  # a JSON escape: not plain base64
            self._give_up(data)
            return
        stream.feed(memoryview(data)[:end] if end < len(data) else data)
        if q < 0:
            return
        stream.end()
        if stream.gave_up:
            self._give_up(data[q:])
            return
        self._buf += _PLACEHOLDER
        self._buf += memoryview(data)[q:]
        self._state = _DONE

    def _give_up(self, rest: bytes) -> None:
        """Back to the body as it came: the characters taken so far, then ``rest``."""
        self._buf += self._stream.text()
        self._buf += rest
        self._stream = None
        self._state = _PLAIN

    def _original(self) -> bytearray:
        if self._state != _DONE:
            return self._buf
        return (self._buf[:self._span_at] + self._stream.text()
                + self._buf[self._span_at + len(_PLACEHOLDER):])

    def result(self, what: str, *, want_logprobs: bool = True) -> Any:
        """The parsed answer, its routing decoded (:func:`decode_answer_routing`; ``want_logprobs``:
        whether the call asked for logprobs); :class:`WireFormatError` when the body is not JSON."""
        if self._state == _SPAN:  # the body ended inside the string
            self._stream.end()
            self._give_up(b"")
        if self._state == _DONE:
            try:
                body = fastjson.loads(self._buf)
            except (ValueError, RecursionError):
                body = None
            meta = body.get("meta_info") if isinstance(body, dict) else None
            if isinstance(meta, dict) and meta.get("routed_experts") == PLACEHOLDER:
                stream, self._stream, self._buf = self._stream, None, bytearray()
                return decode_answer_routing(body, self.spec, want_logprobs=want_logprobs, stream=stream)
            body = meta = None
            self._buf = self._original()
            self._stream = None
            self._state = _PLAIN
        data, self._buf = self._buf, bytearray()
        try:
            body = fastjson.loads(data)
        except (ValueError, RecursionError) as exc:
            text = bytes(data[:800]).decode("utf-8", "replace")
            raise WireFormatError(f"{what}: the answer is not JSON: {text[:200]!r}") from exc
        data = None
        return decode_answer_routing(body, self.spec, want_logprobs=want_logprobs)


def decode_answer_routing(body: Any, spec: RoutedExpertsSpec, *, want_logprobs: bool,
                          stream: RoutedExpertsStream | None = None) -> Any:
    """``body`` with its ``meta_info.routed_experts`` string (or the ended ``stream`` that took it)
    replaced by the ``[rows, num_layers, topk]`` ids in ``spec``'s storage dtype, range-checked.

    Its errors are the decoder's (:class:`WireFormatError` for text that is not base64,
    ``FieldShapeError``, ``ExpertIdRangeError``). Any other body is returned as it is, for
    :func:`~dressage.fields.sglang.decode_generate_response` to word what is wrong with it, and so
    is an abort cut that keeps nothing (whose routing would not be read).
    """
    meta = body.get("meta_info") if isinstance(body, dict) else None
    if not isinstance(meta, dict):
        return body
    text = meta.get("routed_experts")
    if stream is None and not isinstance(text, str):
        return body
    if cut_keeps_nothing(meta, want_logprobs=want_logprobs, want_routed_experts=True):
        if stream is not None:
            meta["routed_experts"] = stream.text().decode("ascii")
        return body
    wire = str(meta.get("routed_experts_dtype", "int32"))
    if stream is not None:
        meta["routed_experts"] = stream.finish(wire)
    else:
        meta["routed_experts"] = decode_routed_experts_string(text, spec, wire)
    return body


def _skip_ws(buf: bytearray, k: int) -> int:
    n = len(buf)
    while k < n and buf[k] in _WS:
        k += 1
    return k
