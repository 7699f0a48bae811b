"""The replay's proposer-time percentiles cover only the steps at which ``propose`` ran;
the time charged to each step (``add_proposer_time``) is every step's, as before."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from agentspec_mw.costmodel import ServingLimits, StepTimeModel
from agentspec_mw.peers.none import NoProposer
from agentspec_mw.proposer import EMPTY_DRAFT, Draft, StepContext, TokenIds
from agentspec_mw.replay import sim
from agentspec_mw.replay.report import format_table
from agentspec_mw.replay.run import merge_runs, result_row
from agentspec_mw.replay.sim import ReplayCall, WorkloadRun, replay_workload

#: One second per batched token: simulated time = tokens scheduled.
PER_TOKEN = StepTimeModel(name="per-token", c_fix=0.0, c_tok=1.0, c_kv=0.0, c_oh=0.0)
#: Proposer calls' costs on the fake clock, µs.
PROPOSE_US, EXTEND_US, START_US, STOP_US = 1000, 10, 5, 5


class FakeClock:
    """``perf_counter_ns`` that only the proposer below moves: a deterministic timing."""

    def __init__(self) -> None:
        self.ns = 0

    def perf_counter_ns(self) -> int:
        return self.ns

    def spend(self, us: int) -> None:
        self.ns += us * 1000


class Timed:
    """Drafts nothing; each call spends a fixed time on the fake clock."""

    name = "timed"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def start(self, req_id: str, prompt_ids: TokenIds, tags: object = None) -> None:
        self.clock.spend(START_US)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        self.clock.spend(EXTEND_US)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        self.clock.spend(PROPOSE_US)
        return [EMPTY_DRAFT] * len(req_ids)

    def stop(self, req_id: str) -> None:
        self.clock.spend(STOP_US)


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(sim, "time", SimpleNamespace(perf_counter_ns=c.perf_counter_ns))
    return c


def _call(req_id: str = "a", run: str = "r") -> ReplayCall:
    # a 160-token prompt under a 32-token budget: 5 prefill steps (the last samples token
    # 0), then 3 decode steps for the other 3 output tokens
    return ReplayCall(
        req_id=req_id,
        run_id=run,
        prompt=np.arange(1000, 1160, dtype=np.int32),
        output=np.arange(1, 5, dtype=np.int32),
    )


def _replay(clock: FakeClock, k: int = 4, **kw: object) -> WorkloadRun:
    return replay_workload(
        [_call()],
        Timed(clock),
        batch=1,
        k=k,
        cost_model=PER_TOKEN,
        limits=ServingLimits(max_num_batched_tokens=32, kv_capacity_tokens=None, block_size=16),
        **kw,  # type: ignore[arg-type]
    )


def test_percentiles_cover_only_the_steps_with_a_propose(clock: FakeClock) -> None:
    r = _replay(clock)
    # 4 prefill chunks with no proposer call, the last chunk (start + extend of token 0),
    # 3 decode steps (propose + extend, the last also stop)
    last_chunk = START_US + EXTEND_US
    decode = PROPOSE_US + EXTEND_US
    assert r.propose_us == pytest.approx([0, 0, 0, 0, last_chunk, decode, decode, decode + STOP_US])
    row = result_row("timed", "w", 1, 4, r, base=r.sim_time_s)
    # with every engine step counted the median was 7.5 µs, between two prefill steps
    assert row.propose_us_p50 == pytest.approx(decode)
    assert row.propose_us_p99 == pytest.approx(np.percentile([decode, decode, decode + 5], 99))
    assert row.propose_steps == 3
    assert r.step_proposed == [False] * 5 + [True] * 3
    assert r.propose_steps == 3
    assert r.proposed_us == pytest.approx([decode, decode, decode + STOP_US])
    assert "prop_steps" in format_table([row]).splitlines()[0]


def test_the_charge_is_still_every_steps_proposer_time(clock: FakeClock) -> None:
    plain = _replay(clock)
    charged = _replay(clock, add_proposer_time=True)
    total_us = START_US + 4 * EXTEND_US + 3 * PROPOSE_US + STOP_US  # prefill step's too
    assert plain.proposer_time_s == pytest.approx(total_us * 1e-6)
    assert charged.proposer_time_s == pytest.approx(total_us * 1e-6)
    assert charged.sim_time_s == pytest.approx(plain.sim_time_s + total_us * 1e-6)
    # the drafts and counts do not depend on the timing
    assert (charged.steps, charged.drafted, charged.engine_steps) == (
        plain.steps,
        plain.drafted,
        plain.engine_steps,
    )


def test_no_propose_means_no_percentile_and_merged_rows_count_the_steps(
    clock: FakeClock,
) -> None:
    none = replay_workload([_call()], NoProposer(), batch=1, k=0, cost_model=PER_TOKEN)
    row = result_row("none", "w", 1, 4, none, base=none.sim_time_s)
    assert none.propose_steps == 0 and row.propose_steps == 0
    assert row.propose_us_p50 == 0.0 and row.propose_us_p99 == 0.0

    a, b = _replay(clock), _replay(clock)
    merged = merge_runs([a, b, none])
    assert len(merged.step_proposed) == len(merged.propose_us) == merged.engine_steps
    assert merged.propose_steps == 6
    all_row = result_row("timed", "ALL", 1, 4, merged, merged.sim_time_s)
    assert all_row.propose_steps == 6
    assert all_row.propose_us_p50 == pytest.approx(PROPOSE_US + EXTEND_US)


def test_a_step_that_schedules_nothing_still_charges_its_propose(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drafts proposed before a step in which every running request is preempted took
    their time all the same: it is charged to the next step (it was dropped)."""
    plain = _replay(clock, add_proposer_time=True)
    schedule = sim._schedule
    emptied: list[bool] = []

    def preempt_all_once(running: list[Any], *rest: Any) -> dict[Any, int]:
        if not emptied and any(r.decoding for r in running):
            emptied.append(True)
            (r,) = running
            r.draft = ()  # as a preemption leaves it: the request computes again
            return {}
        return schedule(running, *rest)

    monkeypatch.setattr(sim, "_schedule", preempt_all_once)
    hit = _replay(clock, add_proposer_time=True)
    assert emptied
    # one extra propose (the wasted one), charged: nothing of it is lost
    assert hit.proposer_time_s == pytest.approx(plain.proposer_time_s + PROPOSE_US * 1e-6)
    assert sum(hit.propose_us) == pytest.approx(hit.proposer_time_s * 1e6)
    assert hit.sim_time_s == pytest.approx(plain.sim_time_s + PROPOSE_US * 1e-6)
    assert hit.propose_steps == plain.propose_steps
