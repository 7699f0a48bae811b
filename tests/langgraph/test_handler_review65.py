"""The callback adapter's bookkeeping in three cases a review found wrong (2026-12-06):
a wrapped app inside another, an LLM call cancelled by asyncio, and a checkpointed task
re-run after an error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec
from agentspec_mw_langgraph.engine_chat import _call_wire_tags

STRICT = TaggingConfig(adapter_raise_errors=True)


def _one_node(name: str, fn: Any, checkpointer: Any = None) -> Any:
    g = StateGraph(MessagesState)
    g.add_node(name, fn)
    g.add_edge(START, name)
    g.add_edge(name, END)
    return g.compile(checkpointer=checkpointer)


class _Recording(FakeListChatModel):
    """Records the query id a request layer would send for each call."""

    sent: list[Any] = []

    def _call(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> str:
        wire = _call_wire_tags(run_manager) or {}
        self.sent.append(wire.get("agentspec_query"))
        return super()._call(messages, stop, run_manager, **kw)


def test_a_wrapped_app_inside_a_wrapped_app_is_one_query() -> None:
    model = _Recording(responses=["ok"])
    model.sent = []

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    inner = with_agentspec(_one_node("agent", agent), config=STRICT)
    og = StateGraph(MessagesState)
    og.add_node("solver", inner)
    og.add_node("writer", agent)
    og.add_edge(START, "solver")
    og.add_edge("solver", "writer")
    og.add_edge("writer", END)
    outer = with_agentspec(og.compile(), config=STRICT)
    for _ in range(3):  # the handlers' order varies from run to run
        model.sent = []
        outer.invoke({"messages": [HumanMessage("q")]})
        assert len(set(model.sent)) == 1 and model.sent[0] is not None
        assert model.sent[0] in get_handler(outer).graphs()
    assert get_handler(inner).graphs() == {}  # the outer handler tagged its calls
    assert get_handler(inner).stats.tags_derived == 0
    outer_stats = get_handler(outer).stats
    assert outer_stats.tags_derived == outer_stats.tags_delivered == 6
    agents = {c.agent_id for g in get_handler(outer).graphs().values() for c in g.llm_calls()}
    assert agents == {"solver/agent", "writer"}
    assert (
        get_handler(inner).live_state()
        == get_handler(outer).live_state()
        == {
            "runs": 0,
            "roots": 0,
            "calls": 0,
        }
    )
    # the inner app on its own is tagged by its own handler
    inner.invoke({"messages": [HumanMessage("q")]})
    assert len(get_handler(inner).graphs()) == 1


class _Slow(FakeListChatModel):
    delay: float = 5.0

    async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(self.delay)
        return await super()._agenerate(*args, **kwargs)


def test_a_call_cancelled_by_a_timeout_is_a_failed_attempt() -> None:
    slow, fast = _Slow(responses=["slow"]), FakeListChatModel(responses=["fast"])

    async def agent(state: MessagesState) -> dict[str, Any]:
        try:
            msg = await asyncio.wait_for(slow.ainvoke(state["messages"]), 0.05)
        except TimeoutError:
            msg = await fast.ainvoke(state["messages"])  # the fallback, after it
        return {"messages": [msg]}

    app = with_agentspec(_one_node("agent", agent), config=STRICT)
    asyncio.run(app.ainvoke({"messages": [HumanMessage("q")]}))
    (graph,) = get_handler(app).graphs().values()
    assert [(c.status, c.ordinal) for c in graph.llm_calls()] == [("error", 0), ("ok", 0)]
    kinds = {g["kind"] for g in graph.to_dict()["groups"]}
    assert "retry" in kinds and "parallel" not in kinds


def test_a_cancelled_run_leaves_no_call_running() -> None:
    model = _Slow(responses=["ok"])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    app = with_agentspec(_one_node("agent", agent), config=STRICT)

    async def main() -> None:
        task = asyncio.create_task(app.ainvoke({"messages": [HumanMessage("q")]}))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (graph,) = get_handler(app).graphs().values()
    assert [c.status for c in graph.llm_calls()] == ["error"]
    assert get_handler(app).live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_a_task_rerun_after_an_error_is_a_retry_and_after_an_interrupt_is_not() -> None:
    model = FakeListChatModel(responses=["ok"])
    runs = [0]

    def flaky(state: MessagesState) -> dict[str, Any]:
        reply = model.invoke(state["messages"])
        runs[0] += 1
        if runs[0] == 1:
            raise RuntimeError("transient")
        return {"messages": [reply]}

    app = with_agentspec(_one_node("agent", flaky, InMemorySaver()), config=STRICT)
    cfg: Any = {"configurable": {"thread_id": "rerun"}}
    with pytest.raises(RuntimeError):
        app.invoke({"messages": [HumanMessage("q")]}, cfg)
    app.invoke(None, cfg)
    graph = get_handler(app).graph("thread:rerun")
    assert graph is not None
    assert [e["kind"] for e in graph.to_dict()["edges"]] == ["retry"]

    def asks(state: MessagesState) -> dict[str, Any]:
        reply = model.invoke(state["messages"])
        answer = interrupt("approve?")
        return {"messages": [reply, HumanMessage(str(answer))]}

    app2 = with_agentspec(_one_node("agent", asks, InMemorySaver()), config=STRICT)
    cfg2: Any = {"configurable": {"thread_id": "resume"}}
    app2.invoke({"messages": [HumanMessage("q")]}, cfg2)
    app2.invoke(Command(resume="yes"), cfg2)
    graph2 = get_handler(app2).graph("thread:resume")
    assert graph2 is not None
    assert [e["kind"] for e in graph2.to_dict()["edges"]] == ["repeat"]
