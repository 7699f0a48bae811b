"""A model calling a model in async code (review 71): the async twin of review 70's case.

LangChain sends an async call's end event from a task of its own (``@shielded``), whose
context is a copy, so the end event cannot give the calling model its tags back in the
caller's context as it does in sync code. The ended inner call's ticket must not hide the
outer call's tags: the outer model's own request, made after the inner call, carries them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, MessagesState, StateGraph

from agentspec_mw.tags import StructureTags, tags_to_wire
from agentspec_mw_langgraph import (
    TaggingConfig,
    current_tags,
    get_handler,
    with_agentspec,
)
from agentspec_mw_langgraph.context import (
    CallTicket,
    current_ticket,
    deliver_wire_tags,
    set_current_tags,
)

from .fake_chat import ScriptedChatModel

STRICT = TaggingConfig(adapter_raise_errors=True)


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"re: {messages[-1].content}")


def _one_node(name: str, fn: Any) -> Any:
    g = StateGraph(MessagesState)
    g.add_node(name, fn)
    g.add_edge(START, name)
    g.add_edge(name, END)
    return g.compile()


class _AsyncCondensing(BaseChatModel):
    """Calls ``inner`` (awaited) during its own generation, recording the tags (and the
    ticket) current around that call: what its own request would carry before and after."""

    inner: Any = None
    seen: list[Any] = []

    @property
    def _llm_type(self) -> str:
        return "async-condensing"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError

    async def _condense(self) -> tuple[Any, ...]:
        before, ticket = current_tags(), current_ticket()
        await self.inner.ainvoke("condense")
        await asyncio.sleep(0)  # the inner call's end-event task has run
        return before, ticket, current_tags(), current_ticket()

    async def _agenerate(self, messages: Any, *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(await self._condense())
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="ok"))])

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        self.seen.append(await self._condense())
        yield ChatGenerationChunk(message=AIMessageChunk(content="o"))
        yield ChatGenerationChunk(message=AIMessageChunk(content="k"))


async def _call_outer(outer: _AsyncCondensing, how: str, messages: Any) -> str:
    if how == "ainvoke":
        return str((await outer.ainvoke(messages)).content)
    if how == "astream":
        return "".join([str(c.content) async for c in outer.astream(messages)])
    # a runnable wrapping the model (a chain), itself calling a model inside the outer one
    chain = RunnableLambda(lambda m: m) | outer
    return str((await chain.ainvoke(messages)).content)


def _check(
    outer: _AsyncCondensing,
    inner: ScriptedChatModel,
    after: list[Any],
    agent: str = "agent",
) -> tuple[StructureTags, StructureTags]:
    ((before, ticket, own, own_ticket),) = outer.seen
    assert before is not None and before.agent_id == agent
    assert ticket is not None
    # what the outer model's own request carries after the inner call: its own tags
    assert own is before
    assert own_ticket is ticket
    ((inner_tags, _),) = inner.seen
    assert inner_tags is not None and inner_tags is not before  # the inner call's own
    assert inner_tags.agent_id == agent and inner_tags.query_id == before.query_id
    assert after == [(None, None)]  # the node's context is clear once the outer call ended
    return before, inner_tags


@pytest.mark.parametrize("how", ["ainvoke", "astream", "chain"])
@pytest.mark.parametrize("run", ["ainvoke", "astream"])
def test_an_async_model_calling_a_model_keeps_its_own_tags(how: str, run: str) -> None:
    inner = ScriptedChatModel(script=echo)
    outer = _AsyncCondensing(inner=inner, seen=[])
    after: list[Any] = []

    async def agent(state: MessagesState) -> dict[str, Any]:
        reply = await _call_outer(outer, how, state["messages"])
        await asyncio.sleep(0)  # the outer call's end-event task has run
        after.append((current_tags(), current_ticket()))
        return {"messages": [AIMessage(content=reply)]}

    app = with_agentspec(_one_node("agent", agent), config=STRICT)

    async def main() -> None:
        if run == "ainvoke":
            await app.ainvoke({"messages": [("user", "q")]})
        else:
            async for _ in app.astream({"messages": [("user", "q")]}):
                pass

    asyncio.run(main())
    _check(outer, inner, after)
    handler = get_handler(app)
    assert handler is not None
    (graph,) = handler.graphs().values()
    assert [(c.node, c.status) for c in graph.llm_calls()] == [("agent", "ok"), ("agent", "ok")]
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_concurrent_async_runs_never_get_each_others_tags() -> None:
    n = 20
    inner = ScriptedChatModel(script=echo)
    outers = [_AsyncCondensing(inner=inner, seen=[]) for _ in range(n)]
    afters: list[list[Any]] = [[] for _ in range(n)]

    def agent_for(i: int) -> Any:
        async def agent(state: MessagesState) -> dict[str, Any]:
            await asyncio.sleep(0.001 * (n - i))  # interleave the runs
            reply = await outers[i].ainvoke(state["messages"])
            await asyncio.sleep(0)
            afters[i].append((current_tags(), current_ticket()))
            return {"messages": [reply]}

        return agent

    apps = [with_agentspec(_one_node("agent", agent_for(i)), config=STRICT) for i in range(n)]

    async def main() -> None:
        await asyncio.gather(
            *(app.ainvoke({"messages": [("user", f"R{i}")]}) for i, app in enumerate(apps))
        )

    asyncio.run(main())
    queries = set()
    for outer, after in zip(outers, afters, strict=True):
        ((before, ticket, own, own_ticket),) = outer.seen
        assert before is not None and own is before and own_ticket is ticket
        assert after == [(None, None)]
        queries.add(before.query_id)
    assert len(queries) == n
    inner_queries = {tags.query_id for tags, _ in inner.seen if tags is not None}
    assert inner_queries == queries and len(inner.seen) == n


def test_one_handler_concurrent_async_runs_never_get_each_others_tags() -> None:
    n = 20
    inner = ScriptedChatModel(script=echo)
    outer = _AsyncCondensing(inner=inner, seen=[])
    after: dict[str, Any] = {}

    async def agent(state: MessagesState) -> dict[str, Any]:
        marker = str(state["messages"][0].content)
        reply = await outer.ainvoke(state["messages"])
        await asyncio.sleep(0)
        after[marker] = (current_tags(), current_ticket())
        return {"messages": [reply]}

    app = with_agentspec(_one_node("agent", agent), config=STRICT)

    async def main() -> None:
        await asyncio.gather(*(app.ainvoke({"messages": [("user", f"R{i}")]}) for i in range(n)))

    asyncio.run(main())
    assert len(outer.seen) == n
    assert all(
        own is before and own_ticket is ticket for before, ticket, own, own_ticket in outer.seen
    )
    assert len({before.query_id for before, *_ in outer.seen}) == n
    assert set(after.values()) == {(None, None)}
    handler = get_handler(app)
    assert handler is not None
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_an_ended_ticket_reads_as_what_it_replaced_down_the_nesting() -> None:
    node = StructureTags(agent_id="n", query_id="q")
    outer_tags = StructureTags(agent_id="outer", query_id="q")
    inner_tags = StructureTags(agent_id="inner", query_id="q")
    delivered: list[str] = []
    outer = CallTicket(None, lambda: delivered.append("outer"), previous=(node, None))
    inner = CallTicket(None, lambda: delivered.append("inner"), previous=(outer_tags, outer))

    async def main() -> list[Any]:
        set_current_tags(inner_tags, inner)
        seen: list[Any] = [(current_tags(), current_ticket())]
        inner.end()  # as an end event in another context does: nothing restored here
        seen.append((current_tags(), current_ticket()))
        seen.append(deliver_wire_tags())  # a request layer attaching the outer call's
        outer.end()
        seen.append((current_tags(), current_ticket()))
        return seen

    seen = asyncio.run(main())
    wire = tags_to_wire(outer_tags)
    assert seen == [(inner_tags, inner), (outer_tags, outer), wire, (node, None)]
    assert delivered == ["outer"] and (outer.delivered, inner.delivered) == (1, 0)


def test_the_outer_models_own_request_after_the_inner_call_is_delivered() -> None:
    inner = ScriptedChatModel(script=echo)
    sent: list[Any] = []

    class _Sends(_AsyncCondensing):
        async def _agenerate(self, messages: Any, *args: Any, **kwargs: Any) -> ChatResult:
            own = current_tags()
            await self.inner.ainvoke("condense")
            await asyncio.sleep(0)  # the inner call's end-event task has run
            # what a request layer attaches to the outer model's own request
            sent.append((own, deliver_wire_tags()))
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="ok"))])

    outer = _Sends(inner=inner, seen=[])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await outer.ainvoke(state["messages"])]}

    app = with_agentspec(_one_node("agent", agent), config=STRICT)
    asyncio.run(app.ainvoke({"messages": [("user", "q")]}))
    handler = get_handler(app)
    assert handler is not None
    ((own, wire),) = sent
    assert own is not None and own.agent_id == "agent" and wire == tags_to_wire(own)
    (graph,) = handler.graphs().values()
    outer_call, inner_call = graph.llm_calls()
    assert (outer_call.agent_id, inner_call.agent_id) == ("agent", "agent")
    assert (outer_call.ordinal, inner_call.ordinal) == (0, 1)
    assert handler.stats.tags_delivered == 1  # the outer call's; the inner one sent nothing
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
