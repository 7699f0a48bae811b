"""``agentspec bench`` review (session 62): ``--show`` with a bad ``--out`` is one line,
``--run-timeout inf`` means no limit, ``--json`` may not be one of OUT's files, and a bad
option is one line. No engine starts: :class:`FakeEngine` (or a stand-in worker script)."""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path

import pytest

import agentspec_mw_langgraph.bench as bench
from agentspec_mw.cli import main
from agentspec_mw_langgraph.bench import BenchConfig, read_report, run_bench
from agentspec_mw_langgraph.bench_worker import WorkerSpec

from ..test_bench import _report
from .test_bench_faults import FakeEngine, _rows, _small, fake_engines  # noqa: F401 (fixture)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("agentspec bench: error: "), err
    assert "errors.pydantic.dev" not in err and "input_value" not in err
    return lines[0]


# --- 2: --show with an --out under a file -----------------------------------------------------


def test_show_with_an_unwritable_out_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = tmp_path / "stored.json"
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=1)
    stored.write_text(
        _report(config, _rows({"none": [1.0], "suffix": [1.0]}), []).model_dump_json()
    )
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["bench", "--show", str(stored), "--out", str(afile / "x")]) == 2
    assert f"cannot write '{afile}/x.png'" in _one_line(capsys)
    assert capsys.readouterr().out == ""  # refused before the table


# --- 3: --run-timeout inf ---------------------------------------------------------------------

_READY_WORKER = textwrap.dedent(
    """\
    import json, sys

    print("@@agentspec-bench@@ " + json.dumps({"kind": "ready", "start_s": 0.5}), flush=True)
    for line in sys.stdin:
        if json.loads(line).get("cmd") == "stop":
            break
    """
)


def test_run_timeout_inf_is_no_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``inf`` (or ``None``) waits without a limit, where ``inf`` crashed the wait for the
    engines with an OverflowError; a finite value past threading.TIMEOUT_MAX is refused."""
    config = BenchConfig(run_timeout_s=math.inf)
    (tmp_path / "ready_worker.py").write_text(_READY_WORKER)

    class Engine(bench._Engine):
        worker_module = "ready_worker"

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    spec = WorkerSpec(label="none", speculative=None, tagged=True, apps=("demo",))
    engine = Engine(spec, env, tmp_path / "none.log")
    try:
        assert engine.wait_ready(config.run_timeout_s) == 0.5  # was an OverflowError
    finally:
        engine.close()
    assert config.run_timeout_s is None
    assert BenchConfig.model_validate_json(config.model_dump_json()).run_timeout_s is None
    with pytest.raises(ValueError, match="give inf"):
        BenchConfig(run_timeout_s=1e10)


def test_run_timeout_inf_reaches_run_bench_and_1e10_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[BenchConfig] = []
    monkeypatch.setattr(bench, "run_bench", lambda config, **_: seen.append(config))
    assert main(["bench", "--quick", "--run-timeout", "inf", "--no-progress"]) == 0
    assert seen[-1].run_timeout_s is None
    assert main(["bench", "--quick", "--run-timeout", "1e10", "--no-progress"]) == 2
    assert "run_timeout_s: run_timeout_s=1e+10 is over" in _one_line(capsys)


# --- 6: --json among OUT's files ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["o.txt", "o.png", "o.steps.jsonl", "o.none.log"])
@pytest.mark.usefixtures("fake_engines")
def test_a_json_path_that_is_one_of_outs_files_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=r"--json '.*o\..*' names a file the bench writes itself"):
        run_bench(_small(), out=tmp_path / "o", json_path=tmp_path / name, progress=False)
    assert FakeEngine.STARTED == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("fake_engines")
def test_the_cli_refuses_json_among_outs_files_and_takes_a_json_beside_them(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "--quick", "--no-progress", "--out", "o"]
    assert main([*argv, "--json", "o.txt"]) == 2
    assert (
        "--json 'o.txt' names a file the bench writes itself with --out 'o' ('o.txt'; "
        in _one_line(capsys)
    )
    assert FakeEngine.STARTED == []
    assert main([*argv, "--json", "o.json"]) == 0
    assert read_report(tmp_path / "o.json").rows and (tmp_path / "o.txt").is_file()


# --- 9: option errors are one line -------------------------------------------------------------


def test_a_bad_bench_option_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--k", "0", "--no-progress"]) == 2
    assert _one_line(capsys) == (
        "agentspec bench: error: k: Input should be greater than or equal to 1"
    )
