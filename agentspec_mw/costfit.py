"""A step-time model fitted online to the engine's own measured steps (``cost_model="measured"``).

The presets of :mod:`agentspec_mw.costmodel` describe one model on one GPU. Anywhere else
— another model, another GPU, or the CPU engine this project's demo runs on, where one
more verified token costs a large share of a step rather than 0.3 % of it — a preset
makes the budget draft for an engine that is not there. :class:`MeasuredStepTime` is a
linear model ``T = c_fix + c_tok * N_batched + c_kv * N_kv + c_spec_kv * N_spec_kv +
c_draft_kv * N_draft_kv + c_emit * N_emitted`` (``spec_kv`` and ``draft_kv`` price a draft
by its request's context, see :class:`~agentspec_mw.costmodel.StepTimeModel`; the last
term is the host's work per token the step emits, below) whose coefficients are the
weighted least-squares fit of the steps the host times (:meth:`MeasuredStepTime.observe`;
the vLLM adapter times the interval between two draft calls, see
:class:`agentspec_mw_vllm.session.DraftSession`):

* **relative error** — each step weighs ``1 / seconds^2``, as in the offline fit
  (:func:`fit_step_times`) the presets come from: the fit minimises each step's relative
  error. Unweighted, the few prefill steps (0.5-1 s on the demo's engine, against 40-150 ms
  decode steps) decided the slopes: two engines running one workload ended at draft prices
  3x apart (0.81 and 1.88x the grid's), where the offline fit of either's steps gives 1.7x
  and the weighted online fit 1.5-1.6x (docs/experiments/weighted_fit_2026-12-04.md);

* **prior** — the fit is a ridge regression toward a preset (default ``llama8b-h100``)
  *scaled to this engine's speed* (by the ratio of the measured times to the preset's
  times for the same steps): each slope has a Gaussian prior centred on the scaled
  preset's, with a standard deviation of ``prior_spread`` times that value (default 1),
  weighed against a relative step-time noise of ``noise`` (default 10 %). The
  prior's weight does not grow with the number of steps, so a slope leaves the preset's
  value only as far as the steps' spread in its feature identifies it: a feature the
  steps barely vary in (the resident KV of one or two short requests) keeps the preset's
  relative cost instead of absorbing the host's speed drifting over time. Before
  ``min_steps`` steps are observed the model *is* the scaled preset. A preset describes
  another engine's absolute times, so it only says how the costs compare;
* **forgetting** — observations decay with a half-life of ``half_life_steps`` steps, so the
  fit follows an engine whose speed changes (another process on the host, a new model);
* **draft shape** — when the prior prices drafts by their request's context (``c_spec_kv``,
  ``c_draft_kv`` > 0: the ``cpu-smollm2`` grid, which varies drafts at fixed batches), the fit
  learns one factor on the prior's draft price ``c_spec_kv N_spec_kv + c_draft_kv N_draft_kv``
  instead of the two terms: every drafting request pays both in proportions a busy engine's
  steps barely vary, so free terms wandered (0-13 µs per KV token of a drafting request
  across runs against the grid's 3.0; docs/experiments/cost_model_ab_2026-12-03.md). On
  the demo at 32 concurrent workflows the factor ends at 0.9x the grid's when the engine
  ran only that load and 1.7-2x after 1-workflow steps (one linear price for both
  regimes), 0-1.1x on `supervisor_team` (docs/experiments/weighted_fit_2026-12-04.md). A
  prior without a draft price (the GPU presets) leaves both terms free;
* **emitted tokens** — a step that accepts drafts emits more tokens, and the host's work
  per emitted token lands in that step (not profiled; on a 2-core CPU host likely also the
  front end delaying the engine's OpenMP threads). The count is the timed step's own: vLLM
  calls the drafter after that step's sampling, rejection sampler and bookkeeping, with the
  tokens it sampled; the step before's scheduler update and output processing (detokenising
  too, in an in-process engine), which fall in the same interval, cost 0.01-0.02 ms per
  token on the demo's engine (timed once, 2026-12-07, with a scratch hook on
  ``DraftSession.step`` and ``Scheduler.schedule``, not kept), so the term is not theirs. Left
  out of the fit it was charged to drafts and to the KV term: on the
  demo's engine (N = 1 / 16 / 32, 699 steps, docs/experiments/emitted_tokens_2026-12-04.md)
  it is ~0.39 ms per emitted token, and without it the offline fit's draft factor was 2.84x
  the grid's (2.15x with it) and its KV price 5.7 µs (3.0 with it; the grid 3.42). It is
  fitted (prior 0) but is not part of :attr:`model`, the
  model the budget reads: per step the host's cost is ``A(n) + c_emit E(n)`` with ``E(n)``
  the expected emitted tokens, and ``E / (A + c_emit E)`` is largest where ``E / A`` is, so
  the budget's choice is exact without it (drafting moves this work, it does not add it).
  Its prior is 0 with a standard deviation of a batched token's (scaled) cost: no preset
  measured it. :meth:`MeasuredStepTime.predict` includes it;
* **sign** — coefficients are never negative: the fit is the non-negative optimum
  (an active-set solve, :func:`_nonnegative_normal_solve`);
* **outliers** — a step measured over ``outlier_ratio`` × the fit's prediction (before
  ``min_steps`` steps: × the median of the steps measured so far) is not used: a pause
  the step-time model does not describe (garbage collection, an idle engine). Nor is one
  under the prediction / ``outlier_ratio`` squared (a timing glitch: weighed by ``1 /
  seconds^2``, one step at 1 % of its time outweighed thousands; the bound is squared
  because the prediction itself may lag a change of speed by up to ``outlier_ratio``).
  ``min_steps`` such steps in a row, either way, are no pause but an engine that slowed
  down (another process took the cores) or sped up that much: the fit starts over from
  the prior (:attr:`restarts`).

A preset of the ridge or roofline form is taken as the linear form of its constants for
the prior (``c_fix + c_tok N`` for ``max(c_fix, c_tok N)``): under its ridge a draft is
priced ``c_tok`` by the prior, not free; the steps correct what they identify.

It implements :class:`~agentspec_mw.costmodel.StepTimeFn` plus ``linear_coefficients``,
which the AgentSpec budget reads each step (so it always uses the current fit).

The fit's features: ``(1, N_batched, N_kv, N_spec_kv, N_draft_kv, N_emitted)``, or with a
draft shape ``(1, N_batched, N_kv, the prior's draft price, N_emitted)``.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from agentspec_mw.costmodel import PRESETS, StepTimeModel

__all__ = [
    "MeasuredStepTime",
    "fit_observed_steps",
    "fit_ridge_step_times",
    "fit_step_times",
    "observed_step_features",
]


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares ``a x ~ b`` with ``x >= 0`` (the offline fits): the normal equations
    solved by :func:`_nonnegative_normal_solve`."""
    a = np.asarray(a, dtype=np.float64)
    return _nonnegative_normal_solve(a.T @ a, a.T @ np.asarray(b, dtype=np.float64))


def _nonnegative_normal_solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin x^T a x - 2 b^T x`` over ``x >= 0`` (``a`` symmetric positive
    semi-definite: normal equations, the online fit's with its ridge): Lawson and Hanson's
    active-set method, exact (a coefficient fixed at 0 is freed again while the gradient
    says it should grow; session 69's review found the older "fix the negative one for good"
    loop off the optimum in 281 of 3,000 random problems).

    ``a`` is scaled to a unit diagonal first and each subproblem solved exactly: the
    features' scales differ by ~1e7 (KV tokens against a draft price in seconds), and a
    least-squares solve's relative cutoff on the unscaled matrix set a weakly identified
    coefficient to 0 whatever its ridge (the draft price factor, after ~600 steps without
    drafts). A zero diagonal entry (a feature never seen, no ridge) keeps its coefficient
    at 0."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    d = len(b)
    diag = np.diag(a).copy()
    live = diag > 0.0
    scale = np.sqrt(np.where(live, diag, 1.0))
    sa = a / np.outer(scale, scale)
    sb = np.where(live, b / scale, 0.0)
    x = np.zeros(d)
    free = np.zeros(d, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(sb).max(initial=0.0)))
    for _ in range(4 * d + 4):
        grad = sb - sa @ x  # half the negative gradient
        enter = np.where(~free & live & (grad > tol), grad, -np.inf)
        if not np.isfinite(enter.max(initial=-np.inf)):
            break
        free[int(np.argmax(enter))] = True
        for _ in range(4 * d + 4):
            idx = np.flatnonzero(free)
            z = np.zeros(d)
            sub = sa[np.ix_(idx, idx)]
            try:
                z[idx] = np.linalg.solve(sub, sb[idx])
            except np.linalg.LinAlgError:  # collinear features: the least-norm solution
                z[idx] = np.linalg.lstsq(sub, sb[idx], rcond=None)[0]
            if (z[idx] > 0.0).all():
                x = z
                break
            # step from x toward z until the first free coefficient reaches 0; it leaves
            out = idx[z[idx] <= 0.0]
            gap = x[out] - z[out]
            alpha = float(np.min(np.divide(x[out], gap, out=np.zeros(len(out)), where=gap > 0)))
            x = x + alpha * (z - x)
            free &= x > tol
            x[~free] = 0.0
    return np.maximum(x, 0.0) / scale


def fit_step_times(
    num_batched: np.ndarray,
    num_kv: np.ndarray,
    num_rows: np.ndarray,
    seconds: np.ndarray,
    spec_kv: np.ndarray | None = None,
    draft_kv: np.ndarray | None = None,
) -> np.ndarray:
    """Offline fit of ``T = c_fix + c_tok N_batched + c_kv N_kv + c_row N_rows`` (and, given
    the drafts' features, ``+ c_spec_kv N_spec_kv + c_draft_kv N_draft_kv``) to timed steps
    (how the ``cpu-smollm2`` preset is made, ``benchmarks/fit_step_time.py``).

    ``N_rows`` is the step's logits rows: one per scheduled request (vLLM computes the
    last position's logits of every scheduled request, a partial prefill chunk's too)
    plus one per draft token (each verified position is sampled) — the LM head and the
    sampler run once per row. ``N_spec_kv`` is the KV tokens of the requests that carry a
    draft and ``N_draft_kv`` the sum over draft tokens of their request's KV tokens
    (:class:`~agentspec_mw.costmodel.StepTimeModel` says why). Every coefficient is
    non-negative; the fit minimises the *relative* error of each step (weights ``1 /
    seconds``), so a few multi-second prefill steps do not outweigh hundreds of decode
    steps.

    Returns ``(c_fix, c_tok, c_kv, c_row)`` in seconds, followed by ``(c_spec_kv,
    c_draft_kv)`` when ``spec_kv`` and ``draft_kv`` are given.
    """
    y = np.asarray(seconds, dtype=np.float64)
    if y.ndim != 1 or y.size < 4 or np.any(y <= 0):
        raise ValueError(f"fit_step_times needs >= 4 positive step times, got {y.size}")
    cols = [np.ones_like(y), num_batched, num_kv, num_rows]
    if (spec_kv is None) != (draft_kv is None):
        raise ValueError("fit_step_times: give both spec_kv and draft_kv, or neither")
    if spec_kv is not None and draft_kv is not None:
        cols += [spec_kv, draft_kv]
    x = np.column_stack(cols).astype(np.float64)
    w = 1.0 / y
    return _nonnegative_lstsq(x * w[:, None], y * w)


def observed_step_features(steps: np.ndarray) -> np.ndarray:
    """The regressors ``(1, N_batched, N_kv, N_spec_kv, N_draft_kv, N_emitted)`` of steps
    given as rows ``[num_batched, num_kv, spec_kv, draft_kv, emitted, seconds]`` (the
    arguments of :meth:`MeasuredStepTime.observe`, as ``agentspec bench`` records them)."""
    a = np.asarray(steps, dtype=np.float64).reshape(-1, 6)
    return np.column_stack([np.ones(len(a)), a[:, :5]])


def fit_observed_steps(steps: np.ndarray) -> np.ndarray:
    """Offline fit of :class:`MeasuredStepTime`'s linear form to recorded steps (rows as
    :func:`observed_step_features` takes them), without its prior or forgetting: every
    coefficient non-negative, each step's *relative* error minimised (weights ``1 /
    seconds``). Returns ``(c_fix, c_tok, c_kv, c_spec_kv, c_draft_kv, c_emit)`` in seconds;
    predicted times are ``observed_step_features(steps) @ coef``.

    One fit to the steps of several engines that ran the same work gives them a common
    yardstick: ``Σ measured / Σ predicted`` of each engine's steps is how slowly its
    process ran (``agentspec bench`` divides it out of two engines' throughput ratio).
    """
    a = np.asarray(steps, dtype=np.float64).reshape(-1, 6)
    y = a[:, 5]
    if y.size < 6 or np.any(y <= 0) or not np.all(np.isfinite(a)):
        raise ValueError(
            f"fit_observed_steps needs >= 6 finite steps of positive time, got {y.size}"
        )
    w = 1.0 / y
    return _nonnegative_lstsq(observed_step_features(a) * w[:, None], y * w)


def fit_ridge_step_times(
    num_batched: np.ndarray,
    num_kv: np.ndarray,
    num_rows: np.ndarray,
    seconds: np.ndarray,
) -> tuple[np.ndarray, float]:
    """Offline fit of the ridge form ``T = c_oh + c_kv N_kv + c_row N_rows + max(c_fix,
    c_tok N_batched)`` (:class:`~agentspec_mw.costmodel.StepTimeModel`, how the
    ``llama8b-h200`` preset is made, ``benchmarks/fit_gpu_steps.py``) on the relative error.

    For a fixed ridge ``N0 = c_fix / c_tok`` the form is linear in ``(1, max(N_batched,
    N0), N_kv, N_rows)``, fitted as :func:`fit_step_times` fits; ``N0`` is the one of a
    log-spaced scan from 1 to the largest step, refined by golden-section search, with
    the least weighted squared error. Returns ``(c_fix, c_tok, c_kv, c_row, c_oh)`` in
    seconds and the fit's root-mean-square relative error.
    """
    y = np.asarray(seconds, dtype=np.float64)
    nb = np.asarray(num_batched, dtype=np.float64)
    if y.ndim != 1 or y.size < 5 or np.any(y <= 0):
        raise ValueError(f"fit_ridge_step_times needs >= 5 positive step times, got {y.size}")

    def fit_at(n0: float) -> tuple[np.ndarray, float]:
        tokens = np.maximum(nb, n0)
        coef = fit_step_times(tokens, num_kv, num_rows, y)
        err = (coef[0] + coef[1] * tokens + coef[2] * num_kv + coef[3] * num_rows - y) / y
        return coef, float(np.sqrt(np.mean(err * err)))

    grid = np.geomspace(1.0, max(2.0, float(nb.max())), 200)
    best = int(np.argmin([fit_at(float(n))[1] for n in grid]))
    lo, hi = float(grid[max(best - 1, 0)]), float(grid[min(best + 1, grid.size - 1)])
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(40):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if fit_at(a)[1] <= fit_at(b)[1]:
            hi = b
        else:
            lo = a
    n0 = (lo + hi) / 2.0
    coef, rms = fit_at(n0)
    c_oh, c_tok, c_kv, c_row = coef.tolist()
    return np.array([c_tok * n0, c_tok, c_kv, c_row, c_oh]), rms


class MeasuredStepTime:
    """A linear step-time model fitted online to measured steps (see the module doc).

    Thread-safe: the host may observe from the engine's thread while another reads.
    """

    name = "measured"

    def __init__(
        self,
        prior: StepTimeModel | None = None,
        *,
        prior_spread: float = 1.0,
        noise: float = 0.1,
        half_life_steps: float = 4096.0,
        refit_every: int = 8,
        min_steps: int = 16,
        outlier_ratio: float = 4.0,
    ) -> None:
        # prior_spread may be inf (no prior: the unregularised fit); the others must be
        # finite (a NaN outlier_ratio turned the outlier test off, a NaN half-life made
        # every sum NaN)
        bad = [
            f"{name}={value!r}"
            for name, value, ok in (
                ("prior_spread", prior_spread, prior_spread > 0),
                ("noise", noise, 0 < noise < math.inf),
                ("half_life_steps", half_life_steps, 0 < half_life_steps < math.inf),
                ("refit_every", refit_every, refit_every >= 1),
                ("min_steps", min_steps, min_steps >= 1),
                ("outlier_ratio", outlier_ratio, 1 < outlier_ratio < math.inf),
            )
            if not ok
        ]
        if bad:
            raise ValueError(
                "MeasuredStepTime needs prior_spread > 0, finite noise > 0, finite "
                "half_life_steps > 0, refit_every >= 1, min_steps >= 1 and finite "
                "outlier_ratio > 1; got " + ", ".join(bad)
            )
        prior = prior if prior is not None else PRESETS["llama8b-h100"]
        if prior.form != "linear":
            prior = prior.model_copy(update={"form": "linear"})
        self.prior = prior
        self.prior_spread = float(prior_spread)
        self.noise = float(noise)
        self.refit_every = int(refit_every)
        self.min_steps = int(min_steps)
        self.outlier_ratio = float(outlier_ratio)
        # a step is an outlier when over outlier_ratio x the prediction, or under it /
        # outlier_ratio^2. Not / outlier_ratio: the prediction is no better than the speed
        # of the engine the fit followed, and it follows one that slows down by up to
        # outlier_ratio without a restart (steps up to that much longer are used), and by
        # more with one. When the slow-down ends, every step is that factor shorter than
        # predicted and must be used for the fit to come back (the engine back at its
        # speed after a 5x slow-down, test_an_engine_five_times_slower_is_followed: its
        # steps are ~0.2x the prediction, under the 1/4 a bound of prediction /
        # outlier_ratio set). A step is a glitch only when it is outlier_ratio x shorter
        # again. The glitches that did the harm (a timer reading a few % of the step or
        # less, each weighing 1 / ratio^2, ~1,000 steps and more) are far below the bound
        self._short_ratio = self.outlier_ratio * self.outlier_ratio
        self._decay = 2.0 ** (-1.0 / half_life_steps)
        # the prior's draft price shape (see "draft shape" in the module doc), or None
        self._shape: tuple[float, float] | None = None
        if prior.c_spec_kv > 0.0 or prior.c_draft_kv > 0.0:
            self._shape = (prior.c_spec_kv, prior.c_draft_kv)
        # the online fit has no row feature; its tokens are the step's scheduled tokens,
        # mostly decode and draft tokens (each a logits row) once the engine is busy, so
        # the prior's per-token cost is c_tok + c_row (a prefill chunk's tokens are
        # over-charged by c_row each in the prior only; the fit follows the steps)
        # with a draft shape the fourth feature is the prior's draft price (factor 1); the
        # last is the emitted tokens, whose prior cost is 0 (a preset has no such term)
        draft_prior = (1.0,) if self._shape is not None else (prior.c_spec_kv, prior.c_draft_kv)
        self._p = np.array(
            [prior.c_fix + prior.c_oh, prior.c_tok + prior.c_row, prior.c_kv, *draft_prior, 0.0]
        )
        self._d = d = len(self._p)
        self._tri = [(i, j) for i in range(d) for j in range(i, d)]  # x x^T's upper triangle
        # decayed sums over the steps, each weighted by 1 / seconds^2, x = (1, N, kv,
        # *_draft_features, emitted): x x^T (its first row holds the weight and the sums of
        # x; kept as the upper triangle in the order of _tri), x y, and the preset's time for
        # the same steps. Python floats: each step
        # adds a few products, which numpy's per-call cost made ~3x slower (the same IEEE
        # operations in the same order, so the same sums to the bit). The preset's time of
        # a step is numpy's dot, whose summation order Python's would not match: the
        # steps' weights and features wait in ``_pending`` and are added, in order, when the
        # fit needs the sum (all set by _forget)
        self._lock = threading.Lock()
        self.skipped = 0
        """Steps not used (outliers, non-positive or non-finite times, negative or
        non-finite features, steps whose weighted products overflow)."""
        self.restarts = 0
        """Times the fit started over after ``min_steps`` outliers in a row."""
        self.rejected_fits = 0
        """Refits whose coefficients the model could not take (not finite, or a one-token
        step priced at no time): the previous model was kept (:meth:`_adopt`)."""
        self._forget()

    def _forget(self) -> None:
        """No step seen (at the start, and when the fit starts over): empty sums, no early
        steps' median, the scaled prior as the model."""
        self._xx = [0.0] * len(self._tri)
        self._xy = [0.0] * self._d
        self._prior_y = 0.0
        self._pending: list[tuple[float, ...]] = []
        self._early: list[float] = []
        self.observed = 0
        """Steps used in the fit so far."""
        self._since_fit = self._outliers_in_row = 0
        self._emitted_cost = 0.0
        self._model = self._adopt(self._p)

    def _restart(self) -> None:
        """Forget every step: the scaled prior again, refitted from the next steps on."""
        self._forget()
        self.restarts += 1

    def observe(
        self,
        num_batched: float,
        num_kv: float,
        seconds: float,
        spec_kv: float = 0.0,
        draft_kv: float = 0.0,
        emitted: float = 0.0,
    ) -> bool:
        """Add one measured step; returns whether it was used. ``spec_kv``: KV tokens of
        the requests that carried a draft; ``draft_kv``: Σ over draft tokens of their
        request's KV tokens (:class:`~agentspec_mw.costmodel.StepTimeModel`); ``emitted``:
        the tokens the step emitted (each request's accepted drafts plus its one sampled
        token).

        A step with a time that is not positive and finite, a feature that is negative or
        not finite (NaN, inf), or so large that its weighted products or the fit's sums
        with them overflow, is not used (counted in :attr:`skipped`): one such step would
        make the fit's sums NaN or inf for good. Nor is an outlier (see the module doc)."""
        with self._lock:
            if not (
                0.0 < seconds < math.inf
                and 0.0 <= num_batched < math.inf
                and 0.0 <= num_kv < math.inf
                and 0.0 <= spec_kv < math.inf
                and 0.0 <= draft_kv < math.inf
                and 0.0 <= emitted < math.inf
            ) or not self._fits_in_sums(seconds, num_batched, num_kv, spec_kv, draft_kv, emitted):
                self.skipped += 1
                return False
            if self.observed >= self.min_steps:
                typical = self._model.step_time(num_batched, num_kv, None, spec_kv, draft_kv)
                typical += self._emitted_cost * emitted
                if seconds > self.outlier_ratio * typical or seconds * self._short_ratio < typical:
                    self._outliers_in_row += 1
                    if self._outliers_in_row < self.min_steps:
                        self.skipped += 1
                        return False
                    # min_steps outliers in a row are no pause nor glitch: the engine runs
                    # that much slower (another process took the cores) or faster now. The
                    # fit would reject every later step and never follow it: it starts over
                    # from the prior. Long and short outliers count in one run (only a step
                    # that is used ends it)
                    self._restart()
            if self.observed < self.min_steps:
                # the preset's times mean little yet: compare with the steps seen so far
                # (both ways; not counted in the run: the median follows a new speed, as
                # every step is in it, used or not)
                self._early.append(seconds)
                if len(self._early) >= 4:
                    typical = float(np.median(self._early))
                    if seconds > self.outlier_ratio * typical or (
                        seconds * self._short_ratio < typical
                    ):
                        self.skipped += 1
                        return False
            self._outliers_in_row = 0
            x = (
                1.0,
                float(num_batched),
                float(num_kv),
                *self._draft_features(spec_kv, draft_kv),
                float(emitted),
            )
            # relative error: each step weighs 1 / seconds^2 (as the offline fit and the
            # grid's; unweighted, a few long prefill steps outweighed the decode steps)
            w2 = 1.0 / (seconds * seconds)
            d = self._decay
            tri = zip(self._xx, self._tri, strict=True)
            xx = [s * d + w2 * (x[i] * x[j]) for s, (i, j) in tri]
            xy = [s * d + w2 * x[i] * seconds for i, s in enumerate(self._xy)]
            # every term is finite and non-negative (_fits_in_sums), but the sums can still
            # overflow (two steps of weight 1e308): such a step is not used, as NaN or inf
            # sums would drop every later refit for good
            if not (max(xx) < math.inf and max(xy) < math.inf):
                self.skipped += 1
                return False
            self._xx, self._xy = xx, xy
            self._pending.append((w2, *x[1:]))
            self.observed += 1
            self._since_fit += 1
            if self._since_fit >= self.refit_every or self.observed <= self.min_steps:
                self._model = self._adopt(self._solve())
                self._since_fit = 0
        return True

    def _fits_in_sums(
        self,
        seconds: float,
        num_batched: float,
        num_kv: float,
        spec_kv: float,
        draft_kv: float,
        emitted: float,
    ) -> bool:
        """Whether a step of finite, non-negative values adds only finite terms to the
        sums: its weight ``w2 = 1 / seconds^2`` and its largest product ``w2 * x_max^2``
        are finite (with ``x_max >= 1``, every other term of :meth:`observe` then is)."""
        square = seconds * seconds
        if not square > 0.0:  # underflows: 1 / square would divide by zero
            return False
        top = max(1.0, num_batched, num_kv, emitted, *self._draft_features(spec_kv, draft_kv))
        return math.isfinite((1.0 / square) * (top * top))

    def _draft_features(self, spec_kv: float, draft_kv: float) -> tuple[float, ...]:
        """The fit's draft features of a step: ``(N_spec_kv, N_draft_kv)``, or with a
        draft shape ``(the prior's draft price of the step,)``."""
        if self._shape is None:
            return float(spec_kv), float(draft_kv)
        return (self._shape[0] * float(spec_kv) + self._shape[1] * float(draft_kv),)

    def _solve(self) -> np.ndarray:
        """``(c_fix, c_tok, c_kv, *draft, c_emit)`` (``draft``: the coefficients of
        :meth:`_draft_features`): the scaled preset before
        ``min_steps`` steps, then the non-negative ridge fit described in the module
        docstring (the vectors in Python floats, elementwise as numpy did them; the solve
        is numpy's)."""
        if self._pending:
            prior, d, y = self._p, self._decay, self._prior_y
            for w2, *feats in self._pending:
                y = y * d + w2 * float(prior @ np.array((1.0, *feats)))
            self._prior_y = y
            self._pending.clear()
        xx, xy, p = self._xx, self._xy, self._p.tolist()
        weight = xx[0]
        if self._prior_y > 0:
            f = xy[0] / self._prior_y
            scaled = [c * f for c in p]
        else:
            scaled = p
        if self.observed < self.min_steps:
            return np.array(scaled)
        d = self._d
        mean = [xx[i] / weight for i in range(d)]  # the first row of x x^T: the sums of x
        # prior sd of each slope: prior_spread x the scaled preset's (at least the slope
        # that adds 1 % of the mean step at the feature's mean), against the step noise;
        # the emitted tokens' (no preset prices them): a batched token's scaled cost
        mean_step = xy[0] / weight
        noise2 = self.noise * self.noise  # the weighted residuals are relative errors
        ridge = [0.0]  # the intercept is the data's
        for m, c in zip(mean[1:-1], scaled[1:-1], strict=True):
            floor = 0.01 * mean_step / (m if m > 1.0 else 1.0)
            sd = self.prior_spread * (c if c > floor else floor)
            sd = sd if sd > 1e-30 else 1e-30
            ridge.append(noise2 / (sd * sd))
        sd = self.prior_spread * scaled[1]
        sd = sd if sd > 1e-30 else 1e-30
        ridge.append(noise2 / (sd * sd))
        a = np.empty((d, d))
        for idx, (i, j) in enumerate(self._tri):
            a[i, j] = a[j, i] = xx[idx]
        for i in range(d):
            a[i, i] += ridge[i]
        b = np.array([xy[j] + ridge[j] * scaled[j] for j in range(d)])
        return _nonnegative_normal_solve(a, b)

    def _adopt(self, coef: np.ndarray) -> StepTimeModel:
        """Take the fit's coefficients: the emitted-token cost, and the rest as a linear
        :class:`StepTimeModel` (``c_oh`` folded into ``c_fix``; with a draft shape, the draft
        factor times the prior's two terms), returned.

        A fit that prices a one-token step at no time (``c_fix + c_tok == 0``: every
        step's time put on its KV and drafts), or that is not finite, is not a model the
        budget can price by (:class:`StepTimeModel` rejects it): the current model and
        emitted-token cost are kept instead, counted in :attr:`rejected_fits` (the first
        model, the prior's, qualifies: a :class:`StepTimeModel` prices a one-token step
        above zero)."""
        if not (0.0 < float(coef[0]) + float(coef[1]) < math.inf and np.isfinite(coef).all()):
            self.rejected_fits += 1
            return self._model
        self._emitted_cost = float(coef[-1])
        if self._shape is not None:
            spec, draft = float(coef[3]) * self._shape[0], float(coef[3]) * self._shape[1]
        else:
            spec, draft = float(coef[3]), float(coef[4])
        return StepTimeModel(
            name="measured",
            c_fix=float(coef[0]),
            c_tok=float(coef[1]),
            c_kv=float(coef[2]),
            c_oh=0.0,
            c_spec_kv=spec,
            c_draft_kv=draft,
        )

    @property
    def model(self) -> StepTimeModel:
        """The current fit without its emitted-token term, as a frozen
        :class:`StepTimeModel` (replaced at each refit): what the budget prices drafts by."""
        return self._model

    @property
    def emitted_cost(self) -> float:
        """The fitted seconds per emitted token (``c_emit``; not in :attr:`model`)."""
        return self._emitted_cost

    def predict(
        self,
        num_batched: float,
        num_kv: float,
        spec_kv: float = 0.0,
        draft_kv: float = 0.0,
        emitted: float = 0.0,
    ) -> float:
        """Seconds the current fit predicts for a step (:meth:`observe`'s arguments),
        its emitted tokens included."""
        with self._lock:
            model, emit = self._model, self._emitted_cost
        return model.step_time(num_batched, num_kv, None, spec_kv, draft_kv) + emit * emitted

    def linear_coefficients(self) -> np.ndarray:
        """The current fit as ``(c_fix, c_tok, c_kv, c_oh)`` with ``c_oh = 0``."""
        coef = self._model.linear_coefficients()
        assert coef is not None  # the fit is linear
        return coef

    def draft_coefficients(self) -> tuple[float, float] | None:
        """The current fit's ``(c_spec_kv, c_draft_kv)``, ``None`` while both are 0."""
        return self._model.draft_coefficients()

    def step_time(self, num_batched: float, num_kv: float) -> float:
        """Seconds one step of this shape (no drafts priced by context) takes, by the
        current fit."""
        return self._model.step_time(num_batched, num_kv)

    def step_time_array(self, num_batched: np.ndarray, num_kv: float) -> np.ndarray:
        """Vectorised :meth:`step_time` over an array of batched-token counts."""
        return self._model.step_time_array(num_batched, num_kv)

    def marginal_token_cost(self, num_batched: float, num_kv: float) -> float:
        """Seconds one more batched token adds to a step (the fitted ``c_tok``)."""
        return self._model.marginal_token_cost(num_batched, num_kv)

    def describe(self) -> str:
        """One line: the fit in milliseconds and how many steps it rests on."""
        m = self._model
        rejected = f", {self.rejected_fits} rejected fits" if self.rejected_fits else ""
        drafts = ""
        if m.c_spec_kv or m.c_draft_kv:
            drafts = (
                f" + {m.c_spec_kv * 1e9:.1f} ns/KV token of a drafting request"
                f" + {m.c_draft_kv * 1e9:.2f} ns/(draft x KV token)"
            )
        return (
            f"measured step time {m.c_fix * 1e3:.2f} ms + {m.c_tok * 1e3:.3f} ms/token "
            f"+ {m.c_kv * 1e9:.1f} ns/KV token{drafts} "
            f"+ {self._emitted_cost * 1e3:.3f} ms/emitted token ({self.observed} steps, "
            f"{self.skipped} skipped{rejected})"
        )
