"""Review 72a: concurrent graph runs given one ``thread_id`` are queries apart (groups,
relations and learned segments never cross runs, also across apps); a model call a
LangChain middleware makes for itself (a summary, a tool selection) is never tagged as
the agent's own step: under ``with_agentspec`` it is an agent of its own, under
``AgentSpecMiddleware`` it goes untagged, wherever the middleware is placed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from agentspec_mw.tags import StructureTags
from agentspec_mw_langgraph import (
    AgentSpecMiddleware,
    TaggingConfig,
    get_handler,
    with_agentspec,
)

from .fake_chat import ScriptedChatModel, tool_call
from .test_concurrency import echo, react_script
from .test_fanout import build_map_reduce
from .test_react import build as build_react

THREAD = {"configurable": {"thread_id": "1"}}


def _map_input(run: str) -> dict[str, Any]:
    return {"topics": [f"{run}a", f"{run}b"], "notes": [], "summary": ""}


def _by_run(seen: list[tuple[StructureTags | None, str]]) -> dict[str, list[StructureTags]]:
    out: dict[str, list[StructureTags]] = {}
    for tags, text in seen:
        assert tags is not None
        run = next(w for w in ("R0", "R1") if w in text)
        out.setdefault(run, []).append(tags)
    return out


# ---------------------------------------------------------------- item 1: threads
def test_concurrent_runs_given_one_thread_id_are_queries_apart(strict: TaggingConfig) -> None:
    """``app.batch(inputs, config)`` gives every input the same ``thread_id``: before, both
    runs were query ``thread:1`` and their fan-outs one group ``thread:1|fanout|worker@2#0``
    of four members, with ``repeat`` edges from one run's planner to the other's."""
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build_map_reduce(model), config=strict)
    app.batch([_map_input("R0"), _map_input("R1")], THREAD)

    runs = _by_run(model.seen)
    queries = {run: {t.query_id for t in tags} for run, tags in runs.items()}
    assert all(len(q) == 1 for q in queries.values())
    (q0,), (q1,) = queries["R0"], queries["R1"]
    assert q0 != q1 and {q0, q1} & {"thread:1"}
    busy = q1 if q0 == "thread:1" else q0
    assert busy.startswith("thread:1|run:")
    for run, tags in runs.items():  # each fan-out group is its own run's
        groups = {t.group_id for t in tags if t.group_id is not None}
        assert len(groups) == 1, run
        assert next(iter(groups)).startswith(tags[0].query_id + "|fanout|")
    handler = get_handler(app)
    assert handler is not None
    for qid in (q0, q1):
        graph = handler.graph(qid)
        (fanout,) = graph.groups_of("fanout")
        assert len(fanout.members) == 2
        assert len(graph.llm_calls()) == 4
        assert not graph.groups_of("repeat") and not graph.edges
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_concurrent_runs_of_one_thread_never_learn_each_others_segments(
    strict: TaggingConfig,
) -> None:
    """Rule 4 learns what an agent's post-tool-result call produced in its query: before,
    run R1's first post-tool call was predicted ``tool_call`` from R0's (its own first
    one is ``answer``)."""
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build_react(model), config=strict)

    async def main() -> None:
        await asyncio.gather(
            *(app.ainvoke({"messages": [HumanMessage(f"R{i}")]}, THREAD) for i in range(2))
        )

    asyncio.run(main())
    runs = _by_run(model.seen)
    for run, tags in runs.items():
        assert [t.segment for t in tags] == ["tool_call", "answer", "tool_call"], run
    assert len({t.query_id for tags in runs.values() for t in tags}) == 2


def test_a_thread_continues_as_one_query_once_its_run_ended(strict: TaggingConfig) -> None:
    """Sequential runs of a thread (a conversation, a resumed run) stay one query, also
    after a concurrent run had a query of its own."""
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build_map_reduce(model), config=strict)
    app.batch([_map_input("R0"), _map_input("R1")], THREAD)
    app.invoke(_map_input("R2"), THREAD)
    app.invoke(_map_input("R3"), THREAD)
    last = [t for t, text in model.seen if "R2" in text or "R3" in text]
    assert {t.query_id for t in last if t is not None} == {"thread:1"}


def test_two_apps_running_at_once_on_one_thread_are_queries_apart(
    strict: TaggingConfig,
) -> None:
    """Two wrapped apps (two handlers) whose runs overlap on one ``thread_id`` send
    different query ids (their node names and fan-out templates are the same, so their
    group ids would be too); in another scope the thread is not shared."""
    barrier = threading.Barrier(2, timeout=10)

    def script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        if str(messages[-1].content).startswith("note on"):
            barrier.wait()  # both apps' fan-outs are in flight together
        return echo(messages, tools)

    models = [ScriptedChatModel(script=script) for _ in range(2)]
    apps = [with_agentspec(build_map_reduce(m), config=strict) for m in models]
    outs: list[Any] = []

    def run(i: int) -> None:
        outs.append(apps[i].invoke({"topics": [f"R{i}a"], "notes": [], "summary": ""}, THREAD))

    def run_both() -> None:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert len(outs) == 2

    run_both()
    groups = [{t.group_id for t, _ in m.seen if t is not None and t.group_id} for m in models]
    queries = [{t.query_id for t, _ in m.seen if t is not None} for m in models]
    assert all(len(q) == 1 for q in queries) and queries[0] != queries[1]
    assert not groups[0] & groups[1]

    # other scopes: the same thread in each, at the same time
    barrier.reset()
    scoped = [
        with_agentspec(
            build_map_reduce(m),
            config=TaggingConfig(adapter_raise_errors=True, tags_scope=f"tenant-{i}"),
        )
        for i, m in enumerate(models)
    ]
    for m in models:
        m._seen.clear()
    apps[:] = scoped
    outs.clear()
    run_both()
    for m in models:
        assert {t.query_id for t, _ in m.seen if t is not None} == {"thread:1"}


def test_two_apps_one_after_another_share_the_thread_query(strict: TaggingConfig) -> None:
    """Documented, not changed: two apps run one after another with one ``thread_id`` and
    node names send the same agent and query ids (within one scope history is shared,
    losslessly); a scope per app, or a thread id per app, keeps them apart."""
    first, second = ScriptedChatModel(script=react_script), ScriptedChatModel(script=react_script)
    with_agentspec(build_react(first), config=strict).invoke(
        {"messages": [HumanMessage("R0")]}, THREAD
    )
    with_agentspec(build_react(second), config=strict).invoke(
        {"messages": [HumanMessage("R1")]}, THREAD
    )
    keys = [{(t.scope, t.agent_id, t.query_id) for t, _ in m.seen if t} for m in (first, second)]
    assert keys[0] == keys[1] == {("default", "agent", "thread:1")}


# ------------------------------------------------------- item 2: middleware's own calls
@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


@tool
def lookup(city: str) -> str:
    """Look up the weather of a city."""
    return f"sunny in {city}"


def agent_script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    if isinstance(messages[-1], ToolMessage):
        return AIMessage(content="final")
    return tool_call("search", {"query": "x"}, f"c{len(messages)}")


def selector_script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    name = tools[0]["function"]["name"]  # the selection's response schema, as a tool
    return tool_call(name, {"tools": ["search"]}, "sel")


class MetadataSpy(BaseCallbackHandler):
    """The agentspec keys in the metadata each chat model run starts with, by model."""

    def __init__(self) -> None:
        self.by_model: dict[str, list[dict[str, Any]]] = {}

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        md = kwargs.get("metadata") or {}
        name = str((kwargs.get("invocation_params") or {}).get("model"))
        keys = {k: v for k, v in md.items() if k.startswith("agentspec_")}
        self.by_model.setdefault(name, []).append(keys)


def _history() -> list[BaseMessage]:
    return [HumanMessage("q0"), AIMessage("a0"), HumanMessage("q1"), AIMessage("a1")]


def _agent_parts() -> tuple[ScriptedChatModel, ScriptedChatModel, ScriptedChatModel, list[Any]]:
    from langchain.agents.middleware import LLMToolSelectorMiddleware, SummarizationMiddleware

    agent = ScriptedChatModel(script=agent_script, model="agent-model")
    summary = ScriptedChatModel(
        script=lambda m, t: AIMessage(content="SUMMARY"), model="summary-model"
    )
    selector = ScriptedChatModel(script=selector_script, model="selector-model")
    middleware = [
        SummarizationMiddleware(model=summary, trigger=("messages", 3), keep=("messages", 1)),
        LLMToolSelectorMiddleware(model=selector, max_tools=1),
    ]
    return agent, summary, selector, middleware


@pytest.mark.parametrize("place", ["first", "last"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_middlewares_own_calls_never_get_the_agent_steps_tags(
    place: str, mode: str, strict: TaggingConfig
) -> None:
    """Before, with ``AgentSpecMiddleware`` placed before ``LLMToolSelectorMiddleware``,
    the selector's model call ran inside the tagged call and read the agent's tags
    (``agent_id='helper'``, ``segment='tool_call'``) from the ContextVar, and its run's
    metadata carried them: the engine-backed model would send them as the agent's step."""
    from langchain.agents import create_agent

    agent_model, summary, selector, others = _agent_parts()
    tagging = AgentSpecMiddleware(strict)
    chain = [tagging, *others] if place == "first" else [*others, tagging]
    agent = create_agent(agent_model, [search, lookup], middleware=chain, name="helper")
    spy = MetadataSpy()
    inp = {"messages": [*_history(), HumanMessage("q2")]}
    config = {**THREAD, "callbacks": [spy]}
    if mode == "sync":
        agent.invoke(inp, config)  # type: ignore[arg-type]
    else:
        asyncio.run(agent.ainvoke(inp, config))  # type: ignore[arg-type]

    steps = [t for t, _ in agent_model.seen]
    assert [(t.agent_id, t.segment) for t in steps if t] == [
        ("helper", "tool_call"),
        ("helper", "answer"),
    ]
    assert len(steps) == 2
    assert summary.seen and all(t is None for t, _ in summary.seen)
    assert selector.seen and all(t is None for t, _ in selector.seen)
    assert [m["agentspec_agent"] for m in spy.by_model["agent-model"]] == ["helper"] * 2
    assert all(m == {} for m in spy.by_model["summary-model"] + spy.by_model["selector-model"])
    assert tagging.stats.tags_derived == 2
    assert tagging.stats.tags_delivered == 0  # nothing read them: fakes send no request


def test_middleware_counts_one_delivery_per_request() -> None:
    """A model call read its tags once per attempt; the request counts once."""
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage as Msg

    from agentspec_mw_langgraph.context import deliver_wire_tags

    class Reading(ScriptedChatModel):
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):  # type: ignore[no-untyped-def]
            deliver_wire_tags()
            return super()._generate(messages, stop, run_manager, **kw)

    tagging = AgentSpecMiddleware()
    agent = create_agent(Reading(script=lambda m, t: Msg(content="hi")), [], middleware=[tagging])
    agent.invoke({"messages": [HumanMessage("q")]})
    assert tagging.stats.tags_delivered == 1


def test_with_agentspec_tags_middlewares_own_calls_as_agents_of_their_own(
    strict: TaggingConfig,
) -> None:
    """Before, the selector's call in the ``model`` node was agent ``model`` (the agent's
    id; its JSON joined the agent's ``tool_call`` history) and the agent's first call was
    recorded as its ``repeat``; the summary was ``SummarizationMiddleware.before_model``."""
    from langchain.agents import create_agent

    agent_model, summary, selector, others = _agent_parts()
    graph_app = create_agent(agent_model, [search, lookup], middleware=others)
    app = with_agentspec(graph_app, config=strict)
    app.invoke({"messages": [*_history(), HumanMessage("q2")]}, THREAD)

    assert {t.agent_id for t, _ in agent_model.seen if t} == {"model"}
    assert {t.agent_id for t, _ in summary.seen if t} == {
        "SummarizationMiddleware.before_model/summarization"
    }
    assert {t.agent_id for t, _ in selector.seen if t} == {"model/tool_selection"}
    assert all(t is not None for m in (agent_model, summary, selector) for t, _ in m.seen)
    handler = get_handler(app)
    assert handler is not None
    graph = handler.graph("thread:1")
    calls = graph.llm_calls()
    agent_calls = [c.call_id for c in calls if c.agent_id == "model"]
    selections = [c.call_id for c in calls if c.agent_id == "model/tool_selection"]
    assert len(agent_calls) == len(selections) == 2
    repeats = {g.group_id: g.members for g in graph.groups_of("repeat")}
    assert repeats["thread:1|repeat|model"] == agent_calls
    assert repeats["thread:1|repeat|model/tool_selection"] == selections
