"""The demo's multi-agent workflow: planner, ``Send`` fan-out of workers, a tool-calling
agent with real local tools, a critic and a final answer.

The graph is ordinary LangGraph code over any chat model; ``agentspec demo`` runs it on
the embedded engine and the examples reuse it. Every node makes bounded calls (the
tool agent at most :data:`MAX_TOOL_ROUNDS` model turns), so a run's length depends only
on ``max_tokens`` and the number of queries.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import ToolCall
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

__all__ = [
    "ASPECTS",
    "MAX_TOOL_ROUNDS",
    "NOTES",
    "DemoState",
    "build_workflow",
    "calculator",
    "demo_tools",
    "initial_state",
    "lookup_note",
    "word_count",
]

#: The aspects the planner's fan-out sends one worker each.
ASPECTS: tuple[str, ...] = ("history", "how it works", "everyday uses")
#: Model turns of the tool agent (a tool round, then the answer).
MAX_TOOL_ROUNDS = 2

#: The local knowledge base ``lookup_note`` reads.
NOTES: dict[str, str] = {
    "tea": "Tea is brewed from Camellia sinensis leaves; about 6.5 million tonnes a year.",
    "coffee": "Coffee is brewed from roasted seeds of Coffea; about 10 million tonnes a year.",
    "bread": "Bread is baked dough of flour and water; wheat is the most common flour.",
    "cheese": "Cheese is made by coagulating milk protein; there are over 1,800 kinds.",
}

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return float(_BINOPS[type(node.op)](left, right))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / % ** and parentheses)."""
    try:
        value = _eval(ast.parse(expression, mode="eval"))
    except (SyntaxError, ValueError, ArithmeticError) as exc:  # 1/0, 999999 ** 60
        return f"error: {exc}"
    return f"{value:g}"


@tool
def word_count(text: str) -> str:
    """Count the words of a text."""
    return str(len(text.split()))


@tool
def lookup_note(topic: str) -> str:
    """Look a topic up in the local notes."""
    return NOTES.get(topic.strip().lower(), f"no note about {topic!r}")


def demo_tools() -> list[BaseTool]:
    """The tool agent's tools (pure local functions)."""
    return [calculator, word_count, lookup_note]


class DemoState(TypedDict):
    """The workflow's state."""

    topic: str
    plan: str
    notes: Annotated[list[str], operator.add]
    facts: str
    critique: str
    answer: str


class _WorkerState(TypedDict):
    topic: str
    aspect: str


def initial_state(topic: str) -> DemoState:
    """The input of one query about ``topic``."""
    return {"topic": topic, "plan": "", "notes": [], "facts": "", "critique": "", "answer": ""}


def _run_tool(tools: dict[str, BaseTool], call: ToolCall) -> str:
    """The tool's result, or the error as text (bad arguments go back to the model)."""
    fn = tools.get(call["name"])
    if fn is None:
        return f"error: unknown tool {call['name']!r}"
    try:
        return str(fn.invoke(call["args"]))
    except (ValueError, TypeError, ArithmeticError) as exc:  # ValidationError: a ValueError
        return f"error: {type(exc).__name__}: {exc}"


def _text(message: BaseMessage) -> str:
    return str(message.content).strip()


def build_workflow(model: BaseChatModel) -> Any:
    """The compiled workflow over ``model`` (nodes: planner, worker, tools_agent, critic,
    writer; the planner fans out one ``worker`` per :data:`ASPECTS` entry with ``Send``)."""
    tools = demo_tools()
    by_name = {t.name: t for t in tools}
    tool_model = model.bind_tools(tools)

    def planner(state: DemoState) -> dict[str, Any]:
        msg = model.invoke(
            [
                SystemMessage("You are a planner. Answer with a short numbered plan."),
                HumanMessage(f"Plan a short report about {state['topic']} in three steps."),
            ]
        )
        return {"plan": _text(msg)}

    def fan_out(state: DemoState) -> list[Send]:
        return [Send("worker", {"topic": state["topic"], "aspect": a}) for a in ASPECTS]

    def worker(state: _WorkerState) -> dict[str, Any]:
        msg = model.invoke(
            [
                SystemMessage("You are a concise researcher."),
                HumanMessage(
                    f"Write two sentences about the {state['aspect']} of {state['topic']}."
                ),
            ]
        )
        return {"notes": [f"{state['aspect']}: {_text(msg)}"]}

    def tools_agent(state: DemoState) -> dict[str, Any]:
        messages: list[BaseMessage] = [
            SystemMessage("You are a research assistant. Use the tools when they help."),
            # one worked example: small models follow a demonstrated tool call
            HumanMessage("Look up bread in the notes, then state the facts."),
            AIMessage(
                "",
                tool_calls=[{"name": "lookup_note", "args": {"topic": "bread"}, "id": "ex1"}],
            ),
            ToolMessage(NOTES["bread"], tool_call_id="ex1"),
            AIMessage(f"Fact: {NOTES['bread']}"),
            HumanMessage(f"Look up {state['topic']} in the notes, then state the facts."),
        ]
        first_new = len(messages)
        reply: AIMessage | None = None
        for _ in range(MAX_TOOL_ROUNDS):
            reply = tool_model.invoke(messages)  # type: ignore[assignment]
            assert reply is not None
            messages.append(reply)
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                messages.append(
                    ToolMessage(_run_tool(by_name, call), tool_call_id=call["id"] or "")
                )
        observed = [m.content for m in messages[first_new:] if isinstance(m, ToolMessage)]
        facts = _text(reply) if reply is not None else ""
        return {"facts": "\n".join([*map(str, observed), facts]).strip()}

    def critic(state: DemoState) -> dict[str, Any]:
        notes = "\n".join(sorted(state["notes"]))
        msg = model.invoke(
            [
                SystemMessage("You are a strict critic."),
                HumanMessage(f"Notes:\n{notes}\nFacts:\n{state['facts']}\nName one weakness."),
            ]
        )
        return {"critique": _text(msg)}

    def writer(state: DemoState) -> dict[str, Any]:
        notes = "\n".join(sorted(state["notes"]))
        msg = model.invoke(
            [
                SystemMessage("You write the final answer."),
                HumanMessage(
                    f"Plan:\n{state['plan']}\nNotes:\n{notes}\nFacts:\n{state['facts']}\n"
                    f"Critique:\n{state['critique']}\nWrite the final report on "
                    f"{state['topic']}."
                ),
            ]
        )
        return {"answer": _text(msg)}

    g = StateGraph(DemoState)
    g.add_node("planner", planner)
    g.add_node("worker", worker)  # type: ignore[arg-type]
    g.add_node("tools_agent", tools_agent)
    g.add_node("critic", critic)
    g.add_node("writer", writer)
    g.add_edge(START, "planner")
    g.add_conditional_edges("planner", fan_out, ["worker"])
    g.add_edge("planner", "tools_agent")
    g.add_edge(["worker", "tools_agent"], "critic")
    g.add_edge("critic", "writer")
    g.add_edge("writer", END)
    return g.compile()
