"""Review 73: the state of a root run whose start never completed (another handler rejected
it, the handler's own start failed under ``adapter_raise_errors``, its task was cancelled
while other handlers' starts ran) is dropped: LangChain sends such a run no end event, and
its ``_Root``/``_Run`` entries (and the query an unthreaded one opened) stayed for the
handler's life, one per start. A run that did start keeps its state however long it waits."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec
from agentspec_mw_langgraph import handler as handler_mod
from agentspec_mw_langgraph.handler import AgentSpecCallbackHandler

from .fake_chat import ScriptedChatModel
from .test_concurrency import react_script
from .test_react import build as build_react

ZERO = {"runs": 0, "roots": 0, "calls": 0}
THREAD: RunnableConfig = {"configurable": {"thread_id": "73"}}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """LangChain logs every callback a handler raised in."""
    logger = logging.getLogger("langchain_core.callbacks.manager")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


class RejectRoots(BaseCallbackHandler):
    """Rejects every root start (``raise_error``: LangChain raises it and sends the run no
    end event), as a guard that blocks a run does."""

    raise_error = True

    def on_chain_start(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("parent_run_id") is None:
            raise RuntimeError("blocked")

    def on_retriever_start(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("blocked")


def _settled(handler: AgentSpecCallbackHandler) -> dict[str, int]:
    gc.collect()
    return handler.live_state()


def _queries(model: ScriptedChatModel) -> set[str]:
    return {str(t.query_id) for t, _ in model.seen if t is not None}


@pytest.mark.parametrize("config", [{}, THREAD], ids=["unthreaded", "threaded"])
def test_rejected_graph_starts_leave_no_state(
    strict: TaggingConfig, config: RunnableConfig
) -> None:
    """Before: one ``_Root`` and one ``_Run`` per rejected start, kept for good (and, for a
    run without a thread, a live ``run:<id>`` query)."""
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build_react(model), config=strict)
    handler = get_handler(app)
    assert handler is not None
    for i in range(3):
        with pytest.raises(RuntimeError, match="blocked"):
            rejected_config: RunnableConfig = {**config, "callbacks": [RejectRoots()]}
            app.invoke({"messages": [HumanMessage(f"R{i}")]}, rejected_config)
    assert _settled(handler) == ZERO
    assert handler.graphs() == {}  # no query kept for a run that never ran

    async def rejected() -> None:
        for i in range(3):
            with pytest.raises(RuntimeError, match="blocked"):
                await app.ainvoke(
                    {"messages": [HumanMessage(f"A{i}")]}, {**config, "callbacks": [RejectRoots()]}
                )
        await asyncio.sleep(0.05)  # the executor that ran the guard lets the run id go

    asyncio.run(rejected())
    assert _settled(handler) == ZERO
    assert handler.graphs() == {}

    app.invoke({"messages": [HumanMessage("R9")]}, config)  # a run that runs: as before
    assert len(model.seen) == 3 and len(_queries(model)) == 1
    if config:
        assert _queries(model) == {"thread:73"}
    assert list(handler.graphs()) == list(_queries(model))
    assert handler.live_state() == ZERO
    assert handler.stats.adapter_errors == 0


def test_a_failed_own_start_leaves_no_state(
    strict: TaggingConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler's own start failing under ``adapter_raise_errors`` rejects the run too
    (after its root entry was stored): before, that entry stayed."""
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build_react(model), config=strict)
    handler = get_handler(app)
    assert handler is not None

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("broken graph")

    with monkeypatch.context() as patch:
        patch.setattr(handler_mod, "RedundancyGraph", broken)
        with pytest.raises(ValueError, match="broken graph"):
            app.invoke({"messages": [HumanMessage("R0")]})
    assert _settled(handler) == ZERO
    app.invoke({"messages": [HumanMessage("R1")]})
    assert len(model.seen) == 3 and len(_queries(model)) == 1
    assert handler.live_state() == ZERO


class SlowStart(AsyncCallbackHandler):
    """An async handler whose root start takes long: a cancel lands while LangChain awaits
    it, after the inline AgentSpec handler saw the start."""

    async def on_chain_start(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("parent_run_id") is None:
            await asyncio.sleep(10)


def test_a_run_cancelled_during_its_start_leaves_no_state(strict: TaggingConfig) -> None:
    """LangGraph's error handling starts after the start callbacks: a run cancelled while
    they ran got no end event, and its state stayed (its thread unclaimed, its query not)."""
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build_react(model), config=strict)
    handler = get_handler(app)
    assert handler is not None

    async def main() -> None:
        for config in ({}, THREAD):
            slow: RunnableConfig = {**config, "callbacks": [SlowStart()]}
            task = asyncio.ensure_future(app.ainvoke({"messages": [HumanMessage("R0")]}, slow))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert _settled(handler) == ZERO
    assert handler.graphs() == {}
    assert ("default", "thread:73") not in handler_mod._THREAD_RUNS


class Retriever(BaseRetriever):
    def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        return [Document(page_content=query)]


def test_a_rejected_retriever_start_leaves_no_state(strict: TaggingConfig) -> None:
    """A retriever outside any graph run is a root of its own until its end event: one
    whose start another handler rejected kept its entries and its query for good."""
    handler = AgentSpecCallbackHandler(strict)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="blocked"):
            Retriever().invoke("q", {"callbacks": [handler, RejectRoots()]})
    assert _settled(handler) == ZERO
    assert handler.graphs() == {}
    assert Retriever().invoke("q", {"callbacks": [handler]})[0].page_content == "q"
    assert handler.live_state() == ZERO


def test_a_paused_stream_keeps_its_run(strict: TaggingConfig) -> None:
    """A run that started keeps its state while it waits, even before its first child run
    (``stream_mode="values"`` yields the input first), across rejected starts and other runs
    in the same context: all its calls share its query."""
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build_react(model), config=strict)
    handler = get_handler(app)
    assert handler is not None
    it = app.stream({"messages": [HumanMessage("R1")]}, THREAD, stream_mode="values")
    next(it)  # the run started; no node ran yet
    assert _settled(handler) == {"runs": 1, "roots": 1, "calls": 0}
    with pytest.raises(RuntimeError, match="blocked"):
        app.invoke({"messages": [HumanMessage("R2")]}, {"callbacks": [RejectRoots()]})
    app.invoke({"messages": [HumanMessage("R3")]})
    assert _settled(handler) == {"runs": 1, "roots": 1, "calls": 0}
    for _ in it:
        pass
    paused = {str(t.query_id) for t, _ in model.seen[3:] if t is not None}
    assert len(model.seen) == 6 and paused == {"thread:73"}
    assert len(handler.graph("thread:73").llm_calls()) == 3
    assert handler.live_state() == ZERO
