"""Run an ASGI app under uvicorn: blocking (a ``serve`` command) or on a daemon thread (tests, ``dressage run``).

Binding happens here, before uvicorn starts, so port 0 yields the real port and bind errors
become a ConfigError naming the address.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from dressage.errors import ConfigError

__all__ = ["UvicornServer"]


class UvicornServer:
    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, name: str = "server",
                 log_level: str = "warning") -> None:
        self.app, self.host, self.port, self.name, self.log_level = app, host, int(port), name, log_level
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._bound: int | None = None

    @property
    def url(self) -> str:
        if self._bound is None:
            raise RuntimeError(f"the {self.name} is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._bound}"

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
        # and without it every answer with a body waits out a delayed ACK (~40 ms).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"{self.name}.port: cannot bind {self.host}:{self.port}: {exc}") from exc
        self._bound = sock.getsockname()[1]
        return sock

    def _uvicorn(self) -> Any:
        import uvicorn

        return uvicorn.Server(uvicorn.Config(self.app, log_level=self.log_level, access_log=False,
                                             lifespan="off", timeout_keep_alive=30))

    def serve(self) -> None:
        """Serve until interrupted."""
        sock = self._bind()
        self._server = self._uvicorn()
        self._server.run(sockets=[sock])

    def start_background(self, timeout: float = 10.0) -> str:
        """Start on a daemon thread; returns the base URL once the server accepts connections."""
        if self._thread is not None:
            return self.url
        sock = self._bind()
        self._server = self._uvicorn()
        self._server.install_signal_handlers = lambda: None  # only the main thread may install them
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"dressage-{self.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} did not start within {timeout} s")
            time.sleep(0.01)
        return self.url

    @property
    def running(self) -> bool:
        """Whether the background server thread is still serving."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> "UvicornServer":
        self.start_background()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
