"""``benchmarks/draft_reliability.py``: it scores exactly the drafts the replay verified."""

from __future__ import annotations

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload
from tests.helpers import react_calls, script


def test_positions_and_accepted_are_the_replays_own() -> None:
    dr = script("draft_reliability")
    text = b"Thought: search the flight.\nAction: search[flight 42]\n"
    calls = react_calls(6, grow=3, text=text)
    env = ProposerEnv(token_bytes=[bytes([t]) for t in range(256)], max_k=8)
    probe = dr.Reliability(make_proposer("agentspec", env))
    run = replay_workload(calls, probe, batch=2, k=8, cost_model=get_cost_model("llama8b-h100"))
    positions, expected, accepted = probe.bins.sum(axis=0)
    assert run.drafted > 0
    assert positions == run.drafted and accepted == run.accepted
    assert 0 < expected < positions
    assert "expected" in dr.summary(probe.bins) and "per tenth" in dr.summary(probe.bins)
