"""Review 72g: the thread claim of a graph run (``thread:<id>`` vs ``thread:<id>|run:<root>``)
is held only by a run that runs, and given back however the run stops; the middleware's
step tagger reaches a natively async model."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from agentspec_mw_langgraph import (
    AgentSpecMiddleware,
    TaggingConfig,
    current_tags,
    get_handler,
    with_agentspec,
)
from agentspec_mw_langgraph import handler as handler_mod

from .fake_chat import ScriptedChatModel
from .test_concurrency import echo, react_script
from .test_react import build as build_react

THREAD: RunnableConfig = {"configurable": {"thread_id": "72g"}}
KEY = ("default", "thread:72g")
STREAM_THREAD: RunnableConfig = {"configurable": {"thread_id": "72g-stream"}}
STREAM_KEY = ("default", "thread:72g-stream")


class RejectFirstRun(BaseCallbackHandler):
    """Rejects the first chain start it sees (``raise_error``: LangChain raises it and
    sends the run no end event), as a guard that blocks a run does."""

    raise_error = True

    def __init__(self) -> None:
        self.block = True

    def on_chain_start(self, *args: Any, **kwargs: Any) -> None:
        if self.block:
            self.block = False
            raise RuntimeError("blocked")


def _queries(model: ScriptedChatModel) -> set[str]:
    return {str(t.query_id) for t, _ in model.seen if t is not None}


def test_a_rejected_run_start_never_holds_its_thread(strict: TaggingConfig) -> None:
    """Before, the claim was taken at the graph run's start: a start another handler
    rejected never ended, so the thread stayed held for the handler's life and every
    later run of it was a query apart (``thread:72g|run:<id>``, one per run)."""
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build_react(model), config=strict)
    try:
        app.invoke({"messages": [HumanMessage("R0")]}, {**THREAD, "callbacks": [RejectFirstRun()]})
    except RuntimeError:
        pass
    assert KEY not in handler_mod._THREAD_RUNS
    app.invoke({"messages": [HumanMessage("R1")]}, THREAD)
    app.invoke({"messages": [HumanMessage("R2")]}, THREAD)
    assert _queries(model) == {"thread:72g"}
    assert KEY not in handler_mod._THREAD_RUNS


def test_a_stopped_stream_gives_its_thread_back(strict: TaggingConfig) -> None:
    """A stream the caller stops (closed, left by ``break``, an async one dropped without
    ``aclose``) or a cancelled ``ainvoke`` ends its run: the thread is free again."""
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build_react(model), config=strict)
    handler = get_handler(app)
    assert handler is not None
    it = app.stream({"messages": [HumanMessage("R0")]}, STREAM_THREAD)
    next(it)
    assert STREAM_KEY in handler_mod._THREAD_RUNS  # running: held
    it.close()
    assert STREAM_KEY not in handler_mod._THREAD_RUNS
    for _ in app.stream({"messages": [HumanMessage("R1")]}, STREAM_THREAD):
        break
    assert STREAM_KEY not in handler_mod._THREAD_RUNS

    async def main() -> None:
        agen = app.astream({"messages": [HumanMessage("R2")]}, STREAM_THREAD)
        async for _ in agen:
            break
        del agen
        await asyncio.sleep(0.05)  # the loop's finaliser closes it
        assert STREAM_KEY not in handler_mod._THREAD_RUNS
        task = asyncio.ensure_future(app.ainvoke({"messages": [HumanMessage("R3")]}, STREAM_THREAD))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert STREAM_KEY not in handler_mod._THREAD_RUNS

    asyncio.run(main())
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
    assert _queries(model) == {"thread:72g-stream"}


def test_interrupt_and_resume_keep_the_thread_query(strict: TaggingConfig) -> None:
    """An ``interrupt()`` (root graph and subgraph) ends the run and frees the thread; the
    ``Command(resume=...)`` run holds it again: one query throughout."""
    model = ScriptedChatModel(script=echo)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def ask(state: MessagesState) -> dict[str, Any]:
        return {"messages": [HumanMessage(str(interrupt("ok?")))]}

    sub = StateGraph(MessagesState)
    sub.add_node("ask", ask)
    sub.add_edge(START, "ask")
    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("ask", ask)
    g.add_node("sub", sub.compile())
    g.add_node("agent2", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", "ask")
    g.add_edge("ask", "sub")
    g.add_edge("sub", "agent2")
    g.add_edge("agent2", END)
    app = with_agentspec(g.compile(checkpointer=InMemorySaver()), config=strict)
    out = app.invoke({"messages": [HumanMessage("a")]}, THREAD)
    assert "__interrupt__" in out and KEY not in handler_mod._THREAD_RUNS
    out = app.invoke(Command(resume="yes"), THREAD)
    assert "__interrupt__" in out and KEY not in handler_mod._THREAD_RUNS
    out = app.invoke(Command(resume="yes"), THREAD)
    assert "__interrupt__" not in out and KEY not in handler_mod._THREAD_RUNS
    assert len(model.seen) == 2 and _queries(model) == {"thread:72g"}


class NativeAsync(ScriptedChatModel):
    """A model with its own ``_agenerate``/``_astream`` (no executor hop): records the
    tags it sees."""

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self._seen.append((current_tags(), "agenerate"))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="hi"))])

    async def _astream(  # type: ignore[override]
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> Any:
        self._seen.append((current_tags(), "astream"))
        yield ChatGenerationChunk(message=AIMessageChunk(content="hi"))
        self._seen.append((current_tags(), "astream after a chunk"))


def test_the_step_tagger_reaches_a_natively_async_model(strict: TaggingConfig) -> None:
    """The tagger is a sync inline handler under an async callback manager: what it sets at
    the call's start is current in ``_agenerate`` and ``_astream`` (``ainvoke``,
    ``astream(stream_mode="messages")``, ``astream_events``)."""
    from langchain.agents import create_agent

    model = NativeAsync(script=lambda m, t: AIMessage(content="x"))
    tagging = AgentSpecMiddleware(strict)
    agent = create_agent(model, [], middleware=[tagging], name="helper")

    async def main() -> None:
        await agent.ainvoke({"messages": [HumanMessage("q")]})
        async for _ in agent.astream({"messages": [HumanMessage("q")]}, stream_mode="messages"):
            pass
        async for _ in agent.astream_events({"messages": [HumanMessage("q")]}, version="v2"):
            pass
        assert current_tags() is None

    asyncio.run(main())
    seen = model.seen
    assert [where for _, where in seen] == ["agenerate"] + ["astream", "astream after a chunk"] * 2
    assert all(t is not None and t.agent_id == "helper" for t, _ in seen)
    assert tagging.stats.tags_derived == 3
