"""Rendering trace prompts to text for any Hugging Face tokenizer.

* Message-list prompts go through the tokenizer's chat template
  (``apply_chat_template(..., add_generation_prompt=True)``) when it has one. Tool calls
  stored as ``{"function": {"name", "arguments"}}`` reach a template that renders
  ``tool_calls``; for a template that does not (it would silently drop them, hiding the
  agent's own earlier calls), each call is appended to the message content as one line
  ``{"name": NAME, "arguments": ARGUMENTS}`` with the arguments string exactly as the
  model emitted it — the serialization the traces use for tool-call outputs.
* Fallback (no chat template, or the template raises): each message becomes
  ``"<|{role}|>\\n{content}\\n"`` (tool calls appended as their JSON), followed by
  ``"<|assistant|>\\n"`` — the plain role-tagged layout of templates such as Zephyr's.
* Plain-string prompts (completion-style models) are used as they are.

The output is never templated: it is the text the model emitted, tokenized without
special tokens.
"""

from __future__ import annotations

import json
from typing import Any

from agentspec_mw.traces.schema import Message

__all__ = ["RENDER_VERSION", "render_prompt_text"]

#: Bump when rendering changes: it is part of the token cache key.
RENDER_VERSION = 2


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for part in content:
            if isinstance(part, dict) and "text" in part:
                parts.append(str(part["text"]))
            else:
                parts.append(json.dumps(part, sort_keys=True))
        return "".join(parts)
    return str(content)


def _as_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        d = m.model_dump(exclude_none=True)
        d["content"] = _content_text(m.content)
        out.append(d)
    return out


def tool_call_line(call: dict[str, Any]) -> str:
    """One tool call as the traces serialize it: ``{"name": ..., "arguments": <raw>}``."""
    fn = call.get("function", call)
    args = fn.get("arguments", "")
    raw = args if isinstance(args, str) else json.dumps(args)
    return f'{{"name": {json.dumps(fn.get("name", ""))}, "arguments": {raw}}}'


def _fold_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = dict(m)
            lines = [tool_call_line(c) for c in m.pop("tool_calls")]
            m["content"] = "\n".join([m["content"], *lines] if m.get("content") else lines)
        out.append(m)
    return out


def fallback_render(messages: list[dict[str, Any]]) -> str:
    """The documented template-free rendering (see the module docstring)."""
    chunks = []
    for m in _fold_tool_calls(messages):
        chunks.append(f"<|{m['role']}|>\n{m.get('content') or ''}\n")
    chunks.append("<|assistant|>\n")
    return "".join(chunks)


def render_prompt_text(prompt: list[Message] | str, tokenizer: Any) -> str:
    """Return the prompt text the model would see (see the module docstring)."""
    if isinstance(prompt, str):
        return prompt
    messages = _as_dicts(prompt)
    template = getattr(tokenizer, "chat_template", None)
    if template:
        if "tool_calls" not in str(template):
            messages = _fold_tool_calls(messages)
        try:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            return str(text)
        except Exception:  # noqa: BLE001 - a template that rejects the messages: fall back
            pass
    return fallback_render(messages)
