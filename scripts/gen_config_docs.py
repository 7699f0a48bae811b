"""Generate docs/configuration.md from the pydantic config models (fields, types,
defaults, constraints and the docstring under each field).

    python scripts/gen_config_docs.py          # rewrite docs/configuration.md
    python scripts/gen_config_docs.py --check  # exit 1 if the committed file is stale

The field docstrings are read from the class source (attribute docstrings), so the page
says exactly what the code says; ``tests/test_config_docs.py`` fails when it is stale.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "configuration.md"

#: (section title, "module:Class", where it is used) in page order.
MODELS: list[tuple[str, str, str]] = [
    (
        "LangGraph adapter",
        "agentspec_mw_langgraph.config:TaggingConfig",
        "`with_agentspec(graph, config=TaggingConfig(...))` or `AgentSpecMiddleware(TaggingConfig"
        "(...))` — how a graph's calls are tagged (import: `from agentspec_mw_langgraph import "
        "TaggingConfig`; `AgentSpecConfig` is its deprecated former name).",
    ),
    (
        "AgentSpec proposer",
        "agentspec_mw.agentspec.config:AgentSpecConfig",
        "Options of the AgentSpec proposer: `build_llm(proposer_options={...})`, "
        "`agentspec serve --proposer-options '{...}'`, or `agentspec replay --set "
        "agentspec.OPTION=VALUE`.",
    ),
    (
        "AgentSpec proposer: experimental",
        "agentspec_mw.agentspec.config:_ExperimentalConfig",
        "Ablation switches and model constants of the AgentSpec proposer, for benchmarks: "
        '`experimental={...}` of the options above (`{"experimental": {"sources": ["iso"]}}`),'
        " or `agentspec replay --set agentspec.experimental.OPTION=VALUE`. The defaults are "
        "the design; their former top-level names still work, with a `DeprecationWarning`.",
    ),
    (
        "vLLM drafter",
        "agentspec_mw_vllm.config:DrafterConfig",
        'Which proposer the vLLM adapter drives: `additional_config={"agentspec": {...}}`, '
        "or the `AGENTSPEC_PROPOSER`, `AGENTSPEC_PROPOSER_OPTIONS`, `AGENTSPEC_COST_MODEL` "
        "environment variables (`build_llm` and `agentspec serve` fill it in).",
    ),
    (
        "vLLM server",
        "agentspec_mw_vllm.serve:ServeConfig",
        "`agentspec serve` (its command-line options map onto these fields).",
    ),
    (
        "Replay",
        "agentspec_mw.replay.run:ReplayConfig",
        "`agentspec replay` (the `config` object of its JSON report).",
    ),
    (
        "SuffixDecoding peer",
        "agentspec_mw.peers.suffix:SuffixConfig",
        "Options of the `suffix` proposer of the replay tool (`--set suffix.OPTION=VALUE`).",
    ),
    (
        "n-gram peer",
        "agentspec_mw.peers.ngram:NgramConfig",
        "Options of the `ngram` proposer of the replay tool (`--set ngram.OPTION=VALUE`).",
    ),
]

_CONSTRAINTS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "min length",
                "max_length": "max length"}  # fmt: skip


def _load(ref: str) -> type[BaseModel]:
    module, _, name = ref.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        raise TypeError(f"{ref} is not a pydantic model")
    return cls


def field_sources(cls: type[BaseModel]) -> dict[str, tuple[str, str]]:
    """``{field: (annotation as written, docstring)}`` from the class source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, tuple[str, str]] = {}
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = ""
            nxt = body[i + 1] if i + 1 < len(body) else None
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                doc = inspect.cleandoc(nxt.value.value)
            out[node.target.id] = (ast.unparse(node.annotation), doc)
    return out


def _default(info: Any) -> str:
    if info.default_factory is not None:
        return f"`{info.default_factory()!r}`"
    if info.default is PydanticUndefined:
        return "**required**"
    return f"`{info.default!r}`"


def _constraints(info: Any) -> str:
    parts = []
    for meta in info.metadata:
        for attr, symbol in _CONSTRAINTS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_model(title: str, ref: str, usage: str) -> str:
    """One section: the class docstring, where it is used, and a table of its fields."""
    cls = _load(ref)
    sources = field_sources(cls)
    module, _, name = ref.partition(":")
    lines = [f"## {title}: `{name}`", "", f"`{module}.{name}`. {usage}", ""]
    if cls.__doc__:
        lines += [inspect.cleandoc(cls.__doc__), ""]
    lines += [
        "| field | type | default | constraints | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for field, info in cls.model_fields.items():
        annotation, doc = sources.get(field, (str(info.annotation), info.description or ""))
        lines.append(
            f"| `{field}` | `{_cell(annotation)}` | {_cell(_default(info))} | "
            f"{_cell(_constraints(info))} | {_cell(doc)} |"
        )
    return "\n".join(lines) + "\n"


def render() -> str:
    """The whole page."""
    head = (
        "# Configuration reference\n\n"
        "Generated by `scripts/gen_config_docs.py` from the config models; do not edit by "
        "hand (`tests/test_config_docs.py` fails when this page is stale). Every model is "
        "validated: an out-of-range value raises a `ValueError` that names the field.\n"
    )
    toc = "\n".join(f"- [{title}](#{_anchor(title, ref)})" for title, ref, _ in MODELS)
    sections = [render_model(*m) for m in MODELS]
    return head + "\n" + toc + "\n\n" + "\n".join(sections)


def _anchor(title: str, ref: str) -> str:
    text = f"{title}: {ref.partition(':')[2]}".lower()
    return "".join(c for c in text.replace(" ", "-") if c.isalnum() or c in "-_")


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with ``--check`` report whether it is up to date."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run python scripts/gen_config_docs.py")
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
