"""LangChain messages -> OpenAI-format dicts and trace output text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.utils import convert_to_openai_messages

from agentspec_mw.traces.render import tool_call_line

__all__ = [
    "has_tool_calls",
    "is_tool_result",
    "output_text",
    "to_openai_messages",
    "trailing_tool_call_ids",
]


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


def _raw_arguments(message: AIMessage) -> list[tuple[str | None, str]]:
    """The ``(id, arguments)`` of each tool call as the provider sent it (ChatOpenAI keeps
    them in ``additional_kwargs``), in the model's order."""
    raw = message.additional_kwargs.get("tool_calls") or []
    return [
        (c.get("id"), str((c.get("function") or {}).get("arguments", "")))
        for c in raw
        if isinstance(c, dict)
    ]


def has_tool_calls(message: Any) -> bool:
    """Whether ``message`` called a tool, also with arguments that did not parse
    (``invalid_tool_calls``): the model still emitted a call, not an answer."""
    return bool(
        getattr(message, "tool_calls", None) or getattr(message, "invalid_tool_calls", None)
    )


def output_text(message: BaseMessage) -> str:
    """The output as traces store it: content, then one ``tool_call_line`` per tool call,
    a call whose arguments did not parse (``invalid_tool_calls``) with its raw arguments."""
    content = message.content if isinstance(message.content, str) else message.text
    lines = [content] if content else []
    if not isinstance(message, AIMessage) or not has_tool_calls(message):
        return "\n".join(lines)
    raw = _raw_arguments(message)
    by_id = {cid: args for cid, args in raw if cid}
    calls: list[tuple[str | None, str, str]] = []  # (id, name, arguments)
    for i, call in enumerate(message.tool_calls):
        args = by_id.get(call.get("id") or "")
        if not args and not message.invalid_tool_calls and i < len(raw):
            args = raw[i][1]  # no ids to match: by position, as the provider listed them
        calls.append((call.get("id"), call["name"], args or json.dumps(call["args"])))
    for bad in message.invalid_tool_calls:
        args = bad.get("args")
        calls.append((bad.get("id"), bad.get("name") or "", args if args is not None else ""))
    order = {cid: i for i, (cid, _) in enumerate(raw) if cid}
    if all(cid in order for cid, _, _ in calls):  # the model's order
        calls.sort(key=lambda c: order[c[0] or ""])
    for _, name, args in calls:
        lines.append(tool_call_line({"name": name, "arguments": args}))
    return "\n".join(lines)
