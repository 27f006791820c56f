"""The Proxy's OpenAI-compatible HTTP server (``dressage proxy serve``).

Agents create a session, then use ``/sessions/{id}/v1`` as an ordinary OpenAI base URL. Each
chat call becomes one SGLang ``/generate`` request and one StepRecord; errors are OpenAI-style
JSON with the offending field named, and a failed call records nothing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.errors import ConfigError, EngineTimeout, WireFormatError
from dressage.proxy.chat import QwenToolCallParser, ToolCallParser, build_chat_prompt
from dressage.proxy.core import FinalizedSession, ProxyCore
from dressage.proxy.app import build_app
from dressage.proxy.schemas import ChatRequest, GenerateRequest
from dressage.serving import UvicornServer
from dressage.trajectory import Boundary, RouteDecision

__all__ = ["ProxyServerConfig", "ProxyService", "ProxyServer"]


@dataclass(kw_only=True, slots=True)
class ProxyServerConfig:
    """HTTP side of the Proxy."""

    host: str = "127.0.0.1"
    """Bind address; loopback unless the agents run elsewhere."""
    port: int = 0
    """Port; 0 picks a free one."""
    engine_url: str = "http://127.0.0.1:30000"
    """SGLang (or the built-in engine) base URL."""
    api_token: str | None = None
    """When set, every endpoint but /health needs ``Authorization: Bearer <token>``."""
    served_model_name: str = "dressage-policy"
    """``model`` reported in OpenAI responses."""
    request_timeout_s: float = 600.0
    """Time-out of one engine call (a 504 to the agent when exceeded)."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Larger request bodies get 413."""
    default_max_tokens: int = 1024
    """max_new_tokens when a request gives no max_tokens."""

    def __post_init__(self) -> None:
        if not 0 <= int(self.port) <= 65535:
            raise ConfigError(f"proxy.port: {self.port} is not a port")
        if not str(self.engine_url).startswith(("http://", "https://")):
            raise ConfigError(f"proxy.engine_url: expected http(s)://host:port, got {self.engine_url!r}")
        for key in ("request_timeout_s", "max_body_bytes", "default_max_tokens"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"proxy.{key} must be positive, got {getattr(self, key)!r}")


class ProxyService:
    """Per-process state behind the HTTP app: the ProxyCore, the tokenizer and the engine client."""

    def __init__(self, config: ProxyServerConfig, core: ProxyCore, tokenizer: Any, engine: Any,
                 *, parser: ToolCallParser | None = None) -> None:
        self.config, self.core, self.tokenizer, self.engine = config, core, tokenizer, engine
        self.parser = parser or QwenToolCallParser()
        self.weight_version = 0
        self.finalized: dict[str, FinalizedSession] = {}
        self.calls = 0
        self.failed_calls = 0

    def session_url(self, base: str, session_id: str) -> str:
        return f"{base.rstrip('/')}/sessions/{session_id}/v1"

    def _sampling(self, req: ChatRequest | GenerateRequest) -> dict[str, Any]:
        if isinstance(req, GenerateRequest):
            sp = dict(req.sampling_params or {})
            sp.setdefault("max_new_tokens", self.config.default_max_tokens)
            return sp
        sp: dict[str, Any] = {"max_new_tokens": req.max_completion_tokens or req.max_tokens or self.config.default_max_tokens,
                              "stop_token_ids": list(self.tokenizer.stop_token_ids)}
        for name in ("temperature", "top_p"):
            value = getattr(req, name)
            if value is not None:
                sp[name] = value
        if req.stop is not None:
            sp["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if req.seed is not None:
            sp["sampling_seed"] = req.seed
        return sp

    async def _call_engine(self, session_id: str, decision: RouteDecision, prompt_ids: np.ndarray,
                           sampling: dict[str, Any]) -> dict[str, Any]:
        params = self.core.generate_params(decision)
        try:
            return await asyncio.wait_for(
                self.engine.generate(prompt_ids.tolist(), sampling, rid=f"{session_id}-{self.calls}", **params),
                timeout=self.config.request_timeout_s)
        except asyncio.TimeoutError:
            raise EngineTimeout(f"the engine did not answer within {self.config.request_timeout_s} s") from None

    async def chat(self, session_id: str, req: ChatRequest) -> dict[str, Any]:
        session = self.core.active_session(session_id)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        tools = req.tools
        prompt = build_chat_prompt(session, self.tokenizer, messages, tools)
        if prompt.boundary_reason is not None:
            decision = RouteDecision("create", None, 0, Boundary(prompt.boundary_reason))
        else:
            decision = self.core.plan(session_id, prompt.prompt_ids, tools=tools)
        self.calls += 1
        body = await self._call_engine(session_id, decision, prompt.prompt_ids, self._sampling(req))
        out_ids = body.get("output_ids") if isinstance(body, dict) else None
        if not isinstance(out_ids, list):
            raise WireFormatError("engine response has no output_ids list")
        text = self.tokenizer.decode(out_ids, skip_special_tokens=True)
        content, reasoning, calls = self.parser.parse(text, call_id_prefix=f"call_{len(session.steps)}")
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        finish = (body.get("meta_info") or {}).get("finish_reason")
        finish = finish.get("type") if isinstance(finish, dict) else finish
        step = await asyncio.to_thread(
            self.core.ingest, session_id, decision, body, prompt_ids=prompt.prompt_ids,
            version=self.weight_version, messages=messages, tools=tools,
            metadata={"assistant_message": message, "finish_reason": finish},
            boundary_reason=prompt.boundary_reason)
        finish_reason = "tool_calls" if calls else ("length" if finish == "length" else "stop")
        return {
            "id": f"chatcmpl-{session_id[:8]}-{step.step_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.served_model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": step.prompt_len, "completion_tokens": step.response_len,
                      "total_tokens": step.seq_len},
        }

    async def generate_tokens(self, session_id: str, req: GenerateRequest) -> dict[str, Any]:
        """Token-in, token-out call for TITO-native agents."""
        self.core.active_session(session_id)
        prompt_ids = np.asarray(req.input_ids, dtype=np.int32)
        decision = self.core.plan(session_id, prompt_ids)
        self.calls += 1
        body = await self._call_engine(session_id, decision, prompt_ids, self._sampling(req))
        step = await asyncio.to_thread(self.core.ingest, session_id, decision, body, prompt_ids=prompt_ids,
                                       version=self.weight_version)
        meta = body.get("meta_info", {})
        return {"output_ids": step.response_ids.tolist(), "text": body.get("text", ""),
                "step_id": step.step_id, "parent_id": step.parent_id, "lineage_id": step.lineage_id,
                "meta_info": {k: meta[k] for k in ("finish_reason", "prompt_tokens", "completion_tokens")
                              if k in meta}}

    def finalize(self, session_id: str, reward: float | None) -> FinalizedSession:
        done = self.core.finalize(session_id, reward)
        self.finalized[session_id] = done
        return done

    def forget(self, session_ids) -> None:
        """Drop finished sessions once their Samples were consumed."""
        for sid in session_ids:
            self.finalized.pop(sid, None)
            self.core.forget(sid)


class ProxyServer:
    """The Proxy app under uvicorn; ``start_background()`` for tests and ``dressage run``."""

    def __init__(self, service: ProxyService) -> None:
        self.service = service
        self._server = UvicornServer(build_app(service), host=service.config.host, port=service.config.port,
                                     name="proxy")

    @property
    def url(self) -> str:
        return self._server.url

    def serve(self) -> None:
        self._server.serve()

    def start_background(self, timeout: float = 10.0) -> str:
        return self._server.start_background(timeout)

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> "ProxyServer":
        self.start_background()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
