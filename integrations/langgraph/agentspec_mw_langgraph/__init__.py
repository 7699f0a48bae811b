"""AgentSpec-MW for LangGraph: ``with_agentspec(graph)``, the callback adapter, the
``create_agent`` middleware, the redundancy graph, tag-forwarding chat models and trace
recording (docs/langgraph.md)."""

from __future__ import annotations

from typing import Any

from agentspec_mw_langgraph.config import TaggingConfig
from agentspec_mw_langgraph.context import current_tags, current_wire_tags
from agentspec_mw_langgraph.handler import AdapterStats, AgentSpecCallbackHandler
from agentspec_mw_langgraph.recorder import TraceRecorder
from agentspec_mw_langgraph.redundancy import CallNode, Edge, Group, RedundancyGraph
from agentspec_mw_langgraph.routing import routing_headers
from agentspec_mw_langgraph.wrap import get_handler, with_agentspec

__all__ = [
    "AdapterStats",
    "AgentSpecCallbackHandler",
    "AgentSpecMiddleware",
    "CallNode",
    "ChatAgentSpecVLLM",
    "Edge",
    "Group",
    "RedundancyGraph",
    "TaggingConfig",
    "TraceRecorder",
    "agentspec_chat_openai",
    "agentspec_http_clients",
    "current_tags",
    "current_wire_tags",
    "get_handler",
    "routing_headers",
    "with_agentspec",
]

_LAZY = {
    "AgentSpecMiddleware": "agentspec_mw_langgraph.middleware",
    "ChatAgentSpecVLLM": "agentspec_mw_langgraph.engine_chat",
    "agentspec_chat_openai": "agentspec_mw_langgraph.openai",
    "agentspec_http_clients": "agentspec_mw_langgraph.openai",
}


def __getattr__(name: str) -> Any:
    """Import the chat-model and middleware layers on first use (they pull optional
    dependencies); ``AgentSpecConfig`` is the deprecated name of :class:`TaggingConfig`."""
    if name == "AgentSpecConfig":
        from agentspec_mw_langgraph.config import deprecated_alias

        return deprecated_alias()
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentspec_mw_langgraph' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
