"""LangChain messages -> OpenAI-format dicts and trace output text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.utils import convert_to_openai_messages

from agentspec_mw.traces.render import tool_call_line

__all__ = ["is_tool_result", "output_text", "to_openai_messages", "trailing_tool_call_ids"]


def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """OpenAI chat-format dicts (``role``, ``content``, ``tool_calls``, ``tool_call_id``)."""
    out = convert_to_openai_messages(list(messages))
    return [dict(m) for m in (out if isinstance(out, list) else [out])]


def is_tool_result(message: BaseMessage | None) -> bool:
    """True for a tool result fed back to the model."""
    return isinstance(message, ToolMessage) or getattr(message, "type", None) == "tool"


def trailing_tool_call_ids(messages: Sequence[BaseMessage]) -> list[str]:
    """The ``tool_call_id`` of the tool results that end the prompt."""
    ids = []
    for message in reversed(messages):
        if not is_tool_result(message):
            break
        ids.append(str(getattr(message, "tool_call_id", "")))
    return ids[::-1]


def _raw_arguments(message: AIMessage) -> list[str]:
    raw = message.additional_kwargs.get("tool_calls") or []
    return [str((c.get("function") or {}).get("arguments", "")) for c in raw]


def output_text(message: BaseMessage) -> str:
    """The output as traces store it: content, then one ``tool_call_line`` per tool call."""
    content = message.content if isinstance(message.content, str) else message.text
    lines = [content] if content else []
    if isinstance(message, AIMessage) and message.tool_calls:
        raw = _raw_arguments(message)
        for i, call in enumerate(message.tool_calls):
            args = raw[i] if i < len(raw) and raw[i] else json.dumps(call["args"])
            lines.append(tool_call_line({"name": call["name"], "arguments": args}))
    return "\n".join(lines)
