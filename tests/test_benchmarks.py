"""The benchmark scripts that drive ``agentspec replay`` run end to end on the sample trace."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.peers
def test_rejection_frontier_end_to_end(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frontier = _script("rejection_frontier")
    out = tmp_path / "frontier"
    argv = ["--traces", str(sample_path), "--tokenizer", str(tiny_tokenizer_dir)]
    argv += ["--batch", "4", "--k", "4", "--targets", "0.15,none", "--out-dir", str(out)]
    argv += ["--", "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    assert frontier.main(argv) == 0
    printed = capsys.readouterr().out
    for w in ("sample_tool_agent", "sample_react"):
        assert f"#### {w}" in printed
    lines = [ln for ln in printed.splitlines() if ln.startswith(("| 0.15 ", "| none ", "| Suffix"))]
    assert len(lines) == 6  # three rows per workload
    assert all(ln.endswith("|") and ln.count("|") == 6 for ln in lines)
    assert [ln for ln in lines if ln.startswith("| SuffixDecoding")][0].endswith("| 1.000 |")
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.glob("*.json")) == [
        "frontier_0.15.json",
        "frontier_none.json",
        "frontier_suffix.json",
    ]


def test_rejection_frontier_rejects_a_bad_target_before_replaying(tmp_path: Path) -> None:
    frontier = _script("rejection_frontier")
    argv = ["--traces", "x", "--tokenizer", "t", "--targets", "0.15,1.5"]
    argv += ["--out-dir", str(tmp_path / "f")]
    with pytest.raises(SystemExit, match="'1.5' is not in"):
        frontier.main(argv)
    assert not (tmp_path / "f").exists()
