"""Concurrent calls of one node run are siblings, not repeats.

A node that batches its model (``generate`` with several prompts, ``asyncio.gather`` of
``ainvoke``s) makes calls that run at the same time: none follows another, so none is a
``repeat`` of another. The redundancy graph puts them in one ``parallel`` group; each
repeats the call before the batch, and the next sequential call repeats the batch's last
call to start. The tags stay as they were (the drafting keys do not change).
"""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec
from agentspec_mw_langgraph.redundancy import RedundancyGraph

from .fake_chat import ScriptedChatModel


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content="echo " + str(messages[-1].content))


class _Slow(ScriptedChatModel):
    """Yields to the event loop before answering: gathered calls all start, then end."""

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        answer = self._answer(messages, kwargs)
        await asyncio.sleep(0.1)  # far longer than starting the gathered calls takes
        return ChatResult(generations=[ChatGeneration(message=answer)])


class _Loop(TypedDict):
    rounds: int


def _loop_graph(node: Any, rounds: int = 2) -> Any:
    """One node ``agent`` run ``rounds`` times (one superstep each)."""
    g = StateGraph(_Loop)
    g.add_node("agent", node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["rounds"] < rounds else END)
    return g.compile()


def _only_graph(app: Any) -> RedundancyGraph:
    """The redundancy graph of the one query ``app`` ran."""
    handler = get_handler(app)
    assert handler is not None
    (graph,) = handler.graphs().values()
    return graph


def _by_prompt(graph: RedundancyGraph, model: ScriptedChatModel) -> dict[str, str]:
    """Call id by the last prompt text (calls are in start order in both lists)."""
    calls = graph.llm_calls()
    prompts = [text for _, text in model.seen]
    assert len(calls) == len(prompts)
    return {text: c.call_id for text, c in zip(prompts, calls, strict=True)}


def _edges(graph: RedundancyGraph) -> set[tuple[str, str, str]]:
    return {(e.src, e.dst, e.kind) for e in graph.edges}


def test_generate_batch_is_parallel_not_a_chain_of_repeats(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)

    def agent(state: _Loop, config: RunnableConfig) -> _Loop:
        if state["rounds"] == 0:
            model.invoke("plan", config)
            prompts = [[HumanMessage(p)] for p in ("a", "b", "c")]
            model.generate(prompts, callbacks=config["callbacks"])  # all start, then run
        else:
            model.invoke("next", config)
        return {"rounds": state["rounds"] + 1}

    app = with_agentspec(_loop_graph(agent), config=strict)
    app.invoke({"rounds": 0})
    graph = _only_graph(app)
    ids = _by_prompt(graph, model)
    plan, a, b, c, nxt = (ids[p] for p in ("plan", "a", "b", "c", "next"))
    # each call of the batch repeats the call before it; none repeats a sibling; the next
    # sequential call repeats the batch's last call to start
    assert _edges(graph) == {
        (plan, a, "repeat"),
        (plan, b, "repeat"),
        (plan, c, "repeat"),
        (c, nxt, "repeat"),
    }
    assert [g.members for g in graph.groups_of("parallel")] == [[a, b, c]]
    assert [g.members for g in graph.groups_of("repeat")] == [[plan, a, b, c, nxt]]
    supersteps = {g.group_id.rsplit("|", 1)[1]: g.members for g in graph.groups_of("superstep")}
    assert supersteps == {"1": [plan, a, b, c], "2": [nxt]}  # unchanged
    assert {g["kind"] for g in graph.to_dict()["groups"]} == {"parallel", "repeat", "superstep"}
    # the tags are what they were: one agent, one query, no group (one drafting key)
    tags = [t for t, _ in model.seen if t is not None]  # a batch's calls read no ContextVar
    assert [(t.agent_id, t.group_id, t.group_kind) for t in tags] == [("agent", None, None)] * 2
    assert {(c.group_id, c.group_kind) for c in graph.llm_calls()} == {(None, None)}
    handler = get_handler(app)
    assert handler is not None and handler.stats.adapter_errors == 0


def test_gathered_calls_are_parallel(strict: TaggingConfig) -> None:
    model = _Slow(script=echo)

    async def agent(state: _Loop) -> _Loop:
        await model.ainvoke("before")
        await asyncio.gather(model.ainvoke("x"), model.ainvoke("y"))
        await model.ainvoke("after")
        return {"rounds": state["rounds"] + 1}

    app = with_agentspec(_loop_graph(agent, rounds=1), config=strict)
    asyncio.run(app.ainvoke({"rounds": 0}))
    graph = _only_graph(app)
    ids = _by_prompt(graph, model)
    before, x, y, after = (ids[p] for p in ("before", "x", "y", "after"))
    assert _edges(graph) == {
        (before, x, "repeat"),
        (before, y, "repeat"),
        (y, after, "repeat"),
    }
    assert [g.members for g in graph.groups_of("parallel")] == [[x, y]]
    tags = [t for t, _ in model.seen]
    assert all(t is not None and (t.group_id, t.group_kind) == (None, None) for t in tags)
    assert len({(t.agent_id, t.query_id) for t in tags if t is not None}) == 1


def test_two_batches_are_two_parallel_groups(strict: TaggingConfig) -> None:
    """A batch that starts after the previous one ended is a new group, repeating the
    previous batch's last call to start."""
    model = _Slow(script=echo)

    async def agent(state: _Loop) -> _Loop:
        await asyncio.gather(model.ainvoke("a1"), model.ainvoke("a2"))
        await asyncio.gather(model.ainvoke("b1"), model.ainvoke("b2"))
        return {"rounds": state["rounds"] + 1}

    app = with_agentspec(_loop_graph(agent, rounds=1), config=strict)
    asyncio.run(app.ainvoke({"rounds": 0}))
    graph = _only_graph(app)
    ids = _by_prompt(graph, model)
    a1, a2, b1, b2 = (ids[p] for p in ("a1", "a2", "b1", "b2"))
    assert _edges(graph) == {(a2, b1, "repeat"), (a2, b2, "repeat")}
    assert sorted(g.members for g in graph.groups_of("parallel")) == [[a1, a2], [b1, b2]]


def test_sequential_calls_stay_a_chain_of_repeats(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)

    def agent(state: _Loop, config: RunnableConfig) -> _Loop:
        model.invoke("one", config)
        model.invoke("two", config)
        return {"rounds": state["rounds"] + 1}

    app = with_agentspec(_loop_graph(agent), config=strict)
    app.invoke({"rounds": 0})
    graph = _only_graph(app)
    calls = [c.call_id for c in graph.llm_calls()]
    assert len(calls) == 4
    assert [(e.src, e.dst, e.kind) for e in graph.edges] == [
        (src, dst, "repeat") for src, dst in zip(calls, calls[1:], strict=False)
    ]
    assert graph.groups_of("parallel") == []
