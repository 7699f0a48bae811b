"""The redundancy graph of one query: which calls are siblings, repeats or retries.

Nodes are the calls a query made (LLM calls, and tool runs as ``observation`` nodes).
Relations are of two shapes:

* **groups** (hyperedges) — ``fanout``: the calls at the same position (same step
  template and call ordinal) of the siblings of a ``Send`` fan-out, including calls inside
  subgraphs those siblings run, or of one round of a functional ``@task``'s calls (the
  handler's ``_round_of``); ``superstep``: the LLM calls that run in the same superstep at
  every graph level (parallel agents, also across sibling subgraphs); ``parallel``: the
  calls of one agent instance in one node run that ran at the same time (a ``generate``
  batch, an ``asyncio.gather``: each started while another of them was still running);
  ``repeat``: the calls of one agent across loop steps; ``retry``: attempts of one task
  call after an error.
* **edges** (directed) — ``repeat`` (previous call of the same agent instance -> this
  call; every call of a ``parallel`` group repeats the call before the group, and the next
  call after it repeats the group's last call to start), ``retry`` (failed attempt -> new
  attempt) and ``observation`` (tool run -> the LLM call whose prompt ends with its result).

The graph is plain data: :meth:`RedundancyGraph.to_dict` / :meth:`to_json` export it.
It is not locked; the handler mutates it under its own lock and hands out copies.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from agentspec_mw.tags import Segment

__all__ = ["CallNode", "Edge", "Group", "GroupKind", "RedundancyGraph"]

GroupKind = Literal["fanout", "superstep", "parallel", "repeat", "retry"]
EdgeKind = Literal["repeat", "retry", "observation"]


@dataclass
class CallNode:
    """One call of a query."""

    call_id: str
    """The LangChain run id of the call."""
    kind: Literal["llm", "tool"]
    agent_id: str
    node: str | None
    """The innermost LangGraph node (``None`` outside a graph)."""
    step: int | None
    """The innermost graph's superstep."""
    template: tuple[tuple[str, int | None], ...]
    """``(node, step)`` per graph level, outermost first (the step template)."""
    namespace: str
    """``langgraph_checkpoint_ns`` (with task ids)."""
    ordinal: int
    """Position among the calls of its node run (failed attempts not counted)."""
    segment: Segment | None
    """Predicted segment (``observation`` for tool runs)."""
    actual_segment: Segment | None = None
    """What the call produced (set when it ends)."""
    group_id: str | None = None
    """The group put on the call's tags: its ``fanout`` group, if any. Retries, repeats and
    parallel calls are recorded in :attr:`RedundancyGraph.groups` only: they are the same
    agent in the same query, which the tags' ``agent_id`` + ``query_id`` already key
    together."""
    group_kind: Literal["fanout"] | None = None
    """The kind of :attr:`group_id`."""
    name: str | None = None
    """The tool name (tool runs) or model run name."""
    status: Literal["running", "ok", "error"] = "running"
    send_index: int | None = None
    """The ``Send`` index of the innermost level pushed by a fan-out, if any."""


@dataclass(frozen=True)
class Edge:
    """A directed relation between two calls."""

    src: str
    dst: str
    kind: EdgeKind


@dataclass
class Group:
    """A set of related calls."""

    group_id: str
    kind: GroupKind
    members: list[str] = field(default_factory=list)


class RedundancyGraph:
    """The calls of one query and how they relate (see the module doc)."""

    def __init__(self, query_id: str, max_calls: int | None = None) -> None:
        self.query_id = query_id
        self.max_calls = max_calls
        """Calls kept at most (``None``: no limit); later calls are counted in ``dropped``."""
        self.dropped = 0
        """Calls not kept because the graph was full."""
        self.calls: dict[str, CallNode] = {}
        self.groups: dict[str, Group] = {}
        self.edges: list[Edge] = []

    def add_call(self, call: CallNode) -> bool:
        """Add a call node (its id must be new); ``False`` if the graph is full."""
        assert call.call_id not in self.calls, f"duplicate call {call.call_id}"
        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            self.dropped += 1
            return False
        self.calls[call.call_id] = call
        return True

    def join(self, group_id: str, kind: GroupKind, call_id: str) -> None:
        """Put ``call_id`` into group ``group_id`` (created on first use; no-op for a call
        the graph did not keep)."""
        if call_id not in self.calls:
            return
        group = self.groups.setdefault(group_id, Group(group_id, kind))
        assert group.kind == kind, f"group {group_id} is {group.kind}, not {kind}"
        if call_id not in group.members:
            group.members.append(call_id)

    def link(self, src: str, dst: str, kind: EdgeKind) -> None:
        """Add the edge ``src -> dst`` (no-op unless the graph kept both calls)."""
        if src in self.calls and dst in self.calls:
            self.edges.append(Edge(src, dst, kind))

    def llm_calls(self) -> list[CallNode]:
        """The LLM calls, in the order they started."""
        return [c for c in self.calls.values() if c.kind == "llm"]

    def groups_of(self, kind: GroupKind, min_size: int = 1) -> list[Group]:
        """The groups of one kind with at least ``min_size`` members."""
        return [g for g in self.groups.values() if g.kind == kind and len(g.members) >= min_size]

    def copy(self) -> RedundancyGraph:
        """A deep copy (what the handler hands out)."""
        return copy.deepcopy(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable export: ``{"query_id", "dropped", "calls", "groups", "edges"}``."""
        return {
            "query_id": self.query_id,
            "dropped": self.dropped,
            "calls": [asdict(c) for c in self.calls.values()],
            "groups": [asdict(g) for g in self.groups.values()],
            "edges": [asdict(e) for e in self.edges],
        }

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as JSON (``kwargs`` go to :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), **kwargs)
