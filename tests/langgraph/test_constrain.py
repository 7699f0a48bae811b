"""Forced tool choice and response formats reach the engine as vLLM structured-output
constraints (fake backend; the real engine's check is in ``test_engine_defaults.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.backend import GenerationRequest, sampling_params
from agentspec_mw_langgraph.constrain import named_tool, output_constraint

from .fake_engine import FakeBackend
from .schemas import Person, add, weather

TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}},
]


def _tag_schema(constraint: dict[str, Any]) -> dict[str, Any]:
    tag = json.loads(constraint["structural_tag"])
    first, body, last = tag["format"]["elements"]
    assert (first["value"], last["value"]) == ("<tool_call>\n", "\n</tool_call>")
    schema: dict[str, Any] = body["json_schema"]
    return schema


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("any", None),
        ("required", None),
        (True, None),
        ("weather", "weather"),
        ({"type": "function", "function": {"name": "add"}}, "add"),
        ({"name": "add"}, "add"),
    ],
)
def test_named_tool(choice: Any, expected: str | None) -> None:
    assert named_tool(choice, TOOLS) == expected


def test_true_with_one_tool_names_it() -> None:
    assert named_tool(True, TOOLS[:1]) == "add"


@pytest.mark.parametrize(
    ("choice", "match"),
    [
        ("subtract", "not a bound tool"),
        ({"type": "function"}, "names no tool"),
        (3, "is not a tool choice"),
    ],
)
def test_bad_tool_choice_is_a_clear_error(choice: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        named_tool(choice, TOOLS)


def test_forced_choice_is_one_hermes_call_of_the_bound_tools() -> None:
    schema = _tag_schema(output_constraint(TOOLS, "any", None) or {})
    names = [b["properties"]["name"]["const"] for b in schema["anyOf"]]
    assert names == ["add", "weather"]
    named = _tag_schema(output_constraint(TOOLS, "weather", None) or {})
    assert named["properties"]["name"] == {"const": "weather"}
    assert named["required"] == ["name", "arguments"]


@pytest.mark.parametrize("choice", [None, "auto", "none", False])
def test_unforced_choice_constrains_nothing(choice: Any) -> None:
    assert output_constraint(TOOLS, choice, None) is None


def test_response_formats() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert output_constraint(None, None, fmt) == {"json": schema}
    assert output_constraint(None, None, {"type": "json_object"}) == {"json_object": True}
    assert output_constraint(None, None, {"type": "text"}) is None
    assert output_constraint(None, None, Person)["json"]["required"] == ["name", "age"]  # type: ignore[index]
    with pytest.raises(ValueError, match="needs 'json_schema'"):
        output_constraint(None, None, {"type": "json_schema"})
    with pytest.raises(ValueError, match="is not 'text'"):
        output_constraint(None, None, {"type": "yaml"})
    with pytest.raises(ValueError, match="is not a response format"):
        output_constraint(None, None, 42)


def test_constraint_reaches_sampling_params() -> None:
    pytest.importorskip("vllm")
    constraint = output_constraint(TOOLS, "add", None)
    params = sampling_params(
        GenerationRequest(prompt_token_ids=[1], max_tokens=4, structured_outputs=constraint)
    )
    assert params.structured_outputs is not None
    assert params.structured_outputs.structural_tag == (constraint or {})["structural_tag"]
    plain = sampling_params(GenerationRequest(prompt_token_ids=[1], max_tokens=4))
    assert plain.structured_outputs is None


def _model(tiny_tokenizer: Any, reply: str) -> tuple[ChatAgentSpecVLLM, FakeBackend]:
    backend = FakeBackend(tiny_tokenizer, lambda _prompt: reply)
    return ChatAgentSpecVLLM(engine=backend, max_tokens=32), backend


def test_bind_tools_forced_choice_sends_the_constraint(tiny_tokenizer: Any) -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    model, backend = _model(tiny_tokenizer, call)
    msg = model.bind_tools([add, weather], tool_choice="add").invoke("1+2?")
    assert msg.tool_calls[0]["args"] == {"a": 1, "b": 2}
    (_, request), *_ = backend.requests
    named = _tag_schema(request.structured_outputs or {})
    assert named["properties"]["name"] == {"const": "add"}
    model.bind_tools([add]).invoke("1+2?")
    model.bind_tools([add], tool_choice="none").invoke("1+2?")
    assert [r.structured_outputs for _, r in backend.requests[1:]] == [None, None]
    with pytest.raises(ValueError, match="not a bound tool"):
        model.bind_tools([add], tool_choice="subtract")


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_with_structured_output(tiny_tokenizer: Any, method: str) -> None:
    body = '{"name": "Ann", "age": 30}'
    reply = (
        f'<tool_call>\n{{"name": "Person", "arguments": {body}}}\n</tool_call>'
        if method == "function_calling"
        else body
    )
    model, backend = _model(tiny_tokenizer, reply)
    runnable = model.with_structured_output(Person, method=method)  # type: ignore[arg-type]
    assert runnable.invoke([HumanMessage("Ann, 30")]) == Person(name="Ann", age=30)
    raw = model.with_structured_output(Person, method=method, include_raw=True)  # type: ignore[arg-type]
    out = raw.invoke("Ann, 30")
    assert isinstance(out, dict) and out["parsed"] == Person(name="Ann", age=30)
    constraint = backend.requests[0][1].structured_outputs or {}
    if method == "function_calling":
        assert _tag_schema(constraint)["properties"]["name"] == {"const": "Person"}
    elif method == "json_schema":
        assert constraint["json"]["required"] == ["name", "age"]
    else:
        assert constraint == {"json_object": True}


def test_with_structured_output_reports_a_parse_failure(tiny_tokenizer: Any) -> None:
    model, _ = _model(tiny_tokenizer, '{"name": "Ann"')  # cut at max_tokens
    out = model.with_structured_output(Person, method="json_schema", include_raw=True).invoke("x")
    assert isinstance(out, dict) and out["parsed"] is None and out["parsing_error"] is not None
    with pytest.raises(ValueError, match="method='xml'"):
        model.with_structured_output(Person, method="xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unsupported arguments"):
        model.with_structured_output(Person, tools=[])


def test_create_agent_response_format_forces_a_call_each_turn(tiny_tokenizer: Any) -> None:
    from langchain.agents import create_agent

    body = '{"name": "Person", "arguments": {"name": "Ann", "age": 30}}'
    model, backend = _model(tiny_tokenizer, f"<tool_call>\n{body}\n</tool_call>")
    out = create_agent(model, [add], response_format=Person).invoke(
        {"messages": [HumanMessage("Ann, 30")]}
    )
    assert out["structured_response"] == Person(name="Ann", age=30)
    (_, request), *_ = backend.requests
    names = [
        b["properties"]["name"]["const"]
        for b in _tag_schema(request.structured_outputs or {})["anyOf"]
    ]
    assert sorted(names) == ["Person", "add"]  # ToolStrategy: a real tool or the answer
