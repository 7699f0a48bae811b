"""The redundancy graph, trace records and routing keys in the cases a review found wrong
(review 71): a functional ReAct loop's turns, trace run ids a thread's later recordings
reused, a subgraph a node runs twice with a fan-out in it, the routing key of a fan-out
whose siblings run several steps, a tool that errors, tool calls whose arguments do not
parse, a parallel task that only interrupted, and the workload name ``ALL``."""

from __future__ import annotations

import json
import operator
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

import numpy as np
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Send, interrupt
from pydantic import ValidationError

from agentspec_mw.replay.run import issued_together
from agentspec_mw.tags import StructureTags
from agentspec_mw.traces.loader import iter_records
from agentspec_mw.traces.schema import TraceRecord
from agentspec_mw.traces.tokenized import CallMeta
from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec
from agentspec_mw_langgraph.context import current_ticket
from agentspec_mw_langgraph.messages import output_text
from agentspec_mw_langgraph.routing import routing_key

from .fake_chat import ScriptedChatModel

STRICT = TaggingConfig(adapter_raise_errors=True)


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"re: {messages[-1].content}")


def _metas(path: Path) -> list[CallMeta]:
    return [
        CallMeta(r.workload, r.run_id, r.call_index, r.agent, r.segment_hint, r.parent_group,
                 r.meta.get("step"))
        for r in iter_records(path)
    ]  # fmt: skip


def _together(metas: list[CallMeta], i: int) -> bool:
    """Whether the replay issues call ``i`` together with call ``i - 1``."""
    return issued_together(metas[i - 1], metas[i], np.array([1]), np.array([2]))


# ------------------------------------------- 1. a functional ReAct loop's turns
def test_functional_tasks_called_one_after_another_are_repeats(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"

    def script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        n = sum(isinstance(m, ToolMessage) for m in messages)
        if n < 2:
            call = {"name": "lookup", "args": {"q": str(n)}, "id": f"c{n}"}
            return AIMessage(content="", tool_calls=[call])
        return AIMessage(content="final answer")

    model = ScriptedChatModel(script=script)

    @task
    def call_model(messages: list[BaseMessage]) -> AIMessage:
        return model.invoke(messages)  # type: ignore[return-value]

    @task
    def call_tool(call: dict[str, Any]) -> ToolMessage:
        return ToolMessage(content=f"res {call['args']['q']}", tool_call_id=call["id"])

    @entrypoint()
    def agent(messages: list[BaseMessage]) -> AIMessage:
        reply = call_model(messages).result()
        while reply.tool_calls:
            results = [call_tool(c).result() for c in reply.tool_calls]
            messages = [*messages, reply, *results]
            reply = call_model(messages).result()
        return reply

    app = with_agentspec(agent, config=TaggingConfig(adapter_raise_errors=True, trace_path=path))
    app.invoke([HumanMessage("q")])
    handler = get_handler(app)
    assert handler is not None
    handler.close()
    turns = [tags for tags, _ in model.seen]
    assert len(turns) == 3 and all(t is not None for t in turns)
    # every call of the task takes one fan-out position; each turn's prompt carries the
    # turn before's reply, so it is the next round there: a fan-out of its own
    gids = [str(t.group_id) for t in turns]  # type: ignore[union-attr]
    position = gids[0].removesuffix("#0")
    assert gids == [f"{position}#0", f"{position}~1#0", f"{position}~2#0"]
    graph = handler.graph(turns[0].query_id)  # type: ignore[union-attr]
    assert [len(g.members) for g in graph.groups_of("fanout")] == [1, 1, 1]
    (repeat,) = graph.groups_of("repeat")
    assert len(repeat.members) == 3
    metas = _metas(path)
    assert not _together(metas, 1) and not _together(metas, 2)


def test_functional_siblings_that_carry_another_agents_reply_stay_a_fanout() -> None:
    """The research tasks' prompts carry the planner's reply: another position's, so they
    are still siblings; only a reply at their own position makes a call a later turn."""
    model = ScriptedChatModel(script=echo)

    @task
    def plan(question: str) -> AIMessage:
        return model.invoke([HumanMessage(f"plan {question}")])  # type: ignore[return-value]

    @task
    def research(outline: AIMessage, topic: str) -> AIMessage:
        prompt = [HumanMessage("plan"), outline, HumanMessage(f"research {topic}")]
        return model.invoke(prompt)  # type: ignore[return-value]

    @entrypoint()
    def flow(question: str) -> str:
        outline = plan(question).result()
        notes = [f.result() for f in [research(outline, t) for t in ("a", "b")]]
        return " ".join(str(n.content) for n in notes)

    app = with_agentspec(flow, config=STRICT)
    app.invoke("q")
    seen = {text: tags for tags, text in model.seen}
    siblings = [seen["research a"], seen["research b"]]
    assert all(t is not None and t.group_kind == "fanout" for t in siblings)
    assert siblings[0].group_id == siblings[1].group_id  # type: ignore[union-attr]
    graph = get_handler(app).graph(siblings[0].query_id)  # type: ignore[union-attr]
    research_group = [g for g in graph.groups_of("fanout") if "research" in g.group_id]
    assert len(research_group) == 1 and len(research_group[0].members) == 2


# ------------------------------------------------ 2. trace run ids of a thread
class _Count(TypedDict):
    n: int


def _counter_graph(model: ScriptedChatModel) -> Any:
    def agent(state: _Count) -> dict[str, Any]:
        model.invoke(f"turn {state['n']}")
        return {"n": state["n"] + 1}

    g = StateGraph(_Count)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g.compile(checkpointer=InMemorySaver())


def test_recordings_of_one_thread_by_two_handlers_share_a_file(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    compiled = _counter_graph(ScriptedChatModel(script=echo))
    config = TaggingConfig(adapter_raise_errors=True, trace_path=path)
    thread = {"configurable": {"thread_id": "1"}}
    for _ in range(2):  # two processes, or a re-wrapped app, on one conversation
        app = with_agentspec(compiled, config=config)
        app.invoke({"n": 0}, thread)
        app.invoke({"n": 0}, thread)  # one handler: the same recording, counted on
        get_handler(app).close()  # type: ignore[union-attr]
    records = list(iter_records(path))  # raised TraceFormatError: call_index 0 twice
    assert len(records) == 4
    first, second = records[0].run_id, records[2].run_id
    assert first != second and first.startswith("thread:1|run:")
    assert [(r.run_id, r.call_index) for r in records] == [
        (first, 0),
        (first, 1),
        (second, 0),
        (second, 1),
    ]
    assert {r.meta["query_id"] for r in records} == {"thread:1"}


def test_a_thread_recorded_again_after_it_left_the_history(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    config = TaggingConfig(adapter_raise_errors=True, trace_path=path, graph_history=1)
    app = with_agentspec(_counter_graph(ScriptedChatModel(script=echo)), config=config)
    for thread in ("1", "2", "1"):
        app.invoke({"n": 0}, {"configurable": {"thread_id": thread}})
    get_handler(app).close()  # type: ignore[union-attr]
    records = list(iter_records(path))
    assert len({r.run_id for r in records}) == 3
    assert [r.meta["query_id"] for r in records] == ["thread:1", "thread:2", "thread:1"]
    assert all(r.call_index == 0 for r in records)


def test_a_run_without_thread_keeps_its_query_id_as_run_id(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    model = ScriptedChatModel(script=echo)
    config = TaggingConfig(adapter_raise_errors=True, trace_path=path, tags_query_from_thread=False)
    app = with_agentspec(_counter_graph(model), config=config)
    app.invoke({"n": 0}, {"configurable": {"thread_id": "1"}})
    get_handler(app).close()  # type: ignore[union-attr]
    ((tags, _),) = model.seen
    (record,) = iter_records(path)
    assert tags is not None and record.run_id == record.meta["query_id"] == tags.query_id


# --------------------------------- 3. a subgraph with a fan-out, run twice by one node
class _Fan(TypedDict):
    topics: list[str]
    notes: Annotated[list[str], operator.add]


def test_each_run_of_a_subgraph_has_its_own_fanout(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    model = ScriptedChatModel(script=echo)

    def worker(state: _Fan) -> dict[str, Any]:
        return {"notes": [str(model.invoke(f"note {state['topics'][0]}").content)]}

    sub = StateGraph(_Fan)
    sub.add_node("worker", worker)
    sub.add_conditional_edges(
        START,
        lambda s: [Send("worker", {"topics": [t], "notes": []}) for t in s["topics"]],
        ["worker"],
    )
    sub.add_edge("worker", END)
    compiled_sub = sub.compile()

    def outer(state: _Fan) -> dict[str, Any]:
        compiled_sub.invoke({"topics": ["a1", "a2"], "notes": []})
        compiled_sub.invoke({"topics": ["b1", "b2"], "notes": []})
        return {}

    g = StateGraph(_Fan)
    g.add_node("outer", outer)
    g.add_edge(START, "outer")
    g.add_edge("outer", END)
    app = with_agentspec(
        g.compile(), config=TaggingConfig(adapter_raise_errors=True, trace_path=path)
    )
    app.invoke({"topics": [], "notes": []})
    get_handler(app).close()  # type: ignore[union-attr]
    seen = {text: tags for tags, text in model.seen}
    assert all(t is not None and t.group_kind == "fanout" for t in seen.values())
    gid = {text: t.group_id for text, t in seen.items() if t is not None}
    assert gid["note a1"] == gid["note a2"] != gid["note b1"] == gid["note b2"]
    assert gid["note a1"] is not None and gid["note a1"].endswith("|fanout|outer@1/worker@1#0")
    assert gid["note b1"] is not None and gid["note b1"].endswith("|fanout|outer@1/worker@1.1#0")
    graph = get_handler(app).graph(next(iter(seen.values())).query_id)  # type: ignore[union-attr]
    assert sorted(len(grp.members) for grp in graph.groups_of("fanout")) == [2, 2]
    # one superstep, as for the invocations of a batch (test_review62): the step template
    (superstep,) = graph.groups_of("superstep")
    assert len(superstep.members) == 4
    metas = _metas(path)
    assert [_together(metas, i) for i in (1, 2, 3)] == [True, False, True]


# ------------------------------------------- 4. the routing key of a fan-out
@tool
def lookup(q: str) -> str:
    """Look a word up."""
    if q == "bad":
        raise ValueError("boom")
    return f"result for {q}"


class _Headers(ScriptedChatModel):
    """Also records the routing header each call's requests would carry."""

    keys: list[tuple[str, str | None]] = []

    def _answer(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        ticket = current_ticket()
        key = ticket.headers.get("x-session-id") if ticket is not None else None
        with self._lock:
            self.keys.append((str(messages[0].content), key))
        return super()._answer(messages, kwargs)


def _react_subgraph(model: ScriptedChatModel, handle_tool_errors: bool = False) -> Any:
    bound = model.bind_tools([lookup])
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda s: {"messages": [bound.invoke(s["messages"])]})
    g.add_node("tools", ToolNode([lookup], handle_tool_errors=handle_tool_errors))
    g.add_edge(START, "agent")
    g.add_conditional_edges(
        "agent", lambda s: "tools" if s["messages"][-1].tool_calls else END, ["tools", END]
    )
    g.add_edge("tools", "agent")
    return g


def _one_lookup(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    if not isinstance(messages[-1], ToolMessage):
        call = {"name": "lookup", "args": {"q": "x"}, "id": "c0"}
        return AIMessage(content="", tool_calls=[call])
    return AIMessage(content="done")


class _Topics(MessagesState):
    topics: list[str]


def test_a_fanout_keeps_one_routing_key_across_its_siblings_steps() -> None:
    model = _Headers(script=_one_lookup, keys=[])
    g = StateGraph(_Topics)
    g.add_node("researcher", _react_subgraph(model).compile())
    g.add_conditional_edges(
        START,
        lambda s: [
            Send("researcher", {"messages": [HumanMessage(f"about {t}")], "topics": []})
            for t in s["topics"]
        ],
        ["researcher"],
    )
    g.add_edge("researcher", END)
    config = TaggingConfig(adapter_raise_errors=True, routing_granularity="fanout")
    app = with_agentspec(g.compile(), config=config)
    app.invoke({"messages": [], "topics": ["x", "y"]})
    tags = [t for t, _ in model.seen]
    assert len(tags) == 4 and all(t is not None and t.group_kind == "fanout" for t in tags)
    assert len({t.group_id for t in tags if t is not None}) == 2  # two steps of the siblings
    keys = {key for _, key in model.keys}
    assert len(keys) == 1  # was one key per inner step
    first = tags[0]
    assert isinstance(first, StructureTags) and first.query_id is not None
    assert keys != {routing_key(first.scope, first.query_id)}  # the fan-out's own key


# ------------------------------------------------ 5. a tool that raised
def test_a_tool_error_the_model_reads_is_its_observation() -> None:
    def script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        n = sum(isinstance(m, ToolMessage) for m in messages)
        if n < 2:
            call = {"name": "lookup", "args": {"q": "bad" if n == 0 else "good"}, "id": f"c{n}"}
            return AIMessage(content="", tool_calls=[call])
        return AIMessage(content="done")

    model = ScriptedChatModel(script=script)
    app = with_agentspec(_react_subgraph(model, handle_tool_errors=True).compile(), config=STRICT)
    out = app.invoke({"messages": [HumanMessage("q")]})
    assert [m.status for m in out["messages"] if isinstance(m, ToolMessage)] == [
        "error",
        "success",
    ]
    graph = get_handler(app).graph(model.seen[0][0].query_id)  # type: ignore[union-attr, arg-type]
    observed = {
        (graph.calls[e.src].status, graph.calls[e.dst].step)
        for e in graph.edges
        if e.kind == "observation"
    }
    assert observed == {("error", 3), ("ok", 5)}  # the error's edge was missing


# ------------------------------------------ 6. tool calls that did not parse
_RAW = {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "par'}}
_BAD = {"name": "lookup", "args": '{"q": "par', "id": "c0", "error": "bad json"}


def test_an_unparsable_tool_call_is_recorded_as_a_call(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"

    def script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        return AIMessage(
            content="", additional_kwargs={"tool_calls": [_RAW]}, invalid_tool_calls=[_BAD]
        )

    model = ScriptedChatModel(script=script)
    bound = model.bind_tools([lookup])
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda s: {"messages": [bound.invoke(s["messages"])]})
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    app = with_agentspec(
        g.compile(), config=TaggingConfig(adapter_raise_errors=True, trace_path=path)
    )
    app.invoke({"messages": [HumanMessage("q")]})
    get_handler(app).close()  # type: ignore[union-attr]
    (record,) = iter_records(path)
    assert record.output == '{"name": "lookup", "arguments": {"q": "par}'  # was ""
    assert record.meta["actual_segment"] == "tool_call"  # was "answer"


def test_output_text_keeps_the_models_order_of_valid_and_invalid_calls() -> None:
    good = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    message = AIMessage(
        content="calling",
        additional_kwargs={"tool_calls": [_RAW, good]},
        tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c1"}],
        invalid_tool_calls=[_BAD],
    )
    assert output_text(message).splitlines() == [
        "calling",
        '{"name": "lookup", "arguments": {"q": "par}',
        '{"name": "f", "arguments": {"a":1}}',  # its raw arguments, matched by id
    ]
    plain = AIMessage(content="", tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c1"}])
    assert output_text(plain) == '{"name": "f", "arguments": {"a": 1}}'


# --------------------------- 7. a parallel task that interrupted is not a retry
class _Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


def test_a_task_that_only_interrupted_is_not_retried() -> None:
    model = ScriptedChatModel(script=echo)
    b_called = threading.Event()
    crash = [True]

    def a(state: _Notes) -> dict[str, Any]:
        model.invoke("a")
        assert b_called.wait(10)
        if crash[0]:
            crash[0] = False
            raise RuntimeError("a crashed")
        return {"notes": ["a"]}

    def b(state: _Notes) -> dict[str, Any]:
        model.invoke("b")
        b_called.set()
        return {"notes": [str(interrupt("ok?"))]}

    g = StateGraph(_Notes)
    g.add_node("a", a)
    g.add_node("b", b)
    for name in ("a", "b"):
        g.add_edge(START, name)
        g.add_edge(name, END)
    app = with_agentspec(g.compile(checkpointer=InMemorySaver()), config=STRICT)
    thread = {"configurable": {"thread_id": "T"}}
    with pytest.raises(RuntimeError, match="a crashed"):
        app.invoke({"notes": []}, thread)
    assert app.invoke(None, thread).get("__interrupt__")  # re-runs a (and b: it interrupted)
    assert app.invoke(Command(resume="yes"), thread)["notes"] == ["a", "yes"]
    graph = get_handler(app).graph("thread:T")  # type: ignore[union-attr]
    node_of = {c.call_id: c.node for c in graph.llm_calls()}
    assert [node_of[c] for c in node_of] == ["a", "b", "a", "b", "b"]
    groups = {(grp.kind, tuple(node_of[m] for m in grp.members)) for grp in graph.groups.values()}
    assert ("retry", ("a", "a")) in groups
    assert ("retry", ("b", "b")) not in groups  # b's attempt never failed
    assert ("repeat", ("b", "b", "b")) in groups


# ------------------------------------------------------ 8. the workload "ALL"
def test_the_reserved_workload_name_is_refused_up_front() -> None:
    with pytest.raises(ValidationError, match="pooled rows"):
        TaggingConfig(trace_workload="ALL")
    with pytest.raises(ValidationError, match="pooled rows"):  # what it spared
        TraceRecord(workload="ALL", run_id="r", call_index=0, agent="a", prompt="p", output="o")
    assert TaggingConfig(trace_workload="all").trace_workload == "all"
    json.dumps(TaggingConfig(trace_workload="mine").model_dump(mode="json"))


def test_a_deep_copy_of_a_wrapped_app_shares_the_handler() -> None:
    """``copy.deepcopy(with_agentspec(app))`` works, as it does on the app unwrapped (it
    raised on the handler's lock), and the copy shares the handler (running a deep-copied
    compiled graph is LangGraph's own matter: its sentinels do not survive the copy)."""
    import copy

    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    model = FakeListChatModel(responses=["hi"])
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    g.add_edge(START, "agent")
    app = with_agentspec(g.compile())
    clone = copy.deepcopy(app)
    assert get_handler(clone) is get_handler(app)
    app.invoke({"messages": [("user", "hello")]})
    assert get_handler(app).stats.tags_derived == 1
