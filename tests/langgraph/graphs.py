"""Helpers several LangGraph tests share: the fan-out graph shape, a group id's kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph.graph import END, START, StateGraph


def fan_out_graph(
    state: type[Any],
    head: Callable[..., Any],
    dispatch: Callable[..., Any],
    worker: Callable[..., Any],
    tail: Callable[..., Any],
) -> Any:
    """Compile ``START -> head -> dispatch(Send worker ...) -> worker -> tail -> END``.

    Nodes are named after their functions (``planner``, ``worker`` …), which the tags the
    adapters derive from node names see.
    """
    names = [fn.__name__ for fn in (head, worker, tail)]
    g = StateGraph(state)
    for name, fn in zip(names, (head, worker, tail), strict=True):
        g.add_node(name, fn)
    g.add_edge(START, names[0])
    g.add_conditional_edges(names[0], dispatch, [names[1]])
    g.add_edge(names[1], names[2])
    g.add_edge(names[2], END)
    return g.compile()


def group_kind_of(group_id: str | None) -> str | None:
    """The kind inside a derived group id (``<query_id>|<kind>|<key>``); the tags'
    ``group_kind`` itself stays client-side and does not cross the wire."""
    return None if group_id is None else group_id.split("|")[-2]
