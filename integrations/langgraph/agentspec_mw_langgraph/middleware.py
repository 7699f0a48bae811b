"""``AgentSpecMiddleware``: structure tags for langchain's ``create_agent``, as middleware.

::

    from langchain.agents import create_agent
    from agentspec_mw_langgraph import AgentSpecMiddleware

    agent = create_agent(
        model, tools, middleware=[..., AgentSpecMiddleware(engine="http://127.0.0.1:8000/v1")]
    )

Its ``wrap_model_call``/``awrap_model_call`` derive the tags of each model call from the
agent's state and runtime and attach them to the request:

* **agent_id** -- ``agent=`` when given; else the name ``create_agent(name=...)`` gave
  the agent (its runs' ``lc_agent_name`` metadata), after the nodes it runs under
  (``planner``; ``tools/planner`` when a tool of another agent invokes it); else the
  model node's place in the graph (``model``; ``researcher/model`` when the agent runs
  as node ``researcher`` of a parent graph), as
  :func:`~agentspec_mw_langgraph.with_agentspec` derives it;
* **query_id** -- ``thread:<thread_id>`` when the run has one (and
  ``TaggingConfig.tags_query_from_thread``), else ``run:<id>`` of this invocation (set
  when it starts and checkpointed, so an interrupted and resumed invocation keeps it);
  invocations running at once with one ``thread_id`` share it (the middleware keeps no
  per-query state: they share a drafting key, within one scope);
* **segment** -- the rule of :mod:`~agentspec_mw_langgraph.derive` from the tools and
  ``tool_choice`` the model is called with (with a ``response_format`` that
  ``create_agent`` serves as a tool -- ``ToolStrategy``, or a schema the model has no
  native structured output for -- that adds the schema's tool and forces a tool call)
  and the last message; after a tool result, what the agent's last answer to a tool
  result was;
* **group** -- none: a ``create_agent`` agent has no ``Send`` fan-out, and its later
  model calls (tool-loop turns) are the same agent in the same query, so ``agent_id`` +
  ``query_id`` give them one drafting key with its first call (a ``repeat`` group id,
  known only from the second call on, would split that key in two);
* **scope**, **blocks** -- from :class:`~agentspec_mw_langgraph.config.TaggingConfig`.

Delivery: an OpenAI chat model (``ChatOpenAI``, any ``BaseChatOpenAI``) whose base URL
is the ``engine=`` server (compared as ``with_agentspec`` compares them:
:func:`~agentspec_mw_langgraph.openai_hook.server_key`) is replaced, for this call, by a
copy that carries the tags in its ``extra_body={"vllm_xargs": ...}`` (keys the model's
own ``vllm_xargs`` sets win) and the routing key header (``x-session-id``;
:mod:`~agentspec_mw_langgraph.routing`) unless the model's headers set it; when the
request's ``model_settings`` already hold ``extra_body``/``extra_headers`` (which the
model would send instead), the tags go there. So the tags reach only the model they were
derived for: a middleware inside this one that swaps the model (a fallback, dynamic
model selection) sends the other model without them, and never hands OpenAI-only
arguments to a model of another kind. An OpenAI model on another server gets nothing
(a warning, once per server). Without ``engine=``, an OpenAI model whose base URL is on
this machine or a private network (an address that is not global, ``localhost``, a name
with no dot, ``.local``, ``.internal``...) is tagged, with a warning, once, to pass
``engine=``; one on a public name (a hosted API, or a gateway in front of one, where an
unknown body field can fail the request) is not. Any other model gets the tags in the
per-call ContextVar that the engine-backed ``ChatAgentSpecVLLM`` sends as
``extra_args`` (:mod:`~agentspec_mw_langgraph.context`), set when the agent's model call
starts and given back when it ends (by an inline callback handler the call's run config
carries, first among its handlers). The tags also go into that model run's metadata
(``agentspec_*`` keys), so tracers such as LangSmith show them.

A model call a middleware makes for itself is never tagged as the agent's step: it goes
untagged, wherever this middleware is placed. LangChain marks such calls in their run
metadata (``lc_source``, ``lc_internal_call``:
:func:`~agentspec_mw_langgraph.derive.internal_call_source`): ``SummarizationMiddleware``'s
summary (made in its ``before_model`` node, outside any model call) and
``LLMToolSelectorMiddleware``'s selection (made inside the model call, within this
middleware's when that one comes after it) get neither the ContextVar nor the metadata.
``with_agentspec`` tags them as agents of their own. One exception: an OpenAI model's
tags travel on the model object this middleware hands on (its ``extra_body``), so a
middleware after this one that calls that same model for itself
(``LLMToolSelectorMiddleware`` without a ``model=`` of its own) sends them too -- one
more reason to put this middleware last.

Put ``AgentSpecMiddleware`` **last** in ``middleware=[...]``: a middleware's
``wrap_model_call`` wraps those after it, so the tags are derived from the request that
the middleware before it hand on -- after a model swap, a tool selection or a fallback.
langchain's middleware API gives no way to wrap the final model call from any other
position.

A failure while tagging means that call goes out untagged, a logged warning and
``stats.adapter_errors += 1`` (``TaggingConfig(adapter_raise_errors=True)``: it raises).

Use the middleware or ``with_agentspec``, not both on one agent: with both, the OpenAI
request carries the middleware's tags and the engine-backed model the handler's. Unlike
``with_agentspec`` it keeps no redundancy graph and records no traces.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Annotated, Any, NotRequired
from urllib.parse import urlsplit

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables.config import var_child_runnable_config

from agentspec_mw.errors import MissingDependencyError
from agentspec_mw.tags import Segment, StructureTags, tags_to_wire
from agentspec_mw_langgraph import derive
from agentspec_mw_langgraph.config import TaggingConfig
from agentspec_mw_langgraph.context import (
    CallTicket,
    current_call,
    current_ticket,
    set_current_tags,
)
from agentspec_mw_langgraph.handler import _bounded
from agentspec_mw_langgraph.openai_hook import server_key
from agentspec_mw_langgraph.routing import tags_routing_key

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
    from langchain.agents.middleware.types import ModelCallResult, PrivateStateAttr
    from langchain.agents.structured_output import AutoStrategy, ProviderStrategy, ToolStrategy
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        "langchain", "AgentSpecMiddleware", "pip install 'agentspec-mw-langgraph[openai]'"
    ) from None

__all__ = ["AgentSpecMiddleware", "AgentSpecState", "MiddlewareStats"]

_log = logging.getLogger(__name__)
_MODEL_NODE = "model"  # create_agent's model node
_DEFAULT_NAME = "LangGraph"  # a compiled graph's name when it was given none
# host names that only resolve on one's own network (RFC 6762 .local, RFC 8375 .home.arpa,
# the .internal and .lan of clouds, Docker and home routers, Kubernetes' .svc); a name
# with no dot (a Compose or Kubernetes service) is one too
_PRIVATE_SUFFIXES = (".local", ".localhost", ".internal", ".lan", ".home.arpa", ".svc")


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
    """Model calls that got tags (not those of an OpenAI model on another server than the
    ``engine=``'s, which go without)."""
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


def _base_url(model: Any) -> str | None:
    """The base URL an OpenAI chat model's requests go to (its SDK client's, which also
    reflects ``OPENAI_BASE_URL``), or ``None``."""
    base = getattr(getattr(model, "root_client", None), "base_url", None)
    if not base:
        base = getattr(model, "openai_api_base", None)
    return str(base).rstrip("/") if base else None


def _key(url: str | None) -> str | None:
    if not url:
        return None
    try:
        return server_key(url)
    except ValueError:
        return None


def _own_network(key: str | None) -> bool:
    """Whether a server key's host is this machine or on a private network: an address
    that is not global (loopback, private, link-local, the shared 100.64/10 of carrier NAT
    and overlay networks), ``localhost``, a name with no dot, or a name under a
    suffix only a private network resolves (:data:`_PRIVATE_SUFFIXES`). Decided from the
    URL alone (no lookup): a hosted API, or a gateway in front of one, is on a public
    name, and an unknown body field there can fail the request."""
    host = urlsplit(key).hostname if key else None
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        host = host.rstrip(".")
        return host == "localhost" or "." not in host or host.endswith(_PRIVATE_SUFFIXES)
    return not address.is_global


def _engine_key(engine: object) -> str | None:
    """The server key of ``engine=``: a URL, or an OpenAI chat model's base URL.

    Raises:
        ValueError: a string that is not an ``http(s)://`` URL.
        TypeError: anything else.
    """
    if engine is None:
        return None
    if isinstance(engine, str):
        return server_key(engine)
    base = _base_url(engine) if _is_openai(engine) else None
    if base:  # its SDK client's, as requests are matched (OPENAI_BASE_URL included)
        return server_key(base)
    raise TypeError(
        "engine= must be the vLLM server's OpenAI base URL, e.g. "
        "AgentSpecMiddleware(engine='http://127.0.0.1:8000/v1') (or a ChatOpenAI with that "
        f"base_url), got {type(engine).__name__}: {engine!r:.60}"
    )


def _provider_format(model: Any, tools: list[Any]) -> bool:
    """Whether ``create_agent`` serves a raw schema as the provider's own structured output
    for this model (else as a tool)."""
    try:
        from langchain.agents.factory import _supports_provider_strategy
    except ImportError:  # pragma: no cover - another langchain version
        return bool((getattr(model, "profile", None) or {}).get("structured_output"))
    return bool(_supports_provider_strategy(model, tools=tools))


def _tools_as_called(request: ModelRequest[Any]) -> tuple[list[Any], Any]:
    """The tools and ``tool_choice`` the model is called with: ``create_agent`` adds the
    ``response_format``'s tools, and forces a tool call, when it serves the format as a
    tool (``ToolStrategy``; a raw schema or ``AutoStrategy`` for a model without a native
    structured output)."""
    tools, choice = list(request.tools), request.tool_choice
    fmt: Any = request.response_format
    if fmt is None:
        return tools, choice
    if not isinstance(fmt, AutoStrategy | ToolStrategy | ProviderStrategy):
        fmt = AutoStrategy(schema=fmt)
    if isinstance(fmt, AutoStrategy):
        if _provider_format(request.model, request.tools):
            return tools, choice  # a provider's response_format: no tool
        fmt = ToolStrategy(schema=fmt.schema)
    if isinstance(fmt, ToolStrategy) and fmt.schema_specs:
        return [*tools, *(spec.name for spec in fmt.schema_specs)], "any"
    return tools, choice


def _last_answer_after_tool(messages: Sequence[BaseMessage]) -> Segment | None:
    """What the agent produced the last time it answered a tool result."""
    for before, after in zip(reversed(messages[:-1]), reversed(messages[1:]), strict=True):
        if isinstance(after, AIMessage) and isinstance(before, ToolMessage):
            return "tool_call" if after.tool_calls else "answer"
    return None


def _first_handler(callbacks: Any, handler: BaseCallbackHandler) -> Any:
    """``callbacks`` (a run config's: a manager, a list or ``None``) with ``handler``
    first, inherited by child runs; a manager is copied, never changed."""
    if isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.handlers.insert(0, handler)
        manager.inheritable_handlers.insert(0, handler)
        return manager
    return [handler, *(callbacks or [])]


class _StepTagger(BaseCallbackHandler):
    """Gives one model request's tags to the agent's model call(s) it makes.

    Runs inline (as :class:`~agentspec_mw_langgraph.handler.AgentSpecCallbackHandler`),
    first among the handlers: at each chat model (or LLM) start inside the request's
    ``handler(...)`` it puts the wire tags into the run's metadata (tracers show them)
    and, for a model that reads them there (``context``), into the per-call ContextVar,
    given back when the call ends (an end event sent from another context ends the
    ticket, which then reads as what it replaced). A call a middleware makes for itself
    inside the request (``LLMToolSelectorMiddleware``'s selection; LangChain marks such
    calls: :func:`~agentspec_mw_langgraph.derive.internal_call_source`) is not the agent's
    step and gets neither; nor do the calls of a ``generate`` batch.
    """

    run_inline = True

    def __init__(
        self, tags: StructureTags, *, context: bool, on_delivered: Callable[[], None]
    ) -> None:
        super().__init__()
        self.tags = tags
        self.context = context
        self._on_delivered = on_delivered
        self._tickets: dict[uuid.UUID, CallTicket] = {}
        self._lock = threading.Lock()

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: uuid.UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, metadata, kwargs.get("batch_size"))

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: uuid.UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, metadata, kwargs.get("batch_size"))

    def _start(self, run_id: uuid.UUID, metadata: dict[str, Any] | None, batch_size: Any) -> None:
        if derive.internal_call_source(metadata or {}) is not None:
            return  # a middleware's own call: not this agent step
        if isinstance(batch_size, int) and batch_size > 1:
            return  # one ContextVar, one shared metadata dict: not for a batch
        if isinstance(metadata, dict):  # the run's own dict, which tracers read
            metadata.update(tags_to_wire(self.tags))
        if not self.context:
            return
        ticket = CallTicket(None, self._on_delivered, previous=current_call())
        with self._lock:
            self._tickets[run_id] = ticket
        set_current_tags(self.tags, ticket)

    def _end(self, run_id: uuid.UUID) -> None:
        with self._lock:
            ticket = self._tickets.pop(run_id, None)
        if ticket is None:
            return
        restore = current_ticket() is ticket
        ticket.end()
        if restore:
            set_current_tags(*ticket.previous)

    def on_llm_end(self, response: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        self._end(run_id)


class AgentSpecMiddleware(AgentMiddleware[AgentSpecState, Any, Any]):
    """Tags every model call of a ``create_agent`` agent (see the module docstring); put it
    last in ``middleware=[...]``.

    Args:
        config: scope, blocks, segment overrides and the thread rule
            (``TaggingConfig``; its graph/trace fields are not used here).
        agent: the agent id for every call, a non-empty ``str`` (default: the agent's
            ``create_agent(name=...)``, else derived from the graph position).
        engine: the vLLM server's OpenAI base URL (``"http://127.0.0.1:8000/v1"``), or a
            ``ChatOpenAI`` with that ``base_url``: only OpenAI models whose base URL is
            that server get the tags (``localhost`` and ``127.0.0.1``, a trailing ``/`` or
            ``/v1`` do not matter). ``None``: any OpenAI model whose base URL is on this
            machine or a private network, with a warning to pass ``engine=``.

    Raises:
        TypeError: ``config`` is not a :class:`TaggingConfig`, ``agent`` is not a
            non-empty ``str``, or ``engine`` is not a URL or an OpenAI chat model with a
            ``base_url``.
        ValueError: ``engine`` is a string that is not an ``http(s)://`` URL.
    """

    state_schema = AgentSpecState

    def __init__(
        self,
        config: TaggingConfig | None = None,
        *,
        agent: str | None = None,
        engine: Any = None,
    ) -> None:
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
        self.engine = _engine_key(engine)
        """The server whose requests get the tags, as its normalised base URL
        (:func:`~agentspec_mw_langgraph.openai_hook.server_key`), or ``None``."""
        self._lock = threading.Lock()
        self._stats = MiddlewareStats()
        self._warned: set[str] = set()

    # locks do not copy: a copy (copy.deepcopy, pickle) gets its own, and the counters
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        with self._lock:
            state["_stats"] = replace(self._stats)
            state["_warned"] = set(self._warned)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def stats(self) -> MiddlewareStats:
        """A snapshot of the counters."""
        with self._lock:
            return replace(self._stats)

    def _count(self, field: str) -> None:
        with self._lock:
            setattr(self._stats, field, getattr(self._stats, field) + 1)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        _log.warning(message, *args)

    def _tags_server(self, model: Any) -> bool:
        """Whether the requests of an OpenAI chat model get the tags (its base URL is
        the engine's; without ``engine=``: is on this machine or a private network,
        :func:`_own_network`)."""
        base = _base_url(model)
        key = _key(base)
        if self.engine is not None:
            if key == self.engine:
                return True
            self._warn_once(
                f"other:{key or base}",
                "agentspec: model calls to %s go without tags: not the engine= server (%s)",
                base,
                self.engine,
            )
            return False
        if not _own_network(key):
            self._warn_once(
                f"public:{key or base}",
                "agentspec: model calls to %s go without tags: without engine= only a "
                "server on this machine or a private network gets them; to tag a vLLM "
                "server there pass AgentSpecMiddleware(engine=%r)",
                base or "the default OpenAI API",
                base or "http://<vllm-host>:8000/v1",
            )
            return False
        self._warn_once(
            "no-engine",
            "agentspec: AgentSpecMiddleware has no engine=: tagging the model calls to %s "
            "(a server on this machine or a private network); pass engine=%r so that "
            "only that vLLM server's requests carry tags",
            base,
            base,
        )
        return True

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
    def _agent_id(self, namespace: str) -> str:
        """``agent=``; else the agent's name after the nodes it runs under; else the
        model node's place in the graph."""
        if self.agent:
            return self.agent
        metadata = (var_child_runnable_config.get() or {}).get("metadata") or {}
        name = metadata.get("lc_agent_name")
        if not isinstance(name, str) or not name or name == _DEFAULT_NAME:
            return derive.agent_from_namespace(namespace, _MODEL_NODE, _MODEL_NODE)
        path = [node for node, _ in derive.split_namespace(namespace)]
        if path and path[-1] == _MODEL_NODE:
            path.pop()  # the agent's own model node: its name stands for it
        if not path or path[-1] != name:  # a subgraph node named after the agent: once
            path.append(name)
        return "/".join(path)

    def tags_for(self, request: ModelRequest[Any]) -> StructureTags:
        """The tags of one model request.

        Raises:
            ValueError: the state has no query id of the invocation (:meth:`before_agent`
                did not run) and the run has no thread to use instead.
        """
        info = getattr(request.runtime, "execution_info", None)
        namespace = str(getattr(info, "checkpoint_ns", "") or "")
        agent = self._agent_id(namespace)
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
        tools, tool_choice = _tools_as_called(request)
        segment = derive.predict_segment(
            node=_MODEL_NODE,
            tools_bound=bool(tools),
            tool_choice=tool_choice,
            last_is_tool_result=after_tool,
            previous_after_tool=_last_answer_after_tool(messages) if after_tool else None,
            overrides=self.config.tags_segment_by_node,
        )
        params = dict(getattr(request.model, "_identifying_params", {}) or {})
        params["tools"] = tools
        return StructureTags(
            scope=self.config.tags_scope,
            agent_id=_bounded(agent),
            query_id=_bounded(query),
            segment=segment,
            blocks=derive.blocks_for(params, self.config.tags_blocks),
        )

    def _attach(self, request: ModelRequest[Any], tags: StructureTags) -> ModelRequest[Any]:
        """The request with the tags on its OpenAI model (see the module docstring)."""
        model = request.model
        wire = tags_to_wire(tags)
        settings = dict(request.model_settings)
        update: dict[str, Any] = {}  # of the model (a copy for this call)

        def with_tags(extra: Any) -> dict[str, Any]:
            if not isinstance(extra, Mapping):
                raise TypeError(f"extra_body is {type(extra).__name__}, not a dict")
            xargs = extra.get("vllm_xargs")
            return {
                **extra,
                "vllm_xargs": {**wire, **(xargs if isinstance(xargs, Mapping) else {})},
            }

        if settings.get("extra_body") is not None:  # sent instead of the model's own
            settings["extra_body"] = with_tags(settings["extra_body"])
        else:
            update["extra_body"] = with_tags(getattr(model, "extra_body", None) or {})
        key = tags_routing_key(tags, self.config.routing_granularity)
        if key is not None:
            header = self.config.routing_header
            own = settings.get("extra_headers")
            model_kwargs = dict(getattr(model, "model_kwargs", None) or {})
            kwarg_headers = model_kwargs.get("extra_headers")
            defaults = getattr(model, "default_headers", None) or {}
            taken = {str(n).lower() for n in (*(own or {}), *(kwarg_headers or {}), *defaults)}
            if header.lower() not in taken:  # the caller's header wins
                if own is not None:
                    settings["extra_headers"] = {**own, header: key}
                else:  # model_kwargs go to the SDK's create() as they are
                    model_kwargs["extra_headers"] = {**(kwarg_headers or {}), header: key}
                    update["model_kwargs"] = model_kwargs
        tagged_model = model.model_copy(update=update) if update else model
        attached = request.override(model=tagged_model, model_settings=settings)
        self._count("tags_delivered")
        return attached

    def _prepare(self, request: ModelRequest[Any]) -> tuple[ModelRequest[Any], StructureTags]:
        """The request with its tags attached (OpenAI models), and the tags.

        Raises:
            Exception: whatever tagging raised, when ``adapter_raise_errors`` is set.
        """
        tags = self.tags_for(request)
        return (self._attach(request, tags) if _is_openai(request.model) else request), tags

    @contextmanager
    def _tagged(self, request: ModelRequest[Any]) -> Iterator[ModelRequest[Any]]:
        """The request to hand on, tagged, while the model calls inside run.

        The tags reach only the agent's own model call: the calls inside this
        middleware's ``handler(...)`` get them from a :class:`_StepTagger` given to
        them through the run config (first among the handlers), which skips the calls
        a middleware makes for itself (:func:`~.derive.internal_call_source`)."""
        self._count("model_calls")
        openai = _is_openai(request.model)
        if openai and not self._tags_server(request.model):
            yield request
            return
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
        tagger = _StepTagger(tags, context=not openai, on_delivered=self._delivered_once())
        tagger.raise_error = self.config.adapter_raise_errors  # else LangChain logs it
        config = var_child_runnable_config.get() or {}
        config_token = var_child_runnable_config.set(
            {**config, "callbacks": _first_handler(config.get("callbacks"), tagger)}
        )
        previous = current_call()
        set_current_tags(None)  # only the tagger sets them, at the agent's call
        try:
            yield tagged
        finally:
            set_current_tags(*previous)
            var_child_runnable_config.reset(config_token)

    def _delivered_once(self) -> Callable[[], None]:
        """A delivery callback for one model request: counted once, however many
        attempts (a retry middleware inside this one) sent the tags."""
        done = threading.Event()

        def delivered() -> None:
            if not done.is_set():
                done.set()
                self._count("tags_delivered")

        return delivered

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
