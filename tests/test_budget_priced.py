"""Drafts priced by their request's context (``c_spec_kv``, ``c_draft_kv``): the cost
model charges them, the replay charges them, the online fit learns them, and the budget's
allocation is the exact optimum of the step's goodput under them (checked against every
allocation of small random steps)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agentspec_mw.agentspec.budget import (
    StepShape,
    admission_bound,
    admission_bounds,
    allocate,
    draft_costs,
)
from agentspec_mw.costfit import MeasuredStepTime, fit_step_times
from agentspec_mw.costmodel import PRESETS, StepTimeModel

PRICED = StepTimeModel(
    name="priced",
    c_fix=0.050,
    c_tok=1.5e-3,
    c_kv=5e-6,
    c_oh=0.0,
    c_row=0.5e-3,
    c_spec_kv=5e-6,
    c_draft_kv=1e-6,
)


def test_the_model_charges_drafts_by_their_requests_context() -> None:
    plain = PRICED.model_copy(update={"c_spec_kv": 0.0, "c_draft_kv": 0.0})
    # two requests of 1,000 and 100 tokens, the first drafting 3 tokens
    t = PRICED.step_time(5, 1100, None, spec_kv=1000, draft_kv=3000)
    assert t == pytest.approx(plain.step_time(5, 1100) + 5e-6 * 1000 + 1e-6 * 3000)
    assert PRICED.draft_coefficients() == (5e-6, 1e-6)
    assert plain.draft_coefficients() is None
    assert all(p.draft_coefficients() is None for n, p in PRESETS.items() if "h100" in n)
    with pytest.raises(ValueError, match="linear form only"):
        StepTimeModel(c_fix=0, c_tok=0, c_kv=0, c_oh=0, form="roofline", c_spec_kv=1e-9)


def _goodput(surv: list[np.ndarray], d: tuple[int, ...], base: float, a, c) -> float:  # type: ignore[no-untyped-def]
    e = len(surv) + sum(float(s[:n].sum()) for s, n in zip(surv, d, strict=True))
    t = base + sum((a[i] + n * c[i]) if n else 0.0 for i, n in enumerate(d))
    return e / t


@pytest.mark.parametrize("seed", range(40))
def test_the_allocation_is_the_best_of_every_allocation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_req = int(rng.integers(1, 5))
    lens = rng.integers(0, 5, n_req)
    surv = [np.sort(rng.uniform(0.0, 1.0, n))[::-1] for n in lens]
    ctx = rng.integers(10, 3000, n_req).astype(np.int64)
    b, kv = n_req, float(ctx.sum())
    cap = int(rng.integers(0, 12)) if seed % 3 == 0 else None
    alloc = allocate(
        np.concatenate(surv) if n_req else np.zeros(0),
        lens,
        batch_size=b,
        num_kv=kv,
        cost=PRICED,
        budget=cap,
        context_lens=ctx,
    )
    costs = draft_costs(PRICED, ctx)
    assert costs is not None
    a, c = costs
    assert c == pytest.approx(PRICED.c_tok + PRICED.c_row + PRICED.c_draft_kv * ctx)
    base = PRICED.step_time(b, kv)
    choices = [
        d for d in itertools.product(*(range(n + 1) for n in lens)) if cap is None or sum(d) <= cap
    ]
    best = max(_goodput(surv, d, base, a, c) for d in choices)
    got = _goodput(surv, tuple(alloc.counts), base, a, c)
    if cap is None:  # Dinkelbach's optimum; a binding cap is met by dropping positions
        assert got == pytest.approx(best, rel=1e-9)
        assert alloc.goodput == pytest.approx(got, rel=1e-9)
    assert sum(alloc.counts) == alloc.used <= (cap if cap is not None else sum(lens))
    assert got >= b / base * (1 - 1e-12)  # never worse than not drafting
    # every admitted position clears its request's bound
    bounds = admission_bounds(PRICED, StepShape(b, kv, cap, 0), ctx)
    for s, n, bd in zip(surv, alloc.counts, bounds, strict=True):
        assert all(s[:n] >= bd * (1 - 1e-12))


def test_a_long_context_drafts_only_what_pays_for_its_setup() -> None:
    # a step of 32 requests; two have the same candidate, one with 50 tokens of context
    # and one with 4,000: drafting at all costs the long one 20 ms, each position 4 ms more
    surv = np.array([0.9, 0.85, 0.8, 0.75, 0.7, 0.65] * 2)
    lens = np.array([6, 6] + [0] * 30)
    ctx = np.array([50, 4000] + [1000] * 30)
    kw = {"batch_size": 32, "num_kv": float(ctx.sum()), "context_lens": ctx}
    alloc = allocate(surv, lens, cost=PRICED, **kw)  # type: ignore[arg-type]
    assert alloc.counts[:2] == [6, 0]
    plain = PRICED.model_copy(update={"c_spec_kv": 0.0, "c_draft_kv": 0.0})
    same = allocate(surv, lens, cost=plain, **kw)  # type: ignore[arg-type]
    assert same.counts[0] == same.counts[1] > 0


def test_without_draft_terms_the_context_changes_nothing() -> None:
    rng = np.random.default_rng(3)
    lens = np.full(32, 8, dtype=np.int64)
    surv = np.sort(rng.uniform(0.0, 1.0, (32, 8)), axis=1)[:, ::-1].ravel()
    ctx = rng.integers(10, 3000, 32)
    cpu = PRESETS["cpu-smollm2"]
    assert cpu.draft_coefficients() is not None  # measured on the CPU engine
    unpriced = cpu.model_copy(update={"c_spec_kv": 0.0, "c_draft_kv": 0.0})
    for cost in (PRESETS["llama8b-h100"], PRESETS["llama8b-h100-roofline"], unpriced):
        kw = {"batch_size": 32, "num_kv": float(ctx.sum()), "cost": cost, "budget": 4000}
        without = allocate(surv, lens, **kw).counts  # type: ignore[arg-type]
        assert allocate(surv, lens, context_lens=ctx, **kw).counts == without  # type: ignore[arg-type]
        shape = StepShape(32, float(ctx.sum()), 4000, 0)
        assert admission_bounds(cost, shape, ctx).tolist() == [admission_bound(cost, shape)] * 32


def test_the_replay_charges_the_draft_terms() -> None:
    from agentspec_mw.proposer import Draft
    from agentspec_mw.replay.sim import ReplayCall, replay_workload

    class Wrong:
        name = "wrong"

        def start(self, *a: object) -> None: ...
        def extend(self, *a: object) -> None: ...
        def stop(self, *a: object) -> None: ...

        def propose(self, req_ids, k, step):  # type: ignore[no-untyped-def]
            return [Draft((0, 0), (0.5, 0.5)) for _ in req_ids]

    call = ReplayCall(
        req_id="a",
        run_id="r",
        prompt=np.arange(100, 300, dtype=np.int32),
        output=np.arange(1, 11, dtype=np.int32),
    )
    plain = PRICED.model_copy(update={"c_spec_kv": 0.0, "c_draft_kv": 0.0, "name": "plain"})
    times = {}
    for cost in (plain, PRICED):
        steps: list[object] = []
        run = replay_workload([call], Wrong(), batch=1, k=2, cost_model=cost, on_step=steps.append)
        times[cost.name] = run.sim_time_s
        assert run.drafted == 2 * 9 and run.accepted == 0
    # 9 decode steps with 2 drafts each; the request holds 200 + i + 3 tokens after step i
    extra = sum(5e-6 * (203 + i) + 1e-6 * 2 * (203 + i) for i in range(9))
    assert times["priced"] - times["plain"] == pytest.approx(extra)


def _drafting_steps(
    rng: np.random.Generator, n: int, min_drafts: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``n`` random steps, 60 % of them drafting: ``(tokens, kv, spec_kv, draft_kv)``;
    every request of a drafting step drafts ``d`` tokens (``min_drafts <= d < 5``)."""
    b = rng.integers(1, 32, n).astype(float)
    ctx = rng.integers(50, 1500, n).astype(float)
    d = rng.integers(min_drafts, 5, n).astype(float)
    drafting = rng.uniform(0, 1, n) < 0.6
    spec = np.where(drafting, b * ctx, 0.0)
    draft = np.where(drafting, b * d * ctx, 0.0)
    tokens = b + np.where(drafting, b * d, 0.0)
    return tokens, b * ctx, spec, draft


def test_the_fits_learn_the_draft_terms() -> None:
    rng = np.random.default_rng(0)
    n = 400
    tokens, kv, spec, draft = _drafting_steps(rng, n, 0)
    rows = tokens
    true = (0.06, 1.8e-3, 6e-6, 0.5e-3, 5e-6, 1.2e-6)
    y = true[0] + true[1] * tokens + true[2] * kv + true[3] * rows + true[4] * spec
    y = y + true[5] * draft
    y *= rng.normal(1.0, 0.01, n)
    coef = fit_step_times(tokens, kv, rows, y, spec, draft)
    assert coef[4] == pytest.approx(true[4], rel=0.15)
    assert coef[5] == pytest.approx(true[5], rel=0.15)
    # online, from a prior of this engine's shape but without the terms
    prior = PRICED.model_copy(update={"c_spec_kv": 0.0, "c_draft_kv": 0.0})
    fit = MeasuredStepTime(prior=prior, refit_every=1)
    used = sum(fit.observe(tokens[i], kv[i], y[i], spec[i], draft[i]) for i in range(n))
    assert used >= n - 4  # an early step may be 4x the median of the first few
    terms = fit.draft_coefficients()
    assert terms is not None
    assert terms[0] == pytest.approx(true[4], rel=0.3)
    assert terms[1] == pytest.approx(true[5], rel=0.3)
    assert "drafting request" in fit.describe()
    with pytest.raises(ValueError, match="both"):
        fit_step_times(tokens, kv, rows, y, spec, None)


def test_a_prior_with_a_draft_price_keeps_its_shape_and_learns_its_level() -> None:
    """With ``PRICED`` as the prior, the online fit learns one factor on its draft price:
    steps whose drafts cost twice the prior's give both terms x2 in the prior's ratio, and
    steps where only the first term is real (the two are confounded: every drafting
    request pays both) still keep that ratio instead of wandering."""
    rng = np.random.default_rng(1)
    n = 600
    tokens, kv, spec, draft = _drafting_steps(rng, n, 1)
    base = 0.05 + 2e-3 * tokens + 5e-6 * kv
    for spec_cost, draft_cost, factor in ((10e-6, 2e-6, 2.0), (9e-6, 0.0, None)):
        y = (base + spec_cost * spec + draft_cost * draft) * rng.normal(1.0, 0.01, n)
        fit = MeasuredStepTime(prior=PRICED, refit_every=1)
        for i in range(n):
            fit.observe(tokens[i], kv[i], y[i], spec[i], draft[i])
        terms = fit.draft_coefficients()
        assert terms is not None
        assert terms[0] / terms[1] == pytest.approx(PRICED.c_spec_kv / PRICED.c_draft_kv)
        if factor is not None:
            assert terms[0] == pytest.approx(factor * PRICED.c_spec_kv, rel=0.1)


def test_the_host_work_per_emitted_token_is_not_charged_to_drafts() -> None:
    """A step that accepts drafts emits more tokens, and the host's work per emitted token
    lands in it: the online fit learns that cost as its own term, keeps it out of the
    model the budget reads, and prices drafts at what they cost; without the term (every
    step emitting nothing, as before) the same steps charge that work to every batched
    token, drafts included (on the demo's engine it went to the draft and KV terms:
    docs/experiments/emitted_tokens_2026-12-04.md)."""
    rng = np.random.default_rng(2)
    n = 800
    tokens, kv, spec, draft = _drafting_steps(rng, n, 1)
    per_request = np.where(spec > 0, draft / np.maximum(spec, 1.0), 0.0)  # drafts each
    b = tokens / (1.0 + per_request)  # the step's requests
    drafted = tokens - b
    accepted = np.floor(drafted * rng.uniform(0.3, 0.9, n))  # emitted: b + accepted drafts
    emitted = b + accepted
    per_emitted = 0.4e-3
    y = 0.05 + 2e-3 * tokens + 5e-6 * kv + PRICED.c_spec_kv * spec + PRICED.c_draft_kv * draft
    y = (y + per_emitted * emitted) * rng.normal(1.0, 0.01, n)
    with_term = MeasuredStepTime(prior=PRICED, refit_every=1)
    without = MeasuredStepTime(prior=PRICED, refit_every=1)
    for i in range(n):
        with_term.observe(tokens[i], kv[i], y[i], spec[i], draft[i], emitted[i])
        without.observe(tokens[i], kv[i], y[i], spec[i], draft[i])
    assert with_term.emitted_cost == pytest.approx(per_emitted, rel=0.25)
    assert without.emitted_cost == 0.0
    priced = with_term.draft_coefficients()
    assert priced is not None
    assert priced[0] == pytest.approx(PRICED.c_spec_kv, rel=0.15)
    assert with_term.model.c_tok == pytest.approx(2e-3, rel=0.05)
    assert without.model.c_tok > 1.08 * 2e-3
    # the budget's model has no emitted term; the prediction has it
    i = int(np.argmax(emitted))
    args = (tokens[i], kv[i], spec[i], draft[i])
    budget = with_term.model.step_time(tokens[i], kv[i], None, spec[i], draft[i])
    assert with_term.predict(*args, emitted[i]) == pytest.approx(
        budget + with_term.emitted_cost * emitted[i]
    )
    assert "emitted token" in with_term.describe()
