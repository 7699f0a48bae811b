"""Review 70: the bench scores every timed step, the fit's outliers too; bench_bars pools
only comparable runs (batch limit, KV cache), leaves out runs whose outputs differed and
counts a report once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentspec_mw.costfit import MeasuredStepTime
from agentspec_mw_langgraph import bench_worker as bw
from agentspec_mw_langgraph.bench import BenchConfig

from ..helpers import script
from ..test_bench import _report
from .test_bench_faults import _rows


def test_every_timed_step_is_scored_the_fits_outliers_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steady 50 ms steps and a 300 ms pause in every 25: the fit leaves the pauses out,
    the score keeps them (it reported a predicted / measured time of 0.997 where it is
    0.86), and the engine's slowness sees them (``rejected_steps``)."""
    monkeypatch.setattr(bw, "STATS", bw._Stats())
    observe = bw._scored(MeasuredStepTime.observe)
    fit = MeasuredStepTime()
    rng = np.random.default_rng(0)
    for i in range(400):
        s = 0.30 if i >= 100 and i % 25 == 0 else 0.050 * (1 + 0.05 * rng.standard_normal())
        observe(fit, 32, 8000, s)
    stats = bw.STATS
    assert len(stats.rejected_steps) == 12 and len(stats.fit_steps) == 388
    assert max(stats.fit_seconds) == 0.30
    ratio = sum(t * (1 + e) for t, e in zip(stats.fit_seconds, stats.fit_errors, strict=True))
    assert ratio / sum(stats.fit_seconds) < 0.9


def test_bench_bars_pools_only_comparable_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch limit of 4 pools apart from the default 64; a run whose outputs differed
    from none's is left out; a report given twice counts once."""
    rows = _rows({"none": [1.0] * 3, "agentspec": [0.8] * 3})
    paths = []
    for name, extra in (("a", {}), ("b", {"max_num_seqs": 4})):
        config = BenchConfig(
            ns=(4,), methods=("none", "agentspec"), apps=("demo",), repeats=3, **extra
        )
        path = tmp_path / f"{name}.json"
        path.write_text(_report(config, rows, []).model_dump_json())
        paths.append(str(path))
    bad = [r.model_copy(update={"identical_to_none": False}) for r in rows]
    config = BenchConfig(ns=(4,), methods=("none", "agentspec"), apps=("demo",), repeats=3)
    path = tmp_path / "c.json"
    path.write_text(_report(config, bad, []).model_dump_json())
    assert script("bench_bars").main([*paths, paths[0], str(path)]) == 0
    captured = capsys.readouterr()
    assert "given again: counted once" in captured.err
    assert "c demo N=4: outputs differ from none's: left out" in captured.out
    assert "max_num_seqs 4" in captured.out
    assert captured.out.count("1 run(s)") == 2  # a and b apart, each once
