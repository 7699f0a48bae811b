"""Review 71: vLLM skips the draft call of a whole step while any row is within ``k``
tokens of ``max_model_len`` (``GPUModelRunner._input_fits_in_drafter`` in
``sample_tokens``; the step's drafts are zeros instead). The plugin's scheduler wrap numbers
the steps (``BatchContext.scheduler_step``); a gap in the numbers means engine steps ran
between two draft calls:

* the time between the calls spans several steps: not reported to the step-time fit;
* the draft last sent to a request that was scheduled in a step without a draft call was
  verified there (the step's schedule never reaches the drafter): dropped, and the zeros
  vLLM scheduled after it are never taken for its verification;
* without the numbers (no or an older scheduler wrap) the session behaves as before.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from agentspec_mw_vllm import plugin
from agentspec_mw_vllm.metrics import DrafterMetrics
from agentspec_mw_vllm.session import DraftSession
from tests.vllm.fakes import ProbeProposer
from tests.vllm.test_queue import runner_and_output
from tests.vllm.test_session import Batch, RecordingTimer

STEP = 0.050  # every engine step takes 50 ms


class _Engine:
    """A fake engine: a batch, a clock that advances one ``STEP`` per engine step, and
    the scheduler's step numbers (``None``: not counted)."""

    def __init__(self, session: DraftSession, batch: Batch, counted: bool = True) -> None:
        self.session = session
        self.batch = batch
        self.counted = counted
        self.steps = 0
        self.now = [0.0]

    def clock(self) -> float:
        return self.now[0]

    def skipped_step(self, tokens: dict[str, list[int]]) -> None:
        """An engine step whose draft call vLLM skipped: its tokens land in the rows."""
        self.steps += 1
        self.batch.sample(tokens)
        self.now[0] += STEP

    def call(self, tokens: dict[str, list[int]], **kw: Any) -> list[list[int]]:
        """An engine step followed by its draft call."""
        self.steps += 1
        sampled = self.batch.sample(tokens)
        ctx = dataclasses.replace(
            self.batch.ctx(max_len=4096, **kw),
            scheduler_step=self.steps if self.counted else None,
        )
        self.now[0] += STEP
        out = self.session.step(ctx, sampled, self.batch.n, self.batch.buf)
        return out


def _timed(counted: bool) -> tuple[_Engine, RecordingTimer]:
    timer = RecordingTimer()
    engine = _Engine(None, Batch(width=4096), counted)  # type: ignore[arg-type]
    engine.session = DraftSession(
        ProbeProposer(draft_len=0),
        k=3,
        metrics=DrafterMetrics(prometheus=False),
        step_timer=timer,
        clock=engine.clock,
    )
    engine.batch.add("a", [1] * 100)
    engine.batch.add("b", [2] * 100)
    return engine, timer


def test_a_gap_with_skipped_draft_calls_is_not_reported_as_one_step() -> None:
    """Steady 50 ms steps; then two steps run without a draft call: the 150 ms between
    the two calls is three steps, not one step of this call's shape (the fit's outlier
    rule lets up to 4x through)."""
    engine, timer = _timed(counted=True)
    for _ in range(10):
        engine.call({"a": [5], "b": [6]}, scheduled={"a": 1, "b": 1})
    assert [c[2] for c in timer.calls] == [pytest.approx(STEP)] * 9
    engine.skipped_step({"a": [5], "b": [6]})
    engine.skipped_step({"a": [5], "b": [6]})
    engine.call({"a": [5], "b": [6]}, scheduled={"a": 1, "b": 1})
    assert len(timer.calls) == 9  # the 3-step gap is not observed
    # the next gap is one step again, and timed
    engine.call({"a": [5], "b": [6]}, scheduled={"a": 1, "b": 1})
    assert len(timer.calls) == 10
    assert timer.calls[-1][2] == pytest.approx(STEP)
    assert max(c[2] for c in timer.calls) == pytest.approx(STEP)


def test_without_step_numbers_the_gap_is_timed_as_before() -> None:
    """No numbers on the context (no or an older scheduler wrap): as before the change."""
    engine, timer = _timed(counted=False)
    for _ in range(3):
        engine.call({"a": [5], "b": [6]}, scheduled={"a": 1, "b": 1})
    engine.skipped_step({"a": [5], "b": [6]})
    engine.call({"a": [5], "b": [6]}, scheduled={"a": 1, "b": 1})
    assert [c[2] for c in timer.calls] == [pytest.approx(STEP)] * 2 + [pytest.approx(2 * STEP)]


def _counting(draft_len: int = 2) -> tuple[_Engine, DrafterMetrics]:
    metrics = DrafterMetrics(prometheus=False)
    engine = _Engine(None, Batch(width=4096))  # type: ignore[arg-type]
    engine.session = DraftSession(ProbeProposer(draft_len=draft_len), k=3, metrics=metrics)
    return engine, metrics


def _counts(metrics: DrafterMetrics) -> tuple[int, int]:
    snap = metrics.snapshot()
    return snap.total_drafted, snap.total_accepted


def test_zeros_scheduled_after_a_skipped_call_are_not_the_sent_drafts_verification() -> None:
    """The proposer drafts ``[0, 0]`` (token 0 is a real token); vLLM verifies it in the
    next step and skips that step's draft call, so the step after verifies the zeros it
    put in the draft's place: the session took those zeros for its draft's verification
    (2 drafted, 0 accepted: the draft was in fact accepted whole, in the step before)."""
    engine, metrics = _counting()
    engine.batch.add("a", [1, 2, 3])
    assert engine.call({"a": [0]}) == [[0, 0]]
    engine.skipped_step({"a": [0, 0, 9]})  # [0, 0] verified, both accepted
    engine.call({"a": [5]}, spec={"a": [0, 0]})  # the zeros: rejected
    assert _counts(metrics) == (0, 0)


def test_a_draft_verified_in_a_step_without_a_draft_call_is_dropped_not_guessed() -> None:
    """The reviewer's case: the draft ``[7, 7]`` is verified in a step whose draft call
    vLLM skipped. That step's schedule never reaches the drafter (the scheduler may have
    cut the draft), so its verification cannot be told exactly: not counted, and the
    next draft's verification is counted as usual."""
    engine, metrics = _counting()
    engine.batch.add("a", [1, 2, 3])
    assert engine.call({"a": [7]}) == [[7, 7]]
    engine.skipped_step({"a": [7, 7, 9]})
    assert engine.call({"a": [9]}, spec={"a": [0, 0]}) == [[9, 9]]
    assert _counts(metrics) == (0, 0)
    engine.call({"a": [9, 4]}, spec={"a": [9, 9]})
    assert _counts(metrics) == (2, 1)


def test_a_request_not_scheduled_while_the_calls_were_skipped_keeps_its_count() -> None:
    """``b`` is out of the batch in the skipped step (vLLM keeps its draft for the step
    that next schedules it): the draft verified after the gap is its own, counted."""
    engine, metrics = _counting()
    engine.batch.add("a", [1, 2, 3])
    engine.batch.add("b", [4, 5, 6])
    live = {"a", "b"}
    assert engine.call({"a": [7], "b": [8]}) == [[7, 7], [8, 8]]
    saved = (engine.batch.buf[1].copy(), int(engine.batch.n[1]))
    engine.batch.remove("b")
    engine.skipped_step({"a": [7, 7, 9]})
    engine.batch.add("b", [4, 5, 6])
    engine.batch.buf[1], engine.batch.n[1] = saved
    sampled = engine.batch.sample({"a": [3], "b": [8, 8, 1]})
    engine.steps += 1
    ctx = dataclasses.replace(
        engine.batch.ctx(max_len=4096, spec={"a": [0, 0], "b": [8, 8]}),
        scheduler_step=engine.steps,
        live_req_ids=live,
    )
    engine.session.step(ctx, sampled, engine.batch.n, engine.batch.buf)
    assert _counts(metrics) == (2, 2)  # b's [8, 8]; a's [7, 7] (skipped step) dropped


def test_without_step_numbers_drafts_are_counted_as_before() -> None:
    engine, metrics = _counting()
    engine.counted = False
    engine.batch.add("a", [1, 2, 3])
    engine.call({"a": [0]})
    engine.skipped_step({"a": [0, 0, 9]})
    engine.call({"a": [5]}, spec={"a": [0, 0]})
    assert _counts(metrics) == (2, 0)  # the old reading: the zeros taken for the draft


def _scheduler(method: str | None) -> SimpleNamespace:
    spec = None if method is None else SimpleNamespace(method=method)
    return SimpleNamespace(
        waiting=[],
        kv_holding_waiting=[],
        _inflight_prefills=set(),
        kv_cache_manager=None,
        vllm_config=SimpleNamespace(speculative_config=spec),
    )


def test_the_scheduler_wrap_numbers_its_steps_for_a_custom_class_drafter() -> None:
    wrapped = plugin._wrap_schedule(lambda self: SimpleNamespace())
    ours, other = _scheduler("custom_class"), _scheduler("custom_class")
    assert [getattr(wrapped(ours), plugin.STEP_ATTR) for _ in range(3)] == [1, 2, 3]
    assert getattr(wrapped(other), plugin.STEP_ATTR) == 1  # each scheduler its own
    for method in ("ngram", None):
        assert not hasattr(wrapped(_scheduler(method)), plugin.STEP_ATTR)


def test_the_batch_context_passes_the_step_number_on() -> None:
    runner, so = runner_and_output()
    assert plugin.build_batch_context(runner, so).scheduler_step is None
    setattr(so, plugin.STEP_ATTR, 7)
    assert plugin.build_batch_context(runner, so).scheduler_step == 7


def test_an_output_that_schedules_nothing_takes_no_step_number() -> None:
    """A SchedulerOutput with no tokens runs no model step (a batch queue's idle output):
    the next step's number follows the last one's, so no draft call looks skipped."""
    wrapped = plugin._wrap_schedule(lambda self, n: SimpleNamespace(total_num_scheduled_tokens=n))
    ours = _scheduler("custom_class")
    steps = [getattr(wrapped(ours, n), plugin.STEP_ATTR) for n in (5, 0, 0, 3)]
    assert steps == [1, 1, 1, 2]
