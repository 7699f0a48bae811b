"""AgentSpec-MW: speculative decoding middleware for batch inference of LLM agents."""

from __future__ import annotations

from typing import Any

__all__ = ["with_agentspec"]


def __getattr__(name: str) -> Any:
    """``agentspec_mw.with_agentspec``: imported from the LangGraph integration on first use.

    The core never imports LangGraph at import time; this attribute needs the
    ``agentspec-mw-langgraph`` distribution.
    """
    if name == "with_agentspec":
        try:
            from agentspec_mw_langgraph import with_agentspec
        except ImportError as exc:
            from agentspec_mw.errors import MissingDependencyError

            raise MissingDependencyError(
                "agentspec-mw-langgraph",
                "agentspec_mw.with_agentspec",
                "pip install agentspec-mw-langgraph   (or: bash scripts/bootstrap.sh)",
            ) from exc
        return with_agentspec
    raise AttributeError(f"module 'agentspec_mw' has no attribute {name!r}")
