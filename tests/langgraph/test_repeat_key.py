"""A node's repeated calls (tool-loop turns, reflection rounds) draft from one key.

The proposer keys its isolated history by ``(scope, agent, group)``, the group being the
tags' ``group_id`` or else the query (:func:`agentspec_mw.agentspec.identity.identity`).
A repeat that carried a group id of its own, known only from the second call on, put the
first call and the later ones under two keys: the second turn could not draft from the
first. These tests run the bench's real workflows (the demo's tool agent, the reflection
loop) over a scripted model and check the keys the proposer would compute.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from agentspec_mw.agentspec.identity import identity
from agentspec_mw.tags import StructureTags
from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec
from agentspec_mw_langgraph.bench_apps import APPS

from .fake_chat import ScriptedChatModel, tool_call

_PROMPT = np.arange(64, dtype=np.int32)  # the prompt only matters without tags


def _key(tags: StructureTags | None) -> tuple[str, str, str]:
    assert tags is not None
    return identity(_PROMPT, tags, agent_tokens=16, query_tokens=64)


def demo_script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    if tools and not isinstance(messages[-1], ToolMessage):
        return tool_call("lookup_note", {"topic": "tea"}, "c1")
    return AIMessage(content=f"re: {str(messages[-1].content)[:40]}")


def test_demo_tool_agent_turns_share_one_key(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=demo_script)
    app = with_agentspec(APPS["demo"].build(model), config=strict)
    APPS["demo"].run(app, "tea")
    tags = [t for t, _ in model.seen]
    assert len(tags) == 8  # planner, 3 workers, the tool agent twice, critic, writer
    tool_turns = [t for t in tags if t is not None and t.agent_id == "tools_agent"]
    assert [t.segment for t in tool_turns] == ["tool_call", "answer"]
    assert _key(tool_turns[0]) == _key(tool_turns[1])  # the answer drafts from the call
    workers = [t for t in tags if t is not None and t.agent_id == "worker"]
    assert len({t.group_id for t in workers}) == 1 and workers[0].group_id is not None
    assert len({_key(t) for t in workers}) == 1  # fan-out siblings: one group key

    handler = get_handler(app)
    assert handler is not None
    graph = handler.graph(tool_turns[0].query_id or "")
    first, second = (c for c in graph.llm_calls() if c.agent_id == "tools_agent")
    assert (first.ordinal, second.ordinal) == (0, 1)
    # the graph still records the relation
    assert [g.members for g in graph.groups_of("repeat")] == [[first.call_id, second.call_id]]
    assert (first.call_id, second.call_id, "repeat") in {
        (e.src, e.dst, e.kind) for e in graph.edges
    }


def reflect_script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    system = str(messages[0].content)
    if system.startswith("You review"):
        return AIMessage(content="The draft lacks a date.")  # never OK: two revisions
    return AIMessage(content="Tea is a drink made from leaves.")


def test_reflection_rounds_share_one_key_per_agent(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=reflect_script)
    app = with_agentspec(APPS["reflect"].build(model), config=strict)
    APPS["reflect"].run(app, "tea")
    tags = [t for t, _ in model.seen]
    agents = [t.agent_id for t in tags if t is not None]
    assert agents == ["writer", "reviewer", "reviser", "reviewer", "reviser", "reviewer"]
    for agent in ("reviewer", "reviser"):
        keys = {_key(t) for t in tags if t is not None and t.agent_id == agent}
        assert len(keys) == 1, agent
    # different agents of the query keep apart
    assert len({_key(t) for t in tags}) == 3
