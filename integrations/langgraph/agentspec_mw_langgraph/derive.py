"""The tag derivation rule: pure functions from callback metadata to tag fields.

The rule (docs/langgraph.md repeats it with examples):

* **agent_id** — the node names along ``langgraph_checkpoint_ns`` joined by ``/`` (task
  ids and the counters of repeated subgraph invocations dropped): node ``agent`` of the
  root graph is ``agent``; node ``agent`` of a subgraph mounted as node ``researcher`` is
  ``researcher/agent``. A call outside any graph node uses the run name of the model. A
  model call a LangChain middleware makes for itself (its metadata marks it: ``lc_source``,
  ``lc_internal_call``; ``SummarizationMiddleware``'s summary, ``LLMToolSelectorMiddleware``'s
  selection) is an agent of its own: that id, ``/`` and its source (``model/tool_selection``).
* **query_id** — ``thread:<thread_id>`` when the run has a ``thread_id`` (and
  ``tags_query_from_thread`` is on), else ``run:<root run id>``; a graph run started while
  another graph run holds its thread (same scope, same process) gets
  ``thread:<thread_id>|run:<root run id>``.
* **segment**, predicted before generation, first match wins:

  1. ``tags_segment_by_node[node]`` when configured;
  2. tools bound and ``tool_choice`` forces a tool (``"any"``, ``"required"``, a tool
     name or a tool dict; as a dict, ``{"type": ...}`` other than ``"auto"`` or
     ``"none"``) -> ``tool_call``;
  3. tools bound (``tool_choice`` absent or ``"auto"``, or ``{"type": "auto"}``) and the
     last prompt message is not a tool result -> ``tool_call``;
  4. tools bound and the last message is a tool result -> what this agent's previous call
     made after a tool result in this query actually produced; ``answer`` the first time;
  5. no tools bound (or ``tool_choice`` ``"none"`` / ``{"type": "none"}``): ``answer``
     after a tool result; ``plan`` when a word of the node name is ``plan`` or an
     inflection of it, also after ``re`` (words split at ``_``, ``-``, spaces and camelCase
     humps: ``planner``, ``research_plan``, ``makePlan``, ``replan``; not ``explanation``,
     ``airplane_search`` or ``planet_researcher``); else ``answer``.

  Tool results themselves (tool runs) are recorded as ``observation`` nodes.
* **blocks** — ``tags_blocks`` when configured; else the ``agentspec_blocks`` the chat
  model advertises in its invocation params (the engine-backed model does); else, when
  tools are bound and the model name names a Hermes-format family (Qwen, Hermes, SmolLM),
  the code fence and ``<tool_call>``/``</tool_call>``; else ``None`` (proposer defaults).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentspec_mw.tags import Segment

__all__ = [
    "CODE_FENCE",
    "HERMES_TOOL_BLOCK",
    "actual_segment",
    "agent_from_namespace",
    "blocks_for",
    "forces_tool",
    "internal_call_source",
    "predict_segment",
    "query_id_for",
    "split_namespace",
]

CODE_FENCE = ("```", "```")
HERMES_TOOL_BLOCK = ("<tool_call>", "</tool_call>")
_HERMES_FAMILIES = re.compile(r"qwen|hermes|smollm", re.IGNORECASE)
# the words of a node name: split at _, -, whitespace and camelCase humps ("HTTPPlan")
_NAME_WORDS = re.compile(r"[_\-\s]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# a planning node's word: "plan" and its inflections, also after "re" ("replan": LangGraph's
# plan-and-execute tutorial re-plans there); not words that only begin so ("planet", "plant")
_PLAN_WORD = re.compile(r"(re)?plan(s|ner|ners|ning|ned)?", re.IGNORECASE)


def split_namespace(checkpoint_ns: str) -> list[tuple[str, str]]:
    """``"a:t1|b:t2"`` -> ``[("a", "t1"), ("b", "t2")]`` (a part without ``:`` has task ``""``).

    All-digit parts are dropped, as LangGraph's ``recast_checkpoint_ns`` drops them: they
    count a task's repeated invocations of one subgraph (``"a:t1|1|b:t3"``), no node.
    """
    out = []
    for part in checkpoint_ns.split("|") if checkpoint_ns else ():
        if part.isdigit():
            continue
        name, _, task = part.rpartition(":")
        out.append((name, task) if name else (task, ""))
    return out


def agent_from_namespace(checkpoint_ns: str | None, node: str | None, fallback: str) -> str:
    """The agent id: node names along the namespace joined by ``/`` (see the module doc)."""
    names = [name for name, _ in split_namespace(checkpoint_ns or "")]
    if node and (not names or names[-1] != node):
        names.append(node)
    return "/".join(names) if names else fallback


def query_id_for(
    root_run_id: str, thread_id: Any, use_thread: bool, *, thread_busy: bool = False
) -> str:
    """``thread:<id>`` for a threaded run (when ``use_thread``), else ``run:<root id>``.

    ``thread_busy``: another graph run holds the thread now (two concurrent runs given the
    same ``thread_id``); this one is a query of its own, ``thread:<id>|run:<root id>``.
    """
    if use_thread and thread_id is not None and str(thread_id):
        return f"thread:{thread_id}|run:{root_run_id}" if thread_busy else f"thread:{thread_id}"
    return f"run:{root_run_id}"


# LangChain's marks of a model call a middleware makes for itself (langchain.agents.
# middleware: ``lc_source`` names the middleware's purpose, ``internal_call_metadata()``
# sets ``lc_internal_call``, public for third-party middleware)
_SOURCE_KEY = "lc_source"
_INTERNAL_KEY = "lc_internal_call"


def internal_call_source(metadata: Mapping[str, Any]) -> str | None:
    """The source of a middleware's own model call from its run metadata (``"summarization"``,
    ``"tool_selection"``; ``"internal"`` when only ``lc_internal_call`` marks it), else
    ``None`` (an agent's own call)."""
    source = metadata.get(_SOURCE_KEY)
    if isinstance(source, str) and source:
        return source
    return "internal" if metadata.get(_INTERNAL_KEY) else None


def _choice_mode(tool_choice: Any) -> Any:
    """A ``tool_choice`` as its mode: a string as it is, a ``{"type": ...}`` dict
    (Anthropic's ``{"type": "auto"}``, OpenAI's ``{"type": "function", ...}``) as its type,
    anything else unchanged."""
    if isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("type"), str):
        return tool_choice["type"]
    return tool_choice


def forces_tool(tool_choice: Any) -> bool:
    """True when ``tool_choice`` makes the model call a tool."""
    mode = _choice_mode(tool_choice)
    if mode is None or mode is False:
        return False
    if isinstance(mode, str):
        return mode not in ("auto", "none")  # "any", "required", "tool", "function", a name
    return True  # True, or a tool dict without a type


def predict_segment(
    *,
    node: str | None,
    tools_bound: bool,
    tool_choice: Any,
    last_is_tool_result: bool,
    previous_after_tool: Segment | None,
    overrides: Mapping[str, Segment],
) -> Segment:
    """The segment predicted before generation (rules 1-5 of the module doc)."""
    if node is not None and node in overrides:
        return overrides[node]
    tools = tools_bound and _choice_mode(tool_choice) != "none"
    if tools and forces_tool(tool_choice):
        return "tool_call"
    if tools:
        if not last_is_tool_result:
            return "tool_call"
        return previous_after_tool or "answer"
    if last_is_tool_result:
        return "answer"
    if node is not None and any(_PLAN_WORD.fullmatch(word) for word in _NAME_WORDS.split(node)):
        return "plan"
    return "answer"


def actual_segment(predicted: Segment | None, has_tool_calls: bool) -> Segment:
    """What a call produced: ``tool_call`` if it emitted tool calls, else plan/answer."""
    if has_tool_calls:
        return "tool_call"
    return "plan" if predicted == "plan" else "answer"


def _model_name(invocation_params: Mapping[str, Any]) -> str:
    for key in ("model", "model_name", "model_id"):
        value = invocation_params.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def blocks_for(
    invocation_params: Mapping[str, Any],
    configured: Sequence[tuple[str, str]] | None,
) -> tuple[tuple[str, str], ...] | None:
    """The block delimiters of one call (the ``blocks`` rule of the module doc)."""
    if configured is not None:
        return tuple((str(a), str(b)) for a, b in configured)
    advertised = invocation_params.get("agentspec_blocks")
    if advertised:
        return tuple((str(a), str(b)) for a, b in advertised)
    if invocation_params.get("tools") and _HERMES_FAMILIES.search(_model_name(invocation_params)):
        return (CODE_FENCE, HERMES_TOOL_BLOCK)
    return None
