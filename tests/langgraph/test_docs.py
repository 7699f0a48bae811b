"""The Python examples of docs/langgraph.md run (except engine/server ones and sketches)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "langgraph.md"
SKIP = ("# needs:", "# sketch")


def test_doc_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    runnable = [b for b in blocks if not b.lstrip().startswith(SKIP)]
    assert len(runnable) >= 4
    module = types.ModuleType("docs_langgraph")  # a real module: type hints resolve in it
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for i, block in enumerate(runnable):
        exec(compile(block, f"{DOC.name}[python block {i}]", "exec"), module.__dict__)  # noqa: S102
