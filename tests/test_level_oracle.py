"""``benchmarks/level_oracle.py``: its offline emulation reproduces the proposer's pick."""

from __future__ import annotations

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload
from tests.helpers import react_calls, script


def test_emulated_pick_and_calibration_reproduce_the_proposer() -> None:
    lo = script("level_oracle")
    calls = react_calls(8, grow=5)
    env = ProposerEnv(token_bytes=[bytes([t]) for t in range(256)], max_k=8)
    cost = get_cost_model("llama8b-h100")
    o = lo.LevelOracle(make_proposer("agentspec", env), {c.req_id: c.output for c in calls})
    replay_workload(calls, o, batch=2, k=8, cost_model=cost)  # asserts the uncapped re-lookup
    assert o.cnt["steps"] > 0
    # the emulation of kernels.score picks what the proposer picked, at every request-step
    assert o.cnt["default = pick"] == o.cnt["steps"]
    assert o.tok["proposer"] == o.tok["picked"]
    # a table fitted as the proposer fits its own (picked candidates, emitted positions) is
    # the proposer's: same picks, same admissible tokens
    for x in ("", ", admissible"):
        assert o.tok[f"fitted, picked only, emitted{x}"] == o.tok[f"proposer{x}"]
    # oracles bound the pick
    assert o.tok["best source and level"] >= o.tok["best source"] >= o.tok["picked"]
    assert o.tok["picked, its best level"] >= o.tok["picked"]
