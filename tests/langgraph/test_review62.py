"""Faults found in review 62: namespace counters in agent ids, per-call state of a call
whose end handling failed, a string ``stop``, ordinals of concurrent failed calls, tracer
metadata of a batch, the tags of an abandoned stream, interleaved streams outside a graph,
and recording after ``close()``."""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tracers.run_collector import RunCollectorCallbackHandler
from langgraph.graph import END, START, MessagesState, StateGraph

from agentspec_mw.tags import StructureTags
from agentspec_mw.traces.loader import iter_records
from agentspec_mw_langgraph import (
    AgentSpecMiddleware,
    ChatAgentSpecVLLM,
    TaggingConfig,
    current_tags,
    derive,
    get_handler,
    with_agentspec,
)
from agentspec_mw_langgraph.context import (
    CallTicket,
    current_ticket,
    current_wire_tags,
    deliver_wire_tags,
    set_current_tags,
)
from agentspec_mw_langgraph.handler import AgentSpecCallbackHandler
from agentspec_mw_langgraph.recorder import TraceRecorder

from .fake_chat import ScriptedChatModel
from .fake_engine import FakeBackend
from .test_adapter_faults import _S, CharTokenizer, _one_node_graph

ZERO = {"runs": 0, "roots": 0, "calls": 0}


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content="echo " + str(messages[-1].content))


# ------------------------------------------- 1: LangGraph's subgraph-call counters
def test_split_namespace_skips_invocation_counters() -> None:
    assert derive.split_namespace("outer:t1|2|inner:t2") == [("outer", "t1"), ("inner", "t2")]
    assert derive.agent_from_namespace("outer:t1|1|inner:t2", "inner", "x") == "outer/inner"


def test_subgraph_invoked_repeatedly_is_one_agent(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)

    def inner(state: _S) -> _S:
        return {"x": str(model.invoke("inner " + state["x"]).content)}

    sub = _one_node_graph(inner, "inner")

    def outer(state: _S) -> _S:
        sub.invoke({"x": "one"})
        sub.invoke({"x": "two"})
        sub.batch([{"x": "three"}, {"x": "four"}])
        return {"x": "done"}

    app = with_agentspec(_one_node_graph(outer, "outer"), config=strict)
    app.invoke({"x": ""})
    (graph,) = get_handler(app).graphs().values()
    calls = graph.llm_calls()
    assert len(calls) == 4
    assert {c.agent_id for c in calls} == {"outer/inner"}
    assert {t.agent_id for t, _ in model.seen} == {"outer/inner"}  # what the proposer keys on
    # every call is step 1 of its subgraph run inside step 1 of the outer graph: one
    # superstep group (keyed by the step template, which never held the counters)
    (superstep,) = graph.groups_of("superstep")
    assert superstep.group_id.endswith("|superstep|1/1") and len(superstep.members) == 4
    assert graph.groups_of("retry") == []  # separate invocations, not attempts
    assert [e.kind for e in graph.edges] == ["repeat"] * 3


def test_middleware_subagent_invoked_repeatedly_is_one_agent() -> None:
    from langchain.agents import create_agent

    model = ScriptedChatModel(script=echo)
    researcher = create_agent(model, tools=[], middleware=[AgentSpecMiddleware()])

    def supervisor(state: MessagesState) -> dict[str, Any]:
        for q in ("first", "second", "third"):
            researcher.invoke({"messages": [HumanMessage(q)]})
        return {}

    g = StateGraph(MessagesState)
    g.add_node("supervisor", supervisor)
    g.add_edge(START, "supervisor")
    g.add_edge("supervisor", END)
    g.compile().invoke({"messages": [HumanMessage("go")]})
    assert [(last, t.agent_id if t else None) for t, last in model.seen] == [
        ("first", "supervisor/model"),
        ("second", "supervisor/model"),
        ("third", "supervisor/model"),
    ]


# ------------------------------------------- 2: the end handling of a call fails
class _NoGeneration(ScriptedChatModel):
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._answer(messages, kwargs)
        return ChatResult(generations=[])


def test_call_without_generations_ends_and_is_released(strict: TaggingConfig) -> None:
    handler = AgentSpecCallbackHandler(strict)
    model = _NoGeneration(script=echo)
    for _ in range(3):
        model.generate([[HumanMessage("hi")]], callbacks=[handler])
    assert handler.live_state() == ZERO
    assert handler.stats.adapter_errors == 0

    def node(state: _S, config: RunnableConfig) -> _S:
        model.generate([[HumanMessage("in graph")]], callbacks=config["callbacks"])
        return {"x": "ok"}

    app = with_agentspec(_one_node_graph(node, "node"), config=strict)
    app.invoke({"x": ""})
    (graph,) = get_handler(app).graphs().values()
    assert [c.status for c in graph.llm_calls()] == ["ok"]


def test_trace_record_with_lone_surrogates_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A prompt or output with a lone surrogate (not valid Unicode: the trace schema
    refuses it) is recorded with each lone surrogate replaced by U+FFFD, one warning per
    record; valid astral characters stay. The call's state is released either way."""
    path = tmp_path / "t.jsonl"
    handler = AgentSpecCallbackHandler(TaggingConfig(trace_path=path))
    model = ScriptedChatModel(script=echo, callbacks=[handler])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            model.invoke("broken emoji \ud83d")
        model.invoke([SystemMessage("low \ude00 alone"), HumanMessage("ok \U0001f600 \ud83d!")])
        model.invoke("clean \U0001f600")
    assert handler.live_state() == ZERO
    assert [c.status for g in handler.graphs().values() for c in g.llm_calls()] == ["ok"] * 5
    assert handler.stats.adapter_errors == 0
    assert handler.stats.traces_recorded == 5
    handler.close()
    records = list(iter_records(path))
    texts = [
        ([m.content for m in r.prompt] if isinstance(r.prompt, list) else r.prompt, r.output)
        for r in records
    ]
    assert texts == [(["broken emoji \ufffd"], "echo broken emoji \ufffd")] * 3 + [
        (["low \ufffd alone", "ok \U0001f600 \ufffd!"], "echo ok \U0001f600 \ufffd!"),
        (["clean \U0001f600"], "echo clean \U0001f600"),
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 4  # one per record that had some
    assert all("U+FFFD" in w and "continuing without tags" not in w for w in warnings)


def test_trace_record_that_fails_otherwise_is_an_adapter_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that cannot be built for another reason is lost: logged and counted."""

    def refuse(**fields: Any) -> Any:
        raise ValueError("no record")

    monkeypatch.setattr("agentspec_mw_langgraph.handler.TraceRecord", refuse)
    handler = AgentSpecCallbackHandler(TaggingConfig(trace_path=tmp_path / "t.jsonl"))
    model = ScriptedChatModel(script=echo, callbacks=[handler])
    with caplog.at_level(logging.WARNING):
        model.invoke("hi")
    assert handler.live_state() == ZERO
    assert handler.stats.adapter_errors == 1 and handler.stats.traces_recorded == 0
    assert "no record" in caplog.text
    assert "trace record may miss" in caplog.text and "without tags" not in caplog.text
    handler.close()


# ------------------------------------------------------------- 3: a string stop
def test_string_stop_is_one_stop_string() -> None:
    backend = FakeBackend(CharTokenizer(), lambda prompt: "hello")
    model = ChatAgentSpecVLLM(engine=backend)
    model.invoke("hi", stop="END")
    assert backend.requests[-1][1].stop == ("END",)
    model.bind(stop="</answer>").invoke("hi")
    assert backend.requests[-1][1].stop == ("</answer>",)
    ChatAgentSpecVLLM(engine=backend, stop="A").invoke("hi", stop=["B", "C"])  # type: ignore[arg-type]
    assert backend.requests[-1][1].stop == ("A", "B", "C")


# ------------------------------------ 4: a failed call among concurrent ones frees its ordinal
class _FailsOn(ScriptedChatModel):
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        answer = self._answer(messages, kwargs)
        if messages[-1].content == "fail":
            await asyncio.sleep(0.05)  # its siblings have started (and taken ordinals)
            raise RuntimeError("boom")
        return ChatResult(generations=[ChatGeneration(message=answer)])


def test_retry_among_concurrent_calls_links_the_failed_attempt(strict: TaggingConfig) -> None:
    model = _FailsOn(script=echo)

    async def node(state: _S) -> _S:
        await asyncio.gather(
            model.ainvoke("fail"), model.ainvoke("b"), model.ainvoke("c"), return_exceptions=True
        )
        await model.ainvoke("retry")  # the user's retry of the failed call
        return {"x": "done"}

    app = with_agentspec(_one_node_graph(node, "node"), config=strict)
    asyncio.run(app.ainvoke({"x": ""}))
    (graph,) = get_handler(app).graphs().values()
    calls = graph.llm_calls()
    (failed,) = [c for c in calls if c.status == "error"]
    retry = calls[-1]
    assert retry.ordinal == failed.ordinal
    assert sorted(c.ordinal for c in calls if c.status == "ok") == [0, 1, 2]
    retries = [(e.src, e.dst) for e in graph.edges if e.kind == "retry"]
    assert retries == [(failed.call_id, retry.call_id)]
    (group,) = graph.groups_of("retry")
    assert set(group.members) == {failed.call_id, retry.call_id}


def test_ordinals_free_smallest_first() -> None:
    """Two failures at once: the next calls take the freed ordinals, smallest first."""
    handler = AgentSpecCallbackHandler(TaggingConfig(adapter_raise_errors=True))
    model = _FailsOn(script=echo)

    async def node(state: _S) -> _S:
        await asyncio.gather(
            model.ainvoke("ok0"), model.ainvoke("fail"), model.ainvoke("fail"),
            return_exceptions=True,
        )  # fmt: skip
        await model.ainvoke("next")
        await model.ainvoke("next")
        await model.ainvoke("next")
        return {"x": "done"}

    app = _one_node_graph(node, "node").with_config(callbacks=[handler])
    asyncio.run(app.ainvoke({"x": ""}))
    (graph,) = handler.graphs().values()
    assert [(c.ordinal, c.status) for c in graph.llm_calls()] == [
        (0, "ok"), (1, "error"), (2, "error"), (1, "ok"), (2, "ok"), (3, "ok"),
    ]  # fmt: skip


# ----------------------------------------------- 5: tracer metadata of a batch
def test_batch_calls_do_not_share_wrong_tracer_metadata(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)
    handler = AgentSpecCallbackHandler(strict)
    collector = RunCollectorCallbackHandler()
    after_tool: list[BaseMessage] = [
        HumanMessage("b"),
        AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "c1"}]),
        ToolMessage("r", tool_call_id="c1"),
    ]

    def planner(state: _S, config: RunnableConfig) -> _S:
        model.generate([[HumanMessage("a")], after_tool], callbacks=config["callbacks"])
        model.invoke("single")
        return {"x": "done"}

    app = _one_node_graph(planner, "planner").with_config(callbacks=[handler, collector])
    app.invoke({"x": ""})
    (graph,) = handler.graphs().values()

    def walk(run: Any) -> Any:
        yield run
        for child in run.child_runs:
            yield from walk(child)

    runs = [r for root in collector.traced_runs for r in walk(root) if r.run_type == "llm"]
    assert len(runs) == 3
    segments = {}
    for run in runs:
        md = run.extra.get("metadata", {})
        segments[str(run.id)] = md.get("agentspec_segment")
    calls = {c.call_id: c for c in graph.llm_calls()}
    assert {calls[rid].segment for rid in segments} == {"plan", "answer"}
    for rid, shown in segments.items():  # a run shows its own tags, or none
        assert shown is None or shown == calls[rid].segment
    single = [rid for rid in segments if calls[rid].ordinal == 2]
    assert [segments[rid] for rid in single] == ["plan"]  # a lone call still shows its tags


# -------------------------------------------- 6: an abandoned stream's tags in the context
def test_abandoned_astream_leaves_no_tags_in_the_node_context(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)
    seen: list[Any] = []

    async def node(state: _S) -> _S:
        async for _ in model.astream("draft two words"):
            break
        await asyncio.sleep(0.02)
        gc.collect()
        await asyncio.sleep(0.02)
        seen.append((current_tags(), current_wire_tags(), current_ticket()))
        return {"x": "ok"}

    app = with_agentspec(_one_node_graph(node, "node"), config=strict)
    asyncio.run(app.ainvoke({"x": ""}))
    (graph,) = get_handler(app).graphs().values()
    assert [c.status for c in graph.llm_calls()] == ["error"]  # the stream was closed
    assert seen == [(None, None, None)]


def test_ended_ticket_publishes_nothing() -> None:
    tags = StructureTags(agent_id="a", query_id="q")
    delivered: list[int] = []
    ticket = CallTicket(None, lambda: delivered.append(1))
    set_current_tags(tags, ticket)
    try:
        assert current_tags() == tags and current_ticket() is ticket
        ticket.end()
        assert ticket.ended
        assert (current_tags(), current_wire_tags(), current_ticket()) == (None, None, None)
        assert deliver_wire_tags() is None and delivered == []
    finally:
        set_current_tags(None)


# -------------------------------------- 7: interleaved calls outside a graph in one context
def test_call_inside_a_consumed_stream_keeps_the_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t.jsonl"
    handler = AgentSpecCallbackHandler(TaggingConfig(trace_path=path, adapter_raise_errors=True))
    model = ScriptedChatModel(script=echo, callbacks=[handler])
    chunks = []
    with caplog.at_level(logging.WARNING):
        for chunk in model.stream("a long answer"):
            chunks.append(chunk.content)
            model.invoke("side question")
    handler.close()
    assert "".join(str(c) for c in chunks) == "echo a long answer"
    assert "never ended" not in caplog.text
    statuses = [c.status for g in handler.graphs().values() for c in g.llm_calls()]
    assert statuses == ["ok"] * (1 + len(chunks))
    assert len(list(iter_records(path))) == 1 + len(chunks)
    assert handler.live_state() == ZERO


# ---------------------------------------------------- 8: recording after close()
def test_recorder_reopens_after_close(tmp_path: Path) -> None:
    model = ScriptedChatModel(script=echo)

    def node(state: _S) -> _S:
        return {"x": str(model.invoke("hi").content)}

    path = tmp_path / "calls.jsonl"
    app = with_agentspec(
        _one_node_graph(node, "node"),
        config=TaggingConfig(trace_path=path, adapter_raise_errors=True),
    )
    for runs in (1, 2, 3):  # a notebook cell run again: invoke, then close() to flush
        app.invoke({"x": ""})
        get_handler(app).close()
        assert len(list(iter_records(path))) == runs
    assert get_handler(app).stats.traces_recorded == 3
    assert get_handler(app).stats.adapter_errors == 0


def test_recorder_close_then_record_keeps_order(tmp_path: Path) -> None:
    from agentspec_mw.traces.schema import TraceRecord

    def rec(i: int) -> TraceRecord:
        return TraceRecord(
            workload="w", source="s", run_id="r", call_index=i, agent="a",
            segment_hint="answer", prompt="p", output="o", meta={},
        )  # fmt: skip

    recorder = TraceRecorder(tmp_path / "t.jsonl")
    for i in range(50):
        assert recorder.record(rec(i))
    recorder.close()
    for i in range(50, 100):
        assert recorder.record(rec(i))
    recorder.flush()
    assert [r.call_index for r in iter_records(tmp_path / "t.jsonl")] == list(range(100))
    recorder.close()
    recorder.close()  # idempotent
    assert recorder.written == 100
