"""``with_agentspec(graph, engine=URL)``: plain ``ChatOpenAI`` models get tags with no change
(the OpenAI SDK hook), scoped to the wrapped graph and its server; URLs are compared
normalised; a call whose requests go elsewhere warns once; derived and delivered tags are
counted apart. Plus the contract test of the private hook point."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import httpx
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

from agentspec_mw.tags import tags_from_wire
from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec
from agentspec_mw_langgraph.openai import AgentSpecTransport
from agentspec_mw_langgraph.openai_hook import hook_stats, server_key

from .fake_openai import FakeOpenAI

pytest.importorskip("langchain_openai")

URL = "http://127.0.0.1:9/v1"
HANDLER_LOG = "agentspec_mw_langgraph.handler"


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


def plain_chat_openai(server: FakeOpenAI, base_url: str = URL, **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    kwargs.setdefault("http_client", httpx.Client(transport=server.transport))
    return ChatOpenAI(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        base_url=base_url,
        api_key="unused",
        max_retries=0,
        http_async_client=httpx.AsyncClient(transport=server.transport),
        **kwargs,
    )


def one_node_graph(*models: Any) -> Any:
    def node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [m.invoke(state["messages"]) for m in models]}

    g = StateGraph(MessagesState)
    g.add_node("n", node)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    return g.compile()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == HANDLER_LOG]


def test_hook_point_contract() -> None:
    from openai._base_client import BaseClient
    from openai._models import FinalRequestOptions

    params = list(inspect.signature(BaseClient._build_request).parameters)
    assert params[:2] == ["self", "options"]
    fields = set(FinalRequestOptions.model_fields)
    assert {"method", "url", "json_data", "extra_json"} <= fields


def test_create_agent_with_plain_chat_openai(strict: TaggingConfig) -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    agent = create_agent(plain_chat_openai(server), [search])  # an existing graph, unchanged
    app = with_agentspec(agent, engine=URL + "/", config=strict)
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
    stats = get_handler(app).stats  # type: ignore[union-attr]
    assert (stats.llm_calls, stats.tags_derived, stats.tags_delivered) == (4, 4, 4)


@pytest.mark.parametrize(
    ("engine", "base_url"),
    [
        ("http://localhost:9", "http://127.0.0.1:9/v1"),
        ("http://[::1]:9/v1/", "http://localhost:9/v1"),
        ("http://0.0.0.0:9/v1", "http://127.0.0.1:9/v1/"),
        ("HTTP://LocalHost:9/V1", "http://127.0.0.1:9/v1"),
        ("http://vllm.test/v1", "http://vllm.test:80"),
        ("https://vllm.test:443/proxy/v1/", "https://vllm.test/proxy"),
    ],
)
def test_engine_url_matches_the_same_server_written_differently(
    engine: str, base_url: str, strict: TaggingConfig, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeOpenAI()
    app = with_agentspec(
        one_node_graph(plain_chat_openai(server, base_url)), engine=engine, config=strict
    )
    with caplog.at_level(logging.WARNING):
        app.invoke({"messages": [("user", "x")]})
    assert tags_from_wire(server.bodies[0]["vllm_xargs"]).agent_id == "n"  # type: ignore[union-attr]
    assert get_handler(app).stats.tags_delivered == 1  # type: ignore[union-attr]
    assert _warnings(caplog) == []


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://localhost:9/v1", "http://localhost:10/v1"),
        ("http://vllm.test/v1", "https://vllm.test/v1"),
        ("http://vllm.test/a/v1", "http://vllm.test/v1"),
        ("http://vllm.test/v1", "http://other.test/v1"),
    ],
)
def test_server_key_keeps_different_servers_apart(a: str, b: str) -> None:
    assert server_key(a) != server_key(b)


@pytest.mark.parametrize("bad", ["localhost:8000", "ftp://h/v1", "http://", "http://h:99999"])
def test_server_key_rejects_non_urls(bad: str) -> None:
    with pytest.raises(ValueError, match="server URL"):
        server_key(bad)


def test_other_server_is_untouched_and_warned_once(
    strict: TaggingConfig, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeOpenAI()
    other = "http://127.0.0.1:10/v1"
    app = with_agentspec(
        one_node_graph(plain_chat_openai(server, other)), engine=URL, config=strict
    )
    with caplog.at_level(logging.WARNING):
        app.invoke({"messages": [("user", "x")]})
        app.invoke({"messages": [("user", "y")]})
    assert all("vllm_xargs" not in b for b in server.bodies)
    stats = get_handler(app).stats  # type: ignore[union-attr]
    assert (stats.tags_derived, stats.tags_delivered) == (2, 0)
    (message,) = _warnings(caplog)  # once, not per call
    assert f"engine={other!r}" in message


def test_no_engine_with_chat_openai_warns_what_to_pass(
    strict: TaggingConfig, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeOpenAI()
    app = with_agentspec(one_node_graph(plain_chat_openai(server)), config=strict)
    with caplog.at_level(logging.WARNING):
        app.invoke({"messages": [("user", "x")]})
    assert "vllm_xargs" not in server.bodies[0]
    (message,) = _warnings(caplog)
    assert f"with_agentspec(graph, engine={URL!r})" in message
    assert get_handler(app).stats.tags_delivered == 0  # type: ignore[union-attr]


def test_hook_is_scoped_to_the_wrapped_graph(strict: TaggingConfig) -> None:
    """A client of the registered server used by another graph (wrapped without that
    engine) or outside any graph gets no tags: registration belongs to one graph."""
    server = FakeOpenAI()
    llm = plain_chat_openai(server)
    mine = with_agentspec(one_node_graph(llm), engine=URL, config=strict)
    theirs = with_agentspec(one_node_graph(llm), config=strict)
    mine.invoke({"messages": [("user", "x")]})
    theirs.invoke({"messages": [("user", "y")]})
    llm.invoke("outside any graph")
    first, second, third = server.bodies
    assert "vllm_xargs" in first
    assert "vllm_xargs" not in second and "vllm_xargs" not in third


def test_user_xargs_kept(strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    mine = plain_chat_openai(
        server, extra_body={"vllm_xargs": {"agentspec_scope": "tenant-b", "custom": 7}}
    )
    with_agentspec(one_node_graph(mine), engine=URL, config=strict).invoke(
        {"messages": [("user", "x")]}
    )
    xargs = server.bodies[0]["vllm_xargs"]
    assert (xargs["agentspec_scope"], xargs["custom"]) == ("tenant-b", 7)
    assert xargs["agentspec_agent"] == "n"
    mine.invoke("plain")  # outside a tagged call nothing is added
    assert server.bodies[-1]["vllm_xargs"] == {"agentspec_scope": "tenant-b", "custom": 7}


def test_tagging_transport_counts_as_delivered_without_warning(
    strict: TaggingConfig, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeOpenAI()
    transport = AgentSpecTransport(server.transport)
    llm = plain_chat_openai(server, http_client=httpx.Client(transport=transport))
    app = with_agentspec(one_node_graph(llm), config=strict)  # no engine=: the client tags
    with caplog.at_level(logging.WARNING):
        app.invoke({"messages": [("user", "x")]})
    assert server.bodies[0]["vllm_xargs"]["agentspec_agent"] == "n"
    assert get_handler(app).stats.tags_delivered == 1  # type: ignore[union-attr]
    assert _warnings(caplog) == []


def test_engine_must_be_a_url() -> None:
    with pytest.raises(ValueError, match="http"):
        with_agentspec(one_node_graph(), engine="localhost:8000")


def test_the_openai_api_itself_is_not_warned_about(
    strict: TaggingConfig, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeOpenAI()
    llm = plain_chat_openai(server, "https://api.openai.com/v1")
    app = with_agentspec(one_node_graph(llm), config=strict)  # e.g. only to record traces
    with caplog.at_level(logging.WARNING):
        app.invoke({"messages": [("user", "x")]})
    assert "vllm_xargs" not in server.bodies[0]
    assert _warnings(caplog) == []


def test_engine_can_be_the_chat_openai_model(strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    llm = plain_chat_openai(server, "http://localhost:9/v1")
    app = with_agentspec(one_node_graph(llm), engine=llm, config=strict)
    app.invoke({"messages": [("user", "x")]})
    assert server.bodies[0]["vllm_xargs"]["agentspec_agent"] == "n"
    assert get_handler(app).engine_url == server_key(URL)  # type: ignore[union-attr]
