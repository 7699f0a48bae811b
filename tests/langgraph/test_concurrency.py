"""50 concurrent invocations of one wrapped graph: tags never cross runs."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from agentspec_mw.tags import StructureTags
from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec

from .fake_chat import ScriptedChatModel, tool_call
from .test_fanout import build_map_reduce
from .test_react import build

N = 50


def marker(text: str) -> str:
    found = re.search(r"R\d+", text)
    assert found, text
    return found.group(0)


def _check_runs(seen: list[tuple[StructureTags | None, str]], per_run: int) -> dict[str, str]:
    """Every run's calls share one query id, and no two runs share one."""
    query_of: dict[str, str] = {}
    counts: dict[str, int] = {}
    for tags, text in seen:
        assert tags is not None
        run = marker(text)
        assert query_of.setdefault(run, tags.query_id) == tags.query_id, run
        counts[run] = counts.get(run, 0) + 1
        if tags.group_id is not None:
            assert tags.group_id.startswith(tags.query_id + "|")
    assert len(query_of) == N and len(set(query_of.values())) == N
    assert set(counts.values()) == {per_run}
    return query_of


def react_script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    run = marker(str(messages[0].content))
    rounds = sum(isinstance(m, ToolMessage) for m in messages)
    if rounds < 2:
        return tool_call("lookup", {"city": f"{run}-{rounds}"}, f"{run}-c{rounds}")
    return AIMessage(content=f"done {run}")


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"re {messages[-1].content}")


def test_50_concurrent_async_react(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=react_script)
    app = with_agentspec(build(model), config=strict)

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(app.ainvoke({"messages": [HumanMessage(f"R{i}")]}) for i in range(N))
        )

    outs = asyncio.run(main())
    assert [o["messages"][-1].content for o in outs] == [f"done R{i}" for i in range(N)]
    # the ContextVar seen inside each model call belongs to that call's own run
    query_of = _check_runs(model.seen, 3)
    handler = get_handler(app)
    assert handler is not None
    for run, qid in query_of.items():
        graph = handler.graph(qid)
        calls = graph.llm_calls()
        assert [(c.step, c.segment, c.group_kind) for c in calls] == [
            (1, "tool_call", None),
            (3, "answer", None),
            (5, "tool_call", None),
        ], run
        assert [g.members for g in graph.groups_of("repeat")] == [[c.call_id for c in calls]]
        assert len([c for c in graph.calls.values() if c.kind == "tool"]) == 2
        assert len(graph.edges) == 4
    assert handler.stats.adapter_errors == 0
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


def test_50_concurrent_threads_fanout(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build_map_reduce(model), config=strict)
    inputs = [
        {"topics": [f"R{i}a", f"R{i}b", f"R{i}c"], "notes": [], "summary": ""} for i in range(N)
    ]

    outs = app.batch(inputs, {"max_concurrency": N})
    assert [o["summary"] for o in outs] == [
        f"re summarize re note on R{i}a;re note on R{i}b;re note on R{i}c" for i in range(N)
    ]
    query_of = _check_runs(model.seen, 5)
    handler = get_handler(app)
    assert handler is not None
    for qid in query_of.values():
        graph = handler.graph(qid)
        (fanout,) = graph.groups_of("fanout")
        assert fanout.group_id == f"{qid}|fanout|worker@2#0"
        assert {graph.calls[m].agent_id for m in fanout.members} == {"worker"}
        assert len(fanout.members) == 3 and len(graph.llm_calls()) == 5
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
