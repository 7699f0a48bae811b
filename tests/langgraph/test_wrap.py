"""``with_agentspec`` keeps every graph feature working, is idempotent, releases state,
and degrades to "no tags" when the adapter fails."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from agentspec_mw_langgraph import (
    AgentSpecCallbackHandler,
    TaggingConfig,
    derive,
    get_handler,
    with_agentspec,
)

from .fake_chat import ScriptedChatModel
from .test_fanout import build_map_reduce
from .test_react import build, react_script


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"re {messages[-1].content}")


def test_returns_compiled_graph_and_is_idempotent(strict: TaggingConfig) -> None:
    from langgraph.graph.state import CompiledStateGraph

    model = ScriptedChatModel(script=react_script)
    base = build(model)
    app = with_agentspec(base, config=strict)
    assert isinstance(app, CompiledStateGraph) and app is not base
    assert get_handler(base) is None
    assert with_agentspec(app) is app
    assert with_agentspec(app, config=TaggingConfig(tags_scope="other")) is app
    handler = get_handler(app)
    assert handler is not None
    # the same handler passed again at call time: events arrive twice, counted once
    app.invoke({"messages": [HumanMessage("q")]}, {"callbacks": [handler]})
    stats = handler.stats
    assert (stats.llm_calls, stats.tags_derived) == (3, 3)
    assert stats.duplicate_events > 0
    qid = model.seen[0][0].query_id  # type: ignore[union-attr]
    assert len(handler.graph(qid).llm_calls()) == 3
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_stream_modes_events_batch_async(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build_map_reduce(model), config=strict)
    handler = get_handler(app)
    assert handler is not None
    inp = {"topics": ["x", "y"], "notes": [], "summary": ""}
    for mode in ("values", "updates", "messages", "debug", "custom", "tasks"):
        chunks = list(app.stream(inp, stream_mode=mode))
        assert chunks or mode == "custom", mode
    list(app.stream(inp, stream_mode=["values", "messages"]))
    app.batch([inp, inp])

    async def run_async() -> None:
        await app.ainvoke(inp)
        events = [e async for e in app.astream_events(inp, version="v2")]
        assert any(e["event"] == "on_chat_model_start" for e in events)
        async for _ in app.astream(inp, stream_mode="messages"):
            pass

    asyncio.run(run_async())
    runs = 6 + 1 + 2 + 3  # stream modes, multi-mode, batch, async
    assert len(model.seen) == runs * 4
    assert all(t is not None for t, _ in model.seen)
    assert len({t.query_id for t, _ in model.seen}) == runs  # type: ignore[union-attr]
    assert handler.stats.adapter_errors == 0
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


class AskState(TypedDict):
    question: str
    answer: str


def test_checkpointer_interrupt_resume_configurable(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)

    def draft(state: AskState) -> dict[str, Any]:
        return {"answer": str(model.invoke(state["question"]).content)}

    def review(state: AskState) -> dict[str, Any]:
        verdict = interrupt({"draft": state["answer"]})
        return {"answer": str(model.invoke(f"{verdict}: {state['answer']}").content)}

    g = StateGraph(AskState)
    g.add_node("draft", draft)
    g.add_node("review", review)
    g.add_edge(START, "draft")
    g.add_edge("draft", "review")
    g.add_edge("review", END)
    app = with_agentspec(g.compile(checkpointer=InMemorySaver()), config=strict)
    handler = get_handler(app)
    assert handler is not None
    cfg: Any = {"configurable": {"thread_id": "th1", "user": "u"}}
    first = app.invoke({"question": "why", "answer": ""}, cfg)
    assert "__interrupt__" in first
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
    done = app.invoke(Command(resume="approved"), cfg)
    assert done["answer"] == "re approved: re why"
    assert [(t.query_id, t.agent_id) for t, _ in model.seen] == [  # type: ignore[union-attr]
        ("thread:th1", "draft"),
        ("thread:th1", "review"),
    ]
    graph = handler.graph("thread:th1")  # one graph across the interrupt
    assert [c.step for c in graph.llm_calls()] == [1, 2]


def test_wrapped_graph_as_subgraph(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)
    inner = with_agentspec(build(ScriptedChatModel(script=react_script)), config=strict)
    outer = StateGraph(MessagesState)

    def prep(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    outer.add_node("prep", prep)
    outer.add_node("solver", inner)
    outer.add_edge(START, "prep")
    outer.add_edge("prep", "solver")
    outer.add_edge("solver", END)
    out = outer.compile().invoke({"messages": [HumanMessage("q")]})
    assert out["messages"][-1].content.startswith("done:")
    assert model.seen == [(None, "q")]  # the outer graph is not wrapped
    handler = get_handler(inner)
    assert handler is not None
    graphs = handler.graphs()
    assert len(graphs) == 1
    (graph,) = graphs.values()
    assert [c.agent_id for c in graph.llm_calls()] == ["solver/agent"] * 3
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def _broken(**kwargs: Any) -> Any:
    raise RuntimeError("adapter bug")


def test_adapter_failure_degrades_to_no_tags(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(derive, "predict_segment", _broken)
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build(model))  # default policy: never break the graph
    with caplog.at_level(logging.WARNING):
        out = app.invoke({"messages": [HumanMessage("q")]})
    assert out["messages"][-1].content == "done: q"
    assert [t for t, _ in model.seen] == [None, None, None]
    handler = get_handler(app)
    assert handler is not None
    stats = handler.stats
    assert (stats.llm_calls, stats.tags_derived, stats.adapter_errors) == (3, 0, 3)
    assert "adapter bug" in caplog.text
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_adapter_failure_raises_in_strict_mode(
    monkeypatch: pytest.MonkeyPatch, strict: TaggingConfig
) -> None:
    monkeypatch.setattr(derive, "predict_segment", _broken)
    app = with_agentspec(build(ScriptedChatModel(script=react_script)), config=strict)
    with pytest.raises(RuntimeError, match="adapter bug"):
        app.invoke({"messages": [HumanMessage("q")]})


def test_model_outside_a_graph_is_its_own_query(strict: TaggingConfig) -> None:
    handler = AgentSpecCallbackHandler(strict)
    model = ScriptedChatModel(script=echo)
    model.invoke("hi", {"callbacks": [handler]})
    ((tags, _),) = model.seen
    assert tags is not None and tags.agent_id == "ScriptedChatModel"
    assert tags.query_id.startswith("run:") and tags.segment == "answer"
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_abandoned_stream_releases_state(strict: TaggingConfig) -> None:
    app = with_agentspec(build(ScriptedChatModel(script=react_script)), config=strict)
    handler = get_handler(app)
    assert handler is not None
    stream = app.stream({"messages": [HumanMessage("q")]})
    next(stream)
    next(stream)
    stream.close()  # the caller stops reading half way
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}

    async def partial() -> None:
        astream = app.astream({"messages": [HumanMessage("q")]})
        await astream.__anext__()
        await astream.aclose()

    asyncio.run(partial())
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_graph_size_is_capped() -> None:
    config = TaggingConfig(adapter_raise_errors=True, graph_max_calls=4)
    app = with_agentspec(build(ScriptedChatModel(script=react_script)), config=config)
    app.invoke({"messages": [HumanMessage("q")]}, {"configurable": {"thread_id": "long"}})
    app.invoke({"messages": [HumanMessage("q")]}, {"configurable": {"thread_id": "long"}})
    handler = get_handler(app)
    assert handler is not None
    graph = handler.graph("thread:long")
    assert (len(graph.calls), graph.dropped) == (4, 6)  # 2 runs x (3 LLM calls + 2 tools)
    assert all(e.src in graph.calls and e.dst in graph.calls for e in graph.edges)
    assert handler.stats.tags_derived == 6  # tags do not depend on the cap


def test_handler_given_to_the_model_only(strict: TaggingConfig) -> None:
    """Without node runs, the call's own langgraph metadata still names the agent."""
    handler = AgentSpecCallbackHandler(strict)
    model = ScriptedChatModel(script=echo)

    def node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"], {"callbacks": [handler]})]}

    g = StateGraph(MessagesState)
    g.add_node("solo", node)
    g.add_edge(START, "solo")
    g.add_edge("solo", END)
    g.compile().invoke({"messages": [HumanMessage("q")]})
    ((tags, _),) = model.seen
    assert tags is not None and (tags.agent_id, tags.segment) == ("solo", "answer")
    graph = handler.graph(tags.query_id)
    assert [(c.node, c.step, c.template) for c in graph.llm_calls()] == [
        ("solo", 1, (("solo", 1),))
    ]
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
