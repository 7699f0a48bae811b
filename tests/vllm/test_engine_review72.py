"""Review 72 (a new user's walkthrough): building the in-process engine left the caller's
Python and numpy RNGs reseeded to the engine seed (vLLM seeds the process's global RNGs
when it builds its worker, here in this process), and the plugin's kernel rebinding made a
deprecated torch alias print a FutureWarning naming the plugin on every engine start."""

from __future__ import annotations

import random
import sys
import types
import warnings
from typing import Any

import numpy as np
import pytest


def test_building_the_engine_gives_back_the_callers_random_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vllm
    from vllm.utils.torch_utils import set_random_seed

    from agentspec_mw_vllm import engine, plugin

    class SeedingLLM:  # what vLLM's in-process LLM does to the global RNGs
        def __init__(self, **kwargs: Any) -> None:
            set_random_seed(kwargs["seed"])

    monkeypatch.setattr(vllm, "LLM", SeedingLLM)
    monkeypatch.setattr(plugin, "register", lambda: None)
    monkeypatch.setattr(engine, "apply_env_defaults", lambda **kw: None)
    random.seed(1234)
    np.random.seed(1234)
    want = (random.random(), float(np.random.random()))
    random.seed(1234)
    np.random.seed(1234)
    llm = engine.build_llm("some-model", seed=0)
    assert isinstance(llm, SeedingLLM)
    # before: seed 0's first draws (0.844..., 0.548...)
    assert (random.random(), float(np.random.random())) == want


def test_rebinding_kernels_does_not_warn_about_deprecated_aliases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentspec_mw_vllm.plugin import _safe_rebind_kernels

    class Deprecated:
        @property
        def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
            warnings.warn("deprecated alias", FutureWarning, stacklevel=2)
            return {}

    module = types.ModuleType("agentspec_review72_fake")
    module.alias = Deprecated()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        _safe_rebind_kernels([])
    assert [str(w.message) for w in shown] == []
