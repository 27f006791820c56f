"""Request bodies of the Proxy's HTTP API (pydantic), validated before anything is recorded."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ChatMessage", "ChatRequest", "GenerateRequest", "CreateSession", "FinalizeRequest"]


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
    n: int = Field(default=1, ge=1, le=1)

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, v: bool) -> bool:
        if v:
            raise ValueError("stream=true is not supported by this Proxy yet; send stream=false")
        return v


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
