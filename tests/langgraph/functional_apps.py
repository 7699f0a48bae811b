"""Functional-API apps and helpers shared by the tests of a ``@task``'s rounds (reviews 76
and 76b): a scripted ReAct model, a tool task, a ReAct entrypoint, the wrapped app's
handler, a script counting overlapping calls, a trace's calls as the replay reads them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph

from agentspec_mw.tags import StructureTags
from agentspec_mw.traces.loader import iter_records
from agentspec_mw.traces.tokenized import CallMeta, call_meta
from agentspec_mw_langgraph import get_handler
from agentspec_mw_langgraph.handler import AgentSpecCallbackHandler

Script = Callable[[list[BaseMessage], list[dict[str, Any]]], AIMessage]


def react_script(tool_turns: int, delay: float = 0.0) -> Script:
    """Calls a tool until ``tool_turns`` results are in, then answers; the tool call's
    ``who`` is the first message's text (so a run's calls can be told apart)."""

    def script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        if delay:
            time.sleep(delay)
        n = sum(isinstance(m, ToolMessage) for m in messages)
        if n < tool_turns:
            args = {"who": str(messages[0].content)}
            call = {"name": "lookup", "args": args, "id": f"c{len(messages)}"}
            return AIMessage(content="", tool_calls=[call])
        return AIMessage(content=f"final {messages[0].content}")

    return script


@task
def call_tool(call: Any) -> ToolMessage:
    return ToolMessage(content=f"res {call['args']['who']}", tool_call_id=call["id"])


def model_task(model: Any) -> Any:
    """A ``@task`` named ``call_model`` that invokes ``model`` on its messages."""

    @task
    def call_model(messages: list[BaseMessage]) -> AIMessage:
        return model.invoke(messages)  # type: ignore[no-any-return]

    return call_model


def react_agent(call_model: Any, checkpointer: Any = None) -> Any:
    """A functional ReAct agent: ``call_model`` tasks one after another, each prompt
    carrying every reply before it."""

    @entrypoint(checkpointer=checkpointer)
    def agent(question: str) -> AIMessage:
        messages: list[BaseMessage] = [HumanMessage(question)]
        reply = call_model(messages).result()
        while reply.tool_calls:
            results = [call_tool(c).result() for c in reply.tool_calls]
            messages = [*messages, reply, *results]
            reply = call_model(messages).result()
        return reply  # type: ignore[no-any-return]

    return agent


def handler_of(app: Any) -> AgentSpecCallbackHandler:
    """The wrapped app's handler."""
    handler = get_handler(app)
    assert handler is not None
    return handler


class Overlap:
    """A script that sleeps ``delay`` seconds a call, counting how many calls ran at once
    (``most``)."""

    def __init__(self, delay: float) -> None:
        self.delay, self.now, self.most = delay, 0, 0
        self.lock = threading.Lock()

    def __call__(self, messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.delay)
        with self.lock:
            self.now -= 1
        return AIMessage(content=f"{messages[-1].content}!")


def trace_metas(path: Path) -> list[CallMeta]:
    """A trace's calls in file order, as the replay reads them."""
    return [call_meta(r) for r in iter_records(path)]


def two_runs_at_once(
    app: Any,
    seen: Callable[[], list[tuple[StructureTags | None, str]]],
    config: Callable[[str], Any],
) -> dict[str, list[StructureTags]]:
    """Invoke a wrapped ReAct app (:func:`react_agent` with :func:`react_script`) on
    questions ``Q0`` and ``Q1`` from two threads at once (``config(question)``: each
    invocation's config) and return each run's tags, told apart by the tool results its
    prompts end with (``seen``: the model's ``(tags, last message)`` pairs)."""
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(question: str) -> None:
        try:
            barrier.wait()
            assert app.invoke(question, config(question)).content == f"final {question}"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(q,)) for q in ("Q0", "Q1")]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    by_run: dict[str, list[StructureTags]] = {"Q0": [], "Q1": []}
    for tags, text in seen():
        assert tags is not None
        by_run[text.removeprefix("res ")].append(tags)
    return by_run


def react_subgraph(llm: Callable[[list[BaseMessage]], BaseMessage]) -> Any:
    """A Graph-API ReAct loop, compiled: node ``llm`` (``llm(messages)``'s reply), then
    node ``tools`` (a result for each tool call) while the reply calls tools."""

    def call(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm(list(state["messages"]))]}

    def tools(state: MessagesState) -> dict[str, Any]:
        last: Any = state["messages"][-1]
        return {"messages": [ToolMessage("res", tool_call_id=c["id"]) for c in last.tool_calls]}

    def route(state: MessagesState) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    g = StateGraph(MessagesState)
    g.add_node("llm", call)
    g.add_node("tools", tools)
    g.add_edge(START, "llm")
    g.add_conditional_edges("llm", route)
    g.add_edge("tools", "llm")
    return g.compile()
