"""The budget's step time counts logits rows as the step has them: one per decode and
draft token, one for the prefill chunks; a prefill token, in the step or displaced to a
later one, costs ``c_tok`` only (``cpu-smollm2`` has a row term; GPU presets do not)."""

from __future__ import annotations

import numpy as np
import pytest

from agentspec_mw.agentspec.budget import StepShape, allocate, prefill_time, step_times
from agentspec_mw.costmodel import PRESETS


def test_prefill_tokens_have_no_row_but_their_chunk() -> None:
    cpu = PRESETS["cpu-smollm2"]
    assert cpu.c_row > 0
    b, kv, budget = 16, 16 * 500.0, 4096 - 16
    n = np.arange(6.0)
    for waiting in (0, 1, 300):
        t = step_times(cpu, StepShape(b, kv, budget, waiting), n)
        rows = b + n + (1 if waiting else 0)
        expect = [cpu.step_time(b + waiting + x, kv, r) for x, r in zip(n, rows, strict=True)]
        assert t == pytest.approx(expect, rel=1e-12)
    # displaced: each draft still costs c_tok + c_row; the pushed token costs c_tok later
    # (the chunk's row too: a draft that pushes the whole chunk moves its row, not drops it)
    t = step_times(cpu, StepShape(b, kv, 3, 100_000), n[:4])
    assert np.diff(t) == pytest.approx([cpu.c_tok + cpu.c_row] * 3)
    assert t[0] == pytest.approx(cpu.step_time(b + 3, kv, b + 1))


def test_kernel_and_step_times_agree_under_a_row_term() -> None:
    cpu = PRESETS["cpu-smollm2"]
    rng = np.random.default_rng(0)
    lens = np.full(16, 8, dtype=np.int64)
    survival = np.sort(rng.uniform(0.2, 1.0, (16, 8)), axis=1)[:, ::-1].ravel()
    for waiting in (0, 200):
        shape = StepShape(16, 8000.0, 4000, waiting)
        alloc = allocate(
            survival,
            lens,
            batch_size=16,
            num_kv=8000.0,
            cost=cpu,
            budget=4000,
            prefill_tokens=waiting,
        )
        # the goodput's time leaves the conserved prefill out (budget module docstring)
        t = step_times(cpu, shape, np.array([float(alloc.used)]))[0] - prefill_time(cpu, shape)
        assert alloc.goodput == pytest.approx(alloc.expected / t, rel=1e-9)


@pytest.mark.parametrize("name", ["llama8b-h100", "llama8b-h100-roofline"])
def test_gpu_presets_are_unchanged(name: str) -> None:
    """No row term: the prefill tokens cost what they did (c_tok each)."""
    cost = PRESETS[name]
    assert cost.c_row == 0
    b, kv, budget = 64, 64 * 2000.0, 8192 - 64
    n = np.arange(4.0)
    t = step_times(cost, StepShape(b, kv, None, 500), n)
    assert t.tolist() == cost.step_time_array(b + 500 + n, kv).tolist()  # bit for bit
    t = step_times(cost, StepShape(b, kv, budget, 500), n)
    assert t.tolist() == cost.step_time_array(b + 500 + n, kv).tolist()


def test_an_unseen_queue_prices_drafts_as_if_prompts_filled_the_step() -> None:
    """vLLM's model runner cannot see waiting prompts (``num_prefill_tokens=None``): the
    step is priced as if they filled its share of the budget — the same allocation under
    the linear form, each draft at its full-step price under the ridge form (not free)."""
    from agentspec_mw.agentspec.budget import step_shape
    from agentspec_mw.proposer import StepContext

    blind = StepContext(batch_size=32, num_kv_tokens=64_000, max_num_batched_tokens=8192)
    assert step_shape(blind).prefill_tokens == 8192 - 32
    assert (
        step_shape(
            StepContext(batch_size=32, max_num_batched_tokens=8192, num_prefill_tokens=0)
        ).prefill_tokens
        == 0
    )
    assert step_shape(StepContext(batch_size=32)).prefill_tokens == 0  # no budget: no queue
    rng = np.random.default_rng(2)
    lens = np.full(32, 8)
    surv = np.concatenate([np.sort(rng.uniform(0.0, 0.3, 8))[::-1] for _ in lens])
    for name, same in (("llama8b-h100", True), ("llama8b-h200", False)):
        cost = PRESETS[name]
        kw = dict(batch_size=32, num_kv=64_000.0, cost=cost, budget=8192 - 32)
        idle = allocate(surv, lens, prefill_tokens=0, **kw)  # type: ignore[arg-type]
        full = allocate(surv, lens, prefill_tokens=8192 - 32, **kw)  # type: ignore[arg-type]
        assert (idle.counts == full.counts) is same, name
        assert full.used <= idle.used
