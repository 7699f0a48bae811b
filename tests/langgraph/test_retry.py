"""Retries: a node re-run by a RetryPolicy, and a model call re-tried by ``with_retry``."""

from __future__ import annotations

import itertools
from typing import Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec

from .fake_chat import ScriptedChatModel


class State(TypedDict):
    text: str


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"draft for {messages[-1].content}")


def test_node_retry_policy(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)
    attempts = itertools.count()

    def writer(state: State) -> dict[str, Any]:
        out = str(model.invoke(state["text"]).content)
        if next(attempts) == 0:
            raise ValueError("validation failed")
        return {"text": out}

    def critic(state: State) -> dict[str, Any]:
        return {"text": str(model.invoke("check " + state["text"]).content)}

    g = StateGraph(State)
    g.add_node(
        "writer",
        writer,
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.001, retry_on=ValueError),
    )
    g.add_node("critic", critic)
    g.add_edge(START, "writer")
    g.add_edge("writer", "critic")
    g.add_edge("critic", END)
    app = with_agentspec(g.compile(), config=strict)
    assert app.invoke({"text": "essay"}) == {"text": "draft for check draft for essay"}

    tags = [t for t, _ in model.seen]
    assert all(t is not None for t in tags)
    qid = tags[0].query_id  # type: ignore[union-attr]
    handler = get_handler(app)
    assert handler is not None
    graph = handler.graph(qid)
    first, second, check = graph.llm_calls()
    retry_gid = f"{qid}|retry|{first.namespace}#0"
    assert first.namespace == second.namespace and first.namespace.startswith("writer:")
    # the retry shares the failed attempt's drafting key (same agent, same query)
    assert [(t.agent_id, t.group_id, t.group_kind) for t in tags] == [  # type: ignore[union-attr]
        ("writer", None, None),
        ("writer", None, None),
        ("critic", None, None),
    ]
    assert [(g.group_id, g.members) for g in graph.groups_of("retry")] == [
        (retry_gid, [first.call_id, second.call_id])
    ]
    assert graph.edges[0].kind == "retry"
    assert [(e.src, e.dst, e.kind) for e in graph.edges] == [
        (first.call_id, second.call_id, "retry")
    ]
    # the failed attempt's LLM call itself succeeded; its node run failed
    assert (first.status, second.status, check.status) == ("ok", "ok", "ok")


def test_model_with_retry(strict: TaggingConfig) -> None:
    calls = itertools.count()

    def flaky(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        if next(calls) == 0:
            raise ConnectionError("server busy")
        return AIMessage(content="ok")

    model = ScriptedChatModel(script=flaky)
    retrying = model.with_retry(stop_after_attempt=2, wait_exponential_jitter=False)

    def node(state: State) -> dict[str, Any]:
        first = str(retrying.invoke("a").content)
        return {"text": first + str(retrying.invoke("b").content)}

    g = StateGraph(State)
    g.add_node("solo", node)
    g.add_edge(START, "solo")
    g.add_edge("solo", END)
    app = with_agentspec(g.compile(), config=strict)
    assert app.invoke({"text": ""}) == {"text": "okok"}
    tags = [t for t, _ in model.seen]
    qid = tags[0].query_id  # type: ignore[union-attr]
    handler = get_handler(app)
    assert handler is not None
    graph = handler.graph(qid)
    failed, retried, second = graph.llm_calls()
    assert [c.status for c in (failed, retried, second)] == ["error", "ok", "ok"]
    # the failed attempt does not take an ordinal: the retry reuses it, the next call is #1
    assert [c.ordinal for c in (failed, retried, second)] == [0, 0, 1]
    gid = f"{qid}|retry|{failed.namespace}#0"
    assert [(t.group_id, t.group_kind) for t in tags] == [(None, None)] * 3  # type: ignore[union-attr]
    assert [(g.group_id, g.members) for g in graph.groups_of("retry")] == [
        (gid, [failed.call_id, retried.call_id])
    ]
    assert [(g.group_id, g.members) for g in graph.groups_of("repeat")] == [
        (f"{qid}|repeat|solo", [retried.call_id, second.call_id])
    ]
