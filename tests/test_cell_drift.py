"""``benchmarks/cell_drift.py``: its tally of counted positions is the proposer's own."""

from __future__ import annotations

import numpy as np

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload
from tests.helpers import react_calls, script


def test_tally_equals_the_proposers_counts_and_summary_reads_it() -> None:
    cd = script("cell_drift")
    text = b"Thought: search the flight.\nAction: search[flight 42]\n"
    calls = react_calls(6, grow=3, text=text)
    env = ProposerEnv(token_bytes=[bytes([t]) for t in range(256)], max_k=8)
    cost = get_cost_model("llama8b-h100")
    a = make_proposer("agentspec", env)
    ev = cd.Events(a, {c.req_id: c.output for c in calls})
    run = replay_workload(calls, ev, batch=2, k=8, cost_model=cost)
    assert run.drafted > 0
    a._flush()  # the run's last extends wait for a propose that never comes
    sc = a._scopes
    ftot, fsucc = sc.ftot[1:].sum(axis=0), sc.fsucc[1:].sum(axis=0)
    mine, mine_ok = np.zeros_like(ftot), np.zeros_like(ftot)
    drafted = 0
    for (_s, f), events in ev.events.items():
        mine[f] += len(events)
        mine_ok[f] += sum(ok for _k, _p, ok in events)
        drafted += sum(kind == cd.DRAFTED for kind, _p, _ok in events)
    assert ftot.sum() > 100
    np.testing.assert_array_equal(mine, ftot)
    np.testing.assert_array_equal(mine_ok, fsucc)
    assert run.accepted <= drafted <= run.drafted  # drafted positions up to the first miss
    lines = [cd.summary(ev.events, s, min_count=1) for s in range(4)]
    assert any("predicted" in line and "realised" in line for line in lines)
