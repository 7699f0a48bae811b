"""Review 70: why a row had fewer calls in flight than its batch names the KV cache when
that held them back; a KV capacity under one block is refused up front, naming the option;
a replica replay refuses a batch smaller than its replica count."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentspec_mw.replay.replicas import run_replica_replay
from agentspec_mw.replay.run import ReplayConfig, ResultRow, fewer_in_flight
from tests.test_replay_replicas import _workload


def _row(**kw: object) -> ResultRow:
    base = dict(
        proposer="none", workload="w", batch=32, k=16, calls=10, output_tokens=10, steps=10,
        mat=1.0, rejection_rate=0.0, drafted_per_step=0.0, propose_us_p50=0.0,
        propose_us_p99=0.0, speedup=1.0, max_in_flight=4,
    )  # fmt: skip
    return ResultRow.model_validate({**base, **kw})


def test_fewer_in_flight_names_the_kv_cache_when_it_held_calls_back() -> None:
    (kv,) = fewer_in_flight([_row(kv_waits=350)])
    assert "at most 4 calls were in flight (the KV cache held fewer: 350 waits" in kv
    (runs,) = fewer_in_flight([_row()])
    assert "(the workload has fewer runs)" in runs


def test_a_kv_capacity_under_one_block_is_refused_naming_the_option() -> None:
    with pytest.raises(ValidationError, match=r"--kv-capacity\) = 8 holds no KV block"):
        ReplayConfig(traces=["x"], tokenizer="t", kv_capacity_tokens=8)
    ReplayConfig(traces=["x"], tokenizer="t", kv_capacity_tokens=16)


def test_a_replica_replay_refuses_a_batch_under_its_replica_count() -> None:
    cfg = ReplayConfig(traces=["x"], tokenizer="t", proposers=["none", "ngram"], batch=[1], k=[4])
    with pytest.raises(ValueError, match="batch 1 is smaller than 4 replicas"):
        run_replica_replay(cfg, {"w": _workload(runs=4, calls=1)}, [1, 4], ["round-robin"])
