"""``with_agentspec(graph)``: attach the AgentSpec callback adapter to a compiled graph."""

from __future__ import annotations

import logging
import sys
from typing import Any, TypeVar

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.language_models import BaseLanguageModel
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel

from agentspec_mw_langgraph.config import TaggingConfig
from agentspec_mw_langgraph.handler import AgentSpecCallbackHandler

__all__ = ["get_handler", "with_agentspec"]

_log = logging.getLogger(__name__)
G = TypeVar("G", bound=Pregel)
_ENGINES = (
    "the vLLM server's OpenAI base URL (engine='http://127.0.0.1:8000/v1'), an embedded "
    "engine (agentspec_mw_vllm.build_llm(...)), a chat model (ChatAgentSpecVLLM(...)), "
    "or nothing"
)


def get_handler(graph: Pregel) -> AgentSpecCallbackHandler | None:
    """The AgentSpec handler attached to ``graph`` by :func:`with_agentspec`, if any."""
    callbacks = (graph.config or {}).get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        callbacks = callbacks.handlers
    for cb in callbacks or ():
        if isinstance(cb, AgentSpecCallbackHandler):
            return cb
    return None


def _check_graph(graph: object) -> None:
    if isinstance(graph, Pregel):
        return
    name = type(graph).__name__
    if isinstance(graph, StateGraph):
        raise TypeError(
            f"with_agentspec got a {name} builder, not a compiled graph: call .compile() "
            "first, e.g. with_agentspec(builder.compile(checkpointer=...))"
        )
    if isinstance(graph, BaseLanguageModel):
        raise TypeError(
            f"with_agentspec got a chat model ({name}), not a graph: wrap the graph that "
            "uses it, e.g. with_agentspec(create_agent(model, tools)); for create_agent "
            "you can also add middleware=[AgentSpecMiddleware()] instead"
        )
    raise TypeError(
        f"with_agentspec needs a compiled LangGraph graph (StateGraph(...).compile(), "
        f"create_agent(...)), got {graph!r} ({name})"
    )


def _check_config(config: object) -> None:
    if config is None or isinstance(config, TaggingConfig):
        return
    if isinstance(config, dict):
        raise TypeError(
            f"config={config!r} is a dict: pass TaggingConfig(**...) instead, e.g. "
            "config=TaggingConfig(tags_scope='tenant-a') "
            "(from agentspec_mw_langgraph import TaggingConfig)"
        )
    cls = type(config)
    if cls.__module__ == "agentspec_mw.agentspec.config":
        raise TypeError(
            f"config= got the proposer's {cls.__module__}.{cls.__name__}, which configures "
            "the drafter inside the engine: pass it there (build_llm(proposer_options="
            "{...}) or agentspec serve --proposer-options '{...}'). with_agentspec takes "
            "TaggingConfig (how the graph's calls are tagged)"
        )
    raise TypeError(f"config= must be an agentspec_mw_langgraph.TaggingConfig, got {cls.__name__}")


def _check_engine(engine: object) -> None:
    if engine is None or isinstance(engine, str | BaseLanguageModel):
        return
    cls = type(engine)
    if cls.__module__.split(".")[0] == "vllm":  # vllm.LLM, AsyncLLM
        return
    if callable(getattr(engine, "generate", None)) and callable(
        getattr(engine, "get_tokenizer", None)
    ):  # an EngineBackend
        return
    raise TypeError(f"engine={engine!r} ({cls.__name__}) is not an engine: pass {_ENGINES}")


def _install_hook(engine: object) -> None:
    """The OpenAI-SDK hook: required for a server URL; else, when the OpenAI SDK is in
    use, only so that untagged requests from the graph's clients can be warned about."""
    from agentspec_mw_langgraph.openai_hook import OpenAIHookError, install_openai_hook

    if isinstance(engine, str) or getattr(engine, "openai_api_base", None):
        install_openai_hook()
    elif "openai" in sys.modules:
        try:
            install_openai_hook()
        except OpenAIHookError as exc:
            _log.debug("agentspec: no OpenAI hook (%s)", exc)


def with_agentspec(
    graph: G,
    *,
    engine: Any = None,
    config: TaggingConfig | None = None,
) -> G:
    """Return a copy of ``graph`` whose LLM calls carry AgentSpec structure tags.

    The copy is ``graph.with_config(callbacks=[handler])`` -- the same compiled graph type,
    so invoke/ainvoke, every stream mode, astream_events, batch, checkpointers,
    interrupts, ``configurable`` and use as a subgraph work unchanged. A wrapped subgraph
    under an unwrapped parent sees each of its invocations as a run of its own: the
    siblings of a ``Send`` fan-out of it get a query each, unless the outermost graph is
    wrapped (one query, with its fan-out group) or the run has a ``thread_id`` (one query,
    the thread's, where the siblings read as repeats of one agent). Wrapping an already
    wrapped graph returns it as it is (a differing ``config`` or ``engine`` is ignored with
    a warning); passing its handler again at call time does not double-count.

    Args:
        graph: a compiled LangGraph graph (``StateGraph.compile()``, ``create_agent``...).
        engine: where the graph's models run. A vLLM server's base URL (``"http://host:
            8000/v1"``): the OpenAI-SDK requests the graph's calls send to that server
            (any ``ChatOpenAI`` whose ``base_url`` is the same server: ``localhost`` and
            ``127.0.0.1``, a trailing ``/`` or ``/v1`` do not matter) carry the tags as
            ``vllm_xargs``, with no change to the models
            (:mod:`~agentspec_mw_langgraph.openai_hook`); requests to other servers are
            untouched and warned about once. A ``ChatOpenAI`` with a ``base_url``: the
            same, for its server. An embedded engine or another chat model: kept as
            ``handler.engine`` (the engine-backed chat model sends the tags itself).
            ``None``: no server gets tags; a call that sends an OpenAI request logs a
            warning naming the ``engine=`` to pass.
        config: how to tag (:class:`~agentspec_mw_langgraph.config.TaggingConfig`);
            defaults to ``TaggingConfig()``.

    The handler is :func:`get_handler(result) <get_handler>`.

    Raises:
        TypeError: ``graph`` is not a compiled graph (a ``StateGraph`` builder, a chat
            model, ``None``...), ``config`` is not a ``TaggingConfig`` (a dict, the
            proposer's ``AgentSpecConfig``...), or ``engine`` is none of the above.
        ValueError: ``engine`` is a string that is not an ``http(s)://`` URL.
        OpenAIHookError: ``engine`` is a URL and the OpenAI SDK cannot be hooked.
    """
    _check_graph(graph)
    _check_config(config)
    _check_engine(engine)
    if isinstance(engine, str):
        from agentspec_mw_langgraph.openai_hook import server_key

        server_key(engine)  # ValueError before anything is installed
    _install_hook(engine)
    existing = get_handler(graph)
    if existing is not None:
        if config is not None and config != existing.config:
            _log.warning("agentspec: graph is already wrapped; keeping its existing config")
        if engine is not None and engine is not existing.engine and engine != existing.engine:
            _log.warning("agentspec: graph is already wrapped; keeping its existing engine")
        return graph
    handler = AgentSpecCallbackHandler(config, engine=engine)
    return graph.with_config(callbacks=[handler])
