"""Every error Dressage raises on purpose, in one place.

Hierarchy::

    DressageError
    ├── ConfigError                  bad flag, YAML key or value (names the key)
    ├── FieldError                   trajectory field data that does not fit its spec
    │   ├── UnknownFieldError        a field name that is not registered
    │   ├── FieldShapeError          wrong rank, shape or length (tokens vs logprobs, R3 rows vs T-1)
    │   └── ExpertIdRangeError       an expert id that does not fit the storage dtype
    ├── WireFormatError              an engine response that is not SGLang's /generate format
    ├── EngineError                  the inference engine (SGLang /generate) failed a call
    │   ├── EngineUnavailable        connection refused or reset, or a 5xx answer
    │   ├── EngineTimeout            no answer within the call's timeout
    │   └── EngineRequestError       the engine rejected the request (4xx); the message is its own
    ├── TokenizerError               tokenizer or chat template
    │   └── ChatTemplateError        messages the template cannot render (or no exact TITO delta)
    ├── JournalError                 the Proxy journal cannot be written or read back
    ├── TrajectoryError              session / StepRecord / Segment semantics
    │   ├── SessionStateError        append to a finalized or aborted session
    │   └── UnknownStepError         a parent or step id that does not exist
    ├── TransferQueueError           TransferQueue controller, StorageUnits, client
    │   ├── KeyNotFoundError         unknown, cleared or consumed key
    │   ├── RowRangeError            a read outside the rows a key stores
    │   ├── StorageUnitUnavailable   a unit that died or did not answer in time
    │   ├── LostSamplesError         Samples whose fields were on a lost unit (names them)
    │   ├── StorageFullError         a unit over its budget with spilling disabled
    │   ├── ProtocolError            a malformed, pickled or future-version frame
    │   └── IntegrityError           a stored blob whose checksum does not match
    └── AgentError                   the agents' driver (dressage.agents) could not use the Proxy
        ├── ProxyConnectionError     refused, reset or no answer: nothing came back
        │   └── ProxyTimeout         no answer within the call's time-out
        ├── ProxyStatusError         the Proxy answered 4xx/5xx (``status_code``, its message)
        └── ProxyReplyError          an answer the driver cannot use (no session id, choices, usage)

Third-party errors (zmq, ray, httpx) are translated where they cross into Dressage:
``raise StorageUnitUnavailable(...) from exc``.
"""

from __future__ import annotations

__all__ = [
    "DressageError",
    "ConfigError",
    "FieldError",
    "UnknownFieldError",
    "FieldShapeError",
    "ExpertIdRangeError",
    "WireFormatError",
    "EngineError",
    "EngineUnavailable",
    "EngineTimeout",
    "EngineRequestError",
    "TokenizerError",
    "ChatTemplateError",
    "JournalError",
    "TrajectoryError",
    "SessionStateError",
    "UnknownStepError",
    "TransferQueueError",
    "KeyNotFoundError",
    "RowRangeError",
    "StorageUnitUnavailable",
    "StorageFullError",
    "LostSamplesError",
    "ProtocolError",
    "IntegrityError",
    "AgentError",
    "ProxyConnectionError",
    "ProxyTimeout",
    "ProxyStatusError",
    "ProxyReplyError",
]


class DressageError(Exception):
    """Base class of every error Dressage raises on purpose."""


class ConfigError(DressageError, ValueError):
    """A configuration value, flag or YAML key is invalid; the message names it."""


class FieldError(DressageError, ValueError):
    """Field data does not match its registered spec."""


class UnknownFieldError(FieldError, LookupError):
    """A field name that is not in the registry."""

    def __init__(self, name: str, known: "list[str] | tuple[str, ...]" = ()) -> None:
        self.name = name
        hint = f"; known fields: {', '.join(sorted(known))}" if known else ""
        super().__init__(f"unknown field {name!r}{hint}")


class FieldShapeError(FieldError):
    """An array has the wrong rank, shape or length for its field."""


class ExpertIdRangeError(FieldError):
    """An expert id does not fit the chosen storage dtype (or the model's expert count)."""

    def __init__(self, value: int, row: int, layer: int, slot: int, dtype: str, limit: int) -> None:
        self.value, self.row, self.layer, self.slot = int(value), int(row), int(layer), int(slot)
        self.dtype, self.limit = dtype, int(limit)
        super().__init__(
            f"expert id {self.value} at row {self.row}, layer {self.layer}, top-k slot {self.slot} "
            f"does not fit {dtype} (valid ids: 0..{self.limit}); choose a wider --routed-experts-dtype"
        )


class WireFormatError(DressageError, ValueError):
    """An engine response that does not follow SGLang's /generate format."""


class EngineError(DressageError):
    """A call to the inference engine failed; ``status_code`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        self.status_code = status_code
        super().__init__(message)


class EngineUnavailable(EngineError):
    """The engine could not be reached, dropped the connection, or answered 5xx."""


class EngineTimeout(EngineError):
    """The engine did not answer within the call's timeout."""


class EngineRequestError(EngineError, ValueError):
    """The engine rejected the request as malformed (HTTP 4xx)."""


class TokenizerError(DressageError):
    """A tokenizer could not be loaded or used."""


class ChatTemplateError(TokenizerError, ValueError):
    """Messages the chat template cannot render, or a TITO delta that is not an exact suffix."""


class JournalError(DressageError):
    """The Proxy journal cannot be written, or a record in it cannot be read back."""


class TrajectoryError(DressageError):
    """A rollout-session operation that breaks trajectory semantics."""


class SessionStateError(TrajectoryError):
    """An operation the session's state does not allow (e.g. appending after finalize)."""


class UnknownStepError(TrajectoryError, LookupError):
    """A step id (for instance a parent) that the session does not hold."""


class TransferQueueError(DressageError):
    """Base class of TransferQueue errors."""


class KeyNotFoundError(TransferQueueError, LookupError):
    """A key that was never written, or was already cleared."""


class RowRangeError(TransferQueueError, ValueError):
    """A read asks for rows outside those the key stores."""


class StorageUnitUnavailable(TransferQueueError):
    """A StorageUnit died or did not answer within its timeout."""


class LostSamplesError(TransferQueueError):
    """Samples whose large fields cannot be read any more (their StorageUnit died or lost the keys)."""

    def __init__(self, message: str, *, samples: "list[str] | None" = None, keys: "list[str] | None" = None) -> None:
        self.samples = list(samples or [])
        self.keys = list(keys or [])
        super().__init__(message)


class StorageFullError(TransferQueueError):
    """A StorageUnit is over its memory budget and may not spill."""


class ProtocolError(TransferQueueError):
    """A frame that is malformed, pickled, or from an unknown protocol version."""


class IntegrityError(TransferQueueError):
    """A stored blob whose checksum does not match what was written."""


class AgentError(DressageError):
    """The agents' workload driver could not use an answer (or the lack of one) from the Proxy."""


class ProxyConnectionError(AgentError):
    """The Proxy could not be reached or dropped the connection; no answer came back."""


class ProxyTimeout(ProxyConnectionError):
    """The Proxy did not answer within the call's time-out."""


class ProxyStatusError(AgentError):
    """The Proxy answered with an HTTP error; ``status_code`` and the Proxy's own message."""

    def __init__(self, message: str, *, status_code: int) -> None:
        self.status_code = int(status_code)
        super().__init__(message)


class ProxyReplyError(AgentError, ValueError):
    """A Proxy answer that lacks what the driver needs (session id, base URL, choices, usage)."""


class SampleWireError(DressageError, ValueError):
    """A Sample (or trajectory read answer) in wire form that is malformed or of an unknown version."""
