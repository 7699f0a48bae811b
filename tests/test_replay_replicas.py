"""The replicas what-if: how calls are split over replicas, and that a proposer that learns
from a run's earlier outputs loses that history when round robin spreads the run."""

from __future__ import annotations

import numpy as np
import pytest

from agentspec_mw.cli import main
from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.replay.replicas import run_replica_replay, split_calls
from agentspec_mw.replay.run import ReplayConfig
from agentspec_mw.replay.sim import ReplayCall


def _workload(runs: int = 6, calls: int = 3) -> list[ReplayCall]:
    """Each run's calls emit the same run-specific output (repeats of one agent)."""
    rng = np.random.default_rng(7)
    outputs = {r: rng.integers(1000, 5000, 48).astype(np.int32) for r in range(runs)}
    out = []
    for i in range(calls):
        for r in range(runs):
            prompt = rng.integers(5000, 9000, 40).astype(np.int32)
            out.append(ReplayCall(f"{r}.{i}", f"run{r}", prompt, outputs[r]))
    return out


def _homes(shares: list[list[ReplayCall]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for i, share in enumerate(shares):
        for c in share:
            out.setdefault(c.run_id, set()).add(i)
    return out


def test_affinity_keeps_runs_whole_and_round_robin_spreads_them() -> None:
    calls = _workload(runs=8, calls=3)
    aff = split_calls(calls, 3, "affinity")
    rr = split_calls(calls, 3, "round-robin")
    for shares in (aff, rr):
        assert sorted(c.req_id for s in shares for c in s) == sorted(c.req_id for c in calls)
    assert all(len(h) == 1 for h in _homes(aff).values())
    assert all(len(h) == 3 for h in _homes(rr).values())  # 3 calls, 3 replicas: one each
    assert [len(s) for s in rr] == [8, 8, 8]
    assert split_calls(calls, 1, "round-robin") == [calls]
    with pytest.raises(ValueError, match="routing"):
        split_calls(calls, 2, "random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replicas"):
        split_calls(calls, 0, "affinity")


def test_round_robin_loses_the_runs_history() -> None:
    cfg = ReplayConfig(
        traces=["x"],
        tokenizer="t",
        proposers=["agentspec"],
        batch=[4],
        k=[8],
        cost_model="cpu-smollm2",
    )
    tb = [f"t{i} ".encode() for i in range(10_000)]  # one word per token id
    env = ProposerEnv(token_bytes=tb, cost_model=get_cost_model("cpu-smollm2"), max_k=8)
    rows = run_replica_replay(cfg, {"w": _workload()}, [3], env=env)
    by = {r.routing: r for r in rows if r.workload == "w"}
    assert by["affinity"].replicas == 3 and sum(by["affinity"].replica_calls) == 18
    # affinity: calls 1 and 2 of a run draft its output from call 0; round robin: never
    # on the same replica, so nothing of the run's own to draft from
    assert by["affinity"].rejection_rate < 0.5 and by["affinity"].mat > 2.0
    assert by["round-robin"].mat < by["affinity"].mat
    assert by["affinity"].speedup > by["round-robin"].speedup


def test_cli_rejects_an_unknown_routing(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--traces", "x.jsonl", "--tokenizer", "t", "--replicas", "2"]
    with pytest.raises(SystemExit):
        main([*argv, "--routing", "sticky"])
    assert "sticky" in capsys.readouterr().err
