"""``benchmarks/sampled_calibration.py`` on the real engine: both agents' counts, one round."""

from __future__ import annotations

import pytest

from tests.helpers import script


def test_usage_errors_before_any_engine() -> None:
    mod = script("sampled_calibration")
    with pytest.raises(SystemExit):  # more rounds than topics: no new topics for the last
        mod.main(["--mode", "mixed", "--rounds", "100"])
    with pytest.raises(SystemExit):  # a sampled agent at temperature 0 is a greedy one
        mod.main(["--mode", "sampled", "--temperature", "0"])


@pytest.mark.engine
@pytest.mark.slow
def test_mixed_round_counts_each_agent(capsys: pytest.CaptureFixture[str]) -> None:
    mod = script("sampled_calibration")
    argv = ["--mode", "mixed", "--rounds", "1", "--per-round", "4", "--max-tokens", "48"]
    assert mod.main(argv) == 0
    rows = [ln.split("|") for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 0 |")]
    assert [r[2].strip() for r in rows] == ["g", "s"]
    assert all(int(r[4]) > 0 for r in rows)  # drafts verified for both agents
    assert all(r[6].strip().endswith("%") for r in rows)
