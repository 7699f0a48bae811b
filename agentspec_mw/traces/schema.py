"""The trace record schema: one LLM call of an agent run (the ../shared/traces format)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Message", "SegmentHint", "TraceRecord"]

SegmentHint = Literal["plan", "tool_call", "observation", "answer", "other"]


class Message(BaseModel):
    """One chat message. Extra keys (``tool_calls``, ``name``, ``tool_call_id``) are kept."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    content: str | list[Any] | None = None


class TraceRecord(BaseModel):
    """One LLM call: what was asked (``prompt``) and what the model emitted (``output``)."""

    model_config = ConfigDict(extra="forbid")

    workload: str = Field(min_length=1)
    source: str = ""
    run_id: str = Field(min_length=1)
    call_index: int = Field(ge=0)
    agent: str = Field(min_length=1)
    segment_hint: SegmentHint = "other"
    parent_group: str | None = None
    prompt: list[Message] | str
    output: str
    meta: dict[str, Any] = Field(default_factory=dict)
