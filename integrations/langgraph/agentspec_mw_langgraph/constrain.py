"""What a call constrains its output to: a forced tool call, or a JSON response format.

vLLM enforces these with its structured-output backend (xgrammar by default): at each
step only tokens the grammar allows can be sampled, and draft tokens the grammar rejects
are cut before verification, so outputs stay identical with and without speculation.

* **Forced tool choice** (``tool_choice`` ``"any"``, ``"required"``, ``True``, a tool's
  name, or ``{"type": "function", "function": {"name": ...}}``): the output is exactly one
  tool call in the Hermes format the prompt teaches, ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``, the name one of the bound tools' (the named one) and the
  arguments valid against its parameter schema (its ``$ref`` s inlined) -- an xgrammar
  structural tag. One call, not several: what ``with_structured_output`` and
  ``create_agent``'s ``ToolStrategy`` need. ``True`` with several tools means any of them
  (with one tool, that tool).
* **Response format** (``response_format``, as ``ChatOpenAI`` takes it):
  ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`` (or a pydantic
  model, a TypedDict or a JSON-schema dict) -> JSON valid against the schema;
  ``{"type": "json_object"}`` -> any JSON object; ``{"type": "text"}`` -> no constraint.
  With tools offered (``tool_choice`` ``"auto"`` or none) the output is either one call of
  a bound tool or that JSON, as OpenAI's API lets a model call tools before it answers
  (a vLLM server constrains the whole output to the JSON, so no tool can be called there).
* **Checked calls** (``tool_choice`` ``"auto"`` or none, with ``strict=True`` or
  ``parallel_tool_calls=False``): free text in which every ``<tool_call>`` block is a valid
  call of a bound tool; with ``parallel_tool_calls=False`` the output ends after it.

:func:`output_constraint` returns the keyword arguments of vLLM's
``StructuredOutputsParams`` (the backend builds it), or ``None``.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.json_schema import dereference_refs
from pydantic import BaseModel, ValidationError

from agentspec_mw_langgraph.derive import HERMES_TOOL_BLOCK

__all__ = ["named_tool", "output_constraint", "parsed_response", "response_format_schema"]

_OPEN, _CLOSE = HERMES_TOOL_BLOCK  # the Hermes call block the prompt teaches
_ANY = ("any", "required")
_DEFS = ("$defs", "definitions")
_JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def named_tool(tool_choice: Any, tools: list[dict[str, Any]]) -> str | None:
    """The one tool ``tool_choice`` names, ``None`` when it allows any bound tool.

    Raises:
        ValueError: it names a tool that is not bound, or is not a tool choice at all.
    """
    names = [str(t.get("function", t).get("name", "")) for t in tools]
    if tool_choice is True:
        return names[0] if len(names) == 1 else None
    if isinstance(tool_choice, str):
        if tool_choice in _ANY:
            return None
        name = tool_choice
    elif isinstance(tool_choice, dict):
        fn = tool_choice.get("function", tool_choice)
        named = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(named, str):
            raise ValueError(
                f"tool_choice={tool_choice!r} names no tool: pass 'auto', 'none', 'any', "
                "'required', a tool's name or {'type': 'function', 'function': {'name': ...}}"
            )
        name = named
    else:
        raise ValueError(
            f"tool_choice={tool_choice!r} is not a tool choice: pass 'auto', 'none', 'any', "
            "'required', True, a tool's name or {'type': 'function', 'function': {'name': ...}}"
        )
    if name not in names:
        raise ValueError(f"tool_choice names {name!r}, which is not a bound tool ({names})")
    return name


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its local ``$ref`` s replaced by what they point at and its
    ``$defs`` / ``definitions`` dropped, so it can sit inside another schema (a ``$ref``
    is relative to the document's root). A recursive reference ends as ``{}`` (any value:
    LangChain's :func:`~langchain_core.utils.json_schema.dereference_refs`)."""
    if not any(key in schema for key in _DEFS):
        return schema
    inlined = dereference_refs(schema)
    return {k: v for k, v in inlined.items() if k not in _DEFS}


def _call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of one Hermes call body of ``tool`` (an OpenAI tool dict)."""
    fn = tool.get("function", tool)
    params = _inline_refs(fn.get("parameters") or {"type": "object", "properties": {}})
    return {
        "type": "object",
        "properties": {"name": {"const": fn.get("name", "")}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _call_format(tools: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    """The structural-tag format of one Hermes call of ``name`` (``None``: any of ``tools``)."""
    chosen = [t for t in tools if name is None or t.get("function", t).get("name") == name]
    bodies = [_call_schema(t) for t in chosen]
    schema = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
    return {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": f"{_OPEN}\n"},
            {"type": "json_schema", "json_schema": schema},
            {"type": "const_string", "value": f"\n{_CLOSE}"},
        ],
    }


def _structural_tag(fmt: dict[str, Any]) -> dict[str, Any]:
    return {"structural_tag": json.dumps({"type": "structural_tag", "format": fmt})}


def parsed_response(response_format: Any, content: str) -> dict[str, Any]:
    """``{"parsed": ...}`` for a message's ``additional_kwargs`` when ``response_format`` is
    a pydantic model, as ``ChatOpenAI`` gives it: the content validated into the model,
    ``None`` when it does not validate (an output cut at ``max_tokens``); else ``{}``."""
    if not (isinstance(response_format, type) and issubclass(response_format, BaseModel)):
        return {}
    try:
        return {"parsed": response_format.model_validate_json(content)}
    except ValidationError:
        return {"parsed": None}


def response_format_schema(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema ``response_format`` asks for; ``{}`` for any JSON object;
    ``None`` for plain text.

    Raises:
        ValueError: ``response_format`` is none of the forms in the module docstring.
    """
    if isinstance(response_format, dict) and "type" in response_format:
        kind = response_format["type"]
        if kind == "text":
            return None
        if kind == "json_object":
            return {}
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise ValueError(
                    "response_format {'type': 'json_schema'} needs "
                    "'json_schema': {'name': ..., 'schema': {...}}"
                )
            return schema
        if kind not in _JSON_TYPES:
            raise ValueError(
                f"response_format type {kind!r} is not 'text', 'json_object' or 'json_schema'"
            )
        if "title" not in response_format:  # a bare JSON schema: as it is
            return dict(response_format)
    try:
        return convert_to_json_schema(response_format)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"response_format={response_format!r} is not a response format: pass "
            "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}, "
            "{'type': 'json_object'}, or a pydantic model / TypedDict / JSON schema"
        ) from exc


def _checked_calls(tools: list[dict[str, Any]], one: bool) -> dict[str, Any]:
    """Free text in which every ``<tool_call>`` block is a valid call of a bound tool;
    ``one``: the output ends after the first call."""
    call = _call_format(tools, None)
    begin, body, end = call["elements"]
    return {
        "type": "triggered_tags",
        "triggers": [_OPEN],
        "tags": [{"type": "tag", "begin": begin["value"], "content": body, "end": end["value"]}],
        "at_least_one": False,
        "stop_after_first": one,
    }


def output_constraint(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    response_format: Any,
    *,
    strict: bool | None = None,
    parallel_tool_calls: bool | None = None,
) -> dict[str, Any] | None:
    """``StructuredOutputsParams`` keyword arguments for a call, or ``None`` (see the
    module docstring). ``tools`` are the tools the prompt offers (none with
    ``tool_choice="none"``). When the model may answer in free text or call tools,
    ``strict=True`` checks each call against its tool's schema and
    ``parallel_tool_calls=False`` ends the output after the first call, as in OpenAI's API.

    Raises:
        ValueError: a malformed ``tool_choice`` or ``response_format``.
    """
    if tool_choice not in (None, False, "auto", "none"):
        if not tools:
            raise ValueError(f"tool_choice={tool_choice!r} forces a tool call; no tool is bound")
        return _structural_tag(_call_format(tools, named_tool(tool_choice, tools)))
    schema = None if response_format is None else response_format_schema(response_format)
    if schema is not None and tools:  # the model may call a tool first, or answer
        answer = {"type": "json_schema", "json_schema": schema or {"type": "object"}}
        return _structural_tag({"type": "or", "elements": [_call_format(tools, None), answer]})
    if schema is not None:
        return {"json": schema} if schema else {"json_object": True}
    if tools and (strict or parallel_tool_calls is False):
        return _structural_tag(_checked_calls(tools, parallel_tool_calls is False))
    return None
