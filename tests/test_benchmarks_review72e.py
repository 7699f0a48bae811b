"""Review 72e: defects in the measurement scripts behind docs/results.md's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import bench_row, script


def _bench_report(path: Path, rows: list[dict[str, Any]]) -> str:
    meta = {"cpus": 2, "load_before": [0.0], "load_after": [0.0], "engine_start_s": {}}
    config = {"max_tokens": 48, "min_workflows": 8}
    path.write_text(
        json.dumps({"config": config, "date": "d", **meta, "rows": rows, "mismatches": []})
    )
    return str(path)


def test_bench_bars_tags_bar_misses_on_acceptance_lower_tagged_in_every_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bar is "tagged >= untagged in acceptance and throughput"; the verdict read the
    throughput alone, so two runs with acceptance lower tagged in both (docs/results.md §5's
    48-token runs w and y: -1.2, -1.7 points) printed ``met``."""
    tool = script("bench_bars")
    paths = [
        _bench_report(
            tmp_path / f"run{i}.json",
            [
                bench_row("none", 32, [300.0, 300.0]),
                bench_row("agentspec", 32, [315.0, 309.0], acc=0.76 - 0.01 * i),
                bench_row("agentspec-untagged", 32, [300.0, 300.0], acc=0.78),
            ],
        )
        for i in range(2)
    ]
    assert tool.main(paths) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "tagged vs untagged" in ln]
    assert "(>= 1.0: met)" in line  # the throughput half is met
    assert "acceptance higher tagged in 0 of 2 run(s)" in line
    assert "tagged - untagged median -2.5 points (>= 0: MISS); both: MISS" in line


def test_bench_bars_tags_bar_is_met_where_both_halves_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tool = script("bench_bars")
    path = _bench_report(
        tmp_path / "run.json",
        [
            bench_row("none", 32, [300.0]),
            bench_row("agentspec", 32, [306.0], acc=0.78),
            bench_row("agentspec-untagged", 32, [300.0], acc=0.77),
        ],
    )
    assert tool.main([path]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "tagged vs untagged" in ln]
    assert (
        "higher tagged in 1 of 1 run(s), tagged - untagged median +1.0 points (>= 0: met)" in line
    )
    assert line.endswith("both: met")


def _run(hr: Any, wl: str, b: int, proposer: str, time_s: float) -> Any:
    """A ``headroom.Run`` with only what the ratio table reads set."""
    return hr.Run(
        proposer=proposer, workload=wl, batch=b, k=16, time_s=time_s, speedup=1.0, steps=10,
        prefill_steps=1, prefill_step_time_s=0.1 * time_s, decode_step_time_s=0.9 * time_s,
        kv_wait_steps=0, kv_wait_time_s=0.0, prefill_tokens=100, decode_tokens=100,
        draft_tokens=0, accepted=0, output_tokens=100, call_steps=100, mean_decode_batch=4.0,
        terms_s=None,
    )  # fmt: skip


def test_headroom_geomean_is_over_one_set_of_workloads_for_every_column() -> None:
    """A workload without an ``agentspec`` run at a batch left only that column's mean; the
    ``suffix/none`` mean kept it, so the share of headroom (a ratio of two columns' means)
    compared means over different workloads."""
    hr = script("headroom")
    runs = [
        _run(hr, "a", 32, "none", 2.0),
        _run(hr, "a", 32, "suffix", 1.0),
        _run(hr, "a", 32, "agentspec", 0.8),
        _run(hr, "b", 32, "none", 4.0),
        _run(hr, "b", 32, "suffix", 1.0),  # 4x none; no agentspec run on b
    ]
    rows = hr.ratio_rows(runs, ["none", "suffix", "agentspec"])
    (mean,) = [r for r in rows if "geomean" in r]
    cells = [c.strip() for c in mean.split("|")[1:-1]]
    assert cells[1] == "**geomean (1 of 2)**"
    assert cells[2:5] == ["2.000", "2.500", "1.250"]  # suffix/none over a alone, as agentspec's


def test_headroom_merge_refuses_two_reports_of_the_same_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two reports with a run of the same workload, batch and proposer (another commit's,
    say) were merged silently: the time table printed both, the ratio table kept the last."""
    from dataclasses import asdict

    hr = script("headroom")
    runs = [_run(hr, "a", 32, p, t) for p, t in (("none", 2.0), ("suffix", 1.0), ("oracle", 0.5))]
    config = {"cost_model": "llama8b-h100-roofline", "k": 16, "names": ["none", "suffix", "oracle"]}
    paths = []
    for name in ("old.json", "new.json"):
        path = tmp_path / name
        path.write_text(json.dumps({"config": config, "runs": [asdict(r) for r in runs]}))
        paths.append(str(path))
    assert hr.main(["--merge", paths[0], paths[0]]) == 0  # one file twice: read once
    assert capsys.readouterr().out.count("| a | 32 | none |") == 1
    with pytest.raises(SystemExit, match="none on a at b=32 is in both"):
        hr.main(["--merge", *paths])


def test_oracle_trim_never_drafts_past_the_recorded_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """``trim`` is AgentSpec's drafts cut to their accepted prefix; where the recorded
    output is not known (past its last fed token, or a prompt not recorded) the draft went
    through whole, rejected tokens and all."""
    from agentspec_mw.costmodel import get_cost_model
    from agentspec_mw.proposer import Draft, ProposerEnv, StepContext

    mod = script("_oracle_proposer")
    cls = mod.OracleProposer
    monkeypatch.setattr(cls, "memory", {})
    monkeypatch.setattr(cls, "mode", "trim")
    env = ProposerEnv(
        token_bytes=[bytes([t]) for t in range(256)],
        cost_model=get_cost_model("llama8b-h100"),
        max_k=8,
    )
    prop = cls(env)
    prompt = [1, 2, 3]
    cls.memory[mod._digest(prompt)] = [7, 8, 9, 10]
    draft = Draft((11, 12), (0.9, 0.8))
    monkeypatch.setattr(prop.inner, "propose", lambda ids, k, step: [draft] * len(ids))
    step = StepContext(batch_size=2, num_kv_tokens=8)
    prop.start("a", prompt)
    prop.extend("a", [7, 8, 9, 10])  # at the end of what was recorded
    prop.start("b", [4, 5])  # a prompt with no recorded output
    assert prop.propose(["a", "b"], 4, step) == [Draft(()), Draft(())]
