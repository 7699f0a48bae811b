"""``AgentSpecMiddleware``: structure tags for langchain's ``create_agent``, as middleware.

::

    from langchain.agents import create_agent
    from agentspec_mw_langgraph import AgentSpecMiddleware

    agent = create_agent(model, tools, middleware=[AgentSpecMiddleware()])

Its ``wrap_model_call``/``awrap_model_call`` derive the tags of each model call from the
agent's state and runtime and attach them to the request:

* **agent_id** -- ``agent=`` when given, else the model node's place in the graph
  (``model``; ``researcher/model`` when the agent runs as node ``researcher`` of a parent
  graph), as :func:`~agentspec_mw_langgraph.with_agentspec` derives it;
* **query_id** -- ``thread:<thread_id>`` when the run has one (and
  ``TaggingConfig.tags_query_from_thread``), else ``run:<id>`` of this invocation (set
  when it starts and checkpointed, so an interrupted and resumed invocation keeps it);
* **segment** -- the rule of :mod:`~agentspec_mw_langgraph.derive` from the request's
  tools, ``tool_choice`` and last message; after a tool result, what the agent's last
  answer to a tool result was;
* **group** -- none: a ``create_agent`` agent has no ``Send`` fan-out, and its later
  model calls (tool-loop turns) are the same agent in the same query, so ``agent_id`` +
  ``query_id`` give them one drafting key with its first call (a ``repeat`` group id,
  known only from the second call on, would split that key in two);
* **scope**, **blocks** -- from :class:`~agentspec_mw_langgraph.config.TaggingConfig`.

Delivery: for an OpenAI chat model (``ChatOpenAI``, any ``BaseChatOpenAI``) the tags go
into the request's ``extra_body={"vllm_xargs": ...}`` (through ``ModelRequest.
model_settings``; keys the model's own ``extra_body`` sets win), with the routing key
header (``x-session-id``; :mod:`~agentspec_mw_langgraph.routing`) in ``extra_headers``
unless the model's headers set it; for any model, also into
the per-call ContextVar that the engine-backed ``ChatAgentSpecVLLM`` sends as
``extra_args`` (:mod:`~agentspec_mw_langgraph.context`). The tags also go into the model
run's metadata (``agentspec_*`` keys), so tracers such as LangSmith show them.

A failure while tagging means that call goes out untagged, a logged warning and
``stats.adapter_errors += 1`` (``TaggingConfig(adapter_raise_errors=True)``: it raises).

Use the middleware or ``with_agentspec``, not both on one agent: with both, the OpenAI
request carries the middleware's tags and the engine-backed model the handler's. Unlike
``with_agentspec`` it keeps no redundancy graph and records no traces.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Annotated, Any, NotRequired

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables.config import var_child_runnable_config

from agentspec_mw.errors import MissingDependencyError
from agentspec_mw.tags import Segment, StructureTags, tags_to_wire
from agentspec_mw_langgraph import derive
from agentspec_mw_langgraph.config import TaggingConfig
from agentspec_mw_langgraph.context import (
    CallTicket,
    current_tags,
    current_ticket,
    set_current_tags,
)
from agentspec_mw_langgraph.handler import _bounded
from agentspec_mw_langgraph.routing import tags_routing_key

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
    from langchain.agents.middleware.types import ModelCallResult, PrivateStateAttr
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        "langchain", "AgentSpecMiddleware", "pip install 'agentspec-mw-langgraph[openai]'"
    ) from None

__all__ = ["AgentSpecMiddleware", "AgentSpecState", "MiddlewareStats"]

_log = logging.getLogger(__name__)
_MODEL_NODE = "model"  # create_agent's model node


class AgentSpecState(AgentState[Any]):
    """The agent state plus this invocation's query id (private; checkpointed, so a resumed
    invocation keeps it)."""

    agentspec_query: NotRequired[Annotated[str, PrivateStateAttr]]


@dataclass
class MiddlewareStats:
    """Counters of one :class:`AgentSpecMiddleware` (read ``middleware.stats``)."""

    model_calls: int = 0
    """Model calls seen."""
    tags_derived: int = 0
    """Model calls that got tags."""
    tags_delivered: int = 0
    """Model calls whose tags were attached to the request (OpenAI ``extra_body``, or
    sent by the engine-backed chat model)."""
    adapter_errors: int = 0
    """Failures while tagging (each meant a call without tags and a logged warning)."""


def _is_openai(model: Any) -> bool:
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:
        return False
    return isinstance(model, BaseChatOpenAI)


def _last_answer_after_tool(messages: Sequence[BaseMessage]) -> Segment | None:
    """What the agent produced the last time it answered a tool result."""
    for before, after in zip(reversed(messages[:-1]), reversed(messages[1:]), strict=True):
        if isinstance(after, AIMessage) and isinstance(before, ToolMessage):
            return "tool_call" if after.tool_calls else "answer"
    return None


class AgentSpecMiddleware(AgentMiddleware[AgentSpecState, Any, Any]):
    """Tags every model call of a ``create_agent`` agent (see the module docstring).

    Args:
        config: scope, blocks, segment overrides and the thread rule
            (``TaggingConfig``; its graph/trace fields are not used here).
        agent: the agent id for every call, a non-empty ``str`` (default: derived from the
            graph position).

    Raises:
        TypeError: ``config`` is not a :class:`TaggingConfig`, or ``agent`` is not a
            non-empty ``str``.
    """

    state_schema = AgentSpecState

    def __init__(self, config: TaggingConfig | None = None, *, agent: str | None = None) -> None:
        super().__init__()
        if config is not None and not isinstance(config, TaggingConfig):
            raise TypeError(
                f"config= must be a TaggingConfig, got {type(config).__name__}: "
                "AgentSpecMiddleware(TaggingConfig(tags_scope=...))"
            )
        if agent is not None and (not isinstance(agent, str) or not agent):
            raise TypeError(
                "agent= must be a non-empty str, e.g. AgentSpecMiddleware(agent='planner'), "
                f"got {type(agent).__name__}: {agent!r:.40}"
            )
        self.config = config or TaggingConfig()
        self.agent = agent
        self._lock = threading.Lock()
        self._stats = MiddlewareStats()

    @property
    def stats(self) -> MiddlewareStats:
        """A snapshot of the counters."""
        with self._lock:
            return replace(self._stats)

    def _count(self, field: str) -> None:
        with self._lock:
            setattr(self._stats, field, getattr(self._stats, field) + 1)

    # ------------------------------------------------------------ the query id
    def before_agent(self, state: AgentSpecState, runtime: Any) -> dict[str, Any] | None:
        """A fresh query id for this invocation (used when the run has no thread, or with
        ``tags_query_from_thread=False``). A resumed invocation does not run this hook
        again and keeps the id from its checkpoint."""
        return {"agentspec_query": f"run:{uuid.uuid4()}"}

    async def abefore_agent(self, state: AgentSpecState, runtime: Any) -> dict[str, Any] | None:
        """The async twin of :meth:`before_agent`."""
        return self.before_agent(state, runtime)

    # ---------------------------------------------------------------- the tags
    def tags_for(self, request: ModelRequest[Any]) -> StructureTags:
        """The tags of one model request.

        Raises:
            ValueError: the state has no query id of the invocation (:meth:`before_agent`
                did not run) and the run has no thread to use instead.
        """
        info = getattr(request.runtime, "execution_info", None)
        namespace = str(getattr(info, "checkpoint_ns", "") or "")
        agent = self.agent or derive.agent_from_namespace(namespace, _MODEL_NODE, _MODEL_NODE)
        thread = getattr(info, "thread_id", None)
        has_thread = thread is not None and bool(str(thread))
        state: Mapping[str, Any] = request.state or {}
        run = state.get("agentspec_query")
        if self.config.tags_query_from_thread and has_thread:
            query = f"thread:{thread}"
        elif run:
            query = str(run)
        elif has_thread:  # e.g. resumed from a checkpoint written without the query id
            query = f"thread:{thread}"
        else:
            raise ValueError("the agent state has no agentspec_query: before_agent did not run")
        messages = list(request.messages)
        last = messages[-1] if messages else None
        after_tool = isinstance(last, ToolMessage)
        segment = derive.predict_segment(
            node=_MODEL_NODE,
            tools_bound=bool(request.tools),
            tool_choice=request.tool_choice,
            last_is_tool_result=after_tool,
            previous_after_tool=_last_answer_after_tool(messages) if after_tool else None,
            overrides=self.config.tags_segment_by_node,
        )
        params = dict(getattr(request.model, "_identifying_params", {}) or {})
        params["tools"] = request.tools
        return StructureTags(
            scope=self.config.tags_scope,
            agent_id=_bounded(agent),
            query_id=_bounded(query),
            segment=segment,
            blocks=derive.blocks_for(params, self.config.tags_blocks),
        )

    def _attach(self, request: ModelRequest[Any], tags: StructureTags) -> ModelRequest[Any]:
        """The request with the tags in its OpenAI ``extra_body`` (other models: as is)."""
        if not _is_openai(request.model):
            return request
        wire = tags_to_wire(tags)
        settings = request.model_settings
        extra = settings.get("extra_body") or getattr(request.model, "extra_body", None) or {}
        if not isinstance(extra, Mapping):
            raise TypeError(f"extra_body is {type(extra).__name__}, not a dict")
        xargs = extra.get("vllm_xargs")
        merged = {**wire, **(xargs if isinstance(xargs, Mapping) else {})}
        body = {**extra, "vllm_xargs": merged}
        update: dict[str, Any] = {**settings, "extra_body": body}
        key = tags_routing_key(tags, self.config.routing_granularity)
        if key is not None:
            own = dict(settings.get("extra_headers") or {})
            defaults = getattr(request.model, "default_headers", None) or {}
            taken = {str(name).lower() for name in (*own, *defaults)}
            if self.config.routing_header.lower() not in taken:  # the caller's header wins
                own[self.config.routing_header] = key
            update["extra_headers"] = own
        attached = request.override(model_settings=update)
        self._count("tags_delivered")
        return attached

    def _prepare(self, request: ModelRequest[Any]) -> tuple[ModelRequest[Any], StructureTags]:
        """The request with its tags attached, and the tags.

        Raises:
            Exception: whatever tagging raised, when ``adapter_raise_errors`` is set.
        """
        tags = self.tags_for(request)
        return self._attach(request, tags), tags

    @contextmanager
    def _tagged(self, request: ModelRequest[Any]) -> Iterator[ModelRequest[Any]]:
        self._count("model_calls")
        try:
            tagged, tags = self._prepare(request)
        except Exception as exc:  # noqa: BLE001 - the error policy: this call goes untagged
            if self.config.adapter_raise_errors:
                raise
            self._count("adapter_errors")
            _log.warning(
                "agentspec: tagging a model call failed (%s: %s); continuing without tags",
                type(exc).__name__,
                exc,
            )
            tagged, tags = request, None
        if tags is None:
            yield request
            return
        self._count("tags_derived")
        ticket = None if _is_openai(tagged.model) else CallTicket(None, self._delivered)
        config = var_child_runnable_config.get() or {}
        metadata = {**(config.get("metadata") or {}), **tags_to_wire(tags)}
        config_token = var_child_runnable_config.set({**config, "metadata": metadata})
        previous = (current_tags(), current_ticket())
        set_current_tags(tags, ticket)
        try:
            yield tagged
        finally:
            set_current_tags(*previous)
            var_child_runnable_config.reset(config_token)

    def _delivered(self) -> None:
        self._count("tags_delivered")

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Any],
    ) -> ModelCallResult[Any]:
        """Run the model call with its tags attached."""
        with self._tagged(request) as tagged:
            result: ModelCallResult[Any] = handler(tagged)
            return result

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[Any]],
    ) -> ModelCallResult[Any]:
        """The async twin of :meth:`wrap_model_call`."""
        with self._tagged(request) as tagged:
            result: ModelCallResult[Any] = await handler(tagged)
            return result
