"""The routing key header: every request a tagged call sends carries ``x-session-id``
derived from its tags, so a router (vllm-router ``consistent_hash``) keeps a query's agents,
fan-out siblings and repeats on one replica; granularity and header name are configurable;
a header the caller sets wins."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.types import Send
from pydantic import ValidationError

from agentspec_mw.tags import StructureTags, tags_from_wire
from agentspec_mw_langgraph import (
    AgentSpecMiddleware,
    TaggingConfig,
    agentspec_chat_openai,
    routing_headers,
    with_agentspec,
)
from agentspec_mw_langgraph.routing import routing_key

from .fake_openai import FakeOpenAI
from .graphs import fan_out_graph, group_kind_of

pytest.importorskip("langchain_openai")

URL = "http://127.0.0.1:9/v1"
HEADER = "x-session-id"


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


def chat_openai(server: FakeOpenAI, **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        base_url=URL,
        api_key="unused",
        max_retries=0,
        http_client=httpx.Client(transport=server.transport),
        http_async_client=httpx.AsyncClient(transport=server.transport),
        **kwargs,
    )


class FanState(TypedDict, total=False):
    question: str
    topic: str
    notes: Annotated[list[str], operator.add]


def fanout_graph(llm: Any, width: int = 3, calls: int = 1) -> Any:
    """plan -> ``width`` Send workers (``calls`` LLM calls each) -> write."""

    def plan(state: FanState) -> dict[str, Any]:
        llm.invoke([HumanMessage(f"plan {state['question']}")])
        return {}

    def dispatch(state: FanState) -> list[Send]:
        return [Send("work", {"topic": f"{state['question']}-{i}"}) for i in range(width)]

    def work(state: FanState) -> dict[str, Any]:
        for i in range(calls):
            out = llm.invoke([HumanMessage(f"work {state['topic']} {i}")])
        return {"notes": [str(out.content)]}

    def write(state: FanState) -> dict[str, Any]:
        llm.invoke([HumanMessage(f"write {state['question']}")])
        return {}

    return fan_out_graph(FanState, plan, dispatch, work, write)


def _calls(server: FakeOpenAI) -> list[tuple[StructureTags, str | None]]:
    out = []
    for body, headers in zip(server.bodies, server.headers, strict=True):
        tags = tags_from_wire(body.get("vllm_xargs"))
        assert tags is not None
        out.append((tags, headers.get(HEADER)))
    return out


def test_one_query_one_key_different_queries_differ(strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    app = with_agentspec(fanout_graph(chat_openai(server)), engine=URL, config=strict)
    app.invoke({"question": "q1"})
    asyncio.run(app.ainvoke({"question": "q2"}))
    calls = _calls(server)
    assert len(calls) == 2 * 5
    by_query: dict[str, set[str | None]] = {}
    for tags, key in calls:
        assert tags.query_id is not None
        by_query.setdefault(tags.query_id, set()).add(key)
        assert key == routing_key(tags.scope, tags.query_id)
    assert len(by_query) == 2
    keys = [next(iter(k)) for k in by_query.values()]
    assert all(len(k) == 1 for k in by_query.values())  # plan, 3 siblings, write: one key
    assert keys[0] != keys[1] and all(k and k.startswith("as-") for k in keys)
    # the fan-out siblings were tagged as one group and still share the query's key
    assert sum(group_kind_of(t.group_id) == "fanout" for t, _ in calls) == 2 * 3


def test_granularity_fanout_tenant_off(strict: TaggingConfig) -> None:
    def run(granularity: str) -> list[tuple[StructureTags, str | None]]:
        server = FakeOpenAI()
        config = strict.model_copy(update={"routing_granularity": granularity})
        app = with_agentspec(fanout_graph(chat_openai(server), calls=2), engine=URL, config=config)
        app.invoke({"question": "q1"})
        app.invoke({"question": "q2"})
        return _calls(server)

    fanout = run("fanout")
    first = [(t, k) for t, k in fanout if t.query_id == fanout[0][0].query_id]
    siblings = {k for t, k in first if group_kind_of(t.group_id) == "fanout"}
    others = {k for t, k in first if group_kind_of(t.group_id) != "fanout"}
    assert len(first) == 1 + 3 * 2 + 1  # plan, three workers with two calls each, write
    assert len(siblings) == 1 and len(others) == 1 and siblings != others  # both positions
    assert len({k for _, k in run("tenant")}) == 1  # one scope: one key for both queries
    assert {k for _, k in run("off")} == {None}


def test_header_name_and_callers_header_win(strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    config = strict.model_copy(update={"routing_header": "x-dynamo-session-id"})
    app = with_agentspec(fanout_graph(chat_openai(server), width=1), engine=URL, config=config)
    app.invoke({"question": "q"})
    assert {h.get("x-dynamo-session-id") for h in server.headers} != {None}
    assert all(HEADER not in h for h in server.headers)

    server = FakeOpenAI()
    llm = chat_openai(server, default_headers={"X-Session-ID": "mine"})
    with_agentspec(fanout_graph(llm, width=1), engine=URL, config=strict).invoke({"question": "q"})
    assert {h[HEADER] for h in server.headers} == {"mine"}


def test_requests_to_another_server_get_no_header(strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    app = with_agentspec(
        fanout_graph(chat_openai(server), width=1), engine="http://127.0.0.1:10/v1", config=strict
    )
    app.invoke({"question": "q"})
    assert all(HEADER not in h for h in server.headers)


def test_tagging_transport_sends_the_key(strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    llm = agentspec_chat_openai(
        model="m",
        base_url=URL,
        api_key="unused",
        max_retries=0,
        transport=server.transport,
        async_transport=server.transport,
    )
    app = with_agentspec(fanout_graph(llm, width=2), config=strict)
    app.invoke({"question": "q"})
    keys = {k for _, k in _calls(server)}
    assert len(keys) == 1 and None not in keys


def test_middleware_sends_the_key() -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    middleware = AgentSpecMiddleware(TaggingConfig(tags_scope="tenant-a"))
    agent = create_agent(chat_openai(server), [search], middleware=[middleware])
    agent.invoke({"messages": [HumanMessage("q1")]})
    asyncio.run(agent.ainvoke({"messages": [HumanMessage("q2")]}))
    calls = _calls(server)
    assert len(calls) == 4
    assert calls[0][1] == calls[1][1] != calls[2][1] == calls[3][1]
    assert calls[0][1] == routing_key("tenant-a", calls[0][0].query_id)


def test_plain_client_headers_and_validation() -> None:
    assert routing_headers("t", "q") == {HEADER: routing_key("t", "q")}
    assert routing_headers("t", "q") != routing_headers("t", "q2")
    tenant = routing_key("t", "q", granularity="tenant")
    assert tenant == routing_key("t", "q2", granularity="tenant")
    assert tenant != routing_key("u", "q", granularity="tenant")
    assert routing_headers("t", "q", granularity="off") == {}
    # the key is a hash: ASCII whatever the ids hold, and the fields do not run together
    key = routing_key("tenant-é", "q")
    assert key is not None and key.isascii() and len(key) == 35
    assert routing_key("a", "bc") != routing_key("ab", "c")
    with pytest.raises(ValueError, match="not an HTTP header name"):
        routing_headers("t", "q", header="x session")
    with pytest.raises(ValidationError, match="not an HTTP header name"):
        TaggingConfig(routing_header="bad header")
    with pytest.raises(ValidationError):
        TaggingConfig(routing_granularity="replica")  # type: ignore[arg-type]
