"""Fixtures of the LangGraph adapter tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentspec_mw_langgraph import TaggingConfig
from agentspec_mw_langgraph.shared import release_shared_engines

from .fake_engine import FakeLLM, FakeStepEngine


@pytest.fixture()
def strict() -> TaggingConfig:
    """Adapter config that raises on any adapter bug (LangChain would swallow it)."""
    return TaggingConfig(adapter_raise_errors=True)


@pytest.fixture()
def builds(tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeLLM]]:
    """``build_llm`` replaced by fake engines answering ``engine<n>`` (n-th build)."""
    import agentspec_mw_vllm.engine as engine_mod

    built: list[FakeLLM] = []

    def fake_build_llm(model: Any, **kwargs: Any) -> FakeLLM:
        name = f"engine{len(built) + 1}"
        llm = FakeLLM(tiny_tokenizer, FakeStepEngine(lambda ids: name))
        built.append(llm)
        return llm

    monkeypatch.setattr(engine_mod, "build_llm", fake_build_llm)
    release_shared_engines()
    yield built
    release_shared_engines()
