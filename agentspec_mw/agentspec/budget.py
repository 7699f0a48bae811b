"""Per-step draft budget from a step-time model: admit positions while they pay.

Given, for each request of the step, the survival probability of each draft position
(``s[i][j]`` = probability that positions ``0..j`` are all accepted; non-increasing in
``j``), the step's expected output is ``E(n) = b + Σ admitted s`` and its time
``T(n) = step_time(b + n, kv) + overhead``. The admitted set that maximises goodput
``E/T`` for ``n`` admitted positions is the ``n`` highest survivals (a stable sort keeps
each request's admitted positions a prefix), so the allocation picks
``n* = argmax_n E(n)/T(n)`` — the point where the marginal position no longer pays for
its slot — subject to ``n ≤ budget`` and at most ``k`` per request. With nothing worth
its slot, ``n* = 0``.

This replaces the paper's ``B_t = ⌊α/bz⌋`` (which shrinks with batch size while its text
says the budget tracks the free budget ``M(b) = AI − b``) and its ``max(|CT_i|, ·)``
(which can exceed the budget): here the budget is a real cost, never exceeded.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from agentspec_mw.costmodel import StepTimeFn

__all__ = ["Allocation", "allocate"]


class Allocation:
    """Result of :func:`allocate`: drafted positions per request and the step estimates."""

    __slots__ = ("counts", "expected", "threshold", "offered", "used")

    def __init__(
        self, counts: list[int], expected: float, threshold: float, offered: int, used: int
    ) -> None:
        self.counts = counts
        self.expected = expected
        self.threshold = threshold
        self.offered = offered
        self.used = used


def allocate(
    survival: np.ndarray,
    lens: np.ndarray,
    *,
    batch_size: int,
    num_kv: float,
    cost: StepTimeFn,
    budget: int | None = None,
    overhead_s: float = 0.0,
    min_survival: float = 0.0,
) -> Allocation:
    """Split one step's budget across requests (see the module docstring).

    Args:
        survival: all requests' survival probabilities, concatenated (request ``i`` owns
            ``lens[i]`` consecutive entries, non-increasing, already capped at ``k``).
        lens: candidate positions per request.
        batch_size: requests in the step (each yields at least one token).
        num_kv: resident KV tokens of the step.
        cost: the step-time model.
        budget: most draft tokens the step may take (scheduler budget), if any.
        overhead_s: per-step time not in the model (e.g. the proposer's own time).
        min_survival: never admit a position below this survival.
    """
    n_req = len(lens)
    base_t = cost.step_time(batch_size, num_kv) + overhead_s
    marginal0 = cost.step_time(batch_size + 1, num_kv) - cost.step_time(batch_size, num_kv)
    total = int(lens.sum()) if n_req else 0
    if total != len(survival):
        raise ValueError("allocate: survival must hold sum(lens) entries")
    if total == 0:
        return Allocation([0] * n_req, float(batch_size), marginal0 * batch_size / base_t, 0, 0)
    cap = total if budget is None else max(0, min(total, int(budget)))
    survival = np.ascontiguousarray(survival, dtype=np.float64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    order, csum = _rank(survival, lens, float(min_survival), cap)
    nb = np.arange(len(csum)) + batch_size
    vec = getattr(cost, "step_time_array", None)
    if vec is not None:
        times = np.asarray(vec(nb, num_kv), dtype=np.float64)
    else:
        times = np.fromiter((cost.step_time(int(x), num_kv) for x in nb), np.float64, len(nb))
    exp = batch_size + csum
    goodput = exp / (times + overhead_s)
    best = int(np.argmax(goodput))  # first maximum: ties prefer fewer drafted tokens
    counts = _counts(order, best, lens).tolist() if best else [0] * n_req
    n_now = batch_size + best
    marginal = cost.step_time(n_now + 1, num_kv) - cost.step_time(n_now, num_kv)
    offered = len(csum) - 1  # positions that could be admitted (budget, floor)
    return Allocation(counts, float(exp[best]), marginal * float(goodput[best]), offered, best)


@njit(cache=True, nogil=True)
def _rank(
    survival: np.ndarray, lens: np.ndarray, min_survival: float, cap: int
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    """Survivals highest first (a stable order: a request's positions stay a prefix) and
    the running sums ``csum[n]`` of the first ``n``, for every ``n`` up to ``cap`` and
    while the survivals reach ``min_survival``."""
    order = np.argsort(-survival, kind="mergesort")
    n = min(cap, survival.shape[0])
    csum = np.empty(n + 1, dtype=np.float64)
    csum[0] = 0.0
    m = 0
    while m < n and survival[order[m]] >= min_survival:
        csum[m + 1] = csum[m] + survival[order[m]]
        m += 1
    return order, csum[: m + 1]


@njit(cache=True, nogil=True)
def _counts(order: np.ndarray, best: int, lens: np.ndarray) -> np.ndarray:  # pragma: no cover
    """Positions each request has among the first ``best`` of ``order``."""
    owner = np.empty(order.shape[0], dtype=np.int64)
    p = 0
    for i in range(lens.shape[0]):
        for _ in range(lens[i]):
            owner[p] = i
            p += 1
    counts = np.zeros(lens.shape[0], dtype=np.int64)
    for i in range(best):
        counts[owner[order[i]]] += 1
    return counts
