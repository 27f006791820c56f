"""Every error Dressage raises on purpose, in one place.

Each class carries the HTTP status and OpenAI error ``type`` the Proxy answers it with
(``http_status``, ``openai_type``; a subclass inherits its parent's unless it says otherwise), and
its own stable snake_case ``code`` (``docs/reference/errors.md`` is the table of them, generated from
these classes). Hierarchy, with status and type where a class sets them::

    DressageError                    500 internal_error
    ├── ConfigError                  bad flag, YAML key or value (names the key)    400 invalid_request_error
    │   ├── EngineMismatchError      the engine serves another model shape or tokenizer than the Proxy's
    │   └── NoTransferQueueError     a Proxy without TransferQueue asked for its spec 409
    ├── ContextOverflowError         the prompt leaves no room for a reply           400 invalid_request_error
    ├── UnsupportedParameterError    a request parameter the Proxy cannot honour (names it) 400 invalid_request_error
    ├── SessionIdError               a session / instance / turn id that names none  400 invalid_request_error
    │   └── MissingSessionIdError    no X-Session-Id / X-SMG-Routing-Key header
    ├── RequestRejected              an HTTP request refused before anything is generated 400 invalid_request_error
    │   ├── InputValueError          a lone surrogate, a non-finite number or a malformed tool (names it)
    │   ├── IdempotencyKeyReusedError  an Idempotency-Key sent again with another request  422
    │   ├── BodyTooLargeError        a body over the size limit (bytes received)     413
    │   ├── HeadersTooLargeError     a request line and headers over the size limit
    │   ├── BadHttpRequestError      a request the HTTP parser refused (request line, header, body framing)
    │   ├── AuthenticationError      no or a wrong bearer token                      401 authentication_error
    │   └── PermissionDeniedError    an agent token on an admin path                 403 permission_error
    ├── SessionLimitError            the Proxy holds its maximum of live sessions    429 rate_limit_exceeded
    ├── ProxyOverloadedError         no room in the in-flight byte budget in time    503 proxy_overloaded
    ├── FieldError                   trajectory field data that does not fit its spec 502 engine_output_invalid
    │   ├── UnknownFieldError        a field name that is not registered
    │   ├── FieldShapeError          wrong rank, shape or length (tokens vs logprobs, R3 rows vs T-1)
    │   └── ExpertIdRangeError       an expert id that does not fit the storage dtype
    ├── WireFormatError              an engine response that is not SGLang's format  502 engine_error
    ├── SampleWireError              a Sample or trajectory read answer in a malformed wire form
    ├── UnknownResponseError         a previous_response_id the session does not hold 400 invalid_request_error
    ├── ModelNotFoundError           a model id other than the served model         404 invalid_request_error
    ├── EngineError                  the inference engine failed a call              502 engine_error
    │   ├── EngineUnavailable        connection refused or reset, or a 5xx answer
    │   │   └── NoHealthyEngineError every engine failed its health check            503 engine_unavailable
    │   ├── EngineNotSglangError     what answered at start-up is not an SGLang server (status, content type)
    │   ├── EngineUpdateError        a weight version not set on every engine
    │   ├── EngineTimeout            no answer within the call's timeout             504 engine_timeout
    │   ├── EngineAnswerTooLargeError  an answer or SSE line over --max-engine-answer-bytes  502
    │   ├── EngineRequestError       the engine rejected the request (4xx)           400 invalid_request_error
    │   └── ReplyConstraintError     no sampled reply met tool_choice / parallel_tool_calls 502 engine_output_invalid
    ├── TokenizerError               tokenizer or chat template
    │   └── ChatTemplateError        messages the template cannot render             400 invalid_request_error
    ├── JournalError                 the Proxy journal cannot be written or read back
    │   ├── JournalEncodeError       a value the journal cannot store (lone surrogate, int over 64 bits)
    │   ├── JournalDamagedError      a journal damaged before its end: the Proxy does not start on it
    │   └── JournalWriteError        an append failed; nothing was changed           503 journal_unavailable
    │       └── JournalFullError     the journal's disk is full (ENOSPC, EDQUOT)     507 journal_disk_full
    ├── AnswerEncodeError            a read answer that cannot be encoded; nothing was handed over
    ├── TrajectoryError              session / StepRecord / Segment semantics        409 session_state
    │   ├── SessionStateError        append to a finalized or aborted session
    │   │   └── StepLimitError       the session reached its maximum of steps
    │   ├── WeightVersionChangedError  weights changed mid-trajectory, partial rollout off
    │   │   │                                                                        502 trajectory_version_changed
    │   │   ├── GenerationPreemptedError  a weight update cut the call, partial rollout off  502 generation_preempted
    │   │   └── PartialRolloutStalenessError  one more version than max_partial_rollout_preempts allows
    │   │                                                                  502 partial_rollout_staleness_exceeded
    │   ├── WeightVersionMismatchError  the policy is not the X-Dressage-Expected-Version  502 weight_version_mismatch
    │   └── UnknownStepError         a parent or step id the session does not hold   404 not_found
    │       ├── UnknownSessionError  a session or trajectory id the Proxy does not hold
    │       └── UnknownReadError     a trajectory read id never leased or already settled
    ├── ToolCallHookError            a required tool-call hook failed or overran     502 tool_call_hook_failed
    ├── TransferQueueError           TransferQueue controller, StorageUnits, client  503 transfer_queue_unavailable
    │   ├── TransferWriteError       a step's large fields could not be written; nothing recorded
    │   ├── KeyNotFoundError         unknown, cleared or consumed key
    │   ├── RowRangeError            a read outside the rows a key stores
    │   ├── StorageUnitUnavailable   a unit that died or did not answer in time
    │   ├── LostSamplesError         Samples whose fields were on a lost unit (names them)
    │   ├── StorageFullError         a unit over its budget with spilling disabled
    │   ├── ProtocolError            a malformed, pickled or future-version frame
    │   └── IntegrityError           a stored blob whose checksum does not match
    └── AgentError                   the agents' driver (dressage.harness.agents) could not use the Proxy
        ├── ProxyConnectionError     refused, reset or no answer: nothing came back
        │   └── ProxyTimeout         no answer within the call's time-out
        ├── ProxyStatusError         the Proxy answered 4xx/5xx (``status_code``, its message)
        ├── ProxyReplyError          an answer the driver cannot use (no session id, choices, usage)
        └── AgentCommandError        an agent command that timed out or left no readable reward

Third-party errors (zmq, ray, httpx) are translated where they cross into Dressage:
``raise StorageUnitUnavailable(...) from exc``.

The 502s of a rollout the weights invalidated (``upstream_detail``) also carry upstream Dressage's
``detail`` object (``{"error": code, "message", ...details}``), which its in-sandbox harness reads.

An agent is told :attr:`DressageError.agent_message`, not ``str(exc)``: errors whose message names
internals (an engine's URL, a StorageUnit's address, a wire-level detail) set ``public_message``,
and the Proxy's log keeps the whole message.
"""

from __future__ import annotations

__all__ = [
    "DressageError", "ConfigError", "EngineMismatchError", "NoTransferQueueError", "FieldError", "UnknownFieldError",
    "FieldShapeError", "ExpertIdRangeError", "WireFormatError", "EngineError", "EngineUnavailable", "EngineTimeout",
    "EngineRequestError", "EngineNotSglangError", "EngineUpdateError", "EngineAnswerTooLargeError",
    "ReplyConstraintError", "UnsupportedParameterError", "TokenizerError",
    "ChatTemplateError", "JournalError", "JournalEncodeError", "JournalDamagedError", "JournalWriteError",
    "JournalFullError", "AnswerEncodeError", "ContextOverflowError", "SessionIdError",
    "MissingSessionIdError", "RequestRejected", "IdempotencyKeyReusedError", "InputValueError", "BodyTooLargeError",
    "HeadersTooLargeError", "BadHttpRequestError", "AuthenticationError", "PermissionDeniedError",
    "SessionLimitError", "NoHealthyEngineError",
    "TrajectoryError", "SessionStateError",
    "StepLimitError", "WeightVersionChangedError", "GenerationPreemptedError", "PartialRolloutStalenessError",
    "WeightVersionMismatchError", "UnknownStepError", "UnknownSessionError", "UnknownReadError", "ToolCallHookError",
    "TransferQueueError", "TransferWriteError",
    "KeyNotFoundError", "RowRangeError", "StorageUnitUnavailable", "StorageFullError", "LostSamplesError",
    "ProtocolError", "IntegrityError", "AgentError", "ProxyConnectionError", "ProxyTimeout", "ProxyStatusError",
    "ProxyReplyError", "AgentCommandError", "SampleWireError", "UnknownResponseError", "ModelNotFoundError",
    "ProxyOverloadedError",
]


class DressageError(Exception):
    """Base class of every error Dressage raises on purpose."""

    code = "internal_error"
    """A stable snake_case code for the answer; every class sets its own (``docs/reference/errors.md``
    lists them), and clients match on it, so a code once published does not change."""

    http_status = 500
    openai_type = "internal_error"
    public_message: str | None = None
    """What an agent is told in place of the message, for a class whose message names internals
    (``None``: the message is meant for the agent)."""
    upstream_detail = False
    """The answer also carries upstream Dressage's ``detail`` object (its harness reads the code there)."""

    @property
    def agent_message(self) -> str:
        """The message an agent-facing answer carries (no URL, address or other internal detail)."""
        return self.public_message or str(self)


class ConfigError(DressageError, ValueError):
    """A configuration value, flag or YAML key is invalid; the message names it (and ``param``, when it is a
    request's setting, the field the error answer names)."""

    code = "invalid_config"
    http_status = 400
    openai_type = "invalid_request_error"

    def __init__(self, message: str = "", *, param: str | None = None) -> None:
        self.param = param
        super().__init__(message)


class EngineMismatchError(ConfigError):
    """At start-up: the engine's model info contradicts the Proxy's ``--model`` / tokenizer (names both)."""

    code = "engine_mismatch"


class NoTransferQueueError(ConfigError):
    """The Proxy was asked for its TransferQueue (``GET /transfer_queue/spec``) but runs without one."""

    http_status = 409
    code = "no_transfer_queue"


class FieldError(DressageError, ValueError):
    """Field data does not match its registered spec."""

    code = "invalid_field_data"
    http_status = 502
    openai_type = "engine_output_invalid"


class UnknownFieldError(FieldError, LookupError):
    """A field name that is not in the registry."""

    code = "unknown_field"

    def __init__(self, name: str, known: "list[str] | tuple[str, ...]" = ()) -> None:
        self.name = name
        hint = f"; known fields: {', '.join(sorted(known))}" if known else ""
        super().__init__(f"unknown field {name!r}{hint}")


class FieldShapeError(FieldError):
    """An array has the wrong rank, shape or length for its field."""

    code = "field_shape_mismatch"


class ExpertIdRangeError(FieldError):
    """An expert id does not fit the chosen storage dtype (or the model's expert count)."""

    code = "expert_id_out_of_range"

    def __init__(self, value: int, row: int, layer: int, slot: int, dtype: str, limit: int,
                 num_experts: int | None = None) -> None:
        self.value, self.row, self.layer, self.slot = int(value), int(row), int(layer), int(slot)
        self.dtype, self.limit = dtype, int(limit)
        self.num_experts = None if num_experts is None else int(num_experts)
        where = f"expert id {self.value} at row {self.row}, layer {self.layer}, top-k slot {self.slot}"
        if self.value < 0:
            # No storage dtype holds a negative id: the routing itself is wrong.
            message = f"{where} is negative (valid ids: 0..{self.limit})"
        elif self.num_experts is not None and self.value >= self.num_experts:
            # A wider dtype would store it, but the model has no such expert: the routing does not
            # match the model's expert count.
            message = (f"{where} is not an expert of the model, which has {self.num_experts} "
                       f"(valid ids: 0..{self.limit}); the routing does not match the model's num_experts")
        else:
            message = (f"{where} does not fit {dtype} (valid ids: 0..{self.limit}); "
                       "choose a wider --routed-experts-dtype")
        super().__init__(message)


class WireFormatError(DressageError, ValueError):
    """An engine response that does not follow SGLang's /generate format."""

    code = "engine_answer_malformed"
    http_status = 502
    openai_type = "engine_error"
    public_message = "the inference engine's answer was malformed; the call was not recorded"


class EngineError(DressageError):
    """A call to the inference engine failed; ``status_code`` is the HTTP status when there was one.

    The message names the engine (for the Proxy's log); ``engine_message`` is the engine's own
    explanation, when it gave one, which an agent may read (its prompt was too long, say).
    ``for_operator``: the answer goes to an admin call, which is told the whole message.
    """

    code = "engine_error"
    http_status = 502
    openai_type = "engine_error"
    public_message = "the inference engine failed the call; it was not recorded"

    def __init__(self, message: str, *, status_code: int | None = None, engine_message: str | None = None,
                 for_operator: bool = False) -> None:
        self.status_code = status_code
        self.engine_message = engine_message
        if for_operator:  # an admin call's answer: whoever runs the engines is told which one failed
            self.public_message = None
        super().__init__(message)

    @property
    def agent_message(self) -> str:
        if self.engine_message:
            return f"{self.public_message}: {self.engine_message}"
        return self.public_message or str(self)


class EngineUnavailable(EngineError):
    """The engine could not be reached, dropped the connection, or answered 5xx."""

    code = "engine_unavailable"
    public_message = "the inference engine could not be reached or failed the call; it was not recorded"


class EngineNotSglangError(EngineError):
    """At start-up: what answered at the engine URL is not an SGLang-protocol server (an HTML page, an
    unknown route); the message names its status and content type in one line."""

    code = "engine_not_sglang"


class EngineUpdateError(EngineError):
    """A weight version was not set on every engine; ``details`` names those updated and those that failed."""

    code = "engine_update_failed"


class EngineTimeout(EngineError):
    """The engine did not answer within the call's timeout."""

    code = "engine_timeout"
    http_status = 504
    openai_type = "engine_timeout"
    public_message = "the inference engine did not answer in time; the call was not recorded"


class EngineAnswerTooLargeError(EngineError):
    """The engine's answer (as declared or as received), or one line of a streamed answer, is over
    the Proxy's cap (``engines.max_answer_bytes``); reading stopped at the cap."""

    code = "engine_answer_too_large"
    public_message = "the inference engine's answer was over the Proxy's size cap; the call was not recorded"


class EngineRequestError(EngineError, ValueError):
    """The engine rejected the request as malformed (HTTP 4xx)."""

    code = "engine_rejected_request"
    http_status = 400
    openai_type = "invalid_request_error"
    public_message = "the inference engine refused the request"


class ReplyConstraintError(EngineError):
    """A reply broke its call's ``tool_choice`` rule under constrained decoding (cut short, or an engine that
    ignored the grammar), or every reply drawn broke ``parallel_tool_calls: false``; none was recorded."""

    openai_type = "engine_output_invalid"
    code = "reply_constraint_unmet"
    public_message = None  # the message says which rule no reply met


class NoHealthyEngineError(EngineUnavailable):
    """Every configured engine is out of the pool."""

    http_status = 503
    openai_type = "engine_unavailable"
    code = "no_healthy_engine"
    public_message = "no inference engine is healthy; retry later"


class ProxyOverloadedError(DressageError):
    """The Proxy's in-flight byte budget had no room for a call within its wait; nothing was sent."""

    http_status = 503
    openai_type = "proxy_overloaded"
    code = "proxy_overloaded"


class ContextOverflowError(DressageError, ValueError):
    """The prompt leaves no room in the context window for a single reply token."""

    http_status = 400
    openai_type = "invalid_request_error"
    code = "context_overflow"

    def __init__(self, prompt_tokens: int, context_window: int) -> None:
        self.prompt_tokens, self.context_window = int(prompt_tokens), int(context_window)
        super().__init__(f"the prompt has {self.prompt_tokens} tokens and the model's context window is "
                         f"{self.context_window} tokens: no room for a reply; compress or shorten the conversation")


class UnsupportedParameterError(DressageError, ValueError):
    """A request parameter (or value) the Proxy would otherwise have to ignore; ``param`` names it."""

    http_status = 400
    openai_type = "invalid_request_error"
    code = "unsupported_parameter"

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        self.detail = message
        super().__init__(f"{param}: {message}")

    def rename(self, param: str) -> None:
        """Name the parameter as the client sent it (a refusal of a request translated from another API)."""
        self.param = param
        self.args = (f"{param}: {self.detail}",)


class SessionIdError(DressageError, ValueError):
    """A session, instance or turn id (header or body) that cannot name one (too long, control characters, a
    session id with a '/'); param names the header or field."""

    http_status = 400
    openai_type = "invalid_request_error"
    code = "invalid_session_id"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        self.param = param
        super().__init__(message)


class MissingSessionIdError(SessionIdError):
    """A header-identified call without a session header."""

    code = "missing_session_id"


class RequestRejected(DressageError, ValueError):
    """An HTTP request the Proxy refuses before it generates anything (nothing is recorded)."""

    code = "invalid_request"
    http_status, openai_type = 400, "invalid_request_error"


class IdempotencyKeyReusedError(RequestRejected):
    """An ``Idempotency-Key`` an earlier call of the session carried, sent with another request: a retry
    must repeat its request, and another request must not get the first one's recorded reply."""

    code = "idempotency_key_reused"
    http_status = 422

    def __init__(self, message: str) -> None:
        self.param = "Idempotency-Key"
        super().__init__(message)


class InputValueError(RequestRejected):
    """A body value nothing may store or serve: a lone UTF-16 surrogate (a tool call's arguments text included),
    a non-finite number (NaN, 1e999), a malformed tool; param names it when known."""
    code = "invalid_value"

    def __init__(self, message: str, param: str | None = None) -> None:
        self.param = param
        super().__init__(message if param is None else f"{param}: {message}")


class BodyTooLargeError(RequestRejected):
    """More request body bytes arrived (declared or chunked) than ``max_body_bytes``."""
    http_status, code = 413, "body_too_large"


class HeadersTooLargeError(RequestRejected):
    """A request line and headers over ``max_header_bytes``: answered before they are parsed, and the
    connection closed."""
    code = "headers_too_large"


class BadHttpRequestError(RequestRejected):
    """A request the HTTP parser refused (a malformed request line or header, a body whose chunk sizes or
    ``Content-Length`` are not HTTP/1.1): answered before any route sees it, and the connection closed."""
    code = "bad_http_request"


class AuthenticationError(RequestRejected):
    """A missing or wrong bearer token."""
    http_status, openai_type, code = 401, "authentication_error", "invalid_api_key"


class PermissionDeniedError(RequestRejected):
    """A valid agent token on an endpoint that needs the admin token."""
    http_status, openai_type, code = 403, "permission_error", "admin_token_required"


class SessionLimitError(DressageError):
    """The Proxy holds its maximum of live sessions, none idle long enough to evict."""
    http_status, openai_type, code = 429, "rate_limit_exceeded", "too_many_sessions"


class TokenizerError(DressageError):
    """A tokenizer could not be loaded or used."""

    code = "tokenizer_error"


class ChatTemplateError(TokenizerError, ValueError):
    """Messages the chat template cannot render, or a TITO delta that is not an exact suffix."""

    code = "chat_template_error"
    http_status = 400
    openai_type = "invalid_request_error"


class JournalError(DressageError):
    """The Proxy journal cannot be written, or a record in it cannot be read back."""

    code = "journal_error"


class JournalEncodeError(JournalError, ValueError):
    """A value the journal cannot store (a lone surrogate, an integer outside 64 bits, a non-msgpack
    type): the event is refused and nothing is recorded."""

    code = "journal_unencodable_value"
    http_status = 400
    openai_type = "invalid_request_error"


class JournalDamagedError(JournalError):
    """A journal whose damage is not a torn tail: records after it would be lost by starting on its
    intact prefix, so the Proxy refuses until ``journal repair`` or ``--journal-recover truncate``."""

    code = "journal_damaged"


class JournalWriteError(JournalError):
    """A journal append failed (an I/O error): the state change it carried was not made, the session
    is as it was, and the call may be retried."""

    code = "journal_unavailable"
    http_status = 503
    openai_type = "journal_unavailable"


class JournalFullError(JournalWriteError):
    """The journal's disk (or quota) is full: nothing was changed; retry once space is freed."""

    code = "journal_disk_full"
    http_status = 507
    openai_type = "journal_disk_full"


class AnswerEncodeError(DressageError):
    """A read answer that cannot be encoded (JSON or msgpack): the read hands nothing over and
    forgets nothing; its trajectories stay readable."""

    code = "answer_not_encodable"


class TrajectoryError(DressageError):
    """A rollout-session operation that breaks trajectory semantics."""

    code = "trajectory_error"
    http_status = 409
    openai_type = "session_state"


class SessionStateError(TrajectoryError):
    """An operation the session's state does not allow (e.g. appending after finalize)."""

    code = "session_state"


class StepLimitError(SessionStateError):
    """The session already holds its maximum number of steps."""

    code = "max_steps_exceeded"


class WeightVersionChangedError(TrajectoryError):
    """The policy's weight version changed inside one trajectory while partial rollout is off.

    A 502, as upstream Dressage answers it: its harness ends the rollout on these codes instead of
    handing the failure to the agent. ``details`` (session, versions) go into the answer."""

    http_status = 502
    openai_type = "trajectory_version_changed"
    code = "trajectory_version_changed"
    upstream_detail = True

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = {k: v for k, v in details.items() if v is not None}


class GenerationPreemptedError(WeightVersionChangedError):
    """A weight update paused the call while it generated, and partial rollout is off: it is dropped."""

    openai_type = "generation_preempted"
    code = "generation_preempted"


class PartialRolloutStalenessError(WeightVersionChangedError):
    """With partial rollout: the call would make the session span more weight-version changes than
    ``sessions.max_partial_rollout_preempts`` allows; nothing of it is recorded."""

    openai_type = "partial_rollout_staleness_exceeded"
    code = "partial_rollout_staleness_exceeded"


class WeightVersionMismatchError(TrajectoryError):
    """The call's ``X-Dressage-Expected-Version`` is not the policy version that would serve it."""

    http_status = 502
    openai_type = "weight_version_mismatch"
    code = "weight_version_mismatch"
    upstream_detail = True

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = {k: v for k, v in details.items() if v is not None}


class UnknownStepError(TrajectoryError, LookupError):
    """A step id (for instance a parent) that the session does not hold."""

    code = "unknown_step"
    http_status = 404
    openai_type = "not_found"


class UnknownSessionError(UnknownStepError):
    """A session (or finalized trajectory) id the Proxy does not hold: never created, or already drained."""

    code = "unknown_session"


class UnknownReadError(UnknownStepError):
    """A trajectory read id that was never leased, or whose lease was already settled."""

    code = "unknown_read"


class ToolCallHookError(DressageError):
    """A required tool-call hook failed, or overran its time-out: the call fails, nothing is recorded."""

    http_status = 502
    openai_type = "tool_call_hook_failed"
    code = "tool_call_hook_failed"
    upstream_detail = True

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = {k: v for k, v in details.items() if v is not None}


class TransferQueueError(DressageError):
    """Base class of TransferQueue errors."""

    code = "transfer_queue_error"
    http_status = 503
    openai_type = "transfer_queue_unavailable"
    public_message = "the TransferQueue could not store or read the call's data; retry later"


class TransferWriteError(TransferQueueError):
    """A StepRecord's large fields could not be written to TransferQueue; nothing was recorded."""

    code = "transfer_write_failed"


class KeyNotFoundError(TransferQueueError, LookupError):
    """A key that was never written, or was already cleared."""

    code = "key_not_found"


class RowRangeError(TransferQueueError, ValueError):
    """A read asks for rows outside those the key stores."""

    code = "row_out_of_range"


class StorageUnitUnavailable(TransferQueueError):
    """A StorageUnit died or did not answer within its timeout."""

    code = "storage_unit_unavailable"


class LostSamplesError(TransferQueueError):
    """Samples whose large fields cannot be read any more (their StorageUnit died or lost the keys)."""

    code = "samples_lost"

    def __init__(self, message: str, *, samples: "list[str] | None" = None, keys: "list[str] | None" = None) -> None:
        self.samples = list(samples or [])
        self.keys = list(keys or [])
        super().__init__(message)


class StorageFullError(TransferQueueError):
    """A StorageUnit is over its memory budget and may not spill."""

    code = "storage_full"


class ProtocolError(TransferQueueError):
    """A frame that is malformed, pickled, or from an unknown protocol version."""

    code = "protocol_error"


class IntegrityError(TransferQueueError):
    """A stored blob whose checksum does not match what was written."""

    code = "checksum_mismatch"


class AgentError(DressageError):
    """The agents' workload driver could not use an answer (or the lack of one) from the Proxy."""

    code = "agent_error"


class ProxyConnectionError(AgentError):
    """The Proxy could not be reached or dropped the connection; no answer came back."""

    code = "proxy_unreachable"


class ProxyTimeout(ProxyConnectionError):
    """The Proxy did not answer within the call's time-out."""

    code = "proxy_timeout"


class ProxyStatusError(AgentError):
    """The Proxy answered with an HTTP error; ``status_code`` and the Proxy's own message."""

    code = "proxy_error_status"

    def __init__(self, message: str, *, status_code: int) -> None:
        self.status_code = int(status_code)
        super().__init__(message)


class ProxyReplyError(AgentError, ValueError):
    """A Proxy answer that lacks what the driver needs (session id, base URL, choices, usage)."""

    code = "proxy_reply_unusable"


class AgentCommandError(AgentError):
    """An agent command (a coding CLI run per session) timed out, or wrote no readable reward file."""

    code = "agent_command_failed"


class SampleWireError(DressageError, ValueError):
    """A Sample (or trajectory read answer) in wire form that is malformed or of an unknown version."""

    code = "sample_wire_malformed"


class UnknownResponseError(DressageError, LookupError):
    """A ``previous_response_id`` that the session did not produce, was not stored, or was forgotten."""

    http_status = 400
    openai_type = "invalid_request_error"
    code = "previous_response_not_found"
    param = "previous_response_id"


class ModelNotFoundError(DressageError, LookupError):
    """A model id other than the one the Proxy serves."""

    http_status = 404
    openai_type = "invalid_request_error"
    code = "model_not_found"
