"""``SGLangClient``: the Proxy's async HTTP client for an SGLang (or built-in) engine.

Speaks ``/generate``, ``/abort_request``, ``/health``, ``/model_info`` (``/get_model_info`` on
older releases), the weight-version calls and the reply parsers (``/parse_function_call``,
``/separate_reasoning``). Every call crosses one seam, an :class:`~.transport.EngineTransport`
(:func:`engine_transport` by default: aiohttp's pool); its errors are translated here, at the boundary, into :class:`~dressage.errors.EngineError` subclasses. With R3 on,
``/generate`` answers come back with their routing already decoded (an array in the storage dtype).
Every answer is read up to ``max_answer_bytes`` (one line of a streamed answer likewise): beyond it the
call fails with :class:`~dressage.errors.EngineAnswerTooLargeError` (a 502), having held at most the cap;
a streamed ``/generate`` must end within the call's timeout as a whole (keep-alives do not extend it).
``api_key`` is sent as SGLang's ``Authorization: Bearer`` key; a ``routing_key`` goes out as
``X-SMG-Routing-Key`` so a router or model gateway keeps a session on the worker that caches its prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import re
import socket
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

import numpy as np

from dressage.errors import (EngineAnswerTooLargeError, EngineError, EngineNotSglangError, EngineRequestError,
                             EngineTimeout, EngineUnavailable, WireFormatError)
from dressage.fields.r3_stream import RoutedExpertsSpec
from dressage.observe.context import current_call, engine_span_id
from dressage.fields.sglang import finish_type
from dressage.proxy import fastjson
from dressage.proxy.engines.aio_transport import AiohttpTransport, aiohttp_available
from dressage.proxy.engines.httpx_lean import httpx
from dressage.proxy.engines.httpx_transport import HttpxTransport
from dressage.proxy.engines.r3_body import GenerateBodyReader, decode_answer_routing
from dressage.proxy.engines.transport import (EngineAnswerTooLarge, EngineResponse, EngineTransport,
                                              EngineTransportError, EngineTransportTimeout)

__all__ = ["SGLangClient", "ROUTING_KEY_HEADER", "DEFAULT_MAX_ANSWER_BYTES", "engine_transport"]

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
DEFAULT_MAX_ANSWER_BYTES = 256 * 1024 * 1024
"""The cap on one engine answer (and one streamed line): well above an 8K-token answer with R3
routing of a 40-layer top-8 model (~13 MiB), far below what would exhaust the Proxy."""
_JSON = {"content-type": "application/json"}


def engine_transport(max_connections: int = 1024) -> EngineTransport:
    """The transport an engine client uses unless given one: aiohttp's pool where aiohttp is installed
    (httpx's own scans every pooled connection per request, see :mod:`.aio_transport`), else httpx's."""
    if aiohttp_available():
        return AiohttpTransport(max_connections)
    # Small requests must not wait for a delayed ACK (Nagle): ~40 ms per call otherwise.
    return HttpxTransport(httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]))


_URL = re.compile(r"\b(?:https?|tcp|ipc)://\S+")


def _without_urls(text: str) -> str:
    """``text`` with any URL in it replaced: what an agent reads of an engine's message names no host."""
    return _URL.sub("<engine>", text)[:500]


_CONTEXT_REFUSAL = re.compile(r"context length|context window|maximum context", re.IGNORECASE)


def _refusal(what: str, said: str, status: int | None) -> EngineRequestError:
    """The engine's refusal of a request; one for a prompt beyond its context carries the code
    ``context_overflow``, as the Proxy's own check of the window does."""
    err = EngineRequestError(f"{what}: {said}", status_code=status, engine_message=_without_urls(said))
    if _CONTEXT_REFUSAL.search(said):
        err.code = "context_overflow"
    return err


def _chunk_error(error: Any) -> str:
    """The message of an ``error`` member of a streamed chunk (a string or an OpenAI error object)."""
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(error)


def _error_message(status: int, body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace")[:500]
        if text:
            return text
        try:
            return http.HTTPStatus(status).phrase
        except ValueError:
            return ""
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "detail" in doc:
            return str(doc["detail"])
        if "message" in doc:
            return str(doc["message"])
    return str(doc)[:500]


def _finished(chunk: Any) -> bool:
    """A streamed chunk with a finish reason: the last, which carries the routing string."""
    meta = chunk.get("meta_info") if isinstance(chunk, dict) else None
    return isinstance(meta, dict) and finish_type(meta) is not None


class SGLangClient:
    """One engine at ``base_url``; share it between concurrent calls, ``close()`` when done.

    ``transport`` is an :class:`~.transport.EngineTransport`, or an httpx transport (``httpx.MockTransport``)
    to send through (:class:`~.httpx_transport.HttpxTransport`). ``max_answer_bytes`` caps each answer
    and each line of a streamed one (``None``: no cap)."""

    def __init__(self, base_url: str, *, timeout: float = 600.0, max_connections: int = 1024,
                 headers: Mapping[str, str] | None = None,
                 transport: EngineTransport | httpx.AsyncBaseTransport | None = None,
                 api_key: str | None = None, max_answer_bytes: int | None = DEFAULT_MAX_ANSWER_BYTES) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.max_answer_bytes = None if max_answer_bytes is None else int(max_answer_bytes)
        headers = dict(headers or {})
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.api_key = api_key or None
        if transport is None:
            transport = engine_transport(max_connections)
        elif isinstance(transport, httpx.AsyncBaseTransport):
            transport = HttpxTransport(transport)
        self._transport: EngineTransport = transport
        self._headers = headers
        self._json_headers = {**headers, **_JSON}

    # -- the boundary ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _boundary(self, what: str, timeout: float | None) -> Iterator[None]:
        """The transport's failures as :class:`EngineTimeout` / :class:`EngineUnavailable` /
        :class:`EngineAnswerTooLargeError`."""
        try:
            yield
        except EngineAnswerTooLarge as exc:
            raise EngineAnswerTooLargeError(f"{what}: {exc}") from exc
        except EngineTransportTimeout as exc:
            raise EngineTimeout(f"{what}: no answer within {timeout or self.timeout:g} s ({exc.kind})") from exc
        except EngineTransportError as exc:
            raise EngineUnavailable(f"{what}: {exc.kind}: {exc}") from exc

    async def _send(self, method: str, path: str, *, json_body: Any, timeout: float | None,
                    headers: Mapping[str, str] | None) -> EngineResponse:
        """The response through the transport, its body still to be read: the caller closes it."""
        if json_body is not None:
            fields = {**self._json_headers, **headers} if headers else self._json_headers
            content = fastjson.dumps(json_body, numpy=True)
        else:
            fields = {**self._headers, **headers} if headers else self._headers
            content = None
        return await self._transport.send(method, self.base_url + path, body=content, headers=fields,
                                          timeout=self.timeout if timeout is None else timeout)

    async def _request(self, method: str, path: str, *, json_body: Any = None,
                       timeout: float | None = None, headers: Mapping[str, str] | None = None) -> bytes:
        """The answer's body, read whole; an error status raised as a typed error."""
        status, _, body = await self._answer(method, path, json_body=json_body, timeout=timeout, headers=headers)
        self._check(status, body, f"{method} {self.base_url}{path}")
        return body

    async def _answer(self, method: str, path: str, *, json_body: Any = None, timeout: float | None = None,
                      headers: Mapping[str, str] | None = None) -> tuple[int, str, bytes]:
        """The answer's status, content type and body (read whole), whatever the status."""
        what = f"{method} {self.base_url}{path}"
        with self._boundary(what, timeout):
            resp = await self._send(method, path, json_body=json_body, timeout=timeout, headers=headers)
            try:
                body = await resp.read(self.max_answer_bytes)
            finally:
                await resp.aclose()
        return resp.status, resp.headers.get("content-type") or "no content type", body

    async def _request_into(self, method: str, path: str, *, json_body: Any, sink: Any, timeout: float | None = None,
                            headers: Mapping[str, str] | None = None) -> None:
        """:meth:`_request` with the answer's body (decompressed) fed to ``sink`` as it arrives instead
        of read whole; an error status is read whole and raised as by :meth:`_request`."""
        what = f"{method} {self.base_url}{path}"
        with self._boundary(what, timeout):
            resp = await self._send(method, path, json_body=json_body, timeout=timeout, headers=headers)
            try:
                if resp.status >= 400:
                    body = await resp.read(self.max_answer_bytes)
                else:
                    await resp.feed(sink, self.max_answer_bytes)
            finally:
                await resp.aclose()
        if resp.status >= 400:
            self._check(resp.status, body, what)

    @staticmethod
    def _check(status: int, body: bytes, what: str) -> None:
        if status >= 500:
            raise EngineUnavailable(f"{what}: HTTP {status}: {_error_message(status, body)}", status_code=status)
        if status >= 400:
            # The engine's words on a refused request (a prompt beyond its context, say) are the agent's to read.
            raise _refusal(f"{what}: HTTP {status}", _error_message(status, body), status)

    @staticmethod
    def _json(body: bytes, what: str) -> Any:
        try:
            out = fastjson.loads(body)
        except (ValueError, RecursionError) as exc:
            raise WireFormatError(f"{what}: the answer is not JSON: {body.decode('utf-8', 'replace')[:200]!r}") from exc
        return out

    # -- /generate ---------------------------------------------------------------------------------

    @staticmethod
    def _generate_body(input_ids: Sequence[int], sampling_params: Mapping[str, Any] | None, *,
                       return_logprob: bool, return_routed_experts: bool, routed_experts_start_len: int,
                       rid: str | None, stream: bool, extra: Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(input_ids, np.ndarray) and input_ids.dtype.kind in "iu" and input_ids.ndim == 1:
            ids: Any = np.ascontiguousarray(input_ids)  # written by the JSON encoder as it is: no list of ints
        else:
            ids = [int(t) for t in input_ids]
        body: dict[str, Any] = {"input_ids": ids,
                                "sampling_params": dict(sampling_params or {}),
                                "return_logprob": bool(return_logprob)}
        if return_routed_experts:
            body["return_routed_experts"] = True
            body["routed_experts_start_len"] = int(routed_experts_start_len)
        if rid is not None:
            body["rid"] = rid
        if stream:
            body["stream"] = True
        body.update(extra)
        return body

    @staticmethod
    def _routing_headers(routing_key: str | None) -> dict[str, str] | None:
        """The routing key, and the call's W3C ``traceparent`` (a child span per engine request), which
        SGLang's request tracing continues."""
        call = current_call()
        if call is None:
            return None if routing_key is None else {ROUTING_KEY_HEADER: str(routing_key)}
        headers = {"traceparent": call.traceparent(engine_span_id())}
        if routing_key is not None:
            headers[ROUTING_KEY_HEADER] = str(routing_key)
        return headers

    async def generate(self, input_ids: Sequence[int], sampling_params: Mapping[str, Any] | None = None, *,
                       return_logprob: bool = True, return_routed_experts: bool = False,
                       routed_experts_start_len: int = 0, rid: str | None = None,
                       timeout: float | None = None, routing_key: str | None = None,
                       routed_experts_spec: RoutedExpertsSpec | None = None, **extra: Any) -> dict[str, Any]:
        """``POST /generate`` for one prompt; the engine's JSON answer (``text``, ``output_ids``, ``meta_info``).

        ``extra`` keys (e.g. ``logprob_start_len``) go into the body unchanged. Raises
        :class:`EngineUnavailable`, :class:`EngineTimeout`, :class:`EngineRequestError` or
        :class:`WireFormatError`.

        With ``return_routed_experts`` and a ``routed_experts_spec`` the answer's
        ``meta_info.routed_experts`` comes back decoded into that spec's storage dtype, an array
        ``[rows, num_layers, topk]`` (:func:`~dressage.proxy.engines.r3_body.decode_answer_routing`),
        its string decoded as the body arrives (:mod:`dressage.proxy.engines.r3_body`); a routing
        string that is not valid raises the decoder's error here.
        """
        body = self._generate_body(input_ids, sampling_params, return_logprob=return_logprob,
                                   return_routed_experts=return_routed_experts,
                                   routed_experts_start_len=routed_experts_start_len, rid=rid, stream=False,
                                   extra=extra)
        if return_routed_experts and routed_experts_spec is not None:
            reader = GenerateBodyReader(routed_experts_spec)
            await self._request_into("POST", "/generate", json_body=body, sink=reader, timeout=timeout,
                                     headers=self._routing_headers(routing_key))
            out = reader.result("POST /generate", want_logprobs=return_logprob)
        else:
            answer = await self._request("POST", "/generate", json_body=body, timeout=timeout,
                                         headers=self._routing_headers(routing_key))
            out = self._json(answer, "POST /generate")
        if not isinstance(out, dict):
            raise WireFormatError(f"POST /generate: expected one JSON object, got {type(out).__name__}")
        return out

    async def generate_stream(self, input_ids: Sequence[int], sampling_params: Mapping[str, Any] | None = None, *,
                              return_logprob: bool = True, return_routed_experts: bool = False,
                              routed_experts_start_len: int = 0, rid: str | None = None,
                              timeout: float | None = None, routing_key: str | None = None,
                              routed_experts_spec: RoutedExpertsSpec | None = None,
                              **extra: Any) -> AsyncIterator[dict[str, Any]]:
        """``POST /generate`` with ``stream``: yields each server-sent chunk until ``[DONE]``.

        Each chunk is parsed whole; with ``return_routed_experts`` and a ``routed_experts_spec`` the
        routing string of the finished chunk (the one that carries it) comes back decoded, as from
        :meth:`generate`. The stream must end within ``timeout`` (the client's by default) as a whole:
        lines that keep arriving (keep-alives, chunks) do not extend it."""
        body = self._generate_body(input_ids, sampling_params, return_logprob=return_logprob,
                                   return_routed_experts=return_routed_experts,
                                   routed_experts_start_len=routed_experts_start_len, rid=rid, stream=True,
                                   extra=extra)
        what = f"POST {self.base_url}/generate (stream)"
        decode_routing = return_routed_experts and routed_experts_spec is not None
        deadline = asyncio.get_running_loop().time() + (self.timeout if timeout is None else timeout)
        with self._boundary(what, timeout):
            resp = await self._send("POST", "/generate", json_body=body, timeout=timeout,
                                    headers=self._routing_headers(routing_key))
            try:
                if resp.status >= 400:
                    self._check(resp.status, await resp.read(self.max_answer_bytes), what)
                async for line in resp.lines(self.max_answer_bytes, deadline):
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = fastjson.loads(data)
                    except (ValueError, RecursionError) as exc:
                        raise WireFormatError(f"{what}: a chunk is not JSON: {data[:200]!r}") from exc
                    if isinstance(chunk, dict) and "error" in chunk and "meta_info" not in chunk:
                        raise _refusal(what, _chunk_error(chunk["error"]), None)
                    if decode_routing and _finished(chunk):
                        chunk = decode_answer_routing(chunk, routed_experts_spec, want_logprobs=return_logprob)
                    yield chunk
            finally:
                await resp.aclose()

    # -- control -----------------------------------------------------------------------------------

    async def abort(self, rid: str | None = None, *, abort_all: bool = False, timeout: float = 30.0) -> None:
        """``POST /abort_request``: the aborted generation answers with its partial output.

        SGLang aborts every request whose rid starts with ``rid``, so an empty rid would stop
        them all: it is refused unless ``abort_all`` says so.
        """
        if not rid and not abort_all:
            raise ValueError("abort needs a non-empty rid or abort_all=True")
        await self._request("POST", "/abort_request", json_body={"rid": rid or "", "abort_all": abort_all},
                            timeout=timeout)

    async def health(self, timeout: float = 5.0) -> bool:
        """Whether ``GET /health`` answers 200 within ``timeout``."""
        try:
            await self._request("GET", "/health", timeout=timeout)
        except EngineError:
            return False
        return True

    async def model_info(self, timeout: float = 30.0) -> dict[str, Any]:
        """``GET /model_info``, or ``GET /get_model_info`` from releases that lack the former.

        A server that has neither route, or answers one with something other than a JSON object (an
        HTML page, say), is not an SGLang engine: :class:`EngineNotSglangError` names what answered."""
        for path in ("/model_info", "/get_model_info"):
            status, content_type, body = await self._answer("GET", path, timeout=timeout)
            if status not in (404, 405):
                break
        what = f"GET {self.base_url}{path}"
        if status in (404, 405):
            raise EngineNotSglangError(f"{self.base_url} is not an SGLang engine: GET {path} answered HTTP {status} "
                                       f"({content_type}) and so did /model_info")
        self._check(status, body, what)
        try:
            out = fastjson.loads(body)
        except (ValueError, RecursionError):
            out = None
        if not isinstance(out, dict):
            raise EngineNotSglangError(f"{self.base_url} is not an SGLang engine: GET {path} answered HTTP {status} "
                                       f"({content_type}), not a JSON model info")
        return out

    async def parse_function_call(self, text: str, tool_call_parser: str, tools: Sequence[Mapping[str, Any]],
                                  timeout: float = 30.0) -> dict[str, Any]:
        """``POST /parse_function_call``: ``{"normal_text", "calls": [{"tool_index", "name", "parameters"}]}``
        of a reply's ``text`` read by the engine's parser ``tool_call_parser``."""
        body = {"text": text, "tool_call_parser": tool_call_parser, "tools": list(tools)}
        what = "POST /parse_function_call"
        out = self._json(await self._request("POST", "/parse_function_call", json_body=body, timeout=timeout), what)
        if not isinstance(out, dict) or not isinstance(out.get("normal_text"), str) \
                or not isinstance(out.get("calls"), list):
            raise WireFormatError(f"{what}: expected normal_text and calls, got {str(out)[:200]!r}")
        return out

    async def separate_reasoning(self, text: str, reasoning_parser: str, timeout: float = 30.0) -> dict[str, Any]:
        """``POST /separate_reasoning``: ``{"text", "reasoning_text"}`` of a reply's ``text`` read by the
        engine's parser ``reasoning_parser``."""
        what = "POST /separate_reasoning"
        out = self._json(await self._request("POST", "/separate_reasoning", timeout=timeout,
                                             json_body={"text": text, "reasoning_parser": reasoning_parser}), what)
        if not isinstance(out, dict) or not isinstance(out.get("text"), str):
            raise WireFormatError(f"{what}: expected text and reasoning_text, got {str(out)[:200]!r}")
        return out

    async def get_weight_version(self, timeout: float = 30.0) -> str:
        """``GET /get_weight_version``: the engine's current ``weight_version``."""
        out = self._json(await self._request("GET", "/get_weight_version", timeout=timeout),
                         "GET /get_weight_version")
        version = out.get("weight_version") if isinstance(out, dict) else None
        if isinstance(version, bool) or not isinstance(version, (str, int)) or not str(version).strip():
            raise WireFormatError(f"GET /get_weight_version: no weight_version in {out!r}")
        return str(version)

    async def server_info(self, timeout: float = 30.0) -> dict[str, Any]:
        """``GET /get_server_info``."""
        return self._json(await self._request("GET", "/get_server_info", timeout=timeout), "GET /get_server_info")

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False,
                                    timeout: float = 30.0) -> dict[str, Any]:
        """``POST /update_weight_version`` (the version then reported in ``meta_info.weight_version``)."""
        resp = await self._request("POST", "/update_weight_version", timeout=timeout,
                                   json_body={"new_version": new_version, "abort_all_requests": abort_all_requests})
        return self._json(resp, "POST /update_weight_version")

    async def close(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> "SGLangClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
