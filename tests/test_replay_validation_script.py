"""benchmarks/replay_validation.py: the parts that need no engine (run order, comparison)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import script


def _planner(run: str, topic: str) -> dict[str, object]:
    return {
        "workload": "validation",
        "run_id": run,
        "call_index": 0,
        "agent": "planner",
        "prompt": [
            {"role": "system", "content": "You are a planner."},
            {"role": "user", "content": f"Plan a short report about {topic} in three steps."},
        ],
        "output": "1. a",
    }


def test_topics_follow_the_recordings_run_order(tmp_path: Path) -> None:
    v = script("replay_validation")
    trace = tmp_path / "t.jsonl"
    recs = [_planner("r1", "salt"), {**_planner("r1", "salt"), "agent": "writer"}]
    recs.append(_planner("r2", "tea"))
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert v.topics_in(trace) == ["salt", "tea"]
    assert v.queries_at(1) == 2 and v.queries_at(8) == 8


def test_compare_prints_measured_against_predicted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v = script("replay_validation")
    live = [
        {"drafter": "none", "concurrency": 8, "tok_s": 50.0, "outputs_sha256": "x"},
        {"drafter": "suffix", "concurrency": 8, "tok_s": 75.0, "outputs_sha256": "x"},
    ]
    # a repeat of none in another file, with the engine's CPU seconds: the median counts
    again = [
        {**live[0], "tok_s": 40.0, "output_tokens": 100, "engine_cpu_s": 2.0},
        {**live[0], "tok_s": 60.0, "output_tokens": 100, "engine_cpu_s": 2.0},
    ]
    live[1] |= {"output_tokens": 100, "engine_cpu_s": 1.25}
    rows = [
        {"proposer": p, "workload": "ALL", "batch": 8, "speedup": s, "throughput_tok_s": t}
        for p, s, t in (("none", 1.0, 55.0), ("suffix", 1.65, 90.75))
    ]
    (tmp_path / "live.json").write_text(json.dumps(live))
    (tmp_path / "again.json").write_text(json.dumps(again))
    (tmp_path / "r8.json").write_text(json.dumps({"results": rows}))
    files = [str(tmp_path / f) for f in ("live.json", "again.json", "r8.json")]
    assert v.main(["compare", *files]) == 0
    out = capsys.readouterr().out
    assert "| none | 8 | 3 | 50.0 | 1.000 |" in out
    assert (
        "| suffix | 8 | 1 | 75.0 | 1.500 | +10.0 % | 80.0 | 1.600 | +3.1 % | 90.8 | 1.650 | yes |"
        in out
    )
