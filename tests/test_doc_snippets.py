"""The Python snippets a new user copies first run as written: README.md's and
docs/quickstart.md's (the embedded engine and the server, each pair in one namespace, as a
reader runs them one after the other), and docs/vllm.md's (the embedded engine's API, a
stored bench report read back). docs/langgraph.md's examples: tests/langgraph/test_docs.py.

The snippets build apps but do not call them (their models would need the engine or a
server); building checks every name and argument they use."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.DOTALL)


def _run(page: str, blocks: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run ``blocks`` one after the other in one module namespace; return it."""
    module = types.ModuleType("doc_" + re.sub(r"\W", "_", page))
    monkeypatch.setitem(sys.modules, module.__name__, module)  # type hints resolve in it
    for i, block in enumerate(blocks):
        exec(compile(block, f"{page}[python block {i}]", "exec"), module.__dict__)  # noqa: S102
    return module.__dict__


def _tagged_app(app: Any) -> None:
    from langgraph.graph.state import CompiledStateGraph

    from agentspec_mw_langgraph import get_handler

    assert isinstance(app, CompiledStateGraph)
    assert get_handler(app) is not None  # with_agentspec attached its handler


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_the_first_snippets_build_tagged_apps(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("langchain_openai")
    embedded, server = _blocks(page)
    ns = _run(page, [embedded], monkeypatch)
    _tagged_app(ns["app"])  # the embedded engine starts at the app's first call, not here
    ns = _run(page, [embedded, server], monkeypatch)  # the second uses the first's tool
    _tagged_app(ns["app"])
    assert str(ns["llm"].openai_api_base) == "http://127.0.0.1:8000/v1"


def test_the_stored_bench_report_reads_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (block,) = [b for b in _blocks("docs/vllm.md") if "read_report" in b]
    monkeypatch.chdir(ROOT)  # the snippet's path is the repository's
    _run("docs/vllm.md", [block], monkeypatch)
    assert float(capsys.readouterr().out) > 0


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_embedded_engine_snippet_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("vllm")
    (block,) = [b for b in _blocks("docs/vllm.md") if "build_llm()" in b]
    ns = _run("docs/vllm.md", [block], monkeypatch)
    assert ns["out"][0].outputs[0].token_ids  # it generated
    assert "drafted" in capsys.readouterr().out  # the metrics snapshot was printed
