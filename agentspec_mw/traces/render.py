"""Rendering trace prompts to text for any Hugging Face tokenizer.

* Message-list prompts go through the tokenizer's chat template
  (``apply_chat_template(..., add_generation_prompt=True)``) when it has one. Tool calls
  stored as ``{"function": {"name", "arguments"}}`` reach a template that renders
  ``tool_calls`` as vLLM's chat path hands them over (``_postprocess_messages`` in
  ``vllm/renderers/chat_utils.py``): each assistant call's ``arguments`` JSON string is
  parsed to a dict (empty, ``None``, unparsable or not a JSON object: ``{}``), and an
  empty ``tool_calls`` list is dropped — on a copy, the trace's messages are untouched.
  So a ``tool_call.arguments | tojson`` template (Qwen2.5-Instruct, Llama-3.1) renders an
  object, not an escaped string. For a template that does not render ``tool_calls`` (it
  would silently drop them, hiding the agent's own earlier calls), each call is appended
  to the message content as one line ``{"name": NAME, "arguments": ARGUMENTS}`` with the
  arguments string exactly as the model emitted it — the serialization the traces use for
  tool-call outputs.
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

#: Bump when rendering changes: it is part of the token cache key. 3: tool-call arguments
#: parsed to dicts for tool-aware templates, as vLLM does.
RENDER_VERSION = 3


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


def _arguments_object(args: Any) -> Any:
    """A tool call's ``arguments`` as vLLM's ``_postprocess_messages`` hands them to the
    template: a dict as it is; a JSON string parsed; empty, ``None``, unparsable or not
    a JSON object → ``{}``."""
    if not args:
        return {}
    if isinstance(args, dict):
        return args
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            return {}
    else:
        parsed = args
    return parsed if isinstance(parsed, dict) else {}


def _parse_tool_call_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's ``_postprocess_messages``, on copies (the messages are left as they are).

    An entry vLLM refuses (not an object, ``type`` other than ``function``, no
    ``function`` object) — it fails the request — is passed on as stored.
    """
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("role") != "assistant" or not isinstance(calls, list):
            out.append(m)
            continue
        m = dict(m)
        if not calls:  # vLLM drops it, keeping the template on its plain assistant path
            del m["tool_calls"]
            out.append(m)
            continue
        parsed = []
        for item in calls:
            fn = item.get("function") if isinstance(item, dict) else None
            if not isinstance(fn, dict) or item.get("type", "function") != "function":
                parsed.append(item)
                continue
            args = _arguments_object(fn.get("arguments"))
            parsed.append({**item, "function": {**fn, "arguments": args}})
        m["tool_calls"] = parsed
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
        if "tool_calls" in str(template):
            templated = _parse_tool_call_arguments(messages)
        else:
            templated = _fold_tool_calls(messages)
        try:
            text = tokenizer.apply_chat_template(
                templated, tokenize=False, add_generation_prompt=True
            )
            return str(text)
        except Exception:  # noqa: BLE001 - a template that rejects the messages: fall back
            pass
    return fallback_render(messages)
