"""``agentspec replay --no-plot`` writes no plot (``--plot /dev/null`` wrote ``/dev/null.png``:
a name without an image extension gets ``.png``), also with ``--replicas``; with ``--plot``
it is refused. No engine: the tiny tokenizer and the sample trace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentspec_mw.cli import main

from .test_cli_review62 import _argv, _one_line


@pytest.mark.parametrize("replicas", [(), ("--replicas", "2", "--batch", "2")])
def test_no_plot_writes_the_json_and_no_plot(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    replicas: tuple[str, ...],
) -> None:
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "r.json"
    opts = ("--proposers", "none,ngram", "--json", str(report), "--no-plot", *replicas)
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, *opts)) == 0
    assert report.is_file()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".png")]
    assert "wrote" not in capsys.readouterr().out.replace(f"wrote {report}", "")


def test_no_plot_with_a_plot_is_refused(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = ("--proposers", "none", "--no-plot", "--plot", str(tmp_path / "p.png"))
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, *opts)) == 2
    assert "--plot and --no-plot" in _one_line(capsys)
