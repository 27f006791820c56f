"""Helpers the fault cases and the scale curves share: an engine + Proxy stack on loopback, served child
processes, a free port, and the Proxy's engine-wait header."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import psutil

from dressage.engine.config import EngineConfig
from dressage.engine.server import EngineServer
from dressage.fields import get_model
from dressage.dataplane import DataPlaneConfig
from dressage.proxy.config import EnginesConfig, JournalConfig, ProxyConfig, ServerConfig
from dressage.proxy.recording.core import ProxyCore
from dressage.proxy.deployment import Proxy
from dressage.rollout import RolloutManager

__all__ = ["free_port", "Stack", "start_engine", "start_proxy", "Served", "serve_child", "serve_process",
           "engine_wait_s"]

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
    """A served child process (``dressage ... serve``, the bench's stub engine) and its base URL."""

    proc: subprocess.Popen
    url: str

    def cpu_s(self) -> float:
        """The process's CPU time so far (user + system), in seconds."""
        t = psutil.Process(self.proc.pid).cpu_times()
        return float(t.user + t.system)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve_child(argv: list[str], port: int, what: str, *, timeout_s: float = 60.0) -> Served:
    """Start ``argv`` (a server listening on 127.0.0.1:``port``) and wait until its ``/health`` answers."""
    import httpx

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    served = Served(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(served.url + "/health", timeout=1).status_code == 200:
                return served
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            served.stop()
            raise RuntimeError(f"{what} did not come up (exit code {proc.returncode})")
        time.sleep(0.1)


def serve_process(args: list[str], *, timeout_s: float = 60.0, port: int | None = None) -> Served:
    """Start ``dressage <args> --port P`` as a child process and wait until ``/health`` answers."""
    port = port or free_port()
    return serve_child([sys.executable, "-m", "dressage", *args, "--host", "127.0.0.1", "--port", str(port)], port,
                       f"dressage {' '.join(args)}", timeout_s=timeout_s)


def engine_wait_s(server_timing: str) -> float | None:
    """The ``engine;dur=<ms>`` entry of the Proxy's ``Server-Timing`` header, in seconds (``None``: absent)."""
    for entry in server_timing.split(","):
        name, _, dur = entry.strip().partition(";dur=")
        if name == "engine":
            return float(dur) / 1000.0
    return None
