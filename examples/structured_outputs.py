"""Structured outputs and forced tool calls in a LangGraph app on the embedded engine.

    python examples/structured_outputs.py

A support desk: each ticket is routed by ``with_structured_output`` (a pydantic schema,
offered as a tool whose call is forced), three extractors run in parallel (``Send``) with
``method="json_schema"``, and an actor is forced to call ``open_case``. The embedded engine
enforces each schema with vLLM's structured outputs, so even the 135M default model
returns valid JSON; AgentSpec drafts from the agents' earlier outputs (the same keys, the
same tool), and greedy outputs stay identical to running without it. Two tickets run at
once; at the end the engine's per-agent draft counters are printed.
"""

from __future__ import annotations

import argparse
import operator
import sys
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from pydantic import BaseModel, Field

from agentspec_mw_langgraph import ChatAgentSpecVLLM, with_agentspec

TICKETS = (
    "I was charged twice for my subscription this month. Please refund one payment.",
    "The app crashes every time I open the settings page since the last update.",
)
ASPECTS = ("what the customer wants", "what went wrong", "which product")


class Route(BaseModel):
    """Where a support ticket goes."""

    category: Literal["billing", "bug", "account", "other"]
    urgency: int = Field(description="1 (low) to 5 (high)")


class Fact(BaseModel):
    """One fact from a ticket."""

    fact: str = Field(description="a few words")


@tool
def open_case(team: str, title: str) -> str:
    """Open a support case for a team with a short title."""
    return f"case opened for {team}: {title}"


class Desk(TypedDict, total=False):
    ticket: str
    route: Any
    facts: Annotated[list[Any], operator.add]
    case: list[dict[str, Any]]


class Aspect(TypedDict):
    ticket: str
    aspect: str


def build_app(engine: Any, max_tokens: int = 96) -> Any:
    """The desk graph over ``engine``, wrapped with ``with_agentspec``."""
    model = ChatAgentSpecVLLM(engine=engine, max_tokens=max_tokens)
    router = model.with_structured_output(Route, include_raw=True)
    extractor = model.with_structured_output(Fact, method="json_schema", include_raw=True)
    actor = model.bind_tools([open_case], tool_choice="open_case")

    def route(state: Desk) -> dict[str, Any]:
        prompt = [SystemMessage("Route the support ticket."), HumanMessage(state["ticket"])]
        return {"route": router.invoke(prompt)["parsed"]}

    def fan_out(state: Desk) -> list[Send]:
        return [Send("extract", {"ticket": state["ticket"], "aspect": a}) for a in ASPECTS]

    def extract(part: Aspect) -> dict[str, Any]:
        prompt = [
            SystemMessage(f"Answer in JSON: {part['aspect']}?"),
            HumanMessage(part["ticket"]),
        ]
        return {"facts": [extractor.invoke(prompt)["parsed"]]}

    def act(state: Desk) -> dict[str, Any]:
        prompt = [
            SystemMessage("Open a case for the right team."),
            HumanMessage(f"Ticket: {state['ticket']}\nRoute: {state['route']}"),
        ]
        return {"case": actor.invoke(prompt).tool_calls}

    graph = StateGraph(Desk)
    graph.add_node("route", route)
    graph.add_node("extract", extract)
    graph.add_node("act", act)
    graph.add_edge(START, "route")
    graph.add_conditional_edges("route", fan_out, ["extract"])
    graph.add_edge("extract", "act")
    graph.add_edge("act", END)
    return with_agentspec(graph.compile())  # <- the one line


def main(argv: list[str] | None = None) -> int:
    """Run the desk on the two tickets at once; print what each agent returned and the
    draft counters. A field the model left unfinished at ``--max-tokens`` prints ``None``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF model id or folder (default: SmolLM2-135M)")
    p.add_argument("--max-tokens", type=int, default=96)
    args = p.parse_args(argv)

    from agentspec_mw_vllm import build_llm, get_metrics, shutdown

    llm = build_llm(args.model, speculative="agentspec", k=8)
    try:
        app = build_app(llm, args.max_tokens)
        results = app.batch([{"ticket": t} for t in TICKETS])
        for result in results:
            print(f"ticket: {result['ticket']!r}")
            print(f"  route: {result['route']!r}")
            for fact in result["facts"]:
                print(f"  fact: {fact!r}")
            for call in result["case"]:
                print(f"  tool call: {call['name']}({call['args']})")
        snap = get_metrics().snapshot()
        for key, drafted in sorted(snap.drafted.items()):
            print(f"drafts {key}: {snap.accepted.get(key, 0)}/{drafted} accepted")
    finally:
        shutdown(llm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
