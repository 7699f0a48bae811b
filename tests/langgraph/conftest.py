"""Fixtures of the LangGraph adapter tests."""

from __future__ import annotations

import pytest

from agentspec_mw_langgraph import AgentSpecConfig


@pytest.fixture()
def strict() -> AgentSpecConfig:
    """Adapter config that raises on any adapter bug (LangChain would swallow it)."""
    return AgentSpecConfig(adapter_raise_errors=True)
