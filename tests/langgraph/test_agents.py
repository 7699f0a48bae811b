"""Prebuilt agents get tags by adding ``with_agentspec(...)`` and nothing else."""

from __future__ import annotations

import warnings
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec

from .fake_chat import ScriptedChatModel, tool_call


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    assert [t["function"]["name"] for t in tools] == ["add"]
    if isinstance(messages[-1], ToolMessage):
        return AIMessage(content=f"the sum is {messages[-1].content}")
    return tool_call("add", {"a": 2, "b": 3}, "c1")


def _check(app: Any, model: ScriptedChatModel, node: str) -> None:
    out = app.invoke({"messages": [HumanMessage("what is 2+3?")]})
    assert out["messages"][-1].content == "the sum is 5"
    tags = [t for t, _ in model.seen]
    assert [(t.agent_id, t.segment) for t in tags] == [  # type: ignore[union-attr]
        (node, "tool_call"),
        (node, "answer"),
    ]
    handler = get_handler(app)
    assert handler is not None
    graph = handler.graph(tags[0].query_id)  # type: ignore[union-attr]
    assert [c.actual_segment for c in graph.llm_calls()] == ["tool_call", "answer"]
    obs = [c for c in graph.calls.values() if c.kind == "tool"]
    assert [(o.name, o.segment) for o in obs] == [("add", "observation")]
    assert [(e.src, e.kind) for e in graph.edges if e.kind == "observation"] == [
        (obs[0].call_id, "observation")
    ]


def test_create_agent(strict: TaggingConfig) -> None:
    from langchain.agents import create_agent

    model = ScriptedChatModel(script=script)
    app = with_agentspec(create_agent(model, [add]), config=strict)
    _check(app, model, "model")


def test_create_react_agent(strict: TaggingConfig) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of create_agent
        from langgraph.prebuilt import create_react_agent

        model = ScriptedChatModel(script=script)
        graph = create_react_agent(model, [add])
    app = with_agentspec(graph, config=strict)
    _check(app, model, "agent")
