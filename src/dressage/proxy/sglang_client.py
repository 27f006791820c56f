"""``SGLangClient``: the Proxy's async HTTP client for an SGLang (or built-in) engine.

Speaks ``/generate``, ``/abort_request``, ``/health`` and ``/get_model_info``; httpx errors are
translated here, at the boundary, into :class:`~dressage.errors.EngineError` subclasses.
"""

from __future__ import annotations

import json
import socket
from typing import Any, AsyncIterator, Mapping, Sequence

import httpx

from dressage.errors import EngineError, EngineRequestError, EngineTimeout, EngineUnavailable, WireFormatError

__all__ = ["SGLangClient"]


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "detail" in body:
            return str(body["detail"])
        if "message" in body:
            return str(body["message"])
    return str(body)[:500]


class SGLangClient:
    """One engine at ``base_url``; share it between concurrent calls, ``close()`` when done."""

    def __init__(self, base_url: str, *, timeout: float = 600.0, max_connections: int = 1024,
                 headers: Mapping[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        if transport is None:
            # Small requests must not wait for a delayed ACK (Nagle): ~40 ms per call otherwise.
            transport = httpx.AsyncHTTPTransport(
                limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout,
                                       headers=dict(headers or {}), transport=transport)

    # -- the boundary ------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, *, json_body: Any = None,
                       timeout: float | None = None) -> httpx.Response:
        what = f"{method} {self.base_url}{path}"
        try:
            resp = await self._http.request(method, path, json=json_body,
                                            timeout=self.timeout if timeout is None else timeout)
        except httpx.TimeoutException as exc:
            raise EngineTimeout(f"{what}: no answer within {timeout or self.timeout:g} s ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
        self._check(resp, what)
        return resp

    @staticmethod
    def _check(resp: httpx.Response, what: str) -> None:
        if resp.status_code >= 500:
            raise EngineUnavailable(f"{what}: HTTP {resp.status_code}: {_error_message(resp)}",
                                    status_code=resp.status_code)
        if resp.status_code >= 400:
            raise EngineRequestError(f"{what}: HTTP {resp.status_code}: {_error_message(resp)}",
                                     status_code=resp.status_code)

    @staticmethod
    def _json(resp: httpx.Response, what: str) -> Any:
        try:
            out = resp.json()
        except ValueError as exc:
            raise WireFormatError(f"{what}: the answer is not JSON: {resp.text[:200]!r}") from exc
        # httpx links a Response and its stream both ways, so a read body (MiBs of base64 R3 per call)
        # would wait for the cyclic GC; replacing the spent stream lets it go with the last reference.
        resp.stream = httpx.ByteStream(b"")
        return out

    # -- /generate ---------------------------------------------------------------------------------

    @staticmethod
    def _generate_body(input_ids: Sequence[int], sampling_params: Mapping[str, Any] | None, *,
                       return_logprob: bool, return_routed_experts: bool, routed_experts_start_len: int,
                       rid: str | None, stream: bool, extra: Mapping[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"input_ids": [int(t) for t in input_ids],
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

    async def generate(self, input_ids: Sequence[int], sampling_params: Mapping[str, Any] | None = None, *,
                       return_logprob: bool = True, return_routed_experts: bool = False,
                       routed_experts_start_len: int = 0, rid: str | None = None,
                       timeout: float | None = None, **extra: Any) -> dict[str, Any]:
        """``POST /generate`` for one prompt; the engine's JSON answer (``text``, ``output_ids``, ``meta_info``).

        ``extra`` keys (e.g. ``logprob_start_len``) go into the body unchanged. Raises
        :class:`EngineUnavailable`, :class:`EngineTimeout`, :class:`EngineRequestError` or
        :class:`WireFormatError`.
        """
        body = self._generate_body(input_ids, sampling_params, return_logprob=return_logprob,
                                   return_routed_experts=return_routed_experts,
                                   routed_experts_start_len=routed_experts_start_len, rid=rid, stream=False,
                                   extra=extra)
        resp = await self._request("POST", "/generate", json_body=body, timeout=timeout)
        out = self._json(resp, "POST /generate")
        if not isinstance(out, dict):
            raise WireFormatError(f"POST /generate: expected one JSON object, got {type(out).__name__}")
        return out

    async def generate_stream(self, input_ids: Sequence[int], sampling_params: Mapping[str, Any] | None = None, *,
                              return_logprob: bool = True, return_routed_experts: bool = False,
                              routed_experts_start_len: int = 0, rid: str | None = None,
                              timeout: float | None = None, **extra: Any) -> AsyncIterator[dict[str, Any]]:
        """``POST /generate`` with ``stream``: yields each server-sent chunk until ``[DONE]``."""
        body = self._generate_body(input_ids, sampling_params, return_logprob=return_logprob,
                                   return_routed_experts=return_routed_experts,
                                   routed_experts_start_len=routed_experts_start_len, rid=rid, stream=True,
                                   extra=extra)
        what = f"POST {self.base_url}/generate (stream)"
        try:
            async with self._http.stream("POST", "/generate", json=body,
                                         timeout=self.timeout if timeout is None else timeout) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    self._check(resp, what)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError as exc:
                        raise WireFormatError(f"{what}: a chunk is not JSON: {data[:200]!r}") from exc
                    if isinstance(chunk, dict) and "error" in chunk and "meta_info" not in chunk:
                        raise EngineRequestError(f"{what}: {chunk['error']}")
                    yield chunk
        except httpx.TimeoutException as exc:
            raise EngineTimeout(f"{what}: no answer within {timeout or self.timeout:g} s") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc

    # -- control -----------------------------------------------------------------------------------

    async def abort(self, rid: str | None = None, *, abort_all: bool = False, timeout: float = 30.0) -> None:
        """``POST /abort_request``: the aborted generation answers with its partial output."""
        if rid is None and not abort_all:
            raise ValueError("abort needs a rid or abort_all=True")
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
        """``GET /get_model_info``."""
        return self._json(await self._request("GET", "/get_model_info", timeout=timeout), "GET /get_model_info")

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
        await self._http.aclose()

    async def __aenter__(self) -> "SGLangClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
