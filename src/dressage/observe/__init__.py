"""What lets an operator watch Dressage run: the call context (session, call and W3C trace ids),
JSON log lines that carry it, and Prometheus exposition helpers shared by the Proxy and the
TransferQueue processes. Imports nothing of Dressage above :mod:`dressage.errors`.
"""

from dressage.observe.context import CallContext, bind_call, current_call, parse_traceparent
from dressage.observe.logs import LOG_FORMATS, JsonFormatter, configure_logging

__all__ = ["CallContext", "bind_call", "current_call", "parse_traceparent", "LOG_FORMATS", "JsonFormatter",
           "configure_logging"]
