"""Helpers several test modules share: loading a repository script as a module, a package
faked for ``importlib.util.find_spec``, small synthetic ReAct-like calls, a proposer
whose drafts are always wrong, and one row of an ``agentspec bench --json`` report."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from agentspec_mw.proposer import Draft, StepContext, TokenIds
from agentspec_mw.replay.sim import ReplayCall

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def load_module(path: Path, name: str) -> ModuleType:
    """Import the file at ``path`` as module ``name`` (registered in ``sys.modules``, so
    dataclasses and pickling inside it work)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def fake_find_spec(monkeypatch: pytest.MonkeyPatch, name: str, spec: Any) -> None:
    """``importlib.util.find_spec(name)`` answers ``spec`` (``None``: not installed); other
    names as before."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda wanted, *a: spec if wanted == name else real(wanted, *a),
    )


def script(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` as the scripts run: their folder on ``sys.path``."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return load_module(BENCHMARKS / f"{name}.py", name)


REACT_TEXT = b"Thought: search the flight.\nAction: search[flight 42]\nObservation: ok\n"


def react_calls(n: int, *, grow: int, text: bytes = REACT_TEXT) -> list[ReplayCall]:
    """``n`` byte-token calls over two runs: call ``i``'s prompt is ``Question i: `` +
    ``text``, its output the first ``30 + grow * i`` bytes of ``text``."""
    return [
        ReplayCall(
            req_id=f"c{i}",
            run_id=f"run{i % 2}",
            prompt=np.frombuffer(b"Question %d: " % i + text, np.uint8).astype(np.int32),
            output=np.frombuffer(text[: 30 + grow * i], np.uint8).astype(np.int32),
        )
        for i in range(n)
    ]


class Wrong:
    """Always drafts k tokens that are never right."""

    name = "wrong"

    def start(self, req_id: str, prompt_ids: TokenIds, tags: object = None) -> None: ...
    def extend(self, req_id: str, token_ids: TokenIds) -> None: ...
    def stop(self, req_id: str) -> None: ...

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        return [Draft((-1,) * k) for _ in req_ids]


def bench_row(label: str, n: int, tput: list[float], acc: float | None = None) -> dict[str, Any]:
    """One ``agentspec bench --json`` row of ``label`` on the demo at ``n`` with these
    repeats' tok/s (``acc``: its acceptance)."""
    return {
        "label": label, "app": "demo", "n": n, "repeats": len(tput),
        "tokens_per_s": float(np.median(tput)), "ratio_to_none": 1.0,
        "tokens_per_s_repeats": tput, "tpot_p50_ms": None, "tpot_p99_ms": None,
        "latency_p50_s": 1.0, "drafted": 100, "accepted": 50, "acceptance": acc,
        "rejection": None, "proposer_ms_per_step": None, "fit_error_median": None,
        "fit_error_mean": None, "fit_steps": 0, "per_agent_acceptance": {},
        "per_block": {}, "identical_to_none": True, "load_avg": 1.0,
    }  # fmt: skip
