"""Read, from a vLLM source tree, the facts the plugin's patch relies on.

Used live on the installed vLLM by ``test_contract.py``, and as a script to record the
facts of another release (e.g. an unpacked wheel) as a fixture::

    python -m tests.vllm.vllm_source path/to/site-packages/vllm > tests/vllm/fixtures/vllm-X.json

The facts: the version; ``GPUModelRunner.propose_draft_token_ids``' parameters and the
body of its ``custom_class`` branch; every call of it in ``GPUModelRunner`` (arguments
as written); whether the runner builds the drafter with ``create_custom_proposer`` and
calls its ``load_model``; the speculative methods ``VllmConfig`` sends back from Model
Runner V2 to V1.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["contract_facts"]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"class {name} not found")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{cls.name}.{name} not found")


def _version(root: Path) -> str:
    text = (root / "_version.py").read_text()
    m = re.search(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)['"]""", text)
    if m is None:
        raise LookupError("no __version__ in _version.py")
    return m.group(1)


def _custom_class_branch(func: ast.FunctionDef) -> list[str]:
    for node in ast.walk(func):
        if isinstance(node, ast.If) and "'custom_class'" in ast.unparse(node.test):
            if ast.unparse(node.test) == "spec_config.method == 'custom_class'":
                return [ast.unparse(stmt) for stmt in node.body]
    raise LookupError("no custom_class branch in propose_draft_token_ids")


def _call_sites(cls: ast.ClassDef) -> list[dict[str, Any]]:
    sites = []
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef):
            continue
        for node in ast.walk(method):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "self.propose_draft_token_ids"
            ):
                sites.append(
                    {
                        "in": method.name,
                        "args": [ast.unparse(a) for a in node.args],
                        "keywords": [k.arg for k in node.keywords],
                    }
                )
    return sites


def _v2_fallback_methods(config: ast.ClassDef) -> list[str]:
    func = _method(config, "_get_v2_model_runner_unsupported_features")
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Compare)
            and ast.unparse(node.left) == "speculative_config.method"
            and isinstance(node.ops[0], ast.In)
            and isinstance(node.comparators[0], ast.Tuple)
        ):
            return [ast.literal_eval(e) for e in node.comparators[0].elts]
    raise LookupError("no speculative-method check in _get_v2_model_runner_unsupported_features")


def contract_facts(root: Path) -> dict[str, Any]:
    """The facts (see the module doc) of the vLLM package at ``root`` (the ``vllm`` dir)."""
    runner_src = (root / "v1" / "worker" / "gpu_model_runner.py").read_text()
    runner = _class(ast.parse(runner_src), "GPUModelRunner")
    propose = _method(runner, "propose_draft_token_ids")
    args = propose.args
    runner_text = re.sub(r"\s+", "", runner_src)
    config = _class(ast.parse((root / "config" / "vllm.py").read_text()), "VllmConfig")
    use_v2 = ast.unparse(_method(config, "use_v2_model_runner"))
    return {
        "version": _version(root),
        "propose_params": [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]],
        "custom_class_branch": _custom_class_branch(propose),
        "call_sites": _call_sites(runner),
        "builds_custom_proposer": "self.drafter=create_custom_proposer(" in runner_text,
        "loads_drafter_model": "self.drafter.load_model(self.model)" in runner_text,
        "v2_fallback_methods": _v2_fallback_methods(config),
        "v2_env_var_overrides_fallback": (
            use_v2.index("envs.VLLM_USE_V2_MODEL_RUNNER\n")
            < use_v2.index("_get_v2_model_runner_unsupported_features")
        ),
    }


if __name__ == "__main__":
    print(json.dumps(contract_facts(Path(sys.argv[1])), indent=2))
