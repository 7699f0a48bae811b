"""The workflow shapes ``agentspec bench`` runs concurrently, and how one query runs.

* ``demo`` — the demo's planner → ``Send`` fan-out of three workers + a tool agent →
  critic → writer (:func:`~agentspec_mw_langgraph.demo_graph.build_workflow`);
* ``tool_loop`` — LangChain's ``create_agent`` over real local tools (calculator, word
  count, note lookup), at most :data:`TOOL_LOOP_RECURSION` graph steps;
* ``reflect`` — a retry/reflection loop: draft → review → revise, until the reviewer
  answers ``OK`` or :data:`REFLECT_ROUNDS` revisions were made.

Every shape is ordinary LangGraph code over any chat model. Each query gets a topic; the
final state is reduced to JSON (:func:`final_view`: message types, contents and tool
calls, no random ids) so two runs can be compared for identical outputs.

Apps that are not in the package are named by an import path, LangGraph's
``langgraph.json`` convention (:func:`resolve_app`): ``package.module:attr`` or
``path/to/file.py:attr``, where ``attr`` is a :class:`BenchApp` or a function
``build(model) -> compiled graph``. For a function, the module's ``make_input(topic)``
(if it defines one) makes a query's input, else :func:`default_input`.
"""

from __future__ import annotations

import importlib
import importlib.util
import operator
import os
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph

from agentspec_mw.errors import AgentSpecError
from agentspec_mw_langgraph.demo_graph import NOTES, build_workflow, demo_tools, initial_state

__all__ = [
    "APPS",
    "REFLECT_ROUNDS",
    "TOOL_LOOP_RECURSION",
    "BenchApp",
    "BenchAppError",
    "bench_topics",
    "default_input",
    "final_view",
    "resolve_app",
    "topic_count",
]

#: Graph steps of the ``create_agent`` loop (model and tool nodes each count one).
TOOL_LOOP_RECURSION = 8
#: Revisions of the reflection loop at most.
REFLECT_ROUNDS = 2

_SUBJECTS = (
    "tea", "coffee", "bread", "cheese", "rice", "salt", "glass", "paper", "steel", "wool",
    "cotton", "honey", "chocolate", "soap", "rubber", "copper", "silk", "clay", "maps",
    "clocks", "bicycles", "bridges", "lighthouses", "canals", "windmills", "telescopes",
    "vaccines", "batteries", "compasses", "printing", "railways", "radio", "lenses", "ink",
    "sugar", "pepper", "olive oil", "yogurt", "noodles", "lanterns", "kites", "violins",
    "pianos", "chess", "origami", "pottery", "sundials", "dams", "tunnels", "satellites",
)  # fmt: skip
# appended only: the sequence's first topics stay what earlier runs measured
_ANGLES = (
    "", "modern ", "traditional ", "industrial ", "ancient ", "regional ", "artisanal ",
    "future ",
)  # fmt: skip


def topic_count() -> int:
    """Distinct topics in :func:`bench_topics`' sequence (it repeats after them)."""
    return len(_SUBJECTS) * len(_ANGLES)


def bench_topics(start: int, n: int) -> list[str]:
    """``n`` topics from position ``start`` of a fixed sequence (the same for every
    method, so runs can be compared; a new ``start`` per run keeps the proposers' caches
    from seeing the same query twice within :func:`topic_count` topics; the sequence
    repeats after them)."""
    size = topic_count()
    out = []
    for i in range(start, start + n):
        j = i % size
        out.append(f"{_ANGLES[j // len(_SUBJECTS)]}{_SUBJECTS[j % len(_SUBJECTS)]}")
    return out


class _ReflectState(TypedDict):
    topic: str
    draft: str
    reviews: Annotated[list[str], operator.add]
    rounds: int


def build_reflect(model: BaseChatModel) -> Any:
    """The retry/reflection loop over ``model`` (nodes: writer, reviewer, reviser)."""

    def writer(state: _ReflectState) -> dict[str, Any]:
        msg = model.invoke(
            [
                SystemMessage("You write short, factual paragraphs."),
                HumanMessage(f"Write three sentences about {state['topic']}."),
            ]
        )
        return {"draft": str(msg.content).strip(), "rounds": 0}

    def reviewer(state: _ReflectState) -> dict[str, Any]:
        msg = model.invoke(
            [
                SystemMessage(
                    "You review drafts. Answer OK if the draft is good, otherwise name "
                    "one concrete problem in one sentence."
                ),
                HumanMessage(f"Topic: {state['topic']}\nDraft:\n{state['draft']}"),
            ]
        )
        return {"reviews": [str(msg.content).strip()]}

    def reviser(state: _ReflectState) -> dict[str, Any]:
        msg = model.invoke(
            [
                SystemMessage("You revise drafts to fix the reviewer's point."),
                HumanMessage(
                    f"Draft:\n{state['draft']}\nReview:\n{state['reviews'][-1]}\n"
                    "Write the revised draft."
                ),
            ]
        )
        return {"draft": str(msg.content).strip(), "rounds": state["rounds"] + 1}

    def route(state: _ReflectState) -> str:
        verdict = state["reviews"][-1].strip().upper()
        if verdict.startswith("OK") or state["rounds"] >= REFLECT_ROUNDS:
            return END
        return "reviser"

    g = StateGraph(_ReflectState)
    g.add_node("writer", writer)
    g.add_node("reviewer", reviewer)
    g.add_node("reviser", reviser)
    g.add_edge(START, "writer")
    g.add_edge("writer", "reviewer")
    g.add_conditional_edges("reviewer", route, ["reviser", END])
    g.add_edge("reviser", "reviewer")
    return g.compile()


def build_tool_loop(model: BaseChatModel) -> Any:
    """``create_agent`` over the demo's local tools (a ReAct loop)."""
    from langchain.agents import create_agent

    return create_agent(
        model,
        demo_tools(),
        system_prompt=(
            "You are a research assistant. Use lookup_note to find notes, word_count to "
            "count words and calculator for arithmetic, then answer in two sentences."
        ),
    )


def _tool_loop_input(topic: str) -> dict[str, Any]:
    """The question, after one worked example (small models follow a shown tool call)."""
    return {
        "messages": [
            HumanMessage("Look up bread in the notes and tell me what you found."),
            AIMessage(
                "",
                tool_calls=[{"name": "lookup_note", "args": {"topic": "bread"}, "id": "ex1"}],
            ),
            ToolMessage(NOTES["bread"], tool_call_id="ex1"),
            AIMessage(f"The note says: {NOTES['bread']}"),
            HumanMessage(f"Look up {topic} in the notes and tell me what you found."),
        ]
    }


class BenchApp:
    """One workflow shape: how to build its graph and its input for a topic."""

    def __init__(
        self,
        name: str,
        build: Callable[[BaseChatModel], Any],
        make_input: Callable[[str], Any],
        config: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.build = build
        self.make_input = make_input
        self.config = dict(config or {})

    def run(self, graph: Any, topic: str) -> Any:
        """Run one query to its end; a query that hits the recursion limit ends there
        (its view says so) rather than failing the run."""
        try:
            return graph.invoke(self.make_input(topic), config=self.config or None)
        except GraphRecursionError:
            return {"stopped": f"recursion_limit={self.config.get('recursion_limit')}"}


APPS: dict[str, BenchApp] = {
    "demo": BenchApp("demo", build_workflow, initial_state),
    "tool_loop": BenchApp(
        "tool_loop",
        build_tool_loop,
        _tool_loop_input,
        {"recursion_limit": TOOL_LOOP_RECURSION},
    ),
    "reflect": BenchApp(
        "reflect", build_reflect, lambda t: {"topic": t, "draft": "", "reviews": [], "rounds": 0}
    ),
}


class BenchAppError(AgentSpecError, ValueError):
    """An app name is neither a built-in shape nor an import path to a usable app."""


def default_input(topic: str) -> dict[str, Any]:
    """A query's input for an imported ``build`` whose module has no ``make_input``:
    ``{"messages": [HumanMessage(topic)]}`` (``MessagesState``, ``create_agent``)."""
    return {"messages": [HumanMessage(topic)]}


def _import(name: str, where: str) -> ModuleType:
    """The module ``where`` (a dotted module, or a ``.py`` file), for app ``name``."""
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where).resolve()
        if not path.is_file():
            raise BenchAppError(f"app {name!r}: no file {str(path)!r}")
        mod_name = f"_agentspec_bench_app_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[mod_name]
            raise BenchAppError(
                f"app {name!r}: importing {str(path)!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return module
    if os.getcwd() not in sys.path:  # like ``python -m``: modules in the working folder
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        hint = " (is its folder on PYTHONPATH?)" if exc.name == where.split(".")[0] else ""
        raise BenchAppError(f"app {name!r}: cannot import module {where!r}: {exc}{hint}") from exc
    except Exception as exc:
        raise BenchAppError(
            f"app {name!r}: importing module {where!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def resolve_app(name: str) -> BenchApp:
    """The app ``name``: a key of :data:`APPS`, or ``module:attr`` / ``file.py:attr``.

    ``attr`` (dots allowed: ``obj.build``) must be a :class:`BenchApp` (used as is, under
    the name ``name``) or a callable ``build(model) -> compiled graph``; for a callable,
    the module's ``make_input(topic)`` makes each query's input if the module defines
    one, else :func:`default_input`. Importing runs the module (in the bench's parent
    and in each engine process, which get the same ``name``: the module must be
    importable there too, e.g. through ``PYTHONPATH``).

    Raises:
        BenchAppError: an unknown name, a module that does not import, a missing
            attribute, or an attribute that is neither a ``BenchApp`` nor callable.
    """
    if name in APPS:
        return APPS[name]
    where, sep, attr = name.rpartition(":")
    if not sep or not where or not attr:
        raise BenchAppError(
            f"app {name!r} unknown; choose from {list(APPS)} or give an import path "
            "'package.module:build' or 'path/to/file.py:build'"
        )
    module = _import(name, where)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(k for k in vars(module) if not k.startswith("_"))
            raise BenchAppError(
                f"app {name!r}: module {module.__name__!r} ({getattr(module, '__file__', '?')})"
                f" has no attribute {attr!r}; it has {public}"
            )
        obj = getattr(obj, part)
    if isinstance(obj, BenchApp):
        return BenchApp(name, obj.build, obj.make_input, obj.config)
    if hasattr(obj, "invoke") or not callable(obj):
        kind = "a compiled graph" if hasattr(obj, "invoke") else f"a {type(obj).__name__}"
        raise BenchAppError(
            f"app {name!r}: {attr!r} in module {module.__name__!r} is {kind}; expected a "
            "BenchApp or a function build(model) -> compiled graph (the bench passes "
            "each engine's chat model)"
        )
    make_input = getattr(module, "make_input", default_input)
    if not callable(make_input):
        raise BenchAppError(
            f"app {name!r}: make_input in module {module.__name__!r} is a "
            f"{type(make_input).__name__}; expected a function make_input(topic) -> input"
        )
    return BenchApp(name, obj, make_input)


def _message_view(m: BaseMessage) -> dict[str, Any]:
    view: dict[str, Any] = {"type": m.type, "content": m.content}
    calls = getattr(m, "tool_calls", None)
    if calls:
        view["tool_calls"] = [{"name": c["name"], "args": c["args"]} for c in calls]
    return view


def final_view(state: Any) -> Any:
    """``state`` as JSON-able data without random ids (messages: type, content, calls)."""
    if isinstance(state, BaseMessage):
        return _message_view(state)
    if isinstance(state, dict):
        return {str(k): final_view(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return [final_view(v) for v in state]
    if state is None or isinstance(state, str | int | float | bool):
        return state
    return str(state)
