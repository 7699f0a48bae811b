"""The step-time model fitted online to measured steps (``cost_model="measured"``)."""

from __future__ import annotations

import numpy as np
import pytest

from agentspec_mw.agentspec.budget import allocate
from agentspec_mw.costfit import MeasuredStepTime, fit_ridge_step_times, fit_step_times
from agentspec_mw.costmodel import PRESETS, StepTimeModel, step_time_of

#: A CPU-like engine: 30 ms per step, 3.2 ms per batched token, 200 ns per KV token.
TRUE = (0.030, 0.0032, 2e-7)


def _engine_steps(rng: np.random.Generator, n: int) -> list[tuple[int, int, float]]:
    steps = []
    for _ in range(n):
        batch = int(rng.integers(1, 17))
        tokens = batch * (1 + int(rng.integers(0, 6)))
        kv = batch * int(rng.integers(50, 600))
        seconds = (TRUE[0] + TRUE[1] * tokens + TRUE[2] * kv) * rng.lognormal(0.0, 0.1)
        steps.append((tokens, kv, seconds))
    return steps


def test_the_fit_recovers_the_engine_and_skips_pauses() -> None:
    rng = np.random.default_rng(0)
    fit = MeasuredStepTime()
    for i, (tokens, kv, seconds) in enumerate(_engine_steps(rng, 400)):
        # a pause every 50 steps (one of them among the first steps): 20x the step
        assert fit.observe(tokens, kv, seconds * 20 if i % 50 == 7 else seconds) == (
            i % 50 != 7 or i < 4
        )
    c_fix, c_tok, c_kv, c_oh = fit.linear_coefficients()
    assert c_fix == pytest.approx(TRUE[0], rel=0.1)
    # the GPU prior (a token nearly free, KV reads dear) still pulls c_tok ~6 % low and c_kv
    # up: each step now counts by its relative error, so the long steps that pin c_tok
    # weigh no more than the short ones; the step times below stay within 5 %
    assert c_tok == pytest.approx(TRUE[1], rel=0.1)
    assert c_oh == 0.0 and c_kv >= 0.0
    # what the budget needs: step times across the shapes it compares
    for tokens, kv in [(4, 2000), (32, 4000), (96, 8000)]:
        truth = TRUE[0] + TRUE[1] * tokens + TRUE[2] * kv
        assert fit.step_time(tokens, kv) == pytest.approx(truth, rel=0.05)
    assert fit.observed + fit.skipped == 400 and fit.skipped == 8
    assert "ms/token" in fit.describe() and fit.model.c_tok == c_tok


def test_before_enough_steps_the_model_is_the_preset_at_this_engines_speed() -> None:
    prior = PRESETS["llama8b-h100"]
    fit = MeasuredStepTime(prior)
    assert fit.step_time(8, 1000) == pytest.approx(prior.step_time(8, 1000))
    for _ in range(5):  # every step 10x the preset's
        fit.observe(8, 1000, 10 * prior.step_time(8, 1000))
    assert fit.step_time(8, 1000) == pytest.approx(10 * prior.step_time(8, 1000))
    assert fit.marginal_token_cost(8, 1000) == pytest.approx(10 * prior.c_tok)


def test_a_shape_that_never_varies_keeps_the_presets_relative_costs() -> None:
    prior = PRESETS["llama8b-h100"]
    fit = MeasuredStepTime(prior)
    for _ in range(200):
        fit.observe(2, 1000, 0.050)
    assert fit.step_time(2, 1000) == pytest.approx(0.050, rel=1e-3)
    c_fix, c_tok, _, _ = fit.linear_coefficients()
    ratio = prior.c_tok / (prior.c_fix + prior.c_oh)
    assert c_tok / c_fix == pytest.approx(ratio, rel=0.2)


def test_coefficients_are_never_negative() -> None:
    fit = MeasuredStepTime()
    rng = np.random.default_rng(1)
    for _ in range(100):  # more tokens, *faster* steps: a negative slope in the data
        tokens = int(rng.integers(1, 64))
        fit.observe(tokens, 500, 0.040 - 0.0002 * tokens)
    coef = fit.linear_coefficients()
    assert (coef >= 0.0).all() and coef[1] == 0.0
    assert fit.step_time(1, 500) == pytest.approx(0.034, rel=0.2)


def test_the_fit_follows_an_engine_that_changes_speed() -> None:
    fit = MeasuredStepTime(half_life_steps=64)
    rng = np.random.default_rng(2)
    for tokens, kv, seconds in _engine_steps(rng, 300):
        fit.observe(tokens, kv, seconds)
    for tokens, kv, seconds in _engine_steps(rng, 600):  # the host got 2x slower, gradually
        fit.observe(tokens, kv, 2 * seconds)
    assert fit.step_time(32, 4000) == pytest.approx(
        2 * (TRUE[0] + TRUE[1] * 32 + TRUE[2] * 4000), rel=0.1
    )


def test_bad_times_are_skipped_and_bad_settings_rejected() -> None:
    fit = MeasuredStepTime()
    assert not fit.observe(4, 100, 0.0)
    assert not fit.observe(4, 100, float("nan"))
    assert not fit.observe(-1, 100, 0.01)
    assert fit.skipped == 3 and fit.observed == 0
    for bad in ({"half_life_steps": 0}, {"refit_every": 0}, {"outlier_ratio": 1.0}):
        with pytest.raises(ValueError, match="MeasuredStepTime needs"):
            MeasuredStepTime(**bad)  # type: ignore[arg-type]


def test_an_expensive_token_makes_the_budget_draft_less() -> None:
    surv = np.array([0.95, 0.8, 0.1, 0.05, 0.9, 0.7, 0.1, 0.05])
    lens = np.array([4, 4])
    preset = allocate(surv, lens, batch_size=2, num_kv=2000, cost=PRESETS["llama8b-h100"])
    fit = MeasuredStepTime()
    for tokens, kv, seconds in _engine_steps(np.random.default_rng(3), 200):
        fit.observe(tokens, kv, seconds)
    measured = allocate(surv, lens, batch_size=2, num_kv=2000, cost=fit)
    # on the preset's GPU a verified token costs 0.3 % of a step: draft everything; here
    # one costs ~10 %, and the 5-10 %-likely positions no longer pay for their slot
    assert preset.counts == [4, 4]
    assert measured.counts == [2, 2]


def test_the_offline_fit_separates_prefill_tokens_from_logits_rows() -> None:
    # decode steps (every token a row) and prefill steps (one row per chunk) of an engine
    # whose rows cost 0.5 ms on top of 2 ms per token
    truth = np.array([0.060, 0.002, 8e-6, 0.0005])
    rng = np.random.default_rng(4)
    steps = []
    for _ in range(300):
        if rng.random() < 0.2:
            reqs = int(rng.integers(1, 33))
            tokens, rows = reqs * int(rng.integers(16, 128)), reqs
        else:
            tokens = rows = int(rng.integers(1, 65))
        kv = int(rng.integers(100, 16_000))
        seconds = truth @ [1.0, tokens, kv, rows] * rng.lognormal(0.0, 0.03)
        steps.append((tokens, kv, rows, seconds))
    a = np.array(steps)
    coef = fit_step_times(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    assert coef == pytest.approx(truth, rel=0.1)
    with pytest.raises(ValueError, match="positive step times"):
        fit_step_times(a[:3, 0], a[:3, 1], a[:3, 2], a[:3, 3])


def test_a_row_term_costs_decode_and_draft_tokens_not_prefill_tokens() -> None:
    m = StepTimeModel(c_fix=0.05, c_tok=0.002, c_kv=0.0, c_oh=0.0, c_row=0.001)
    decode = m.step_time(32, 0)  # rows = tokens: a decode/draft step, as budgets see it
    assert decode == pytest.approx(0.05 + 32 * 0.003)
    assert m.step_time(32, 0, num_rows=2) == pytest.approx(0.05 + 32 * 0.002 + 2 * 0.001)
    assert m.marginal_token_cost(32, 0) == pytest.approx(0.003)
    assert m.step_time_array(np.array([32.0]), 0)[0] == pytest.approx(decode)
    c_fix, c_tok, _, _ = m.linear_coefficients()  # type: ignore[misc]
    assert (c_fix, c_tok) == pytest.approx((0.05, 0.003))
    assert step_time_of(m, 512, 0, 4) == pytest.approx(m.step_time(512, 0, 4))
    fit = MeasuredStepTime(m)  # no row feature online: the prior's token is c_tok + c_row
    assert fit.step_time(32, 0) == pytest.approx(decode)
    assert step_time_of(fit, 32, 0, 1) == pytest.approx(decode)


def test_a_feature_the_steps_barely_vary_keeps_the_presets_cost() -> None:
    # one short request at batch 1: its KV grows 1 token a step while the host slows down
    # (another process takes more of the core); without a prior that drift becomes a KV
    # cost 20x the preset's that predicts the next, longer call's steps 2x too slow
    noise = np.random.default_rng(5).lognormal(0.0, 0.15, 100)

    def fitted(**kw: float) -> MeasuredStepTime:
        fit = MeasuredStepTime(PRESETS["cpu-smollm2"], **kw)
        for i in range(100):
            tokens = 1 + 8 * (i % 2)
            fit.observe(tokens, 40 + i, (0.070 + 0.0002 * i + 0.002 * (tokens - 1)) * noise[i])
        return fit

    for fit, most in ((fitted(), 1.3), (fitted(prior_spread=float("inf")), 3.0)):
        assert fit.step_time(1, 600) / fit.step_time(1, 100) < most
    assert fitted(prior_spread=float("inf")).step_time(1, 600) > 1.8 * fitted().step_time(1, 100)
    with pytest.raises(ValueError, match="prior_spread > 0"):
        MeasuredStepTime(prior_spread=0.0)


def test_the_ridge_fit_recovers_a_ridge_engine() -> None:
    # an H200-like step: 4 ms of weights hide the first 170 tokens, KV read on top
    truth = PRESETS["llama8b-h200"]
    rng = np.random.default_rng(5)
    steps = []
    for _ in range(200):
        reqs, q = int(rng.integers(1, 257)), int(rng.integers(1, 17))
        kv = reqs * int(rng.integers(256, 4096))
        t = truth.step_time(reqs * q, kv, reqs * q) * rng.lognormal(0.0, 0.02)
        steps.append((reqs * q, kv, reqs * q, t))
    a = np.array(steps)
    coef, rms = fit_ridge_step_times(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    c_fix, c_tok, c_kv, _c_row, c_oh = coef
    assert c_fix / c_tok == pytest.approx(truth.c_fix / truth.c_tok, rel=0.1)
    assert c_tok == pytest.approx(truth.c_tok, rel=0.1)
    assert c_kv == pytest.approx(truth.c_kv, rel=0.1)
    assert c_fix + c_oh == pytest.approx(truth.c_fix + truth.c_oh, rel=0.05)
    assert 0.01 < rms < 0.03
    with pytest.raises(ValueError, match="positive step times"):
        fit_ridge_step_times(a[:3, 0], a[:3, 1], a[:3, 2], a[:3, 3])


def test_fit_observed_steps_recovers_the_linear_form_and_refuses_too_few() -> None:
    from agentspec_mw.costfit import fit_observed_steps, observed_step_features

    rng = np.random.default_rng(0)
    x = np.column_stack(
        [
            rng.integers(1, 200, 40),  # batched
            rng.integers(100, 9_000, 40),  # kv
            rng.integers(0, 3_000, 40),  # spec_kv
            rng.integers(0, 9_000, 40),  # draft_kv
            rng.integers(1, 100, 40),  # emitted
        ]
    ).astype(float)
    true = np.array([0.02, 5e-4, 1e-6, 2e-6, 1e-7, 1e-4])
    steps = np.column_stack([x, observed_step_features(np.column_stack([x, np.ones(40)])) @ true])
    assert fit_observed_steps(steps) == pytest.approx(true, rel=1e-6)
    with pytest.raises(ValueError, match=">= 6 finite steps"):
        fit_observed_steps(steps[:5])
