"""The remote path: ChatOpenAI requests carry the tags as ``vllm_xargs`` -- sync, async,
streaming and concurrent branches -- against a fake endpoint that records the bodies."""

from __future__ import annotations

import asyncio
import json
import operator
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send

from agentspec_mw.tags import tags_from_wire
from agentspec_mw_langgraph import TaggingConfig, with_agentspec
from agentspec_mw_langgraph.openai import (
    AgentSpecTransport,
    agentspec_chat_openai,
    inject_tags,
)

from .fake_openai import FakeOpenAI

pytest.importorskip("langchain_openai")

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


def make_llm(server: FakeOpenAI) -> Any:
    return agentspec_chat_openai(
        model=MODEL,
        base_url="http://127.0.0.1:9/v1",
        api_key="unused",
        transport=server.transport,
        async_transport=server.transport,
        max_retries=0,
    )


def react_graph(llm: Any) -> Any:
    bound = llm.bind_tools([search])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent, afunc=aagent)  # type: ignore[call-overload]
    g.add_node("tools", ToolNode([search]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def _check_react(bodies: list[dict[str, Any]], runs: int) -> None:
    assert len(bodies) == 2 * runs
    by_query: dict[str, list[Any]] = {}
    for body in bodies:
        tags = tags_from_wire(body["vllm_xargs"])
        assert tags is not None
        first_user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        by_query.setdefault(tags.query_id, []).append((first_user, tags))
    assert len(by_query) == runs
    for calls in by_query.values():
        assert len({u for u, _ in calls}) == 1  # one run's calls never carry another's id
        assert [t.segment for _, t in calls] == ["tool_call", "answer"]
        assert {t.agent_id for _, t in calls} == {"agent"}
        assert {t.blocks for _, t in calls} == {(("```", "```"), ("<tool_call>", "</tool_call>"))}


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_sync_react(mode: str, strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    app = with_agentspec(react_graph(make_llm(server)), config=strict)
    inp = {"messages": [HumanMessage("q0")]}
    if mode == "invoke":
        out = app.invoke(inp)
        assert out["messages"][-1].content == "answer: q0"
    else:
        assert list(app.stream(inp, stream_mode="messages"))
    bodies = server.bodies
    assert all(b.get("stream", False) == (mode == "stream") for b in bodies)
    _check_react(bodies, 1)


def test_async_concurrent_runs_and_streaming(strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    app = with_agentspec(react_graph(make_llm(server)), config=strict)

    async def main() -> None:
        await asyncio.gather(
            *(app.ainvoke({"messages": [HumanMessage(f"q{i}")]}) for i in range(8)),
            *(
                _drain(app.astream({"messages": [HumanMessage(f"s{i}")]}, stream_mode="messages"))
                for i in range(4)
            ),
        )

    asyncio.run(main())
    bodies = server.bodies
    assert sum(bool(b.get("stream")) for b in bodies) == 8
    _check_react(bodies, 12)


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


class FanState(TypedDict):
    topics: list[str]
    notes: Annotated[list[str], operator.add]


def test_concurrent_branches(strict: TaggingConfig) -> None:
    server = FakeOpenAI()
    llm = make_llm(server)

    def fan(state: FanState) -> list[Send]:
        return [Send("worker", {"topics": [t], "notes": []}) for t in state["topics"]]

    def worker(state: FanState) -> dict[str, Any]:
        return {"notes": [str(llm.invoke(state["topics"][0]).content)]}

    async def aworker(state: FanState) -> dict[str, Any]:
        return {"notes": [str((await llm.ainvoke(state["topics"][0])).content)]}

    g = StateGraph(FanState)
    g.add_node("worker", worker, afunc=aworker)  # type: ignore[call-overload]
    g.add_conditional_edges(START, fan, ["worker"])
    g.add_edge("worker", END)
    app = with_agentspec(g.compile(), config=strict)
    topics = [f"t{i}" for i in range(6)]
    assert sorted(app.invoke({"topics": topics, "notes": []})["notes"]) == sorted(
        f"answer: {t}" for t in topics
    )
    asyncio.run(app.ainvoke({"topics": topics, "notes": []}))
    bodies = server.bodies
    assert len(bodies) == 12
    queries: dict[str, set[str]] = {}
    for body in bodies:
        tags = tags_from_wire(body["vllm_xargs"])
        assert tags is not None
        assert tags.agent_id == "worker" and tags.group_kind is None  # not on the wire
        assert tags.group_id == f"{tags.query_id}|fanout|worker@1#0"
        assert tags.blocks is None  # no tools bound
        queries.setdefault(tags.query_id, set()).add(body["messages"][0]["content"])
    assert list(queries.values()) == [set(topics), set(topics)]


def test_untagged_requests_pass_through_and_user_xargs_win() -> None:
    server = FakeOpenAI()
    llm = make_llm(server)
    llm.invoke("plain")  # no handler: no tags, body untouched
    assert "vllm_xargs" not in server.bodies[0]

    from agentspec_mw.tags import StructureTags
    from agentspec_mw_langgraph.context import set_current_tags

    set_current_tags(StructureTags(agent_id="a", query_id="q"))
    try:
        req = httpx.Request(
            "POST",
            "http://h/v1/chat/completions",
            json={"model": "m", "vllm_xargs": {"agentspec_scope": "mine", "other": 1}},
        )
        out = inject_tags(req)
        assert out is not None
        xargs = json.loads(out.read())["vllm_xargs"]
        assert xargs["agentspec_scope"] == "mine" and xargs["other"] == 1
        assert xargs["agentspec_agent"] == "a"
        # a body that is not JSON is sent unchanged and counted
        transport = AgentSpecTransport(server.transport)
        bad = httpx.Request("POST", "http://h/v1/chat/completions", content=b"not json")
        with pytest.raises(json.JSONDecodeError):  # sent unchanged: the fake server rejects it
            transport.handle_request(bad)
        assert transport.stats.errors == 1
    finally:
        set_current_tags(None)


def test_an_unreachable_server_is_named() -> None:
    """Nothing listens on the port: the error's chain names the server's URL, sync and
    async (it was the SDK's "Connection error." over httpx's "Connection refused")."""
    from openai import APIConnectionError

    llm = agentspec_chat_openai(
        model=MODEL, base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0
    )

    def chain(exc: BaseException) -> str:
        parts = []
        cur: BaseException | None = exc
        while cur is not None:
            parts.append(str(cur))
            cur = cur.__cause__
        return " <- ".join(parts)

    with pytest.raises(APIConnectionError) as sync:
        llm.invoke("hi")
    with pytest.raises(APIConnectionError) as async_:
        asyncio.run(llm.ainvoke("hi"))
    for caught in (sync.value, async_.value):
        assert "cannot reach the server at http://127.0.0.1:9/v1/chat/completions" in chain(caught)
