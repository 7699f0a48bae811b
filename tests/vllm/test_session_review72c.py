"""Review 72c: which step the timed interval's emitted tokens belong to, and vLLM running
several batches at once (pipeline parallelism).

* vLLM calls a ``custom_class`` drafter in ``sample_tokens`` after the step's model run,
  sampling, rejection sampler and bookkeeping, with the tokens that step sampled: the
  interval a call closes holds the step whose emitted tokens that call sees. The session
  pairs them (a guard: it did before this review too).
* Under pipeline parallelism vLLM alternates micro-batches of disjoint requests and calls
  the drafter once per batch: a request's calls are two apart, and the gap in the step
  numbers that tells of a skipped draft call shows at the *other* batch's call. The draft
  verified in the skipped step is dropped (before: the zeros vLLM scheduled in its place
  were taken for its verification).
* The time between two draft calls is then not one step: ``cost_model="measured"`` is not
  fitted there; the budget uses the prior preset, and a warning says so.
"""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from agentspec_mw.costfit import MeasuredStepTime, fit_observed_steps
from agentspec_mw.costmodel import StepTimeModel
from agentspec_mw_vllm.adapter import AgentSpecDrafter
from agentspec_mw_vllm.metrics import DrafterMetrics
from agentspec_mw_vllm.session import DraftSession
from tests.vllm.fakes import ProbeProposer
from tests.vllm.test_session import Batch, RecordingTimer


def _counts(metrics: DrafterMetrics) -> tuple[int, int]:
    snap = metrics.snapshot()
    return snap.total_drafted, snap.total_accepted


class _Pipeline:
    """Two micro-batches of disjoint requests, scheduled in turn (steps 1, 3, ... hold
    ``a``; 2, 4, ... hold ``b``), as vLLM's scheduler fills a two-stage pipeline."""

    def __init__(self, session: DraftSession) -> None:
        self.session = session
        self.batches = {"a": Batch(width=256), "b": Batch(width=256)}
        self.batches["a"].add("a", [1, 2, 3])
        self.batches["b"].add("b", [4, 5, 6])
        self.steps = 0

    def step(self, rid: str, tokens: list[int], spec: list[int] | None = None) -> list[list[int]]:
        """An engine step of ``rid``'s micro-batch followed by its draft call."""
        self.steps += 1
        batch = self.batches[rid]
        sampled = batch.sample({rid: tokens})
        ctx = dataclasses.replace(
            batch.ctx(max_len=256, spec={rid: spec} if spec else None),
            scheduler_step=self.steps,
            live_req_ids={"a", "b"},
        )
        return self.session.step(ctx, sampled, batch.n, batch.buf)

    def skipped(self, rid: str, tokens: list[int]) -> None:
        """A step of ``rid``'s micro-batch whose draft call vLLM skipped."""
        self.steps += 1
        self.batches[rid].sample({rid: tokens})


def test_a_micro_batchs_skipped_call_drops_its_draft_not_the_zeros_verification() -> None:
    """``b``'s draft ``[0, 0]`` is verified (both accepted) in step 4, whose draft call
    vLLM skipped; the jump in the numbers shows at ``a``'s call (3 -> 5), and ``b``'s next
    call (6) follows ``a``'s. Before: step 6's zeros were taken for ``b``'s draft (2
    drafted, 0 accepted); now dropped. ``a``'s drafts are counted throughout."""
    metrics = DrafterMetrics(prometheus=False)
    pipe = _Pipeline(DraftSession(ProbeProposer(draft_len=2), k=3, metrics=metrics))
    assert pipe.step("a", [7]) == [[7, 7]]  # 1
    assert pipe.step("b", [0]) == [[0, 0]]  # 2
    pipe.step("a", [7, 7, 8], spec=[7, 7])  # 3: a's draft, both accepted
    assert _counts(metrics) == (2, 2)
    pipe.skipped("b", [0, 0, 9])  # 4: b's [0, 0] verified here, both accepted
    pipe.step("a", [8, 1], spec=[8, 8])  # 5: a's draft, one accepted (the gap 3 -> 5)
    assert _counts(metrics) == (4, 3)
    pipe.step("b", [5], spec=[0, 0])  # 6: the zeros vLLM put in b's draft's place
    assert _counts(metrics) == (4, 3)  # not (6, 3)
    pipe.step("a", [1, 1], spec=[1, 1])  # 7: a's, counted as usual
    pipe.step("b", [5, 5], spec=[5, 5])  # 8: b's own next draft, counted
    assert _counts(metrics) == (8, 5)


def test_without_a_gap_a_micro_batchs_drafts_are_all_counted() -> None:
    metrics = DrafterMetrics(prometheus=False)
    pipe = _Pipeline(DraftSession(ProbeProposer(draft_len=2), k=3, metrics=metrics))
    pipe.step("a", [7])
    pipe.step("b", [0])
    pipe.step("a", [7, 7, 8], spec=[7, 7])
    pipe.step("b", [0, 3], spec=[0, 0])
    assert _counts(metrics) == (4, 3)


STEP = 0.040
C_EMIT = 0.0004  # the host's seconds per emitted token of the step timed


def test_the_timed_interval_goes_with_the_emitted_tokens_its_call_sees() -> None:
    """Each call sees the tokens the step just run sampled (vLLM calls the drafter after
    that step's rejection sampler): the interval it closes is reported with them, and a
    fit of the reported steps, each costing ``C_EMIT`` per token it emitted, finds it
    (paired with the step before's tokens it would not)."""
    timer = RecordingTimer()
    now = [0.0]
    session = DraftSession(
        ProbeProposer(draft_len=0),
        k=3,
        metrics=DrafterMetrics(prometheus=False),
        step_timer=timer,
        clock=lambda: now[0],
    )
    batch = Batch(width=4096)
    batch.add("a", [1] * 50)
    batch.add("b", [2] * 50)
    emitted: list[int] = []
    for i in range(400):
        na, nb = 1 + (i * 7) % 4, 1 + (i * 5) % 3  # accepted + 1, varying step to step
        sampled = batch.sample({"a": [3] * na, "b": [4] * nb})
        now[0] += STEP + C_EMIT * (na + nb)  # the step that sampled them
        ctx = batch.ctx(max_len=4096, scheduled={"a": 4, "b": 4})
        session.step(ctx, sampled, batch.n, batch.buf)
        emitted.append(na + nb)
    assert timer.emitted == emitted[1:]  # the first call has no interval before it
    rows = [
        [nb, kv, sk, dk, e, sec]
        for (nb, kv, sec), (sk, dk), e in zip(timer.calls, timer.drafts, timer.emitted, strict=True)
    ]
    assert fit_observed_steps(np.array(rows))[5] == pytest.approx(C_EMIT, rel=0.01)
    # paired one step late (the suspected defect), the same steps give another price
    late = [[*r[:4], e, r[5]] for r, e in zip(rows[1:], timer.emitted, strict=False)]
    assert fit_observed_steps(np.array(late))[5] < 0.5 * C_EMIT


def _vllm_config(cost_model: str, pipeline: int, concurrent: int | None) -> Any:
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=3),
        additional_config={"agentspec": {"cost_model": cost_model, "cost_prior": "cpu-smollm2"}},
        model_config=SimpleNamespace(max_model_len=512, get_vocab_size=lambda: 1000),
        parallel_config=SimpleNamespace(pipeline_parallel_size=pipeline),
    )
    if concurrent is not None:
        config.max_concurrent_batches = concurrent
    return config


def test_several_batches_in_flight_turn_the_online_fit_off_with_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTSPEC_COST_MODEL", raising=False)
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_vllm.adapter"):
        drafter = AgentSpecDrafter(_vllm_config("measured", 2, 2), proposer=ProbeProposer())
    assert drafter.step_timer is None
    assert drafter.session.step_timer is None
    assert "is not fitted: vLLM runs 2 batches at once" in caplog.text
    assert "'cpu-smollm2'" in caplog.text


@pytest.mark.parametrize("concurrent", [1, None])
def test_one_batch_at_a_time_keeps_the_online_fit(
    concurrent: int | None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTSPEC_COST_MODEL", raising=False)
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_vllm.adapter"):
        drafter = AgentSpecDrafter(_vllm_config("measured", 1, concurrent), ProbeProposer())
    assert isinstance(drafter.step_timer, MeasuredStepTime)
    assert drafter.session.step_timer is drafter.step_timer
    assert "not fitted" not in caplog.text


def test_a_preset_is_kept_whatever_the_batches_in_flight(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTSPEC_COST_MODEL", raising=False)
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_vllm.adapter"):
        drafter = AgentSpecDrafter(_vllm_config("llama8b-h100", 4, 4), ProbeProposer())
    assert drafter.step_timer is None
    assert "not fitted" not in caplog.text


def test_the_preset_the_budget_reads_under_pipeline_parallelism() -> None:
    """The proposer is built with the prior preset itself (no fit that never learns)."""
    seen: list[object] = []

    def capture(name: str, env: Any, **options: Any) -> ProbeProposer:
        seen.append(env.cost_model)
        return ProbeProposer()

    import agentspec_mw_vllm.adapter as adapter

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(adapter, "make_proposer", capture)
        mp.setattr(adapter, "_token_bytes", lambda model_config: [b"x"] * 1000)
        mp.delenv("AGENTSPEC_COST_MODEL", raising=False)
        AgentSpecDrafter(_vllm_config("measured", 2, 2))
    finally:
        mp.undo()
    assert len(seen) == 1 and isinstance(seen[0], StepTimeModel)
    assert not isinstance(seen[0], MeasuredStepTime)
