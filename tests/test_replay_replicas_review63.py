"""Review 63: round robin keeps calls issued together on one replica, and a replica row
is "filled" against the batch each replica holds, not the cluster's."""

from __future__ import annotations

import numpy as np
import pytest

from agentspec_mw.replay.replicas import (
    format_replica_table,
    replica_batch,
    run_replica_replay,
    split_calls,
)
from agentspec_mw.replay.run import ReplayConfig
from agentspec_mw.replay.sim import ReplayCall
from tests.test_replay_replicas import _workload


def _call(req: str, run: str, seed: int, *, with_previous: bool = False) -> ReplayCall:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(5000, 9000, 24).astype(np.int32)
    output = rng.integers(1000, 5000, 12).astype(np.int32)
    return ReplayCall(req, run, prompt, output, with_previous=with_previous)


def _previous(calls: list[ReplayCall]) -> dict[str, str | None]:
    """Each call's previous call of its run in ``calls`` (``None``: the run's first)."""
    last: dict[str, str] = {}
    out: dict[str, str | None] = {}
    for c in calls:
        out[c.req_id] = last.get(c.run_id)
        last[c.run_id] = c.req_id
    return out


def _grouped_workload() -> list[ReplayCall]:
    """Three runs of issued-together groups (sizes below: a call alone, a fan-out, the
    samples of one request), interleaved call by call, each run's calls in order."""
    sizes = {"run0": [1, 3, 1, 2], "run1": [1, 2, 2, 1, 3], "run2": [2, 1, 3]}
    by_run = {
        run: [
            _call(f"{run}.{g}.{m}", run, 100 * r + 10 * g + m, with_previous=m > 0)
            for g, size in enumerate(groups)
            for m in range(size)
        ]
        for r, (run, groups) in enumerate(sizes.items())
    }
    longest = max(len(v) for v in by_run.values())
    return [v[n] for n in range(longest) for v in by_run.values() if n < len(v)]


def test_round_robin_keeps_the_reviewers_fan_out_together() -> None:
    # run r: A, then B and C issued together; R = 2 sent C to A's replica, right after A,
    # where it arrived with A although it follows B
    calls = [
        _call("A", "r", 1),
        _call("B", "r", 2),
        _call("C", "r", 3, with_previous=True),
    ]
    shares = split_calls(calls, 2, "round-robin")
    assert [[c.req_id for c in s] for s in shares] == [["A"], ["B", "C"]]


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_round_robin_routes_each_issued_together_group_as_a_unit(replicas: int) -> None:
    calls = _grouped_workload()
    prev = _previous(calls)
    shares = split_calls(calls, replicas, "round-robin")
    assert sorted(c.req_id for s in shares for c in s) == sorted(c.req_id for c in calls)
    home = {c.req_id: i for i, s in enumerate(shares) for c in s}
    for share in shares:
        on_replica = _previous(share)
        for c in share:
            if c.with_previous:  # still names the call it was issued with
                assert on_replica[c.req_id] == prev[c.req_id], (replicas, c.req_id)
                assert home[c.req_id] == home[str(prev[c.req_id])]
    # a run's consecutive groups still land on consecutive replicas: (i + j) mod R
    for i, run in enumerate(dict.fromkeys(c.run_id for c in calls)):
        leaders = [c for c in calls if c.run_id == run and not c.with_previous]
        assert [home[c.req_id] for c in leaders] == [
            (i + j) % replicas for j in range(len(leaders))
        ]
    assert split_calls(calls, 1, "round-robin") == [calls]


def _cfg(batch: int) -> ReplayConfig:
    return ReplayConfig(
        traces=["x"],
        tokenizer="t",
        proposers=["none", "ngram"],
        batch=[batch],
        k=[4],
        cost_model="llama8b-h100",
    )


def test_a_replica_row_is_filled_against_its_replicas_batch() -> None:
    # 8 one-call runs, batch 8 over 4 replicas: each replica holds its 2 runs in flight,
    # the batch it was given (ceil(8 / 4)); compared with the cluster's 8 it read unfilled
    rows = run_replica_replay(_cfg(8), {"w": _workload(runs=8, calls=1)}, [1, 4], ["round-robin"])
    by = {(r.replicas, r.workload): r for r in rows}
    for wl in ("w", "ALL"):
        one, four = by[(1, wl)], by[(4, wl)]
        assert four.batch == 8 and four.max_in_flight == 2 and four.effective_batch >= 1.6
        assert four.batch_filled, four
        assert one.batch_filled and one.max_in_flight == 8
        assert (one.replica_batch, four.replica_batch) == (8, 2)


def test_a_replica_row_short_of_its_replicas_batch_is_still_unfilled() -> None:
    # 2 runs, batch 8 over 2 replicas: each replica holds 4 runs' room but gets 1 run
    rows = run_replica_replay(_cfg(8), {"w": _workload(runs=2, calls=1)}, [2], ["round-robin"])
    for r in rows:
        assert r.max_in_flight == 1 and not r.batch_filled, r
        assert r.replica_batch == 4
    table = format_replica_table(rows).splitlines()
    assert table[0].split()[-1] == "eff/rep"
    assert table[2].split()[-1] == f"{rows[0].effective_batch:.1f}*/4"
    assert table[-1].startswith("* a replica's effective batch under 80 %")


def test_replica_batch() -> None:
    assert [replica_batch(8, r) for r in (1, 2, 3, 4, 8, 16)] == [8, 4, 3, 2, 1, 1]
