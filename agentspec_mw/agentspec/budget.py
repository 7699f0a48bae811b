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
    """Result of :func:`allocate`: drafted positions per request and the step estimates.

    ``count_array`` is the int64 array the proposer reads on its hot path; ``counts``
    (a list) and ``threshold`` are computed when read.
    """

    __slots__ = ("count_array", "expected", "goodput", "offered", "used", "_at")

    def __init__(
        self,
        count_array: np.ndarray,
        expected: float,
        goodput: float,
        offered: int,
        used: int,
        at: tuple[StepTimeFn, int, float],
    ) -> None:
        self.count_array = count_array
        self.expected = expected
        """Expected tokens of the step: ``b + Σ`` admitted survivals."""
        self.goodput = goodput
        """The admitted set's ``E/T`` (tokens per second of the step)."""
        self.offered = offered
        """Positions at or above ``min_survival`` (up to the budget) the choice saw."""
        self.used = used
        """Positions admitted (``n*``)."""
        self._at = at  # (cost, batch_size, num_kv): for threshold

    @property
    def counts(self) -> list[int]:
        """Drafted positions per request, as a list."""
        return self.count_array.tolist()  # type: ignore[no-any-return]

    @property
    def threshold(self) -> float:
        """What one more position would have to add to the expected tokens to pay for
        its slot: the marginal step time after ``n*`` times the goodput."""
        cost, batch_size, num_kv = self._at
        n_now = batch_size + self.used
        marginal = cost.step_time(n_now + 1, num_kv) - cost.step_time(n_now, num_kv)
        return marginal * self.goodput


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
        cost: the step-time model (one with ``linear_coefficients()`` is evaluated
            inside the kernel; otherwise its ``step_time_array`` or ``step_time``).
        budget: most draft tokens the step may take (scheduler budget), if any.
        overhead_s: per-step time not in the model (e.g. the proposer's own time).
        min_survival: never admit a position below this survival.

    Raises:
        ValueError: ``lens`` does not sum to the number of survivals.
    """
    survival = np.ascontiguousarray(survival, dtype=np.float64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    cap = len(survival) if budget is None else max(0, min(len(survival), int(budget)))
    linear = getattr(cost, "linear_coefficients", None)
    coef = linear() if linear is not None else None
    if coef is not None:
        # the kernel evaluates the linear model itself (as StepTimeModel.step_time_array)
        times = _NO_TIMES
    else:
        coef = _NO_TIMES
        nb = np.arange(batch_size, batch_size + cap + 1)
        vec = getattr(cost, "step_time_array", None)
        if vec is not None:
            times = np.asarray(vec(nb, num_kv), dtype=np.float64)
        else:
            times = np.fromiter((cost.step_time(int(x), num_kv) for x in nb), np.float64, len(nb))
    counts, best, goodput, offered = _solve(
        survival,
        lens,
        float(min_survival),
        cap,
        batch_size,
        float(num_kv),
        overhead_s,
        coef,
        times,
    )
    if offered < 0:
        raise ValueError("allocate: survival must hold sum(lens) entries")
    return Allocation(
        counts, batch_size + goodput[1], goodput[0], offered, best, (cost, batch_size, num_kv)
    )


_NO_TIMES = np.empty(0, dtype=np.float64)


@njit(cache=True, nogil=True)
def _solve(
    survival: np.ndarray,
    lens: np.ndarray,
    min_survival: float,
    cap: int,
    batch: int,
    num_kv: float,
    overhead: float,
    coef: np.ndarray,
    times: np.ndarray,
) -> tuple[np.ndarray, int, tuple[float, float], int]:  # pragma: no cover
    """The allocation in one call: rank the survivals (:func:`_rank`), find ``n*`` and
    its goodput (:func:`_choose`), and count each request's admitted positions.

    The step times are ``times[n]`` for ``n`` drafted tokens, or, for the linear model,
    computed here from ``coef = (c_fix, c_tok, c_kv, c_oh)`` in the same order of
    operations as ``StepTimeModel.step_time_array``. Returns ``(counts, n*, (goodput,
    csum[n*]), offered)``; ``offered = -1`` when ``lens`` does not sum to the survivals.
    """
    total = 0
    for i in range(lens.shape[0]):
        total += lens[i]
    if total != survival.shape[0]:
        return np.zeros(lens.shape[0], dtype=np.int64), 0, (0.0, 0.0), -1
    order, csum = _rank(survival, lens, min_survival, cap)
    m = csum.shape[0]
    if coef.shape[0] == 4:
        nbt = np.empty(m, dtype=np.float64)
        for n in range(m):
            nbt[n] = coef[0] + coef[1] * float(batch + n) + coef[2] * num_kv + coef[3]
    else:
        nbt = times[:m]  # a view: the caller's times are read, not copied
    counts, best, goodput = _choose(order, csum, nbt, lens, float(batch), overhead)
    return counts, best, (goodput, csum[best]), m - 1


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
def _choose(
    order: np.ndarray,
    csum: np.ndarray,
    times: np.ndarray,
    lens: np.ndarray,
    batch: float,
    overhead: float,
) -> tuple[np.ndarray, int, float]:  # pragma: no cover
    """``n* = argmax_n (batch + csum[n]) / (times[n] + overhead)`` (the first maximum:
    ties prefer fewer drafted tokens), its goodput, and the positions each request has
    among the first ``n*`` of ``order``."""
    best = 0
    best_g = -1.0
    for n in range(csum.shape[0]):
        g = (batch + csum[n]) / (times[n] + overhead)
        if g > best_g:
            best_g = g
            best = n
    counts = np.zeros(lens.shape[0], dtype=np.int64)
    if best == 0:
        return counts, 0, best_g
    owner = np.empty(order.shape[0], dtype=np.int64)
    p = 0
    for i in range(lens.shape[0]):
        for _ in range(lens[i]):
            owner[p] = i
            p += 1
    for i in range(best):
        counts[owner[order[i]]] += 1
    return counts, best, best_g
