"""Send map-reduce fan-out and a supervisor with subgraphs: groups asserted exactly."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec

from .fake_chat import ScriptedChatModel
from .graphs import fan_out_graph


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"re: {messages[-1].content}")


class MapState(TypedDict):
    topics: list[str]
    notes: Annotated[list[str], operator.add]
    summary: str


def build_map_reduce(model: ScriptedChatModel):  # type: ignore[no-untyped-def]
    def planner(state: MapState) -> dict[str, Any]:
        model.invoke("plan " + ",".join(state["topics"]))
        return {}

    def fan_out(state: MapState) -> list[Send]:
        return [
            Send("worker", {"topics": [t], "notes": [], "summary": ""}) for t in state["topics"]
        ]

    def worker(state: MapState) -> dict[str, Any]:
        return {"notes": [str(model.invoke(f"note on {state['topics'][0]}").content)]}

    def reducer(state: MapState) -> dict[str, Any]:
        return {
            "summary": str(model.invoke("summarize " + ";".join(sorted(state["notes"]))).content)
        }

    return fan_out_graph(MapState, planner, fan_out, worker, reducer)


def test_send_fanout(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build_map_reduce(model), config=strict)
    out = app.invoke({"topics": ["a", "b", "c"], "notes": [], "summary": ""})
    assert out["summary"] == "re: summarize re: note on a;re: note on b;re: note on c"
    by_prompt = {text: tags for tags, text in model.seen}
    assert all(t is not None for t in by_prompt.values())
    qid = by_prompt["plan a,b,c"].query_id  # type: ignore[union-attr]
    plan = by_prompt["plan a,b,c"]
    assert (plan.agent_id, plan.segment, plan.group_id) == ("planner", "plan", None)  # type: ignore[union-attr]
    workers = [by_prompt[f"note on {t}"] for t in "abc"]
    fanout = f"{qid}|fanout|worker@2#0"
    assert {(w.agent_id, w.segment, w.group_id, w.group_kind) for w in workers} == {  # type: ignore[union-attr]
        ("worker", "answer", fanout, "fanout")
    }
    red = by_prompt["summarize re: note on a;re: note on b;re: note on c"]
    assert (red.agent_id, red.group_id) == ("reducer", None)  # type: ignore[union-attr]

    handler = get_handler(app)
    assert handler is not None
    graph = handler.graph(qid)
    calls = {c.call_id: c for c in graph.llm_calls()}
    worker_ids = {cid for cid, c in calls.items() if c.node == "worker"}
    assert {c.send_index for c in calls.values() if c.node == "worker"} == {0, 1, 2}
    assert [(g.group_id, set(g.members)) for g in graph.groups_of("fanout")] == [
        (fanout, worker_ids)
    ]
    supersteps = {g.group_id: set(g.members) for g in graph.groups_of("superstep")}
    assert supersteps[f"{qid}|superstep|2"] == worker_ids
    assert len(supersteps) == 3
    # siblings are not repeats of each other: different Send positions
    assert graph.groups_of("repeat") == [] and graph.edges == []


class SupState(TypedDict):
    task: str
    log: Annotated[list[str], operator.add]
    round: int


class TeamOut(TypedDict):
    log: Annotated[list[str], operator.add]


def build_supervisor(model: ScriptedChatModel, named: bool = False):  # type: ignore[no-untyped-def]
    def make_team(name: str):  # type: ignore[no-untyped-def]
        def lead(state: SupState) -> dict[str, Any]:
            return {"log": [str(model.invoke(f"{name} lead r{state['round']}").content)]}

        def member(state: SupState) -> dict[str, Any]:
            return {"log": [str(model.invoke(f"{name} member r{state['round']}").content)]}

        sg = StateGraph(SupState, output_schema=TeamOut)
        sg.add_node("lead", lead)
        sg.add_node("member", member)
        sg.add_edge(START, "lead")
        sg.add_edge("lead", "member")
        sg.add_edge("member", END)
        return sg.compile(name=name) if named else sg.compile()

    def supervisor(state: SupState) -> dict[str, Any]:
        model.invoke(f"supervise r{state['round']}")
        return {"round": state["round"] + 1}

    def route(state: SupState) -> list[str] | str:
        return ["research", "writing"] if state["round"] <= 3 else END

    g = StateGraph(SupState)
    g.add_node("supervisor", supervisor)
    g.add_node("research", make_team("research"))
    g.add_node("writing", make_team("writing"))
    g.add_edge(START, "supervisor")
    g.add_conditional_edges("supervisor", route, ["research", "writing", END])
    g.add_edge("research", "supervisor")
    g.add_edge("writing", "supervisor")
    return g.compile()


@pytest.mark.parametrize("named", [False, True], ids=["plain", "subgraph-named-as-node"])
def test_supervisor_with_subgraphs(strict: TaggingConfig, named: bool) -> None:
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build_supervisor(model, named), config=strict)
    app.invoke({"task": "t", "log": [], "round": 1})
    tags = {text: t for t, text in model.seen}
    assert len(tags) == 11  # 3 supervisor rounds + 2 rounds x 2 teams x 2 nodes
    qid = tags["supervise r1"].query_id  # type: ignore[union-attr]
    expect = {
        "supervise r1": ("supervisor", None, None),
        "research lead r2": ("research/lead", None, None),
        "research member r2": ("research/member", None, None),
        "writing lead r2": ("writing/lead", None, None),
        "supervise r2": ("supervisor", None, None),  # repeats: the graph's, not the tags'
        "research lead r3": ("research/lead", None, None),
        "writing member r3": ("writing/member", None, None),
        "supervise r3": ("supervisor", None, None),
    }
    for text, (agent, group, kind) in expect.items():
        t = tags[text]
        assert (t.agent_id, t.group_id, t.group_kind) == (agent, group, kind), text  # type: ignore[union-attr]

    handler = get_handler(app)
    assert handler is not None
    graph = handler.graph(qid)
    calls = graph.llm_calls()
    # step templates walk the parent runs: (outer node, outer step), (inner node, inner step)
    lead2 = next(c for c in calls if c.agent_id == "research/lead" and c.template[0][1] == 2)
    assert lead2.template == (("research", 2), ("lead", 1))
    assert lead2.namespace.startswith("research:") and "|lead:" in lead2.namespace
    ids = {c.call_id: c.agent_id for c in calls}
    # superstep groups: same step at every level -> the two teams' calls run together
    assert {
        g.group_id.removeprefix(qid): sorted(ids[m] for m in g.members)
        for g in graph.groups_of("superstep")
    } == {
        "|superstep|1": ["supervisor"],
        "|superstep|3": ["supervisor"],
        "|superstep|5": ["supervisor"],
        "|superstep|2/1": ["research/lead", "writing/lead"],
        "|superstep|2/2": ["research/member", "writing/member"],
        "|superstep|4/1": ["research/lead", "writing/lead"],
        "|superstep|4/2": ["research/member", "writing/member"],
    }
    assert {g.group_id.removeprefix(qid) for g in graph.groups_of("repeat", min_size=2)} == {
        "|repeat|supervisor",
        "|repeat|research/lead",
        "|repeat|research/member",
        "|repeat|writing/lead",
        "|repeat|writing/member",
    }
