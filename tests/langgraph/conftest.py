"""Fixtures of the LangGraph adapter tests."""

from __future__ import annotations

import pytest

from agentspec_mw_langgraph import TaggingConfig


@pytest.fixture()
def strict() -> TaggingConfig:
    """Adapter config that raises on any adapter bug (LangChain would swallow it)."""
    return TaggingConfig(adapter_raise_errors=True)
