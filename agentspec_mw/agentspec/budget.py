"""Per-step draft budget: admit the draft positions that raise the step's goodput.

Given, for each request of the step, the survival probability of each draft position
(``s[i][j]`` = probability that positions ``0..j`` are all accepted; non-increasing in
``j``), the step's expected output is ``E(n) = b + Σ admitted s``. Its time ``T(n)`` is
the engine's step-time model of the step the drafts make (:func:`step_times`), the
prefill chunks they displace included. For ``n`` admitted positions the best set is the
``n`` highest survivals (a stable sort keeps each request's admitted positions a
prefix), so the allocation picks ``n* = argmax_n E(n)/T(n)``: the expected tokens per
second of the step, at most ``budget`` positions and ``k`` per request. With nothing
worth its slot, ``n* = 0``. Rejection is not an input: a rejected position costs the
step what the model charges for its slot, and that is all it costs.

**Displaced prefill.** vLLM schedules decodes and their drafts before waiting prompt
chunks, so with ``P`` prompt tokens waiting and ``F`` tokens of budget left after the
decodes, ``p(n) = min(P, F − n)`` prefill tokens share a step with ``n`` drafts, and
``d(n) = p(0) − p(n)`` are pushed to a later step. A pushed token is not free: it is
computed later, in a step whose budget is full (there are still tokens waiting), where
it costs that step's marginal token time ``c_disp = t(b + F + 1) − t(b + F)``. So

    T(n) = t(b + n + p(n), kv) + c_disp · d(n).

A prefill token is a batched token without a logits row (a chunk adds one row, at its
last position; the step context does not say how many requests prefill, so one row is
charged while any prefill waits, in this step or, displaced, in a later one): with a row
term ``c_row`` (``cpu-smollm2``) a draft costs ``c_tok + c_row`` and a prefill token, in
this step or displaced, ``c_tok``.
Under the linear model ``c_disp`` is its ``c_tok`` and ``T(n) = t(b + p(0) + n, kv) −
c_row · (p(0) − 1)`` (for ``p(0) > 0``): a draft costs the same whether or not it
displaces a chunk. Under the roofline a
step whose drafts fit under the ridge gets them free only while no prefill waits; once
the chunks fill the budget, each draft pays the full step's ``c_tok`` (such a step is
compute-bound), even where the decodes alone would be memory-bound.

**The prefill chunk is conserved work** (:func:`prefill_time`). Every prompt token is
computed once whatever the drafts do, so the time a step's chunk adds, ``T(0) − t(b,
kv)``, is left out of the denominator: the goodput is ``E(n) / (T(n) − (T(0) − t(b,
kv)))``. What an emitted token is worth is then a share of the decodes' own step, not
of a step made long by a chunk; otherwise every step that carries a chunk (most steps
of agent workloads, whose calls each bring a new prompt) would value a token at its
share of the chunk too and admit positions whose drafts cost more than they return.
The marginal times (what a draft costs, displacement included) are ``T``'s.

**Which positions can pay** (:func:`admission_bound`). With survivals sorted and the
marginal time ``T(n+1) − T(n)`` non-decreasing in ``n`` (true of the linear, roofline
and any convex model, displacement included), ``E/T`` rises until ``n*`` and falls after
it, so every admitted position has ``s ≥ b/t(b, kv) · (T(1) − T(0))``: positions under
that bound are never admitted, and the proposer uses it to skip them before sorting.

**Drafts priced by their request's context** (:func:`draft_costs`). On some engines a
draft costs more than a batched token, by its request's context: on vLLM's CPU backend a
request that carries a draft leaves the one-token decode path of the attention kernel, so
its KV is read again, and each draft position attends over it (measured,
``benchmarks/fit_step_time.py --drafts``). A linear model with ``c_spec_kv`` and
``c_draft_kv`` (:class:`~agentspec_mw.costmodel.StepTimeModel`) charges request ``i``
with context ``L_i`` a setup ``A_i = c_spec_kv · L_i`` once it drafts at all and ``C_i =
c_tok + c_draft_kv · L_i`` per position, so the cheapest positions are no longer the
same for every request. The allocation then maximises the same goodput ``(b + Σ S_i(d_i))
/ (t(b, kv) + Σ [d_i > 0] A_i + d_i C_i)`` by Dinkelbach's method: at the current goodput
``λ`` each request takes the length that maximises ``S_i(d) − λ (A_i [d > 0] + d C_i)``
(``S_i(d)`` its first ``d`` survivals), ``λ`` becomes the goodput of those lengths, and
the loop stops when ``λ`` no longer rises (it is then the optimum; a few rounds). Where
the token budget binds (rare: 4,096 tokens on the CPU engine), the positions worth least
at ``λ`` are dropped until it holds, and a request whose remaining positions no longer pay
for its setup at ``λ`` drops them all. That is a heuristic, not the optimum (a request's
setup makes the capped choice a knapsack), and a round it cuts can fall below ``λ``: the
loop then returns the allocation that gave ``λ`` (no drafts, before the first round), so
the step is never below not drafting. Every admitted position still has ``s ≥ λ_0 C_i``
with ``λ_0 = b / t(b, kv)`` (:func:`admission_bounds`). Without these terms (every GPU
preset) the allocation is the scan above.

This replaces the paper's ``B_t = ⌊α/bz⌋`` (which shrinks with batch size while its text
says the budget tracks the free budget ``M(b) = AI − b``) and its ``max(|CT_i|, ·)``
(which can exceed the budget): here the budget is a real cost, never exceeded.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from agentspec_mw.agentspec.jit import kernel
from agentspec_mw.costmodel import StepTimeFn
from agentspec_mw.proposer import StepContext

__all__ = [
    "Allocation",
    "StepShape",
    "admission_bound",
    "admission_bounds",
    "allocate",
    "draft_costs",
    "prefill_time",
    "prices_drafts",
    "step_shape",
    "step_times",
]


class StepShape(NamedTuple):
    """What the step-time model needs to know about one step, besides its drafts.

    ``budget``: tokens the drafts and prefill chunks share (the scheduler's budget less
    one token per decoding request), ``None`` if unknown (no limit, nothing displaced).
    ``prefill_tokens``: prompt tokens waiting to be computed (:func:`step_shape` says what
    an unknown queue becomes).
    """

    batch_size: int
    num_kv: float
    budget: int | None = None
    prefill_tokens: int = 0


def step_shape(step: StepContext) -> StepShape:
    """The step as the cost model sees it: the drafts' and prefill chunks' share of the
    token budget is the budget less one token per decoding request
    (``num_decode_tokens``, else ``batch_size``).

    A host that cannot see the waiting prompts (``num_prefill_tokens is None``: vLLM's
    model runner without the plugin's count from the scheduler) gets the step priced as if
    prompts waited to fill that share: each draft then costs what it costs a full step —
    under a convex model its highest price, under the linear form the same as without a
    queue (nothing changes there). Under-pricing is
    the costly error: in the replay under the ridge-form ``llama8b-h200``, a budget blind
    to the queue that took every draft under the ridge as free was 2.8-5.2 % slower at batch
    32 than one that saw it, while a price 1.5-2x too high costs at most 1.1 %
    (``benchmarks/cost_belief_ab.py``, docs/experiments/gpu_step_time_h200_2026-12-04.md)."""
    budget = None
    if step.max_num_batched_tokens is not None:
        decode = step.num_decode_tokens or step.batch_size
        budget = max(0, step.max_num_batched_tokens - decode)
    waiting = step.num_prefill_tokens
    if waiting is None:
        waiting = budget or 0
    return StepShape(step.batch_size, step.num_kv_tokens, budget, waiting)


def step_times(cost: StepTimeFn, shape: StepShape, n: np.ndarray) -> np.ndarray:
    """``T(n)`` of the module docstring for each entry of ``n`` (drafted tokens, each at
    most ``shape.budget``): the step with ``n`` drafts and the prefill they leave room
    for, plus the later cost of the prefill they displace."""
    n = np.asarray(n, dtype=np.float64)
    b, kv, budget, waiting = shape
    if budget is None:
        tokens = b + waiting + n
        displaced = np.zeros_like(n)
    else:
        p0 = min(waiting, budget)
        pn = np.minimum(waiting, np.maximum(budget - n, 0.0))
        tokens = b + n + pn
        displaced = p0 - pn
    vec = getattr(cost, "step_time_array", None)
    if vec is not None:
        t = np.asarray(vec(tokens, kv), dtype=np.float64)
    else:
        t = np.fromiter((cost.step_time(float(x), kv) for x in tokens), np.float64, len(tokens))
    # the models charge every batched token a logits row; the prefill chunks have one (in
    # this step, or in the later one a displaced chunk is computed in)
    c_row = float(getattr(cost, "c_row", 0.0))
    t = t - c_row * (tokens - b - n - min(waiting, 1))
    if budget is not None and waiting > 0:
        full = b + budget
        c_disp = cost.step_time(full + 1, kv) - cost.step_time(full, kv) - c_row
        t = t + c_disp * displaced
    return t


def prefill_time(cost: StepTimeFn, shape: StepShape) -> float:
    """What the step's prefill chunk adds to it without drafts: ``T(0) − t(b, kv)``.

    That work is conserved: fewer decode steps do not remove it (every prompt token is
    computed once, in some step), so it is left out of the time an emitted token is
    worth (module docstring)."""
    if not shape.prefill_tokens or (shape.budget is not None and shape.budget <= 0):
        return 0.0
    t0 = float(step_times(cost, shape, np.array([0.0]))[0])
    return max(0.0, t0 - cost.step_time(float(shape.batch_size), shape.num_kv))


def admission_bound(cost: StepTimeFn, shape: StepShape) -> float:
    """The least survival a position needs to be admitted: ``b/t(b, kv) · (T(1) −
    T(0))``, the goodput without drafts (the step's conserved prefill left out,
    :func:`prefill_time`) times the first slot's marginal time (the module docstring
    says why no admitted position is under it)."""
    if shape.budget is not None and shape.budget <= 0:
        return float("inf")
    linear = getattr(cost, "linear_coefficients", None)
    coef = linear() if linear is not None else None
    if coef is not None:
        # linear model: t(b, kv) from its coefficients, and a draft costs c_tok + c_row
        # whether it takes a free slot or displaces a prefill token (module docstring);
        # the same number as the general path below, without its arrays (every step)
        t_dec = _decode_time(coef, shape.batch_size, shape.num_kv)
        return max(0.0, _decode_goodput(shape.batch_size, t_dec) * float(coef[1]))
    t0, t1 = step_times(cost, shape, np.array([0.0, 1.0])).tolist()
    t_dec = t0 - prefill_time(cost, shape)
    return max(0.0, _decode_goodput(shape.batch_size, t_dec) * (t1 - t0))


def _decode_goodput(batch_size: int, t_dec: float) -> float:
    """``b / t(b, kv)``, the step's goodput without drafts; raises ``ValueError`` unless
    ``t_dec`` is positive and finite (a :class:`~agentspec_mw.costmodel.StepTimeModel`
    guarantees that for a step with a decode; a model pricing the step at no time
    cannot say what a draft is worth)."""
    if not 0.0 < t_dec < math.inf:
        raise ValueError(
            f"the step-time model gives {t_dec!r} s for a step of {batch_size} decodes; "
            "the draft budget needs a positive, finite step time"
        )
    return batch_size / t_dec


def _decode_time(coef: np.ndarray, batch_size: int, num_kv: float) -> float:
    """``t(b, kv)`` of a linear model from its ``(c_fix, c_tok, c_kv, c_oh)``: the step's
    decodes alone, no drafts, no prefill."""
    c_fix, c_tok, c_kv, c_oh = coef.tolist()
    return c_fix + c_tok * batch_size + c_kv * num_kv + c_oh  # type: ignore[no-any-return]


def prices_drafts(cost: StepTimeFn) -> bool:
    """Whether ``cost`` prices a draft by its request's context (``draft_coefficients()``
    not ``None``): only then do :func:`admission_bounds` and :func:`allocate` read the
    requests' context lengths."""
    draft = getattr(cost, "draft_coefficients", None)
    return draft is not None and draft() is not None


def draft_costs(cost: StepTimeFn, context_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Per request, ``(A_i, C_i)``: the seconds drafting at all adds to the step
    (``c_spec_kv · L_i``) and each draft position adds (``c_tok + c_draft_kv · L_i``; with
    a row term ``c_tok + c_row``), for a linear model that prices drafts by their
    request's context ``L_i`` (module docstring); ``None`` for any other model."""
    draft = getattr(cost, "draft_coefficients", None)
    terms = draft() if draft is not None else None
    if terms is None:
        return None
    linear = getattr(cost, "linear_coefficients", None)
    coef = linear() if linear is not None else None
    if coef is None:
        return None
    lens = np.asarray(context_lens, dtype=np.float64)
    return terms[0] * lens, float(coef[1]) + terms[1] * lens


def admission_bounds(cost: StepTimeFn, shape: StepShape, context_lens: np.ndarray) -> np.ndarray:
    """Per request, the least survival one of its positions needs to be admitted: the
    goodput without drafts times its per-position cost ``C_i`` (:func:`draft_costs`), or
    :func:`admission_bound` for every request when the model has no per-request price."""
    n = len(context_lens)
    bound = admission_bound(cost, shape)
    costs = draft_costs(cost, context_lens)
    if costs is None or not math.isfinite(bound):
        return np.full(n, bound)
    coef = cost.linear_coefficients()  # type: ignore[attr-defined]  # draft_costs found it
    t_dec = _decode_time(coef, shape.batch_size, shape.num_kv)
    return _decode_goodput(shape.batch_size, t_dec) * costs[1]


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
        at: tuple[StepTimeFn, StepShape],
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
        self._at = at  # (cost, shape): for threshold

    @property
    def counts(self) -> list[int]:
        """Drafted positions per request, as a list."""
        return self.count_array.tolist()  # type: ignore[no-any-return]

    @property
    def threshold(self) -> float:
        """What one more position would have to add to the expected tokens to pay for
        its slot: ``T(n* + 1) − T(n*)`` times the goodput."""
        cost, shape = self._at
        t0, t1 = step_times(cost, shape, np.array([self.used, self.used + 1.0])).tolist()
        return (t1 - t0) * self.goodput


def allocate(
    survival: np.ndarray,
    lens: np.ndarray,
    *,
    batch_size: int,
    num_kv: float,
    cost: StepTimeFn,
    budget: int | None = None,
    prefill_tokens: int = 0,
    min_survival: float = 0.0,
    context_lens: np.ndarray | None = None,
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
        budget: tokens drafts and prefill chunks share this step (the scheduler's budget
            less the decode tokens), if known; never exceeded.
        prefill_tokens: prompt tokens waiting to be prefilled (0 if unknown).
        min_survival: skip positions below this survival (:func:`admission_bound` is a
            bound that changes no allocation).
        context_lens: each request's context (KV tokens); with a model that prices
            drafts by it (:func:`draft_costs`) the allocation weighs each request's own
            costs, else it is not read.

    Raises:
        ValueError: ``lens`` does not sum to the number of survivals.
    """
    survival = np.ascontiguousarray(survival, dtype=np.float64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    cap = len(survival) if budget is None else max(0, min(len(survival), int(budget)))
    waiting = max(0, int(prefill_tokens))
    shape = StepShape(batch_size, float(num_kv), budget, waiting)
    linear = getattr(cost, "linear_coefficients", None)
    coef = linear() if linear is not None else None
    costs = None if context_lens is None else draft_costs(cost, context_lens)
    if costs is not None and coef is not None:
        if len(costs[0]) != len(lens):
            raise ValueError("allocate: context_lens must hold one entry per request")
        base = _decode_time(coef, batch_size, float(num_kv))
        counts, best, goodput, offered = _solve_priced(
            survival, lens, float(min_survival), cap, batch_size, base, costs[0], costs[1]
        )
        if offered < 0:
            raise ValueError("allocate: survival must hold sum(lens) entries")
        return Allocation(counts, batch_size + goodput[1], goodput[0], offered, best, (cost, shape))
    base_tokens = batch_size
    if coef is not None:
        # the kernel evaluates the linear model itself: T(n) = t(b + p(0) + n) less the
        # logits rows the prefill tokens do not have, and without the conserved prefill
        # (c_tok · p(0) + c_row) that is t(b + n) (module docstring)
        times = _NO_TIMES
    else:
        coef = _NO_TIMES
        times = step_times(cost, shape, np.arange(cap + 1)) - prefill_time(cost, shape)
    counts, best, goodput, offered = _solve(
        survival,
        lens,
        float(min_survival),
        cap,
        batch_size,
        base_tokens,
        float(num_kv),
        coef,
        times,
    )
    if offered < 0:
        raise ValueError("allocate: survival must hold sum(lens) entries")
    return Allocation(counts, batch_size + goodput[1], goodput[0], offered, best, (cost, shape))


_NO_TIMES = np.empty(0, dtype=np.float64)


@kernel(nogil=True)
def _solve(
    survival: np.ndarray,
    lens: np.ndarray,
    min_survival: float,
    cap: int,
    batch: int,
    base_tokens: int,
    num_kv: float,
    coef: np.ndarray,
    times: np.ndarray,
) -> tuple[np.ndarray, int, tuple[float, float], int]:  # pragma: no cover
    """The allocation in one call: rank the survivals (:func:`_rank`), find ``n*`` and
    its goodput (:func:`_choose`), and count each request's admitted positions.

    The step times are ``times[n]`` for ``n`` drafted tokens, or, for the linear model,
    computed here from ``coef = (c_fix, c_tok, c_kv, c_oh)`` at ``base_tokens + n``
    batched tokens in the same order of operations as
    ``StepTimeModel.step_time_array``. Returns ``(counts, n*, (goodput, csum[n*]),
    offered)``; ``offered = -1`` when ``lens`` does not sum to the survivals.
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
            nbt[n] = coef[0] + coef[1] * float(base_tokens + n) + coef[2] * num_kv + coef[3]
    else:
        nbt = times[:m]  # a view: the caller's times are read, not copied
    counts, best, goodput = _choose(order, csum, nbt, lens, float(batch))
    return counts, best, (goodput, csum[best]), m - 1


@kernel(nogil=True)
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


@kernel(nogil=True)
def _choose(
    order: np.ndarray,
    csum: np.ndarray,
    times: np.ndarray,
    lens: np.ndarray,
    batch: float,
) -> tuple[np.ndarray, int, float]:  # pragma: no cover
    """``n* = argmax_n (batch + csum[n]) / times[n]`` (the first maximum:
    ties prefer fewer drafted tokens), its goodput, and the positions each request has
    among the first ``n*`` of ``order``."""
    best = 0
    best_g = -1.0
    for n in range(csum.shape[0]):
        g = (batch + csum[n]) / times[n]
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


@kernel(nogil=True)
def _solve_priced(
    survival: np.ndarray,
    lens: np.ndarray,
    min_survival: float,
    cap: int,
    batch: int,
    base_time: float,
    setup: np.ndarray,
    per_pos: np.ndarray,
) -> tuple[np.ndarray, int, tuple[float, float], int]:  # pragma: no cover
    """The allocation when each request prices its drafts itself (module docstring,
    "Drafts priced by their request's context"): Dinkelbach's iteration on the goodput
    ``(batch + Σ S_i(d_i)) / (base_time + Σ [d_i > 0] setup_i + d_i per_pos_i)``, then, if
    the drafts exceed ``cap`` tokens, the positions worth least at the goodput dropped
    (a request's last ones with its setup once what it keeps is worth nothing at it).
    A round whose drops leave it below the goodput it started from ends the iteration
    with the allocation that gave that goodput (before the first round: no drafts).
    Returns ``(counts, Σ d_i, (goodput, Σ admitted survivals), offered)`` like
    :func:`_solve`; ``offered = -1`` when ``lens`` does not sum to the survivals."""
    n_req = lens.shape[0]
    starts = np.empty(n_req + 1, dtype=np.int64)
    starts[0] = 0
    for i in range(n_req):
        starts[i + 1] = starts[i] + lens[i]
    counts = np.zeros(n_req, dtype=np.int64)
    if starts[n_req] != survival.shape[0]:
        return counts, 0, (0.0, 0.0), -1
    usable = np.zeros(n_req, dtype=np.int64)  # each request's leading positions >= min
    offered = 0
    for i in range(n_req):
        j = 0
        while j < lens[i] and survival[starts[i] + j] >= min_survival:
            j += 1
        usable[i] = j
        offered += j
    if offered > cap:
        offered = cap
    lam = batch / base_time
    expected = float(batch)
    time_s = base_time
    used = 0
    value = np.zeros(n_req, dtype=np.float64)  # S_i(d_i) - lam (setup_i + d_i per_pos_i)
    # the allocation whose goodput is lam: no drafts until a round raises it
    prev = np.zeros(n_req, dtype=np.int64)
    prev_expected = expected
    prev_time = time_s
    prev_used = 0
    for _ in range(64):
        expected = float(batch)
        time_s = base_time
        used = 0
        for i in range(n_req):
            acc = 0.0
            best_v = 0.0
            best_d = 0
            a = starts[i]
            for j in range(usable[i]):
                acc += survival[a + j] - lam * per_pos[i]
                v = acc - lam * setup[i]
                if v > best_v:
                    best_v = v
                    best_d = j + 1
            counts[i] = best_d
            value[i] = best_v
            used += best_d
        capped = used > cap
        while used > cap:  # drop the position worth least at lam
            worst = -1
            worst_v = 0.0
            for i in range(n_req):
                d = counts[i]
                if d > 0:
                    v = survival[starts[i] + d - 1] - lam * per_pos[i]
                    if d == 1:
                        v -= lam * setup[i]
                    if worst < 0 or v < worst_v:
                        worst = i
                        worst_v = v
            d = counts[worst] - 1
            counts[worst] = d
            used -= 1
            value[worst] -= survival[starts[worst] + d] - lam * per_pos[worst]
            if d > 0 and value[worst] <= 0.0:
                # what the request keeps no longer pays for its setup at lam: drop it all
                counts[worst] = 0
                used -= d
        s_sum = 0.0
        for i in range(n_req):
            d = counts[i]
            if d > 0:
                a = starts[i]
                for j in range(d):
                    s_sum += survival[a + j]
                time_s += setup[i] + d * per_pos[i]
        expected = batch + s_sum
        g = expected / time_s
        if g <= lam * (1.0 + 1e-12):
            if capped and g < lam:
                # without drops a round is never below lam (Dinkelbach); with them it
                # can be: keep the allocation that gave lam
                return prev, prev_used, (prev_expected / prev_time, prev_expected - batch), offered
            break
        lam = g
        prev[:] = counts
        prev_expected = expected
        prev_time = time_s
        prev_used = used
    return counts, used, (expected / time_s, expected - batch), offered
