"""``Proxy.start(ProxyConfig)``: the one place a Proxy is assembled.

Tokenizer -> TransferQueue (started from the config, or a client given) -> ProxyCore with its
journal recovered -> engine clients (with ``engines.request_timeout_s``) -> ProxyService -> the
uvicorn server. ``dressage proxy serve``, ``dressage run`` and the benchmarks all start a Proxy
here; :func:`build_service` is the same assembly without the HTTP server, for in-process use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
from typing import Any, Callable

from dressage.proxy.config import ProxyConfig
from dressage.proxy.parsers.registry import resolve
from dressage.proxy.recording.core import FinalizedSession, ProxyCore
from dressage.proxy.service import ProxyService

__all__ = ["Proxy", "build_service", "checked_config"]


def build_service(config: ProxyConfig, *, tq_client: Any = None, tokenizer: Any = None, engine: Any = None,
                  sink: Callable[[FinalizedSession], None] | None = None,
                  batch_tag: Callable[[], str | None] | None = None,
                  tq_spec: Callable[[], dict[str, Any]] | None = None) -> tuple[ProxyService, Any]:
    """ProxyCore (journal replayed into it, then journalling) and the service over it.

    Returns the service and the journal's recovery report (``None`` without a journal). ``engine``
    overrides the clients made for ``config.engines.urls``; ``tokenizer`` the one ``config`` names;
    ``tq_spec()`` is the TransferQueue client spec a read's ``meta_info`` hands a trainer.
    """
    from dressage.proxy.recording.tokenizer_clock import TimedTokenizer
    from dressage.tokenizer import load_tokenizer

    tok = TimedTokenizer(tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer))
    core = ProxyCore(config.data_plane, tq_client, sink=sink, decode=tok.decode, special_ids=tok.special_token_ids,
                     batch_tag=batch_tag)
    if config.export.dir is not None:  # before the journal replays: recovered trajectories are written too
        from dressage.proxy.trajectory_files import TrajectoryDirWriter

        core.sink = TrajectoryDirWriter(config.export.dir, config.export.format).tee(core.sink, core.session)
    service = ProxyService(config, core, tok, engine, tq_spec=tq_spec)
    report = service.recover(config.journal) if config.journal.path is not None else None
    return service, report


def checked_config(config: ProxyConfig, *, keep_tokenizer: bool = False) -> tuple[ProxyConfig, Any]:
    """``config`` with the model shape, tokenizer and context window its engines' infos settle (see
    :mod:`dressage.proxy.engines.startup`); raises before anything is started when they do not fit."""
    from dressage.proxy.engines.startup import check_engine, check_router_r3, fetch_engine_infos

    check = check_engine(config, fetch_engine_infos(config.engines, wait_s=config.engines.engine_wait_s))
    check_router_r3(config)
    changes: dict[str, Any] = {}
    if check.model is not config.data_plane.model:
        changes["data_plane"] = dataclasses.replace(config.data_plane, model=check.model)
    if not keep_tokenizer and check.tokenizer != config.tokenizer:
        changes["tokenizer"] = check.tokenizer
    parsers = resolve(config.server.tool_call_parser, config.server.reasoning_parser, check.model_path,
                      config.data_plane.model.name)
    if parsers != (config.server.tool_call_parser, config.server.reasoning_parser):
        changes["server"] = dataclasses.replace(config.server, tool_call_parser=parsers[0],
                                                reasoning_parser=parsers[1])
    window = config.limits.context_length
    if check.context_length is not None and (window is None or check.context_length < window):
        # A prompt the engine cannot take is then refused before any stream opens.
        changes["limits"] = dataclasses.replace(config.limits, context_length=check.context_length)
    return (dataclasses.replace(config, **changes) if changes else config), check


class Proxy:
    """A running Proxy: its service, HTTP server and (when it started one) TransferQueue deployment.

    A context manager; :meth:`shutdown` stops the server and what the Proxy started.
    """

    def __init__(self, config: ProxyConfig, service: ProxyService, server: Any, tq: Any, owns_tq: bool,
                 recovery: Any, owned_client: Any = None) -> None:
        self.config, self.service, self.server = config, service, server
        self.tq, self._owns_tq, self.recovery = tq, owns_tq, recovery
        self._owned_client = owned_client  # the client of a TQ this Proxy joined by its spec
        self.engine_check: Any = None
        """What the start-up check against the engines settled (``None``: not checked)."""
        self.spec_file: str | None = None
        """The TransferQueue client spec file this Proxy wrote (``transfer_queue.spec_out``) before it
        served, removed at :meth:`shutdown`."""

    @classmethod
    def start(cls, config: ProxyConfig, *, tq: Any = None, tq_client: Any = None, tokenizer: Any = None,
              engine: Any = None, sink: Callable[[FinalizedSession], None] | None = None,
              batch_tag: Callable[[], str | None] | None = None) -> "Proxy":
        """Assemble and start a Proxy; returns once its server accepts connections.

        With TQ on, the Proxy writes through ``tq_client``, else a client of ``tq`` (a started
        :class:`dressage.tq.TransferQueue` the caller owns), else a client of the running TQ whose spec
        ``config.transfer_queue.spec`` names, else a deployment it starts from
        ``config.transfer_queue.settings()`` and stops at :meth:`shutdown`.
        """
        from dressage.proxy.http.app import ProxyServer

        check = None
        if engine is None and not config.engines.skip_engine_check:
            config, check = checked_config(config, keep_tokenizer=tokenizer is not None)
        owns_tq, owned_client, joined = False, None, None
        if tq_client is None and config.data_plane.enable_transfer_queue:
            if tq is None and config.transfer_queue.spec is not None:
                from dressage.tq import TransferQueueClient
                from dressage.tq.client.spec import check_controller, load_client_spec

                joined = load_client_spec(config.transfer_queue.spec)
                check_controller(joined)  # a Controller that does not answer is refused now, not per call
                tq_client = owned_client = TransferQueueClient.connect(joined)
            else:
                if tq is None:
                    from dressage.tq import TransferQueue

                    tq, owns_tq = TransferQueue.start(config.transfer_queue.settings()), True
                tq_client = tq.client()
        # A trainer process joins this TQ from a read's meta_info.
        tq_spec = tq.client_spec if tq is not None else (lambda: dict(joined)) if joined is not None else None
        server, spec_file = None, None
        try:
            service, recovery = build_service(config, tq_client=tq_client, tokenizer=tokenizer, engine=engine,
                                              sink=sink, batch_tag=batch_tag, tq_spec=tq_spec)
            if tq is not None and tq.deployment == "embedded":  # its units live here: /metrics shows them
                service.metrics.units = tq.storage_units
            if config.transfer_queue.spec_out is not None and tq_spec is not None:
                # Before the server answers: whoever saw the Proxy serve finds the file in place.
                spec_file = _write_spec(tq_spec(), config.transfer_queue.spec_out)
            server = ProxyServer(service)
            server.start_background()
        except BaseException:
            if server is not None:
                server.stop()
            if spec_file is not None:
                _remove(spec_file)
            if owns_tq:
                tq.shutdown()
            if owned_client is not None:
                owned_client.close()
            raise
        proxy = cls(config, service, server, tq, owns_tq, recovery, owned_client)
        proxy.engine_check = check
        proxy.spec_file = spec_file
        return proxy

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def core(self) -> ProxyCore:
        return self.service.core

    def wait(self) -> None:
        """Block until SIGINT or SIGTERM (main thread) or until the server stops."""
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while self.server.running and not stop.wait(0.5):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def shutdown(self) -> None:
        self.server.stop()
        if self.spec_file is not None:
            # No process may join by a file that outlives the Proxy (and, when it owned it, the TQ) it named.
            _remove(self.spec_file)
            self.spec_file = None
        self.core.close()  # steps still being written land before the TQ goes
        if self._owned_client is not None:
            self._owned_client.close()  # the joined TQ itself runs on: its owner stops it
            self._owned_client = None
        if self._owns_tq and self.tq is not None:
            self.tq.shutdown()
            self._owns_tq = False

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _write_spec(spec: dict[str, Any], path: str) -> str:
    """Write ``spec`` to ``path`` (mode 0600, replaced in one step); a path that cannot be written is a
    ConfigError naming ``transfer_queue.spec_out``."""
    from dressage.errors import ConfigError
    from dressage.tq.client.spec import write_client_spec

    try:
        write_client_spec(spec, path)  # names the file in a ConfigError when it cannot be written
    except ConfigError as exc:
        raise ConfigError(f"transfer_queue.spec_out (--transfer-queue-spec-out): {exc}") from None
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
