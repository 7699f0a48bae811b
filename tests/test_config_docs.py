"""docs/configuration.md is generated from the config models and must be up to date."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", ROOT / "scripts" / "gen_config_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_page_is_current() -> None:
    gen = _generator()
    assert (ROOT / "docs" / "configuration.md").read_text() == gen.render(), (
        "docs/configuration.md is stale: run python scripts/gen_config_docs.py"
    )


def test_every_field_of_every_model_is_documented() -> None:
    gen = _generator()
    page = gen.render()
    for _, ref, _ in gen.MODELS:
        cls = gen._load(ref)
        docs = gen.field_sources(cls)
        for name in cls.model_fields:
            assert f"| `{name}` |" in page, f"{ref}.{name} missing"
            assert docs.get(name, ("", ""))[1], f"{ref}.{name} has no docstring"


class _Example(BaseModel):
    """An example."""

    size: int = Field(default=3, ge=1)
    """How big | wide."""
    names: list[str] = Field(default_factory=lambda: ["a"])
    """Names."""
    path: str
    """Required."""


def test_render_reads_types_defaults_constraints_and_docstrings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = _generator()
    monkeypatch.setattr(gen, "_load", lambda ref: _Example)
    text = gen.render_model("Example", "mod:_Example", "Used here.")
    assert "| `size` | `int` | `3` | ≥ 1 | How big \\| wide. |" in text
    assert "| `names` | `list[str]` | `['a']` |  | Names. |" in text
    assert "| `path` | `str` | **required** |  | Required. |" in text
