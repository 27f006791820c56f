"""The Proxy as its own process on the master, outside Ray: the seed's deployment, in which the
RolloutManager takes finalized trajectories over the Proxy's trajectory-read interface.

:class:`ProxyProcess`, the driver's handle, runs this file as a script, so the child imports the
product and nothing else: no Ray and not the benchmark package (whose modules import Ray). The child
reads its settings as one JSON line on stdin, answers one JSON line with its URL and pid, then serves
the benchmark's requests (``{"op": ..., "args": [...]}``, one JSON line each way) until ``stop`` or the
end of its input. Replies go to a private copy of stdout; fd 1 itself points at stderr, so nothing a
library prints can corrupt them. :class:`ProxyHost` is what both deployments host (the Ray actor in
:mod:`dressage_bench.memory.actors` subclasses it).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import traceback
from typing import Any, Mapping

__all__ = ["ProxyHost", "ProxyProcess"]

_OPS = ("url", "pid", "set_rollout", "held", "state_sizes", "forget_finished", "stop")
_START_TIMEOUT_S = 120.0


class ProxyHost:
    """The Proxy (``Proxy.start``) and what the benchmark asks of it, in whatever process hosts it.

    ``sink`` gets each finalized session (the Ray deployment pushes it to the RolloutManager actor);
    without one, finalized sessions wait in the Proxy until a RolloutManager drains them over
    ``POST /trajectory/read`` (the process deployment, :mod:`dressage_bench.memory.proxy_process`).
    """

    def __init__(self, data_plane: Any, engine_url: str, tq_spec: dict | None, spread: bool, *,
                 node_id: str | None = None, sink: Any = None) -> None:
        from dressage.proxy.config import EnginesConfig, ProxyConfig
        from dressage.proxy.deployment import Proxy

        self.client = None
        if tq_spec is not None:
            from dressage.tq import TransferQueueClient

            self.client = TransferQueueClient.connect(tq_spec, node_id=node_id)
            if spread:
                # No node preference: the Controller places each step on the unit with the most room,
                # so keys spread evenly over every node's StorageUnit.
                self.client.node_id = None
        self.rollout_id = 0
        self.proxy = Proxy.start(ProxyConfig(data_plane=data_plane, engines=EnginesConfig(engine_url=engine_url)),
                                 tq_client=self.client, sink=sink, batch_tag=lambda: f"rollout-{self.rollout_id}")
        self.core, self.service, self._url = self.proxy.core, self.proxy.service, self.proxy.url

    def url(self) -> str:
        return self._url

    def pid(self) -> int:
        return os.getpid()

    def set_rollout(self, rollout_id: int) -> None:
        self.rollout_id = rollout_id
        self.service.weight_version = rollout_id

    def held(self) -> dict[str, int]:
        """Logical bytes the Proxy holds itself: large-field arrays and resident token fields of its steps."""
        return self.core.held_bytes()

    def state_sizes(self) -> dict[str, int]:
        """Sizes of the Proxy's per-session state and of its write-behind (what it keeps across batches)."""
        core, done = self.core, self.service.trajectories
        behind = core.write_behind
        out = {"sessions": len(core.sessions), "calls": len(getattr(core, "_calls", {})),
               "gone": len(getattr(core, "_gone", {})), "finalized": len(done.finalized),
               "gc_objects": len(gc.get_objects()),
               "heap_trims": done.heap_trims, "heap_trim_ms": round(done.heap_trim_s * 1e3, 3)}
        if behind.batcher is not None:
            out.update(write_behind_pending=behind.pending(), write_behind_failures=behind.failures,
                       put_rounds=behind.batcher.rounds, put_steps=behind.batcher.steps)
        return out

    def forget_finished(self) -> int:
        """Drop finished sessions once the trainer consumed their Samples."""
        done = [sid for sid, s in self.core.sessions.items() if s.state != "active"]
        self.service.trajectories.forget(done)
        return len(done)

    def stop(self) -> None:
        self.proxy.shutdown()
        if self.client is not None:
            self.client.close()


class ProxyProcess:
    """The driver's handle on a Proxy process; its methods are :class:`ProxyHost`'s, answered over pipes.

    ``env`` is the child's environment (the cluster's, so allocator settings match the other
    components). The child dies with its stdin: a driver that goes away takes it along.
    """

    def __init__(self, settings: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=dict(env if env is not None else os.environ),
                                      text=True, bufsize=1)
        timer = threading.Timer(_START_TIMEOUT_S, self._proc.kill)
        timer.start()
        try:
            ready = self._exchange(dict(settings))
        except BaseException:
            self._close()
            raise
        finally:
            timer.cancel()
        self._url, self._pid = str(ready["url"]), int(ready["pid"])

    def _exchange(self, message: Mapping[str, Any]) -> Any:
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            try:
                self._proc.stdin.write(json.dumps(message) + "\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                pass  # the reply read below reports the exit
            line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise RuntimeError(f"the Proxy process exited (status {code}); its stderr says why")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"the Proxy process failed: {reply.get('error')}")
        return reply.get("value")

    def url(self) -> str:
        return self._url

    def pid(self) -> int:
        return self._pid

    def set_rollout(self, rollout_id: int) -> None:
        self._exchange({"op": "set_rollout", "args": [int(rollout_id)]})

    def held(self) -> dict[str, int]:
        return dict(self._exchange({"op": "held", "args": []}))

    def state_sizes(self) -> dict[str, int]:
        return dict(self._exchange({"op": "state_sizes", "args": []}))

    def forget_finished(self) -> int:
        return int(self._exchange({"op": "forget_finished", "args": []}))

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._proc.poll() is None:
            try:
                self._exchange({"op": "stop", "args": []})
            except (RuntimeError, OSError, ValueError):
                pass  # already failing: the kill below ends it
        self._close(timeout_s)

    def _close(self, timeout_s: float = 5.0) -> None:
        """Wait for the child (killing it after ``timeout_s``) and close its pipes."""
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass  # the child is gone; nothing is left to flush to


def _serve(settings: Mapping[str, Any], reply: Any) -> None:
    from dressage.dataplane import DataPlaneConfig
    from dressage.fields.models import ModelSpec

    dp = DataPlaneConfig(model=ModelSpec(**settings["model"]), use_rollout_routing_replay=True,
                         enable_transfer_queue=settings["tq_spec"] is not None,
                         routed_experts_dtype=settings["dtype"])
    host = ProxyHost(dp, settings["engine_url"], settings["tq_spec"], bool(settings["spread"]),
                     node_id=settings.get("node_id"))
    reply({"ok": True, "value": {"url": host.url(), "pid": host.pid()}})
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        if op not in _OPS:
            reply({"ok": False, "error": f"unknown op {op!r}"})
            continue
        try:
            value = getattr(host, op)(*msg.get("args", []))
        except Exception as exc:  # the driver raises it; this process goes on serving
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        reply({"ok": True, "value": value})
        if op == "stop":
            return
    host.stop()  # stdin closed: the driver is gone


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def reply(message: Mapping[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")

    try:
        settings = json.loads(sys.stdin.readline())
        _serve(settings, reply)
    except Exception as exc:  # start-up failed: the driver raises the reason, the traceback goes to stderr
        traceback.print_exc()
        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)


if __name__ == "__main__":
    del sys.path[0]  # this file's folder: its module names (config, plot, ...) must not shadow others
    main()
