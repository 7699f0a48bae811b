"""``benchmarks/gap_decompose.py``: the terms are counted on AgentSpec's own schedule."""

from __future__ import annotations

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload
from tests.helpers import react_calls, script


def test_terms_are_non_negative_and_rejected_is_drafted_less_accepted() -> None:
    gd = script("gap_decompose")
    text = b"Thought: search the flight.\nAction: search[flight 42]\n"
    calls = react_calls(6, grow=3, text=text)
    env = ProposerEnv(token_bytes=[bytes([t]) for t in range(256)], max_k=8)
    cost = get_cost_model("llama8b-h100")
    d = gd.Decomposed(
        make_proposer("agentspec", env),
        make_proposer("suffix", env),
        {c.req_id: c.output for c in calls},
        cost,
    )
    run = replay_workload(calls, d, batch=2, k=8, cost_model=cost)
    assert d.call_steps > 0
    assert all(v >= 0 for v in d.secs.values()) and all(v >= 0 for v in d.toks.values())
    assert run.drafted > 0
    # counted on the proposed drafts, which the scheduler may cut (never here: a small step)
    assert d.toks["rejected"] == run.drafted - run.accepted
