"""``build_llm`` collects and freezes the heap before an in-process engine core's init (which
freezes it at its end anyway), and leaves a heap it froze unfrozen when the build fails."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

import agentspec_mw_vllm.engine as engine_mod


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The test starts on an unfrozen heap; a heap an engine of an earlier test froze is
    frozen again after it (the freeze only spares the collector static objects)."""
    was = gc.get_freeze_count()
    gc.unfreeze()
    yield
    if was:
        gc.freeze()


def test_the_heap_is_frozen_only_with_the_engine_core_in_this_process(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert engine_mod._freeze_heap_for_build() is False
    assert gc.get_freeze_count() == 0
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert engine_mod._freeze_heap_for_build() is True
    assert gc.get_freeze_count() > 0
    assert engine_mod._freeze_heap_for_build() is False  # it was frozen already


@pytest.mark.parametrize("already_frozen", [False, True])
def test_a_failed_build_leaves_the_heap_as_the_caller_had_it(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch, already_frozen: bool
) -> None:
    vllm = pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    def refuse(**kwargs: Any) -> Any:
        assert gc.get_freeze_count() > 0  # frozen while vLLM builds
        raise ValueError("no engine today")

    monkeypatch.setattr(vllm, "LLM", refuse)
    monkeypatch.setattr(engine_mod, "engine_kwargs", lambda *a, **k: {})
    if already_frozen:
        gc.freeze()
    with pytest.raises(ValueError, match="no engine today"):
        engine_mod.build_llm()
    assert (gc.get_freeze_count() > 0) is already_frozen
