"""The trace record schema: one LLM call of an agent run (the ../shared/traces format).

Beyond the field types, a record is checked for what would otherwise fail only later,
without naming its file and line: every text is valid Unicode (no lone surrogate from a
``\\ud800``-style JSON escape, which no tokenizer takes), a message's ``tool_calls`` is a
list of ``{"function": {"name": ..., "arguments": ...}}`` objects (or flat
``{"name": ..., "arguments": ...}`` ones), and ``run_id``, ``agent`` and ``parent_group``
fit in the structure tags they become (at most ``MAX_ID_CHARS`` characters).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentspec_mw.tags import MAX_ID_CHARS

__all__ = ["Message", "SegmentHint", "TraceRecord", "check_workload_name"]

SegmentHint = Literal["plan", "tool_call", "observation", "answer", "other"]


def check_workload_name(name: str) -> str:
    """``name``, unless it is ``ALL``: the name of ``agentspec replay``'s pooled rows
    (``agentspec_mw.replay.run.ALL``).

    Raises:
        ValueError: ``name`` is ``ALL``.
    """
    if name == "ALL":
        raise ValueError("'ALL' is the name of the replay's pooled rows: rename the workload")
    return name


class Message(BaseModel):
    """One chat message. Extra keys (``tool_calls``, ``name``, ``tool_call_id``) are kept."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    content: str | list[Any] | None = None


def _check_text(value: Any, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` when a string in ``value`` (a JSON value) is
    not valid Unicode: a lone surrogate, which cannot be encoded as UTF-8."""
    if isinstance(value, str):
        if value.isascii():
            return
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{where} holds a lone surrogate {value[exc.start]!r} at character {exc.start} "
                f"(near {value[max(0, exc.start - 20) : exc.start]!r}), which is not valid "
                "Unicode and cannot be tokenized: fix the \\ud800-\\udfff escape in the record "
                "(a surrogate must be paired) or drop the record"
            ) from None
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{where} key")
            _check_text(item, f"{where}.{key}")


def _check_tool_calls(calls: Any, where: str) -> None:
    """Raise ``ValueError`` unless ``calls`` is what rendering takes (see the module docstring)."""
    if calls is None:
        return
    shape = '{"function": {"name": NAME, "arguments": ARGUMENTS}}'
    if not isinstance(calls, list):
        raise ValueError(f"{where} must be a list of {shape} objects, got {calls!r:.80}")
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name", ""), str):
            raise ValueError(f"{where}[{j}] must be a {shape} object, got {call!r:.80}")


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

    @field_validator("run_id", "agent", "parent_group")
    @classmethod
    def _fits_tags(cls, v: str | None) -> str | None:
        if v is not None and len(v) > MAX_ID_CHARS:
            raise ValueError(
                f"{len(v)} characters ({v[:40]!r}...), over the {MAX_ID_CHARS} the structure "
                "tags take: shorten it (a hash of it, say), keeping distinct values distinct"
            )
        return v

    @field_validator("workload")
    @classmethod
    def _not_all(cls, v: str) -> str:
        return check_workload_name(v)

    @field_validator("workload", "run_id", "agent", "parent_group", "output")
    @classmethod
    def _unicode(cls, v: str | None) -> str | None:
        _check_text(v, "the text")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: list[Message] | str) -> list[Message] | str:
        if isinstance(v, str):
            _check_text(v, "the text")
            return v
        for i, m in enumerate(v):
            _check_text(m.role, f"message {i} role")
            _check_text(m.content, f"message {i} content")
            for key, extra in (m.model_extra or {}).items():
                _check_text(extra, f"message {i} {key}")
            _check_tool_calls((m.model_extra or {}).get("tool_calls"), f"message {i} tool_calls")
        return v
