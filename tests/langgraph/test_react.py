"""A ReAct tool loop: tags per step, observation links, repeat group, ContextVar reach."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec

from .fake_chat import ScriptedChatModel, tool_call


@tool
def lookup(city: str) -> str:
    """Look up the weather of a city."""
    return f"sunny in {city}"


def react_script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    rounds = sum(isinstance(m, ToolMessage) for m in messages)
    if rounds < 2:
        return tool_call("lookup", {"city": f"c{rounds}"}, f"call{rounds}")
    return AIMessage(content="done: " + messages[0].content)  # type: ignore[operator]


def build(model: ScriptedChatModel):  # type: ignore[no-untyped-def]
    bound = model.bind_tools([lookup])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([lookup]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def test_react_loop_tags_and_graph(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=react_script, model="Qwen/Qwen2.5-7B-Instruct")
    app = with_agentspec(build(model), config=strict)
    out = app.invoke({"messages": [HumanMessage("q1")]})
    assert out["messages"][-1].content == "done: q1"

    handler = get_handler(app)
    assert handler is not None
    seen = model.seen
    assert len(seen) == 3
    tags = [t for t, _ in seen]
    assert all(t is not None for t in tags)
    qid = tags[0].query_id  # type: ignore[union-attr]
    assert qid.startswith("run:")
    assert [t.agent_id for t in tags] == ["agent"] * 3  # type: ignore[union-attr]
    assert {t.query_id for t in tags} == {qid}  # type: ignore[union-attr]
    # rule 3 (tools, human last) -> tool_call; rule 4 (after a tool result, first time) ->
    # answer; then rule 4 repeats what the previous post-tool call produced (tool_call).
    assert [t.segment for t in tags] == ["tool_call", "answer", "tool_call"]  # type: ignore[union-attr]
    blocks = (("```", "```"), ("<tool_call>", "</tool_call>"))
    assert [t.blocks for t in tags] == [blocks] * 3  # type: ignore[union-attr]
    # one drafting key for the loop's turns: same agent, same query, no group of their own
    assert [(t.group_id, t.group_kind) for t in tags] == [(None, None)] * 3  # type: ignore[union-attr]

    graph = handler.graph(qid)
    llm = graph.llm_calls()
    assert [(c.step, c.segment, c.actual_segment) for c in llm] == [
        (1, "tool_call", "tool_call"),
        (3, "answer", "tool_call"),
        (5, "tool_call", "answer"),
    ]
    tools = [c for c in graph.calls.values() if c.kind == "tool"]
    assert [(c.agent_id, c.name, c.step, c.segment, c.status) for c in tools] == [
        ("tools", "lookup", 2, "observation", "ok"),
        ("tools", "lookup", 4, "observation", "ok"),
    ]
    ids = [c.call_id for c in llm]
    assert {(e.src, e.dst, e.kind) for e in graph.edges} == {
        (ids[0], ids[1], "repeat"),
        (ids[1], ids[2], "repeat"),
        (tools[0].call_id, ids[1], "observation"),
        (tools[1].call_id, ids[2], "observation"),
    }
    assert [g.members for g in graph.groups_of("repeat")] == [ids]
    assert [len(g.members) for g in graph.groups_of("superstep")] == [1, 1, 1]
    assert graph.groups_of("fanout") == [] and graph.groups_of("retry") == []
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
    stats = handler.stats
    assert (stats.llm_calls, stats.tags_derived, stats.adapter_errors) == (3, 3, 0)


def test_threaded_query_id_and_streaming(strict: TaggingConfig) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    model = ScriptedChatModel(script=react_script)
    g = build(model)
    app = with_agentspec(g.copy(update={"checkpointer": InMemorySaver()}), config=strict)
    cfg = {"configurable": {"thread_id": "t-7"}}
    modes = list(app.stream({"messages": [HumanMessage("q")]}, cfg, stream_mode="messages"))
    assert modes  # tokens streamed
    assert {t.query_id for t, _ in model.seen} == {"thread:t-7"}  # type: ignore[union-attr]
    # no model name of a known family and no advertised blocks -> proposer defaults
    assert {t.blocks for t, _ in model.seen} == {None}  # type: ignore[union-attr]
    handler = get_handler(app)
    assert handler is not None
    assert len(handler.graph("thread:t-7").llm_calls()) == 3
