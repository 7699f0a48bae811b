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
content. The arguments may also come as ``"parameters"`` (Llama 3's JSON format); a call
with neither key gets ``{}`` when ``name`` is its only key. A block that is not valid JSON
of that shape (or that has neither key but others) becomes an invalid tool call, with the
name when the block is a JSON object with a string ``name``.
These are the delimiters the adapter puts in the tags (:data:`TOOL_CALL_BLOCKS`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from langchain_core.messages.tool import InvalidToolCall, ToolCall

from agentspec_mw_langgraph.derive import CODE_FENCE, HERMES_TOOL_BLOCK

__all__ = ["TOOL_CALL_BLOCKS", "parse_tool_calls", "render_chat_prompt", "tools_system_prompt"]

#: The block delimiters of text this format produces: code fences and tool-call blocks.
TOOL_CALL_BLOCKS: tuple[tuple[str, str], ...] = (CODE_FENCE, HERMES_TOOL_BLOCK)


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


def _call_id(salt: str, index: int, body: str) -> str:
    return "call_" + hashlib.sha1(f"{salt}:{index}:{body}".encode()).hexdigest()[:16]


_OPEN, _CLOSE = HERMES_TOOL_BLOCK
_DECODER = json.JSONDecoder()


def _blocks(text: str) -> list[tuple[int, int, str]]:
    """Each ``<tool_call>`` block of ``text``: its start, its end and its body. A body that
    is a JSON value followed by ``</tool_call>`` ends there, so the closing tag may appear
    inside its strings; any other body ends at the next ``</tool_call>``."""
    out: list[tuple[int, int, str]] = []
    pos = 0
    while (start := text.find(_OPEN, pos)) >= 0:
        at = start + len(_OPEN)
        while at < len(text) and text[at].isspace():
            at += 1
        try:
            _, end = _DECODER.raw_decode(text, at)
        except ValueError:
            end = -1
        after = end
        while 0 <= after < len(text) and text[after].isspace():
            after += 1
        if end >= 0 and text.startswith(_CLOSE, after):
            out.append((start, after + len(_CLOSE), text[at:end]))
        else:
            close = text.find(_CLOSE, at)
            if close < 0:
                break
            out.append((start, close + len(_CLOSE), text[at:close].strip()))
        pos = out[-1][1]
    return out


def _arguments(call: dict[str, Any]) -> Any:
    """A call object's arguments: ``"arguments"``, else ``"parameters"`` (Llama 3's JSON
    tool calls), else ``{}`` when ``name`` is the only key.

    Raises:
        ValueError: neither key, but other keys (arguments under a name not known here).
    """
    for key in ("arguments", "parameters"):
        if key in call:
            return call[key]
    others = sorted(str(k) for k in call if k != "name")
    if others:
        raise ValueError(f"no 'arguments' in the call (it has {', '.join(others)})")
    return {}


def parse_tool_calls(
    text: str, salt: str = ""
) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """Split model output into content, tool calls and invalid tool calls.

    A call's id is a hash of ``salt`` (the chat model passes one of the prompt), its index
    and its body: the same output gives the same ids in every run, and a call repeated in
    a later turn of a conversation (a longer prompt) gets a new one."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    blocks = _blocks(text)
    for i, (_, _, body) in enumerate(blocks):
        call_id = _call_id(salt, i, body)
        data: Any = None
        try:
            data = json.loads(body)
            name, args = data["name"], _arguments(data)
            if isinstance(args, str):
                args = json.loads(args)
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ValueError("name must be a string and arguments an object")
            calls.append(ToolCall(name=name, args=args, id=call_id, type="tool_call"))
        except (ValueError, KeyError, TypeError) as exc:
            name = data.get("name") if isinstance(data, dict) else None
            invalid.append(
                InvalidToolCall(
                    name=name if isinstance(name, str) else None,
                    args=body,
                    id=call_id,
                    error=str(exc),
                    type="invalid_tool_call",
                )
            )
    if not blocks:
        return text, calls, invalid
    pieces, pos = [], 0
    for start, end, _ in blocks:
        pieces.append(text[pos:start])
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces).strip(), calls, invalid
