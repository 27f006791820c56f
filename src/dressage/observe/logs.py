"""Log lines as text or as one JSON object per line (``--log-format json``).

A JSON line holds the time, level, logger and message, the exception when there is one, and the ids
of the call being served when the line was written (``session_id``, ``call_id``, ``trace_id``,
``span_id``: :mod:`dressage.observe.context`), so a log pipeline can join a call's lines to its trace.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from dressage.errors import ConfigError
from dressage.observe.context import current_call

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the current call's ids."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if self.process is not None:
            out["process"] = self.process
        ctx = current_call()
        if ctx is not None:
            out.update(session_id=ctx.session_id, call_id=ctx.call_id, trace_id=ctx.trace_id, span_id=ctx.span_id)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(fmt: str = "text", *, level: str | int = "INFO", process: str | None = None,
                      stream: TextIO | None = None) -> logging.Handler:
    """Send the root logger's records to ``stream`` (stderr) as ``fmt`` lines; returns the handler.

    uvicorn's loggers propagate to the root (their own handlers are dropped), so a JSON process writes
    nothing but JSON lines."""
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"log_format: expected one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_dressage", False)]:
        root.removeHandler(old)
    handler._dressage = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    return handler
