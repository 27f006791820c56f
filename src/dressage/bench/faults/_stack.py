"""Helpers the fault cases share: an engine + Proxy stack on loopback, and a free port."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from dressage.engine.config import EngineConfig
from dressage.engine.server import EngineServer
from dressage.fields import get_model
from dressage.proxy.config import DataPlaneConfig
from dressage.proxy.core import ProxyCore
from dressage.proxy.server import ProxyServer, ProxyServerConfig, ProxyService
from dressage.proxy.sglang_client import SGLangClient
from dressage.rollout import RolloutManager
from dressage.tokenizer import load_tokenizer

__all__ = ["free_port", "Stack", "start_engine", "start_proxy"]

MODEL = get_model("qwen3.6-35b-a3b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(port: int = 0, **kw: Any) -> EngineServer:
    cfg = dict(model=MODEL, port=port, seed=1, mean_response_tokens=24, tool_call_rate=0.3)
    cfg.update(kw)
    srv = EngineServer(EngineConfig(**cfg))
    srv.start_background()
    return srv


@dataclass
class Stack:
    server: ProxyServer
    core: ProxyCore
    rm: RolloutManager

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()


def start_proxy(engine_url: str, *, tq_client: Any = None, journal: Any = None, timeout_s: float = 30.0,
                recover_from: Any = None, port: int = 0, **server: Any) -> Stack:
    tok = load_tokenizer("byte")
    dp = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=True, enable_transfer_queue=tq_client is not None,
                         routed_experts_dtype="uint8")
    rm = RolloutManager(dp_size=2)
    core = ProxyCore(dp, tq_client, sink=rm, decode=tok.decode, special_ids=tok.special_token_ids, journal=journal)
    if recover_from is not None:
        core.recover(recover_from)
    service = ProxyService(ProxyServerConfig(engine_url=engine_url, request_timeout_s=timeout_s, port=port, **server), core, tok,
                           SGLangClient(engine_url, timeout=timeout_s))
    server = ProxyServer(service)
    server.start_background()
    return Stack(server, core, rm)
