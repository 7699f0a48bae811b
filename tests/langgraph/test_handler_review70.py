"""The callback adapter in the cases a review found wrong (review 70): a stream whose first
chunk was awaited in a task of its own, a model calling a model, handlers created while
another thread looks them up, long fan-out group ids, a retried subgraph, functional-API
fan-out, and the segment heuristics."""

from __future__ import annotations

import asyncio
import operator
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import RetryPolicy, Send

from agentspec_mw.tags import MAX_ID_CHARS, StructureTags
from agentspec_mw_langgraph import TaggingConfig, current_tags, get_handler, with_agentspec
from agentspec_mw_langgraph import handler as handler_module
from agentspec_mw_langgraph.derive import forces_tool, predict_segment
from agentspec_mw_langgraph.handler import AgentSpecCallbackHandler
from agentspec_mw_langgraph.routing import tags_routing_key

from .fake_chat import ScriptedChatModel

STRICT = TaggingConfig(adapter_raise_errors=True)


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"re: {messages[-1].content}")


def _one_node(name: str, fn: Any, **kwargs: Any) -> StateGraph[Any]:
    g = StateGraph(MessagesState)
    g.add_node(name, fn, **kwargs)
    g.add_edge(START, name)
    g.add_edge(name, END)
    return g


# --------------------------------------------- 1. a stream outlives its first chunk's task
class _Gated(BaseChatModel):
    """Streams two chunks; the second only once ``gate`` is set."""

    gate: Any = None

    @property
    def _llm_type(self) -> str:
        return "gated"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="fast"))])

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        yield ChatGenerationChunk(message=AIMessageChunk(content="w0 "))
        await self.gate.wait()
        yield ChatGenerationChunk(message=AIMessageChunk(content="w1"))


class _Pair(TypedDict):
    a: str
    b: str


def test_a_stream_whose_first_chunk_was_awaited_in_its_own_task_keeps_running(
    tmp_path: Any,
) -> None:
    async def main() -> tuple[Any, AgentSpecCallbackHandler]:
        streaming, other_done = asyncio.Event(), asyncio.Event()
        model = _Gated(gate=other_done)

        async def streamer(state: _Pair) -> dict[str, Any]:
            chunks = model.astream("stream me").__aiter__()

            async def next_chunk() -> Any:
                return await anext(chunks, None)

            out = ""
            # each chunk awaited in a task of its own (as asyncio.wait_for does on 3.11)
            while (chunk := await asyncio.create_task(next_chunk())) is not None:
                out += str(chunk.content)
                streaming.set()
            return {"a": out + str((await model.ainvoke("second")).content)}

        async def other(state: _Pair) -> dict[str, Any]:
            await streaming.wait()  # starts while the stream is in flight
            reply = await model.ainvoke("other")
            other_done.set()
            return {"b": str(reply.content)}

        g = StateGraph(_Pair)
        g.add_node("streamer", streamer)
        g.add_node("other", other)
        g.add_edge(START, "streamer")
        g.add_edge(START, "other")
        g.add_edge("streamer", END)
        g.add_edge("other", END)
        config = TaggingConfig(adapter_raise_errors=True, trace_path=str(tmp_path / "t.jsonl"))
        app = with_agentspec(g.compile(), config=config)
        out = await app.ainvoke({"a": "", "b": ""})
        handler = get_handler(app)
        assert handler is not None
        return out, handler

    out, handler = asyncio.run(main())
    assert out == {"a": "w0 w1fast", "b": "fast"}
    (graph,) = handler.graphs().values()
    calls = graph.llm_calls()
    assert [(c.node, c.status, c.ordinal) for c in calls] == [
        ("streamer", "ok", 0),
        ("other", "ok", 0),
        ("streamer", "ok", 1),
    ]
    assert graph.groups_of("retry") == []
    assert [e.kind for e in graph.edges] == ["repeat"]  # the stream, then the next call
    assert handler.stats.traces_recorded == 3
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
    handler.close()


# ----------------------------------------------------------- 2. a model calling a model
class _Condensing(BaseChatModel):
    """Calls ``inner`` during its own generation, recording the tags around that call."""

    inner: Any = None
    seen: list[Any] = []

    @property
    def _llm_type(self) -> str:
        return "condensing"

    def _generate(self, messages: Any, *args: Any, **kwargs: Any) -> ChatResult:
        before = current_tags()
        self.inner.invoke("condense")
        self.seen.append((before, current_tags()))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="ok"))])


def test_a_model_calling_a_model_keeps_its_own_tags() -> None:
    inner = ScriptedChatModel(script=echo)
    outer = _Condensing(inner=inner, seen=[])
    after: list[StructureTags | None] = []

    def agent(state: MessagesState) -> dict[str, Any]:
        reply = outer.invoke(state["messages"])
        after.append(current_tags())
        return {"messages": [reply]}

    app = with_agentspec(_one_node("agent", agent).compile(), config=STRICT)
    app.invoke({"messages": [("user", "q")]})
    ((before, own),) = outer.seen
    assert before is not None and before.agent_id == "agent"
    assert own is before  # what the outer model's own request carries
    ((inner_tags, _),) = inner.seen
    assert inner_tags is not None and inner_tags is not before  # the inner call's own
    assert after == [None]  # the node's context is clear once the outer call ended


# --------------------------------------------- 3. handlers created while others look up
class _AddsWhileIterated(weakref.WeakSet[AgentSpecCallbackHandler]):
    """A handler set that another thread adds a handler to while it is iterated."""

    keep: list[AgentSpecCallbackHandler]

    def __iter__(self) -> Iterator[AgentSpecCallbackHandler]:
        items = super().__iter__()
        yield next(items)
        adder = threading.Thread(target=lambda: self.keep.append(AgentSpecCallbackHandler()))
        adder.start()
        adder.join(0.2)  # with the lock held by the reader it waits; else it adds now
        yield from items


def test_handlers_created_in_another_thread_do_not_break_the_nesting_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handlers = _AddsWhileIterated()
    handlers.keep = []
    monkeypatch.setattr(handler_module, "_HANDLERS", handlers)
    probe, other = AgentSpecCallbackHandler(), AgentSpecCallbackHandler()
    assert len(handlers) == 2
    assert probe._nested_elsewhere(uuid.uuid4()) is False
    for _ in range(100):  # the adder, blocked while the reader iterated, gets its turn
        if handlers.keep:
            break
        threading.Event().wait(0.05)
    assert len(handlers.keep) == 1 and len(handlers) == 3
    assert other is not probe


# ----------------------------------------------- 4. a shortened fan-out group id's key
class _Fan(TypedDict):
    xs: list[str]
    out: Annotated[list[str], operator.add]


def test_a_fanout_siblings_calls_share_a_routing_key_when_its_group_id_was_shortened() -> None:
    model = ScriptedChatModel(script=echo)

    def worker(state: _Fan) -> dict[str, Any]:
        model.invoke("first " + state["xs"][0])
        return {"out": [str(model.invoke("second " + state["xs"][0]).content)]}

    g = StateGraph(_Fan)
    g.add_node("w", worker)
    g.add_conditional_edges(
        START, lambda s: [Send("w", {"xs": [x], "out": []}) for x in s["xs"]], ["w"]
    )
    g.add_edge("w", END)
    app = with_agentspec(g.compile(), config=TaggingConfig(routing_granularity="fanout"))
    for thread in ("short", "t" * 245):
        model._seen.clear()
        app.invoke({"xs": ["a"], "out": []}, {"configurable": {"thread_id": thread}})
        (first, _), (second, _) = model.seen
        assert first is not None and second is not None
        assert first.group_id is not None and second.group_id is not None
        assert first.group_id.endswith("#0") and second.group_id.endswith("#1")
        assert len(first.group_id) <= MAX_ID_CHARS and len(second.group_id) <= MAX_ID_CHARS
        key = tags_routing_key(first, "fanout")
        assert key == tags_routing_key(second, "fanout")
        assert key != tags_routing_key(first, "query")  # the fan-out's own key
    assert len(first.group_id) == MAX_ID_CHARS  # the long one was shortened


# ------------------------------------------------------------- 5. a retried subgraph
def _flaky_think(model: ScriptedChatModel) -> Any:
    runs = [0]

    def think(state: MessagesState) -> dict[str, Any]:
        reply = model.invoke(state["messages"])
        runs[0] += 1
        if runs[0] == 1:
            raise ValueError("transient")
        return {"messages": [reply]}

    return think


@pytest.mark.parametrize("checkpointer", [None, InMemorySaver()], ids=["plain", "checkpointed"])
def test_a_retried_subgraph_node_is_a_retry(checkpointer: Any) -> None:
    model = ScriptedChatModel(script=echo)
    sub = _one_node("think", _flaky_think(model)).compile()
    policy = RetryPolicy(initial_interval=0.001, retry_on=ValueError)
    app = with_agentspec(
        _one_node("researcher", sub, retry_policy=policy).compile(checkpointer=checkpointer),
        config=STRICT,
    )
    app.invoke({"messages": [("user", "q")]}, {"configurable": {"thread_id": "x"}})
    (graph,) = get_handler(app).graphs().values()  # type: ignore[union-attr]
    first, second = graph.llm_calls()
    assert first.namespace != second.namespace  # the re-run subgraph's tasks are new
    assert [(e.src, e.dst, e.kind) for e in graph.edges] == [
        (first.call_id, second.call_id, "retry")
    ]
    assert [(g.group_id, g.members) for g in graph.groups_of("retry")] == [
        (f"thread:x|retry|{first.namespace}#0", [first.call_id, second.call_id])
    ]
    assert graph.groups_of("repeat") == []


def test_a_subgraph_a_node_runs_twice_is_a_repeat_not_a_retry() -> None:
    model = ScriptedChatModel(script=echo)
    sub = _one_node("think", lambda s: {"messages": [model.invoke(s["messages"])]}).compile()

    def researcher(state: MessagesState) -> dict[str, Any]:
        sub.invoke(state)
        return {"messages": sub.invoke(state)["messages"][-1:]}

    app = with_agentspec(_one_node("researcher", researcher).compile(), config=STRICT)
    app.invoke({"messages": [("user", "q")]})
    (graph,) = get_handler(app).graphs().values()  # type: ignore[union-attr]
    first, second = graph.llm_calls()
    assert first.template == second.template and first.ordinal == second.ordinal == 0
    assert [(e.src, e.dst, e.kind) for e in graph.edges] == [
        (first.call_id, second.call_id, "repeat")
    ]
    assert graph.groups_of("retry") == []


# -------------------------------------------------------- 6. functional-API fan-out
def test_functional_tasks_are_a_fanout() -> None:
    model = ScriptedChatModel(script=echo)

    @task
    def research(topic: str) -> str:
        return str(model.invoke(f"research {topic}").content)

    @entrypoint()
    def flow(topics: list[str]) -> str:
        notes = [f.result() for f in [research(t) for t in topics]]
        return str(model.invoke("summarize " + ";".join(notes)).content)

    app = with_agentspec(flow, config=STRICT)
    app.invoke(["a", "b", "c"])
    siblings = {text: tags for tags, text in model.seen if text.startswith("research")}
    summary = next(tags for tags, text in model.seen if text.startswith("summarize"))
    assert set(siblings) == {"research a", "research b", "research c"}
    gids = {t.group_id for t in siblings.values() if t is not None}
    assert len(gids) == 1 and all(t and t.group_kind == "fanout" for t in siblings.values())
    assert summary is not None and summary.group_id is None
    (gid,) = gids
    assert gid is not None and gid.endswith("|fanout|flow@0/research@0#0")
    graph = get_handler(app).graph(summary.query_id)  # type: ignore[union-attr]
    research_calls = [c for c in graph.llm_calls() if c.node == "research"]
    assert sorted(c.send_index for c in research_calls) == [0, 1, 2]  # type: ignore[type-var]
    assert graph.groups_of("repeat") == [] and graph.edges == []  # siblings, not repeats


# ------------------------------------------------------------ 7. segment heuristics
@pytest.mark.parametrize(
    ("tool_choice", "forces"),
    [
        ({"type": "auto"}, False),
        ({"type": "none"}, False),
        ({"type": "any"}, True),
        ({"type": "required"}, True),
        ({"type": "tool", "name": "search"}, True),
        ({"type": "function", "function": {"name": "search"}}, True),
        ({"name": "search"}, True),
        ("auto", False),
        ("search", True),
    ],
)
def test_a_tool_choice_dict_forces_a_tool_by_its_type(tool_choice: Any, forces: bool) -> None:
    assert forces_tool(tool_choice) is forces


def _segment(node: str, **kwargs: Any) -> str | None:
    args: dict[str, Any] = {
        "tools_bound": False,
        "tool_choice": None,
        "last_is_tool_result": False,
        "previous_after_tool": None,
        "overrides": {},
    }
    return predict_segment(node=node, **{**args, **kwargs})


def test_a_tool_choice_type_none_or_auto_does_not_force_a_tool() -> None:
    after_tool = {"tools_bound": True, "last_is_tool_result": True, "previous_after_tool": None}
    assert _segment("agent", tool_choice={"type": "auto"}, **after_tool) == "answer"
    assert _segment("agent", tool_choice={"type": "none"}, **after_tool) == "answer"
    # tools withheld: not a tool call even before any tool result
    assert _segment("agent", tools_bound=True, tool_choice={"type": "none"}) == "answer"
    assert _segment("agent", tools_bound=True, tool_choice={"type": "any"}) == "tool_call"


@pytest.mark.parametrize(
    ("node", "segment"),
    [
        ("planner", "plan"),
        ("plan", "plan"),
        ("research_plan", "plan"),
        ("make-plan", "plan"),
        ("makePlan", "plan"),
        ("Planner", "plan"),
        ("replan", "plan"),
        ("explanation", "answer"),
        ("airplane_search", "answer"),
        ("explainer", "answer"),
        ("replanner", "plan"),
        ("planning_step", "plan"),
        ("planet_researcher", "answer"),
        ("plant_expert", "answer"),
        ("plane_booking", "answer"),
    ],
)
def test_plan_is_a_word_of_the_node_name(node: str, segment: str) -> None:
    assert _segment(node) == segment
