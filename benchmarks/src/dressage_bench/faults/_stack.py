"""Helpers the fault cases share: an engine + Proxy stack on loopback, and a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from dressage.engine.config import EngineConfig
from dressage.engine.server import EngineServer
from dressage.fields import get_model
from dressage.dataplane import DataPlaneConfig
from dressage.proxy.config import EnginesConfig, JournalConfig, ProxyConfig, ServerConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.deployment import Proxy
from dressage.rollout import RolloutManager

__all__ = ["free_port", "Stack", "start_engine", "start_proxy", "Served", "serve_process"]

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
    proxy: Proxy
    core: ProxyCore
    rm: RolloutManager

    @property
    def url(self) -> str:
        return self.proxy.url

    def stop(self) -> None:
        self.proxy.shutdown()


def start_proxy(engine_url: str, *, tq_client: Any = None, journal: str | None = None, timeout_s: float = 30.0,
                port: int = 0, r3: bool = True, skip_engine_check: bool = False,
                max_answer_bytes: int | None = None, **sections: Any) -> Stack:
    """A Proxy on loopback (``Proxy.start``); ``journal``: a path it journals to and recovers from;
    ``max_answer_bytes``: the cap on one engine answer (default: the Proxy's);
    ``sections``: other sections of the ProxyConfig (``access=AccessConfig(...)``)."""
    dp = DataPlaneConfig(model=MODEL, use_rollout_routing_replay=r3, enable_transfer_queue=tq_client is not None,
                         routed_experts_dtype="uint8")
    rm = RolloutManager(dp_size=2)
    server = sections.pop("server", ServerConfig())
    cfg = ProxyConfig(data_plane=dp, journal=JournalConfig(path=journal),
                      engines=EnginesConfig(engine_url=engine_url, request_timeout_s=timeout_s,
                                            skip_engine_check=skip_engine_check,
                                            **({} if max_answer_bytes is None
                                               else {"max_answer_bytes": max_answer_bytes})),
                      server=replace(server, port=port), **sections)
    proxy = Proxy.start(cfg, tq_client=tq_client, sink=rm)
    return Stack(proxy, proxy.core, rm)


@dataclass
class Served:
    """A ``dressage ... serve`` child process and its base URL."""

    proc: subprocess.Popen
    url: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve_process(args: list[str], *, timeout_s: float = 60.0, port: int | None = None) -> Served:
    """Start ``dressage <args> --port P`` as a child process and wait until ``/health`` answers."""
    import httpx

    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dressage", *args, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return Served(proc, url)
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            Served(proc, url).stop()
            raise RuntimeError(f"dressage {' '.join(args)} did not come up (exit code {proc.returncode})")
        time.sleep(0.1)
