"""``with_agentspec(graph, engine=URL)``: plain ``ChatOpenAI`` models get tags with no change
(the OpenAI SDK hook), plus the contract test of the private hook point."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from agentspec_mw.tags import tags_from_wire
from agentspec_mw_langgraph import AgentSpecConfig, with_agentspec
from agentspec_mw_langgraph.openai_hook import (
    disable_openai_injection,
    hook_stats,
    injected_base_urls,
)

from .fake_openai import FakeOpenAI

pytest.importorskip("langchain_openai")

URL = "http://127.0.0.1:9/v1"


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    disable_openai_injection()
    yield
    disable_openai_injection()


def plain_chat_openai(server: FakeOpenAI, base_url: str = URL, **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        base_url=base_url,
        api_key="unused",
        max_retries=0,
        http_client=httpx.Client(transport=server.transport),
        http_async_client=httpx.AsyncClient(transport=server.transport),
        **kwargs,
    )


def test_hook_point_contract() -> None:
    from openai._base_client import BaseClient
    from openai._models import FinalRequestOptions

    params = list(inspect.signature(BaseClient._build_request).parameters)
    assert params[:2] == ["self", "options"]
    fields = set(FinalRequestOptions.model_fields)
    assert {"method", "url", "json_data", "extra_json"} <= fields


def test_create_agent_with_plain_chat_openai(strict: AgentSpecConfig) -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    agent = create_agent(plain_chat_openai(server), [search])  # an existing graph, unchanged
    app = with_agentspec(agent, engine=URL + "/", config=strict)
    assert injected_base_urls() == {URL}
    before = hook_stats().injected
    app.invoke({"messages": [HumanMessage("q-sync")]})
    asyncio.run(app.ainvoke({"messages": [HumanMessage("q-async")]}))
    bodies = server.bodies
    assert len(bodies) == 4 and hook_stats().injected - before == 4
    tags = [tags_from_wire(b["vllm_xargs"]) for b in bodies]
    assert [(t.agent_id, t.segment) for t in tags] == [  # type: ignore[union-attr]
        ("model", "tool_call"),
        ("model", "answer"),
    ] * 2
    assert tags[0].query_id == tags[1].query_id != tags[2].query_id  # type: ignore[union-attr]


def test_only_registered_servers_and_user_xargs_kept(strict: AgentSpecConfig) -> None:
    server = FakeOpenAI()
    other = plain_chat_openai(server, base_url="http://127.0.0.1:10/v1")
    mine = plain_chat_openai(
        server, extra_body={"vllm_xargs": {"agentspec_scope": "tenant-b", "custom": 7}}
    )
    from langgraph.graph import END, START, MessagesState, StateGraph

    def node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [other.invoke(state["messages"]), mine.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("n", node)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    with_agentspec(g.compile(), engine=URL, config=strict).invoke({"messages": [("user", "x")]})
    to_other, to_mine = server.bodies
    assert "vllm_xargs" not in to_other  # not a registered server: untouched
    xargs = to_mine["vllm_xargs"]
    assert (xargs["agentspec_scope"], xargs["custom"]) == ("tenant-b", 7)
    assert xargs["agentspec_agent"] == "n"
    # outside a tagged call nothing is added, even for a registered server
    mine.invoke("plain")
    assert server.bodies[-1]["vllm_xargs"] == {"agentspec_scope": "tenant-b", "custom": 7}


def test_engine_must_be_a_url() -> None:
    from langgraph.graph import END, START, MessagesState, StateGraph

    g = StateGraph(MessagesState)
    g.add_node("n", lambda s: {})
    g.add_edge(START, "n")
    g.add_edge("n", END)
    with pytest.raises(ValueError, match="http"):
        with_agentspec(g.compile(), engine="localhost:8000")
