"""``with_agentspec(graph)``: attach the AgentSpec callback adapter to a compiled graph."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from langchain_core.callbacks import BaseCallbackManager
from langgraph.pregel import Pregel

from agentspec_mw_langgraph.config import AgentSpecConfig
from agentspec_mw_langgraph.handler import AgentSpecCallbackHandler

__all__ = ["get_handler", "with_agentspec"]

_log = logging.getLogger(__name__)
G = TypeVar("G", bound=Pregel)


def get_handler(graph: Pregel) -> AgentSpecCallbackHandler | None:
    """The AgentSpec handler attached to ``graph`` by :func:`with_agentspec`, if any."""
    callbacks = (graph.config or {}).get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        callbacks = callbacks.handlers
    for cb in callbacks or ():
        if isinstance(cb, AgentSpecCallbackHandler):
            return cb
    return None


def with_agentspec(
    graph: G,
    *,
    engine: Any = None,
    config: AgentSpecConfig | None = None,
) -> G:
    """Return a copy of ``graph`` whose LLM calls carry AgentSpec structure tags.

    The copy is ``graph.with_config(callbacks=[handler])`` -- the same compiled graph type,
    so invoke/ainvoke, every stream mode, astream_events, batch, checkpointers,
    interrupts, ``configurable`` and use as a subgraph work unchanged. Wrapping an already
    wrapped graph returns it as it is (a differing ``config`` is ignored with a warning);
    passing its handler again at call time does not double-count.

    Args:
        graph: a compiled LangGraph graph (``StateGraph.compile()``, ``create_agent``...).
        engine: where the graph's models run. A vLLM server's base URL (``"http://host:
            8000/v1"``): OpenAI-SDK requests to it (any ``ChatOpenAI`` with that
            ``base_url``) get the tags as ``vllm_xargs`` with no change to the models
            (:func:`~agentspec_mw_langgraph.openai_hook.enable_openai_injection`). An
            embedded engine or chat model: kept as ``handler.engine`` for the caller (the
            engine-backed chat model sends the tags itself). ``None``: nothing to set up.
        config: how to tag; defaults to :class:`AgentSpecConfig()`.

    The handler is :func:`get_handler(result) <get_handler>`.

    Raises:
        ValueError: ``engine`` is a string that is not an ``http(s)://`` URL.
        OpenAIHookError: ``engine`` is a URL and the OpenAI SDK cannot be hooked.
    """
    if isinstance(engine, str):
        from agentspec_mw_langgraph.openai_hook import enable_openai_injection

        enable_openai_injection(engine)
    existing = get_handler(graph)
    if existing is not None:
        if config is not None and config != existing.config:
            _log.warning("agentspec: graph is already wrapped; keeping its existing config")
        return graph
    handler = AgentSpecCallbackHandler(config, engine=engine)
    return graph.with_config(callbacks=[handler])
