"""The priced allocation (drafts priced by their request's context) under a binding token
budget: dropping positions to meet the cap must never leave the step below the goodput of
not drafting, nor leave a request holding positions that no longer pay for its setup; and
where no round exceeds the cap the allocation is bit for bit the unlimited budget's
(review 63)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agentspec_mw.agentspec.budget import _solve_priced, allocate, draft_costs
from agentspec_mw.costmodel import PRESETS
from tests.test_budget_priced import PRICED, _goodput

CPU = PRESETS["cpu-smollm2"]


def _best(surv: list[np.ndarray], cap: int, base: float, a: np.ndarray, c: np.ndarray) -> float:
    """The goodput of the best allocation of at most ``cap`` positions (every one tried)."""
    lens = [len(s) for s in surv]
    return max(
        _goodput(surv, d, base, a, c)
        for d in itertools.product(*(range(n + 1) for n in lens))
        if sum(d) <= cap
    )


def test_a_position_left_without_its_setup_is_dropped() -> None:
    """The reviewer's step: one request at 10,000 tokens of context whose two positions pay
    for its setup together; a budget of one token leaves one, which does not: no drafts."""
    surv, lens, ctx = np.array([0.3, 0.3]), np.array([2]), np.array([10_000])
    kw = {"batch_size": 1, "num_kv": 10_000.0, "cost": CPU, "context_lens": ctx}
    assert allocate(surv, lens, **kw).counts == [2]  # type: ignore[arg-type]
    alloc = allocate(surv, lens, budget=1, **kw)  # type: ignore[arg-type]
    no_drafts = 1 / CPU.step_time(1, 10_000.0)
    assert alloc.counts == [0]
    assert alloc.goodput == pytest.approx(no_drafts, rel=1e-12)
    assert alloc.expected == 1.0 and alloc.used == 0


@pytest.mark.parametrize(
    ("surv", "ctx", "cap", "counts"),
    [
        ([[0.86, 0.59, 0.57], [0.7, 0.39]], [2000, 5000], 4, [3, 0]),
        ([[0.84, 0.83], [0.63, 0.46, 0.3]], [1000, 5000], 3, [2, 0]),
        ([[0.87, 0.32], [0.68, 0.59]], [3000, 4000], 1, [1, 0]),
    ],
)
def test_a_request_cut_below_its_setup_gives_up_its_positions(
    surv: list[list[float]], ctx: list[int], cap: int, counts: list[int]
) -> None:
    """Two requests, the second's context long: cut to the cap, the second keeps one
    position that no longer pays for its setup; dropping it (with the setup) is the best
    allocation under the cap (before: [3, 1], [2, 1] and [0, 1], each above not drafting
    but 4-10 % under the best)."""
    s = [np.array(x) for x in surv]
    lens, lens_ctx = np.array([len(x) for x in s]), np.array(ctx)
    b, kv = 2, float(sum(ctx))
    alloc = allocate(
        np.concatenate(s),
        lens,
        batch_size=b,
        num_kv=kv,
        cost=CPU,
        budget=cap,
        context_lens=lens_ctx,
    )
    assert alloc.counts == counts
    costs = draft_costs(CPU, lens_ctx)
    assert costs is not None
    base = CPU.step_time(b, kv)
    best = _best(s, cap, base, *costs)
    assert _goodput(s, tuple(alloc.counts), base, *costs) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(60))
def test_a_binding_budget_never_costs_more_than_not_drafting(seed: int) -> None:
    """Random small steps with long contexts (setups that only several positions pay for)
    and a budget under what the requests offer: the allocation meets the budget, reports
    its own goodput, and is never below not drafting (before: 3 of these 60 were)."""
    rng = np.random.default_rng(1000 + seed)
    cost = CPU if seed % 2 == 0 else PRICED
    n_req = int(rng.integers(1, 5))
    lens = rng.integers(1, 5, n_req)
    surv = [np.sort(rng.uniform(0.0, 1.0, n))[::-1] for n in lens]
    ctx = rng.integers(10, 12_000, n_req).astype(np.int64)
    b, kv = n_req, float(ctx.sum())
    cap = int(rng.integers(0, int(lens.sum())))
    alloc = allocate(
        np.concatenate(surv), lens, batch_size=b, num_kv=kv, cost=cost, budget=cap, context_lens=ctx
    )
    costs = draft_costs(cost, ctx)
    assert costs is not None
    base = cost.step_time(b, kv)
    got = _goodput(surv, tuple(alloc.counts), base, *costs)
    assert sum(alloc.counts) == alloc.used <= cap
    assert alloc.goodput == pytest.approx(got, rel=1e-9)
    assert got >= b / base * (1 - 1e-12)
    assert got <= _best(surv, cap, base, *costs) * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_a_budget_that_never_binds_allocates_as_before(seed: int) -> None:
    """Steps of up to 300 requests, k up to 16, with a budget of at least the positions
    offered: the result is the unlimited budget's, bit for bit (the cap's handling runs only
    where a round exceeds it; checked once against the kernel before it, 8 x 60 steps)."""
    rng = np.random.default_rng(seed)
    for trial in range(60):
        cost = (CPU, PRICED)[trial % 2]
        n_req = int(rng.integers(1, 300))
        k = int(rng.integers(1, 17))
        lens = rng.integers(0, k + 1, n_req).astype(np.int64)
        surv = np.concatenate(
            [np.sort(rng.uniform(0.0, 1.0, n) ** rng.uniform(0.2, 3.0))[::-1] for n in lens]
        )
        ctx = rng.integers(10, 20_000, n_req).astype(np.int64)
        costs = draft_costs(cost, ctx)
        assert costs is not None
        b = n_req + int(rng.integers(0, 50))
        coef = cost.linear_coefficients()
        assert coef is not None
        base = float(coef[0] + coef[1] * b + coef[2] * float(ctx.sum()) + coef[3])
        min_s = float(rng.uniform(0.0, 0.3)) if trial % 3 == 0 else 0.0
        cap = int(lens.sum()) + int(rng.integers(0, 3))
        args = (surv, lens, min_s, cap, b, base, costs[0], costs[1])
        counts, used, (goodput, s_sum), offered = _solve_priced(*args)
        free = (*args[:3], 1 << 40, *args[4:])
        counts0, used0, (goodput0, s_sum0), offered0 = _solve_priced(*free)
        assert counts.tolist() == counts0.tolist()
        assert (used, goodput, s_sum, offered) == (used0, goodput0, s_sum0, offered0)
