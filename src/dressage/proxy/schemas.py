"""Request bodies of the Proxy's HTTP API (pydantic), validated before anything is recorded.

Besides the bodies, the value types every endpoint's schema shares: :data:`Integer` and :data:`Number`
(a JSON ``true`` or a string is not a number), :data:`Flag` (only ``true`` / ``false``), :data:`Shallow` (JSON nested at most
:data:`~dressage.proxy.json_values.MAX_DEPTH` levels, tool-call arguments included) and :data:`Storable`
(what the journal and every answer format can hold). Their refusals are the error types in
:data:`BAD_REQUEST_ERRORS`, answered 400 naming the field.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr,
                      field_validator)
from pydantic_core import PydanticCustomError

from dressage.proxy.json_values import nesting_problem, storable_problem
from dressage.proxy.openai.policy import IGNORED, REFUSED, USED, Param, ParamPolicy

__all__ = ["ChatMessage", "ChatRequest", "GenerateRequest", "CreateSession", "FinalizeRequest",
           "FinalizeSessionRequest", "TrajectoryReadRequest", "TrajectoryAckRequest", "ResumeRequest", "PauseRequest",
           "DiscardRequest", "GENERATE_PARAMS",
           "Integer", "Number", "Flag", "Shallow", "Storable", "check_stream_options", "BAD_REQUEST_ERRORS",
           "MAX_READ_SESSION_IDS"]

BAD_REQUEST_ERRORS = frozenset({"extra_forbidden", "bool_not_number", "string_not_number", "number_not_finite",
                                "not_a_boolean", "json_too_deep", "value_not_storable", "reserved_metadata"})
"""Validation error types answered 400 (a malformed request) rather than 422: an unknown key of a strict
body, a boolean or a string where a number goes, a number that is not finite, anything but ``true`` /
``false`` where a flag goes, JSON nested too deep, a value nothing downstream can store, a session's
reserved metadata key of the wrong type."""
MAX_READ_SESSION_IDS = 4096
"""``session_ids`` one trajectory read may name (after duplicates are dropped)."""


def _a_number(value: Any) -> Any:
    # pydantic reads true as 1 and "5" as 5 in lax mode; a client that sends either for a count sent a
    # wrong type (and a string could carry "NaN" or "inf" past the body guard's check of JSON numbers).
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "a boolean is not a number")
    if isinstance(value, (str, bytes)):
        raise PydanticCustomError("string_not_number", "a string is not a number")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise PydanticCustomError("number_not_finite", "a number must be finite")
    return value


def _a_flag(value: Any) -> Any:
    # Lax mode reads "yes", "off", 1 and 0 as booleans: only JSON true / false are.
    if not isinstance(value, bool):
        raise PydanticCustomError("not_a_boolean", "expected true or false")
    return value


def _shallow(value: Any) -> Any:
    problem = nesting_problem(value)
    if problem is not None:
        raise PydanticCustomError("json_too_deep", "{problem}", {"problem": problem.lstrip(": ") or problem})
    return value


def _storable(value: Any) -> Any:
    problem = storable_problem(value)
    if problem is not None:
        kind = "json_too_deep" if "nested deeper" in problem else "value_not_storable"
        raise PydanticCustomError(kind, "{problem}", {"problem": problem.lstrip(": ") or problem})
    return value


Integer = Annotated[int, BeforeValidator(_a_number)]
"""An integer field: ``true`` / ``false`` (``bool_not_number``) and strings (``string_not_number``) are
refused; an integral number written with a fraction (``2.0``) is that integer."""
Number = Annotated[float, BeforeValidator(_a_number), AfterValidator(_finite)]
"""A number field: booleans and strings are refused, and so is a number that is not finite."""
Flag = Annotated[bool, BeforeValidator(_a_flag)]
"""A boolean field: only JSON ``true`` / ``false`` (``not_a_boolean``)."""
Shallow = AfterValidator(_shallow)
"""Annotate a JSON-valued field the Proxy parses or renders: nested at most ``MAX_DEPTH`` levels
(``json_too_deep``), a tool call's ``arguments`` text included."""
Storable = AfterValidator(_storable)
"""Annotate a JSON-valued field the Proxy stores: ``Shallow``, and only values the journal, msgpack and JSON
answers hold (integers in int64, finite numbers, string keys; ``value_not_storable``)."""


class _Body(BaseModel):
    # OpenAI clients send fields we do not use (stream_options, user, ...): ignore, do not fail.
    model_config = ConfigDict(extra="ignore")


class _Control(BaseModel):
    # Control calls change what is recorded: a misspelt key must fail (400), not be ignored.
    model_config = ConfigDict(extra="forbid")


class ChatMessage(_Body):
    # ``function``: the deprecated function-call form, kept so that it is refused by name (a 400), not as
    # a malformed body; so are an assistant turn's ``function_call`` and ``refusal`` (see ``chat_messages``).
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None
    function_call: Optional[Any] = None
    refusal: Optional[str] = None


class ChatRequest(_Body):
    """``POST /v1/chat/completions``; what the Proxy does with each field is
    :data:`dressage.proxy.openai.chat.params.CHAT_PARAMS` (rendered in ``docs/parameters.md``)."""

    # Keys not declared here are kept (``model_extra``) so that the policy can accept, or refuse by
    # name, each one instead of dropping it.
    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    # One nesting check over the raw messages (content parts, tool calls and their arguments text).
    messages: Annotated[list[ChatMessage], BeforeValidator(_shallow)] = Field(min_length=1)
    tools: Annotated[Optional[list[dict[str, Any]]], Shallow] = None
    tool_choice: Annotated[Any, Shallow] = None
    parallel_tool_calls: Optional[Flag] = None
    temperature: Optional[Number] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[Number] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[Integer] = None
    min_p: Optional[Number] = Field(default=None, ge=0.0, le=1.0)
    frequency_penalty: Optional[Number] = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: Optional[Number] = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: Optional[Number] = Field(default=None, gt=0.0, le=2.0)
    logit_bias: Optional[dict[str, Number]] = None
    max_tokens: Optional[Integer] = Field(default=None, ge=1)
    max_completion_tokens: Optional[Integer] = Field(default=None, ge=1)
    min_tokens: Optional[Integer] = Field(default=None, ge=0)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[Integer] = None
    response_format: Annotated[Optional[dict[str, Any]], Shallow] = None
    logprobs: Optional[Flag] = None
    top_logprobs: Optional[Integer] = Field(default=None, ge=0, le=20)
    stream: Flag = False
    stream_options: Annotated[Optional[dict[str, Any]], Shallow] = None
    """``{"include_usage": true}`` adds a last chunk with the call's usage."""
    n: Integer = Field(default=1, ge=1, le=64)
    """Samples of the prompt (a GRPO group): each is its own engine call and recorded step."""
    session_id: Optional[str] = None
    instance_id: Optional[Union[StrictStr, Integer]] = None
    turn_id: Optional[str] = None
    """Upstream's clients may name the call in the body; an ``X-Session-Id`` / ``X-Instance-Id`` /
    ``X-Turn-Id`` header wins."""

    @field_validator("n", "stream", mode="before")
    @classmethod
    def _null_is_default(cls, v: Any, info: Any) -> Any:
        # Some clients send every parameter, unset ones as null.
        return cls.model_fields[info.field_name].default if v is None else v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        return check_stream_options(v)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        # Any typed choice passes here: one that is not served (``allowed_tools``, ``custom``) is refused
        # by name as an unsupported parameter (``chat.params._tool_mode``), not as a malformed body.
        if v is None or v in ("none", "auto", "required"):
            return v
        if isinstance(v, dict) and isinstance(v.get("type", "function"), str):
            return v
        raise ValueError('tool_choice must be "none", "auto", "required" or {"type": "function", '
                         '"function": {"name": ...}}')

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Optional[Union[str, list[str]]], info: Any) -> Optional[Union[str, list[str]]]:
        # OpenAI's bound, which its clients keep; a request translated from a protocol without it (Anthropic's
        # ``stop_sequences``) passes ``context={"max_stops": None}``: the engine takes any number.
        most = (info.context or {}).get("max_stops", 4)
        stops = [v] if isinstance(v, str) else v or []
        if most is not None and len(stops) > most:
            raise ValueError(f"at most {most} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop sequence must not be empty")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v != -1 and v < 1:
            raise ValueError("top_k must be -1 (whole vocabulary) or at least 1")
        return v


_ANSWER_ONLY = "accepted and ignored: it asks for more in the answer (or is the engine's bookkeeping); what is " \
               "sampled and recorded is the same"
_ROUTING = "accepted and ignored: where SGLang places the request (the Proxy routes its own calls)"
GENERATE_PARAMS = ParamPolicy("SGLang generate", (
    Param("input_ids", USED, "the prompt's token ids (0..2**31-1); recorded as the step's prompt"),
    Param("sampling_params", USED, "passed to the engine as sent (`max_new_tokens` left out: what the context "
          "window leaves); an engine that refuses one gets a 400 naming `sampling_params.NAME`"),
    Param("stream", USED, "`false` only: the Proxy answers a token-level call whole; `true`: 400",
          refuse=lambda v: "a token-level call is answered whole; send stream false" if v is not False else None),
    Param("rid", IGNORED, "accepted and ignored: the Proxy names its own engine requests"),
    Param("return_logprob", IGNORED, _ANSWER_ONLY + "; the step records each token's logprob when the Proxy "
          "records logprobs"),
    Param("logprob_start_len", IGNORED, _ANSWER_ONLY),
    Param("top_logprobs_num", IGNORED, _ANSWER_ONLY),
    Param("token_ids_logprob", IGNORED, _ANSWER_ONLY),
    Param("return_text_in_logprobs", IGNORED, _ANSWER_ONLY),
    Param("return_hidden_states", IGNORED, _ANSWER_ONLY),
    Param("return_routed_experts", IGNORED, _ANSWER_ONLY + "; the Proxy asks for R3 itself when it is on"),
    Param("routed_experts_start_len", IGNORED, _ANSWER_ONLY),
    Param("log_metrics", IGNORED, _ANSWER_ONLY),
    Param("no_logs", IGNORED, _ANSWER_ONLY),
    Param("custom_labels", IGNORED, _ANSWER_ONLY),
    Param("priority", IGNORED, _ROUTING),
    Param("data_parallel_rank", IGNORED, _ROUTING),
    Param("bootstrap_host", IGNORED, _ROUTING),
    Param("bootstrap_port", IGNORED, _ROUTING),
    Param("bootstrap_room", IGNORED, _ROUTING),
    Param("text", REFUSED, "token in, token out: send `input_ids` (text is tokenized by the chat and completions "
          "endpoints)"),
    Param("input_embeds", REFUSED, "embeddings in place of tokens leave no token ids to record"),
    Param("image_data", REFUSED, "the served model reads text only"),
    Param("video_data", REFUSED, "the served model reads text only"),
    Param("audio_data", REFUSED, "the served model reads text only"),
    Param("modalities", REFUSED, "the served model reads text only"),
    Param("lora_path", REFUSED, "a LoRA adapter would sample from another policy than the one trained"),
    Param("lora_id", REFUSED, "a LoRA adapter would sample from another policy than the one trained"),
    Param("custom_logit_processor", REFUSED, "a custom logit processor changes what is sampled and is not "
          "forwarded"),
    Param("session_params", REFUSED, "SGLang's own sessions are not used: the Proxy's session is the URL's"),
))
"""What ``POST /sessions/{id}/generate`` does with each field of SGLang's ``/generate`` body (rendered in
``docs/parameters.md``); a field it does not list is refused by name."""


class GenerateRequest(_Body):
    """``POST /sessions/{id}/generate``: SGLang's body; every field, declared or not, is checked by
    :data:`GENERATE_PARAMS`."""

    model_config = ConfigDict(extra="allow")

    input_ids: list[Integer] = Field(min_length=1)
    sampling_params: Annotated[Optional[dict[str, Any]], Shallow] = None
    stream: Optional[Flag] = None

    @field_validator("input_ids")
    @classmethod
    def _ids(cls, v: list[int]) -> list[int]:
        if any(t < 0 or t > 2**31 - 1 for t in v):
            raise ValueError("token ids must be in 0..2**31-1")
        return v

    @field_validator("sampling_params")
    @classmethod
    def _sampling(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        n = (v or {}).get("max_new_tokens")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 2**31 - 1):
            raise ValueError(f"sampling_params.max_new_tokens must be an integer in 1..2**31-1, got {n!r}")
        return v


def check_stream_options(v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """``stream_options`` of a chat or text completion: its ``include_usage``, when given, a boolean."""
    if v is not None and "include_usage" in v and not isinstance(v["include_usage"], (bool, type(None))):
        raise PydanticCustomError("not_a_boolean", "stream_options.include_usage: expected true or false")
    return v


def _session_metadata(v: dict[str, Any]) -> dict[str, Any]:
    # The keys a Sample takes its prompt group from: a wrong type here would be recorded, handed out and
    # only refused by the trainer, holding the whole read it came in.
    group = v.get("group_index")
    if group is not None and (isinstance(group, bool) or not isinstance(group, int)):
        raise PydanticCustomError("reserved_metadata", "group_index must be an integer, got {got}",
                                  {"got": type(group).__name__})
    instance = v.get("instance_id")
    if instance is not None and (isinstance(instance, bool) or not isinstance(instance, (str, int))):
        raise PydanticCustomError("reserved_metadata", "instance_id must be a string or an integer, got {got}",
                                  {"got": type(instance).__name__})
    return v


class CreateSession(_Control):
    """``POST /sessions``: a misspelt key (``metdata``) is refused rather than dropped with what it carried."""

    metadata: Annotated[dict[str, Any], Storable, AfterValidator(_session_metadata)] = Field(default_factory=dict)
    """Kept with the session, journaled and handed to the trainer: only values every format holds;
    ``group_index`` (an integer) and ``instance_id`` (a string or an integer) are the prompt group's."""


class FinalizeRequest(_Control):
    reward: Optional[Number] = None
    instance_id: Optional[str] = None
    """The prompt instance (GRPO group) of the session, when its calls did not name one."""
    label: Annotated[Optional[Any], Storable] = None
    """The task's label (reference answer), kept with the trajectory."""
    wait_s: Optional[Number] = Field(default=None, ge=0, le=600)
    """How long to wait for the session's calls still in flight (default: the Proxy's setting)."""


class FinalizeSessionRequest(FinalizeRequest):
    """``POST /session/finalize``: the session by body or by ``X-Session-Id`` header."""

    session_id: Optional[str] = None


class DiscardRequest(_Control):
    """``POST /session/discard``: the session by body or by ``X-Session-Id`` header."""

    session_id: Optional[str] = None


class TrajectoryReadRequest(_Control):
    """``POST /trajectory/read``.

    ``trajectory_id`` / ``session_id`` / ``session_ids`` read exactly those trajectories
    (``instance_id`` then only filters them); without them, finalized trajectories are read in
    whole prompt-instance groups, at most ``max_groups`` groups, of ``instance_id`` when given.
    ``segment_view`` rebuilds the Segments in another view for this read; ``drain`` forgets what
    was read.
    """

    trajectory_id: Optional[str] = None
    session_id: Optional[str] = None
    session_ids: Optional[list[str]] = None
    """Duplicates are dropped (the first of each kept, in order); at most :data:`MAX_READ_SESSION_IDS`."""
    instance_id: Optional[str] = None
    max_groups: Optional[Integer] = Field(default=None, ge=1)
    # The two group settings are checked by the read itself (GroupRule): a bad one is a 400 naming it,
    # like every other bad setting of what is handed over for training, not a schema 422.
    min_group_size: Any = None
    """Batch reads: a group is handed over once this many of its sessions finalized (default: the
    Proxy's ``--min-group-size``) ..."""
    group_timeout_s: Any = None
    """... or once its oldest finalized session is this many seconds old (default: ``--group-timeout``)."""
    segment_view: Optional[Literal["lineage", "timeline"]] = None
    drain: Flag = False
    """Forget what was read once the answer was written in full (an answer that cannot be written
    forgets nothing)."""
    lease: Flag = False
    """Two-phase read: hand the trajectories out under the answer's ``read_id``; ``POST /trajectory/ack``
    forgets them, ``POST /trajectory/release`` (or the lease running out) makes them readable again."""
    lease_s: Any = None
    """How long the lease holds (default: the Proxy's ``--read-lease``); checked by the read (a 400)."""
    format: Literal["segments", "samples"] = "segments"
    """``segments``: summaries (large fields as sizes); ``samples``: trainer-ready Samples with
    FieldRefs and the TransferQueue client spec (see :mod:`dressage.train.remote`)."""

    @field_validator("session_ids")
    @classmethod
    def _session_ids(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is None:
            return v
        unique = list(dict.fromkeys(v))  # linear: a read naming 40,000 ids must not stall the event loop
        if len(unique) > MAX_READ_SESSION_IDS:
            raise ValueError(f"at most {MAX_READ_SESSION_IDS} distinct session ids per read, got {len(unique)}; "
                             "read in batches")
        return unique


class TrajectoryAckRequest(_Control):
    """``POST /trajectory/ack`` and ``POST /trajectory/release``: the read whose trajectories the reader
    holds (forget them) or hands back (readable again)."""

    read_id: StrictStr = Field(min_length=1, max_length=128)


class ResumeRequest(_Control):
    weight_version: Optional[StrictInt] = Field(default=None, ge=0)
    """The policy version of the tokens generated from now on (unchanged if omitted)."""
    version: Optional[Union[StrictStr, StrictInt]] = None
    """The same as the engine names it (upstream's field); a plain integer string is that number."""
    update_engines: Flag = False
    """Also set the version on every engine (``POST /update_weight_version``) before resuming."""
    reason: Optional[str] = None

    @field_validator("version")
    @classmethod
    def _version(cls, v: Optional[Union[str, int]]) -> Optional[Union[str, int]]:
        if isinstance(v, str) and not v.strip():
            raise ValueError("version must not be empty")
        if isinstance(v, int) and (isinstance(v, bool) or v < 0):
            raise ValueError("version must be a non-negative integer or a string")
        return v

    def requested(self) -> Optional[Union[str, int]]:
        """The version asked for (``weight_version`` or ``version``; both must agree)."""
        if self.weight_version is not None and self.version is not None \
                and str(self.weight_version) != str(self.version):
            raise ValueError(f"weight_version {self.weight_version} and version {self.version!r} disagree")
        return self.weight_version if self.weight_version is not None else self.version


class PauseRequest(_Control):
    """``POST /v1/rollout/pause``: every call, or only a session's / an instance's."""

    session_id: Optional[str] = None
    instance_id: Optional[Union[StrictStr, Integer]] = None
    """A session's ``instance_id`` as it was given: a string, or an integer (read as its decimal string)."""
    reason: Optional[str] = None
    mode: Optional[Literal["preempt", "abort"]] = None
    timeout_seconds: Optional[Number] = Field(default=None, gt=0, le=600)
