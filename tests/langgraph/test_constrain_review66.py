"""Defects a review found in the structured-output path (2026-12-06); each test failed
before its fix."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.constrain import output_constraint
from agentspec_mw_langgraph.toolformat import parse_tool_calls

from .fake_engine import FakeBackend


class Address(BaseModel):
    street: str
    city: str


class Contact(BaseModel):
    """A person to save."""

    name: str
    home: Address


ANSWER = '{"name": "A", "home": {"street": "s", "city": "c"}}'
SAVE = {
    "type": "function",
    "function": {"name": "save", "description": "Save", "parameters": Contact.model_json_schema()},
}


def _model(
    tiny_tokenizer: Any, script: Callable[[str], str]
) -> tuple[ChatAgentSpecVLLM, FakeBackend]:
    backend = FakeBackend(tiny_tokenizer, script)
    return ChatAgentSpecVLLM(engine=backend), backend


def test_a_forced_call_of_a_tool_whose_schema_has_defs_compiles() -> None:
    """The tool's ``$ref`` s point at its own root; inside the call body they pointed at
    nothing and xgrammar refused the tag (vLLM then said only "Invalid grammar")."""
    xgr = pytest.importorskip("xgrammar")
    constraint = output_constraint([SAVE], "save", None)
    assert constraint is not None
    assert "$ref" not in constraint["structural_tag"]
    xgr.Grammar.from_structural_tag(constraint["structural_tag"])  # raised before
    tag = json.loads(constraint["structural_tag"])
    args = tag["format"]["elements"][1]["json_schema"]["properties"]["arguments"]
    assert args["properties"]["home"]["properties"]["city"] == {"title": "City", "type": "string"}


def test_a_recursive_schema_still_compiles() -> None:
    xgr = pytest.importorskip("xgrammar")

    class Tree(BaseModel):
        value: int
        kids: list[Tree] = []

    tool_dict = {
        "type": "function",
        "function": {"name": "tree", "parameters": Tree.model_json_schema()},
    }
    constraint = output_constraint([tool_dict], "any", None)
    assert constraint is not None
    xgr.Grammar.from_structural_tag(constraint["structural_tag"])


def test_a_closing_tag_inside_an_argument_string_stays_in_the_call() -> None:
    text = (
        "Saved.\n<tool_call>\n"
        '{"name": "write", "arguments": {"text": "wrap calls in <tool_call>...</tool_call>"}}'
        "\n</tool_call>"
    )
    content, calls, invalid = parse_tool_calls(text)
    assert invalid == []
    assert [c["args"] for c in calls] == [{"text": "wrap calls in <tool_call>...</tool_call>"}]
    assert content == "Saved."


def test_a_malformed_block_is_still_an_invalid_call_and_text_after_it_is_content() -> None:
    content, calls, invalid = parse_tool_calls(
        'a <tool_call>{"name": "x", </tool_call> b <tool_call>{"name": "y"}</tool_call>'
    )
    assert [c["name"] for c in calls] == ["y"]
    assert [i["args"] for i in invalid] == ['{"name": "x",']
    assert content == "a  b"


def test_a_call_repeated_in_a_later_turn_gets_a_new_id(tiny_tokenizer: Any) -> None:
    """The id was a hash of the call alone: an agent that polls a tool twice got the same
    id for both calls (and both results), which tool_call_id lookups cannot tell apart."""

    @tool
    def status() -> str:
        """The job's status."""
        return "running"

    turns = iter(['<tool_call>\n{"name": "status", "arguments": {}}\n</tool_call>'] * 2)
    model, _ = _model(tiny_tokenizer, lambda _p: next(turns, "done"))
    out = create_agent(model, [status]).invoke({"messages": [HumanMessage("poll twice")]})
    ids = [c["id"] for m in out["messages"] for c in getattr(m, "tool_calls", [])]
    assert len(ids) == 2 and len(set(ids)) == 2
    again, _ = _model(
        tiny_tokenizer, lambda _p: '<tool_call>\n{"name": "status", "arguments": {}}\n</tool_call>'
    )
    first = again.bind_tools([status]).invoke("poll").tool_calls[0]["id"]
    assert again.bind_tools([status]).invoke("poll").tool_calls[0]["id"] == first  # reproducible


def test_forcing_a_tool_with_none_bound_is_a_clear_error(tiny_tokenizer: Any) -> None:
    model, _ = _model(tiny_tokenizer, lambda _p: "hi")
    with pytest.raises(ValueError, match="no tool is bound"):
        model.bind_tools([], tool_choice="any")
    with pytest.raises(ValueError, match="no tool is bound"):
        model.bind(tool_choice="required").invoke("hi")


def test_a_bare_json_schema_is_a_response_format(tiny_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    model, backend = _model(tiny_tokenizer, lambda _p: '{"x": 1}')
    assert model.bind(response_format=schema).invoke("x?").content == '{"x": 1}'
    assert backend.requests[-1][1].structured_outputs == {"json": schema}


def test_with_tools_offered_a_response_format_allows_a_call_or_the_answer(
    tiny_tokenizer: Any,
) -> None:
    """``create_agent(..., response_format=ProviderStrategy(...))`` sends the schema with the
    tools offered: the whole output was constrained to the JSON, so no tool could ever be
    called. Now the grammar takes one call of a bound tool or the answer, nothing else."""
    xgr = pytest.importorskip("xgrammar")
    from langchain.agents.structured_output import ProviderStrategy
    from xgrammar.testing import _is_grammar_accept_string

    answer = '{"name": "A", "home": {"street": "s", "city": "c"}}'
    call = f'<tool_call>\n{{"name": "save", "arguments": {answer}}}\n</tool_call>'
    replies = iter([call])
    model, backend = _model(tiny_tokenizer, lambda _p: next(replies, answer))

    @tool
    def save(name: str, home: Address) -> str:
        """Save a contact."""
        return "saved"

    out = create_agent(model, [save], response_format=ProviderStrategy(Contact)).invoke(
        {"messages": [HumanMessage("Save A.")]}
    )
    assert out["structured_response"] == Contact(name="A", home=Address(street="s", city="c"))
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    constraint = backend.requests[0][1].structured_outputs
    assert constraint is not None and "structural_tag" in constraint
    grammar = xgr.Grammar.from_structural_tag(constraint["structural_tag"])
    assert _is_grammar_accept_string(grammar, call)
    assert _is_grammar_accept_string(grammar, answer)
    assert not _is_grammar_accept_string(grammar, "Sure, saved.")
    other = '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>'
    assert not _is_grammar_accept_string(grammar, other)


def test_strict_and_parallel_tool_calls_are_enforced_when_the_model_may_call(
    tiny_tokenizer: Any,
) -> None:
    """``bind_tools(..., strict=True)`` / ``parallel_tool_calls=False`` with the model free
    to answer or call were dropped: the calls' arguments went unchecked and several calls
    came back. Now every call must fit its tool, and with ``parallel_tool_calls=False``
    the output ends after the first."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    call = '<tool_call>\n{"name": "save", "arguments": ' + ANSWER + "}\n</tool_call>"
    bad = '<tool_call>\n{"name": "save", "arguments": {"name": 3}}\n</tool_call>'
    model, backend = _model(tiny_tokenizer, lambda _p: call)
    for options, two_calls in (({"strict": True}, True), ({"parallel_tool_calls": False}, False)):
        model.bind_tools([SAVE], **options).invoke("Save A.")
        constraint = backend.requests[-1][1].structured_outputs
        assert constraint is not None
        grammar = xgr.Grammar.from_structural_tag(constraint["structural_tag"])
        assert _is_grammar_accept_string(grammar, "I will save it. " + call)
        assert _is_grammar_accept_string(grammar, "No call needed.")
        assert not _is_grammar_accept_string(grammar, bad)
        assert _is_grammar_accept_string(grammar, call + "\n" + call) == two_calls
    model.bind_tools([SAVE]).invoke("Save A.")
    assert backend.requests[-1][1].structured_outputs is None  # "auto": as before


def test_an_option_the_engine_does_not_read_is_a_warning(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentspec_mw_langgraph import engine_chat

    monkeypatch.setattr(engine_chat, "_warned_ignored", set())  # warned once per process
    model, backend = _model(tiny_tokenizer, lambda _p: "hi")
    with pytest.warns(UserWarning, match="ignores frequency_penalty"):
        model.bind(frequency_penalty=0.5).invoke("hi")
    model.bind(max_completion_tokens=7).invoke("hi")  # ChatOpenAI's name for max_tokens
    assert backend.requests[-1][1].max_tokens == 7


def test_a_pydantic_response_format_gives_the_parsed_object(tiny_tokenizer: Any) -> None:
    """As ``ChatOpenAI``: ``additional_kwargs["parsed"]`` holds the validated model (it was
    missing: code ported from ChatOpenAI got a KeyError)."""
    from .fake_engine import FakeStreamingBackend

    want = Contact(name="A", home=Address(street="s", city="c"))
    model, _ = _model(tiny_tokenizer, lambda _p: ANSWER)
    assert model.bind(response_format=Contact).invoke("A?").additional_kwargs == {"parsed": want}
    streamed = ChatAgentSpecVLLM(engine=FakeStreamingBackend(tiny_tokenizer, lambda _p: ANSWER))
    chunks = list(streamed.bind(response_format=Contact).stream("A?"))
    joined = chunks[0]
    for chunk in chunks[1:]:
        joined += chunk
    assert joined.additional_kwargs == {"parsed": want} and joined.content == ANSWER
    cut, _ = _model(tiny_tokenizer, lambda _p: ANSWER[:20])
    assert cut.bind(response_format=Contact).invoke("A?").additional_kwargs == {"parsed": None}
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "c", "schema": Contact.model_json_schema()},
    }
    assert model.bind(response_format=schema).invoke("A?").additional_kwargs == {}
