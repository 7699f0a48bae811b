"""Tool calling through the model's chat template, in the Hermes ``<tool_call>`` format.

Rendering (:func:`render_chat_prompt`): OpenAI-format messages and tools go to the
tokenizer's chat template (``apply_chat_template(messages, tools=..., add_generation_prompt=
True)``). A template that does not mention ``tools`` (SmolLM2's, for one) would drop them,
so then a system message listing the tools (JSON schemas inside ``<tools></tools>``) and
the calling convention is put first, and earlier assistant tool calls are folded into the
assistant content as the model would have written them. A template that does not mention
``tool_calls`` gets the same folding. Tool results keep the ``tool`` role.

Parsing (:func:`parse_tool_calls`): every ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`` block of the output becomes a tool call; the text outside the blocks is the
content. A block that is not valid JSON of that shape becomes an invalid tool call.
These are the delimiters the adapter puts in the tags (:data:`TOOL_CALL_BLOCKS`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from langchain_core.messages.tool import InvalidToolCall, ToolCall

from agentspec_mw_langgraph.derive import CODE_FENCE, HERMES_TOOL_BLOCK

__all__ = ["TOOL_CALL_BLOCKS", "parse_tool_calls", "render_chat_prompt", "tools_system_prompt"]

#: The block delimiters of text this format produces: code fences and tool-call blocks.
TOOL_CALL_BLOCKS: tuple[tuple[str, str], ...] = (CODE_FENCE, HERMES_TOOL_BLOCK)
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The system text that offers ``tools`` (OpenAI tool dicts) in the Hermes format."""
    schemas = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    return (
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _fold_calls(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    blocks = []
    for call in calls:
        fn = call.get("function", call)
        args = fn.get("arguments", "{}")
        parsed = json.loads(args) if isinstance(args, str) and args else args
        body = json.dumps({"name": fn.get("name", ""), "arguments": parsed})
        blocks.append(f"<tool_call>\n{body}\n</tool_call>")
    text = out.get("content") or ""
    out["content"] = "\n".join([text, *blocks] if text else blocks)
    return out


def render_chat_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> str:
    """The prompt text for ``messages`` (and ``tools``) -- see the module docstring."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    msgs = [dict(m) for m in messages]
    native_tools = bool(tools) and "tools" in template
    if tools and not native_tools:
        system = tools_system_prompt(tools)
        if msgs and msgs[0].get("role") == "system":
            msgs[0]["content"] = f"{msgs[0].get('content') or ''}\n\n{system}".lstrip()
        else:
            msgs.insert(0, {"role": "system", "content": system})
    if "tool_calls" not in template:
        msgs = [_fold_calls(m) for m in msgs]
    for m in msgs:
        if m.get("content") is None:
            m["content"] = ""
    kwargs: dict[str, Any] = {"tools": tools} if native_tools else {}
    return str(
        tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
    )


def _call_id(index: int, body: str) -> str:
    return "call_" + hashlib.sha1(f"{index}:{body}".encode()).hexdigest()[:16]


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """Split model output into content, tool calls and invalid tool calls."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for i, match in enumerate(_BLOCK.finditer(text)):
        body = match.group(1)
        try:
            data = json.loads(body)
            name, args = data["name"], data.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args)
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ValueError("name must be a string and arguments an object")
            calls.append(ToolCall(name=name, args=args, id=_call_id(i, body), type="tool_call"))
        except (ValueError, KeyError, TypeError) as exc:
            invalid.append(
                InvalidToolCall(
                    name=None,
                    args=body,
                    id=_call_id(i, body),
                    error=str(exc),
                    type="invalid_tool_call",
                )
            )
    content = _BLOCK.sub("", text).strip() if (calls or invalid) else text
    return content, calls, invalid
