"""``AgentSpecMiddleware`` in ``create_agent``: the tags of each model call reach a
``ChatOpenAI`` request as ``vllm_xargs`` and the engine-backed model as ``extra_args``,
and the model run's metadata (what tracers show) -- also through ``with_agentspec``."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import httpx
import numpy as np
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_core.tracers.run_collector import RunCollectorCallbackHandler
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from agentspec_mw.agentspec.identity import identity
from agentspec_mw.tags import StructureTags, tags_from_wire
from agentspec_mw_langgraph import (
    AgentSpecMiddleware,
    ChatAgentSpecVLLM,
    TaggingConfig,
    get_handler,
    with_agentspec,
)

from .fake_engine import FakeBackend
from .fake_openai import FakeOpenAI
from .graphs import group_kind_of

pytest.importorskip("langchain_openai")
URL = "http://127.0.0.1:9/v1"


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


def _tags(server: FakeOpenAI) -> list[StructureTags]:
    out = [tags_from_wire(b.get("vllm_xargs")) for b in server.bodies]
    assert all(t is not None for t in out)
    return out  # type: ignore[return-value]


class MetadataSpy(BaseCallbackHandler):
    """Records the metadata every chat model run starts with."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, Any]] = []

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.metadata.append(dict(kwargs.get("metadata") or {}))


def test_create_agent_chat_openai_sync_and_async() -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    middleware = AgentSpecMiddleware(TaggingConfig(tags_scope="tenant-a"))
    agent = create_agent(chat_openai(server), [search], middleware=[middleware])
    out = agent.invoke({"messages": [HumanMessage("q1")]})
    assert out["messages"][-1].content == "answer: q1"
    assert "agentspec_query" not in out  # private state
    asyncio.run(agent.ainvoke({"messages": [HumanMessage("q2")]}))
    tags = _tags(server)
    assert [(t.scope, t.agent_id, t.segment, group_kind_of(t.group_id)) for t in tags] == [
        ("tenant-a", "model", "tool_call", None),
        ("tenant-a", "model", "answer", None),
    ] * 2
    assert tags[0].query_id == tags[1].query_id != tags[2].query_id == tags[3].query_id
    assert tags[0].query_id.startswith("run:")
    assert tags[0].blocks == (("```", "```"), ("<tool_call>", "</tool_call>"))  # Qwen: Hermes
    stats = middleware.stats
    assert (stats.model_calls, stats.tags_derived, stats.tags_delivered) == (4, 4, 4)


def test_tool_loop_turns_share_one_drafting_key() -> None:
    """The agent's answer after a tool result drafts from its tool-call turn: both calls
    give the proposer one ``(scope, agent, group)`` key (a ``repeat`` group id from the
    second call on split it in two), and each query keeps its own key."""
    from langchain.agents import create_agent

    server = FakeOpenAI()
    agent = create_agent(chat_openai(server), [search], middleware=[AgentSpecMiddleware()])
    agent.invoke({"messages": [HumanMessage("q1")]})
    agent.invoke({"messages": [HumanMessage("q2")]})
    prompt = np.arange(64, dtype=np.int32)  # only matters without tags
    keys = [identity(prompt, t, agent_tokens=16, query_tokens=64) for t in _tags(server)]
    assert [t.group_id for t in _tags(server)] == [None] * 4
    assert keys[0] == keys[1] != keys[2] == keys[3]


def test_hook_does_not_count_middleware_requests_as_untagged() -> None:
    from langchain.agents import create_agent

    from agentspec_mw_langgraph.openai_hook import hook_stats, install_openai_hook

    install_openai_hook()
    server = FakeOpenAI()
    agent = create_agent(chat_openai(server), [], middleware=[AgentSpecMiddleware()])
    llm = chat_openai(server)
    before = hook_stats()
    agent.invoke({"messages": [HumanMessage("q")]})
    assert hook_stats().untagged == before.untagged
    llm.invoke("no tags")
    assert hook_stats().untagged == before.untagged + 1


def test_thread_is_the_query_and_user_xargs_win() -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    llm = chat_openai(server, extra_body={"vllm_xargs": {"agentspec_scope": "mine", "x": 1}})
    agent = create_agent(
        llm, [search], middleware=[AgentSpecMiddleware()], checkpointer=InMemorySaver()
    )
    config: Any = {"configurable": {"thread_id": "t-7"}}
    agent.invoke({"messages": [HumanMessage("q")]}, config)
    first = server.bodies[0]["vllm_xargs"]
    assert (first["agentspec_scope"], first["x"]) == ("mine", 1)
    assert {tags_from_wire(b["vllm_xargs"]).query_id for b in server.bodies} == {"thread:t-7"}  # type: ignore[union-attr]


def test_agent_as_a_subgraph_node_and_explicit_agent() -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    inner = create_agent(chat_openai(server), [search], middleware=[AgentSpecMiddleware()])
    named = create_agent(chat_openai(server), [], middleware=[AgentSpecMiddleware(agent="writer")])
    g = StateGraph(MessagesState)
    g.add_node("researcher", inner)
    g.add_node("write", named)
    g.add_edge(START, "researcher")
    g.add_edge("researcher", "write")
    g.add_edge("write", END)
    g.compile().invoke({"messages": [HumanMessage("q")]})
    assert [(t.agent_id, t.segment) for t in _tags(server)] == [
        ("researcher/model", "tool_call"),
        ("researcher/model", "answer"),
        ("writer", "answer"),
    ]


def test_engine_backed_model_gets_extra_args(tiny_tokenizer: Any) -> None:
    from langchain.agents import create_agent

    def script(prompt: str) -> str:
        if "<|im_start|>tool" in prompt:
            return "done"
        return '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'

    backend = FakeBackend(tiny_tokenizer, script)
    middleware = AgentSpecMiddleware()
    model = ChatAgentSpecVLLM(engine=backend, max_tokens=16)
    create_agent(model, [search], middleware=[middleware]).invoke({"messages": [HumanMessage("q")]})
    tags = [tags_from_wire(r.extra_args) for _, r in backend.requests]
    assert [(t.agent_id, t.segment) for t in tags] == [  # type: ignore[union-attr]
        ("model", "tool_call"),
        ("model", "answer"),
    ]
    assert middleware.stats.tags_delivered == 2


def test_tags_in_the_model_runs_metadata() -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    spy = MetadataSpy()
    agent = create_agent(chat_openai(server), [search], middleware=[AgentSpecMiddleware()])
    agent.invoke({"messages": [HumanMessage("q")]}, {"callbacks": [spy]})
    wire = [b["vllm_xargs"] for b in server.bodies]
    assert [{k: m[k] for k in w} for m, w in zip(spy.metadata, wire, strict=True)] == wire


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_with_agentspec_puts_the_tags_in_traced_runs(mode: str, strict: TaggingConfig) -> None:
    """A tracer given at call time (like LangSmith's) sees the tags in the model runs'
    metadata, in the runs it records."""
    from langchain.agents import create_agent

    server = FakeOpenAI()
    app = with_agentspec(create_agent(chat_openai(server), [search]), engine=URL, config=strict)
    collector = RunCollectorCallbackHandler()
    inp = {"messages": [HumanMessage("q")]}
    if mode == "sync":
        app.invoke(inp, {"callbacks": [collector]})
    else:
        asyncio.run(app.ainvoke(inp, {"callbacks": [collector]}))

    def llm_runs(runs: list[Any]) -> list[Any]:
        out = []
        for run in runs:
            if run.run_type == "llm":
                out.append(run)
            out += llm_runs(run.child_runs)
        return out

    runs = sorted(llm_runs(collector.traced_runs), key=lambda r: r.start_time)
    traced = [
        {k: v for k, v in r.extra["metadata"].items() if k.startswith("agentspec_")} for r in runs
    ]
    assert traced == [b["vllm_xargs"] for b in server.bodies]
    assert get_handler(app).stats.tags_delivered == 2  # type: ignore[union-attr]


def test_a_tagging_failure_leaves_the_call_untagged(monkeypatch: pytest.MonkeyPatch) -> None:
    from langchain.agents import create_agent

    def broken(self: Any, request: Any) -> StructureTags:
        raise ValueError("boom")

    monkeypatch.setattr(AgentSpecMiddleware, "tags_for", broken)
    server = FakeOpenAI()
    middleware = AgentSpecMiddleware()
    out = create_agent(chat_openai(server), [], middleware=[middleware]).invoke(
        {"messages": [HumanMessage("q")]}
    )
    assert out["messages"][-1].content == "answer: q"  # the agent ran on
    assert "vllm_xargs" not in server.bodies[0]
    stats = middleware.stats
    assert (stats.model_calls, stats.tags_derived, stats.adapter_errors) == (1, 0, 1)
    strict = AgentSpecMiddleware(TaggingConfig(adapter_raise_errors=True))
    with pytest.raises(ValueError, match="boom"):
        create_agent(chat_openai(server), [], middleware=[strict]).invoke(
            {"messages": [HumanMessage("q")]}
        )
