"""Request bodies of the Proxy's HTTP API (pydantic), validated before anything is recorded."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ChatMessage", "ChatRequest", "GenerateRequest", "CreateSession", "FinalizeRequest",
           "FinalizeSessionRequest", "TrajectoryReadRequest", "ResumeRequest"]


class _Body(BaseModel):
    # OpenAI clients send fields we do not use (stream_options, user, ...): ignore, do not fail.
    model_config = ConfigDict(extra="ignore")


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None


class ChatRequest(_Body):
    model: Optional[str] = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Any = None
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    stream: bool = False
    stream_options: Optional[dict[str, Any]] = None
    """``{"include_usage": true}`` adds a last chunk with the call's usage."""
    n: int = Field(default=1, ge=1, le=1)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        if v is None or v in ("none", "auto", "required"):
            return v
        if isinstance(v, dict) and isinstance((v.get("function") or {}).get("name"), str):
            return v
        raise ValueError('tool_choice must be "none", "auto", "required" or {"type": "function", '
                         '"function": {"name": ...}}')


class GenerateRequest(_Body):
    input_ids: list[int] = Field(min_length=1)
    sampling_params: Optional[dict[str, Any]] = None

    @field_validator("input_ids")
    @classmethod
    def _ids(cls, v: list[int]) -> list[int]:
        if any(t < 0 or t > 2**31 - 1 for t in v):
            raise ValueError("token ids must be in 0..2**31-1")
        return v


class CreateSession(_Body):
    metadata: dict[str, Any] = Field(default_factory=dict)


class FinalizeRequest(_Body):
    reward: Optional[float] = None


class FinalizeSessionRequest(FinalizeRequest):
    """``POST /session/finalize``: the session by body or by ``X-Session-Id`` header."""

    session_id: Optional[str] = None


class TrajectoryReadRequest(_Body):
    """``POST /trajectory/read``: finalized sessions by id or instance (or every unread one); ``drain`` forgets them."""

    session_id: Optional[str] = None
    session_ids: Optional[list[str]] = None
    instance_id: Optional[str] = None
    """Every finalized session of this prompt instance (``X-Instance-Id``): a GRPO group at once."""
    drain: bool = False
    format: Literal["segments", "samples"] = "segments"
    """``segments``: summaries (large fields as sizes); ``samples``: trainer-ready Samples with
    FieldRefs and the TransferQueue client spec (see :mod:`dressage.train.remote`)."""


class ResumeRequest(_Body):
    weight_version: Optional[int] = Field(default=None, ge=0)
    """The policy version of the tokens generated from now on (unchanged if omitted)."""
