"""Helpers several test modules share: loading a repository script as a module, and a
proposer whose drafts are always wrong."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from agentspec_mw.proposer import Draft, StepContext, TokenIds

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


def script(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` as the scripts run: their folder on ``sys.path``."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return load_module(BENCHMARKS / f"{name}.py", name)


class Wrong:
    """Always drafts k tokens that are never right."""

    name = "wrong"

    def start(self, req_id: str, prompt_ids: TokenIds, tags: object = None) -> None: ...
    def extend(self, req_id: str, token_ids: TokenIds) -> None: ...
    def stop(self, req_id: str) -> None: ...

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        return [Draft((-1,) * k) for _ in req_ids]
