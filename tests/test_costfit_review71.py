"""Session 71's review of the online step-time fit: a step far *shorter* than predicted (a
timing glitch, which the ``1 / seconds^2`` weight made worth thousands of steps) is an
outlier as a far longer one is, the running sums never overflow, ``min_steps`` is
validated, and a fit the model cannot take is counted. Each test failed before its fix."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentspec_mw.costfit import MeasuredStepTime
from agentspec_mw.costmodel import PRESETS, StepTimeModel

TRUE = StepTimeModel(c_fix=40e-3, c_tok=1.0e-3, c_kv=3e-6, c_oh=0.0)
SHAPES = [(1, 200), (8, 4000), (16, 8000), (32, 20000)]


def _good(
    fit: MeasuredStepTime, rng: np.random.Generator, n: int, model: StepTimeModel = TRUE
) -> None:
    """``n`` steps of ``model`` (1-32 tokens, 100-20k KV tokens) with 5 % noise."""
    for _ in range(n):
        b = int(rng.integers(1, 33))
        kv = float(rng.integers(100, 20000))
        fit.observe(b, kv, model.step_time(b, kv) * (1 + 0.05 * rng.standard_normal()))


def _worst(fit: MeasuredStepTime, model: StepTimeModel = TRUE) -> float:
    """The fit's largest relative error over :data:`SHAPES`."""
    return max(abs(fit.predict(b, kv) / model.step_time(b, kv) - 1) for b, kv in SHAPES)


# -- a step far shorter than predicted --------------------------------------------------


@pytest.mark.parametrize("ratio", [0.03, 0.01, 1e-4])
def test_one_far_too_short_step_does_not_derail_the_fit(ratio: float) -> None:
    """One step at ``ratio`` x its true time after 2,000 good ones was used (only far longer
    steps were outliers) at ``1 / ratio^2`` times a step's weight: later refits priced a
    one-token step at 0 (kept silently) or collapsed, and the correct steps then looked 4x
    too long and were skipped."""
    rng = np.random.default_rng(0)
    fit = MeasuredStepTime(PRESETS["cpu-smollm2"])
    _good(fit, rng, 2000)
    assert _worst(fit) < 0.02
    assert fit.observe(16, 8000, TRUE.step_time(16, 8000) * ratio) is False
    worst, off = 0.0, 0
    for _ in range(500):  # 4000 steps, checked at every refit
        _good(fit, rng, 8)
        w = _worst(fit)
        worst, off = max(worst, w), off + 8 * (w > 0.10)
    assert off == 0, f"after one {ratio}x step: {off} of 4000 steps off by >10% (worst {worst:.0%})"
    assert fit.restarts == 0 and fit.rejected_fits == 0


def test_a_far_too_short_step_before_min_steps_is_skipped() -> None:
    """Before ``min_steps`` steps the test compares with the steps' median, both ways."""
    rng = np.random.default_rng(3)
    fit = MeasuredStepTime(PRESETS["cpu-smollm2"])
    _good(fit, rng, 6)
    assert fit.observe(16, 8000, TRUE.step_time(16, 8000) * 0.01) is False
    assert (fit.observed, fit.skipped) == (6, 1)
    _good(fit, rng, 400)
    assert _worst(fit) < 0.05


def test_a_five_times_faster_engine_is_followed() -> None:
    """An engine that becomes 5x faster (within ``outlier_ratio^2`` = 16) is followed by
    the fit itself, without a restart."""
    rng = np.random.default_rng(1)
    fit = MeasuredStepTime(PRESETS["cpu-smollm2"], half_life_steps=256)
    _good(fit, rng, 500)
    fast = TRUE.model_copy(update={"c_fix": 8e-3, "c_tok": 0.2e-3, "c_kv": 0.6e-6})
    _good(fit, rng, 300, fast)
    assert _worst(fit, fast) < 0.10
    assert fit.restarts == 0


def test_a_twenty_times_faster_engine_restarts_the_fit() -> None:
    """Steps far shorter than predicted count in the same run of outliers as far longer
    ones: ``min_steps`` of them in a row are an engine that got that much faster, and the
    fit starts over and follows it (before, they were used at 400x a step's weight and no
    restart came)."""
    rng = np.random.default_rng(2)
    fit = MeasuredStepTime(PRESETS["cpu-smollm2"], half_life_steps=256)
    _good(fit, rng, 500)
    fast = TRUE.model_copy(update={"c_fix": 2e-3, "c_tok": 0.05e-3, "c_kv": 0.15e-6})
    skipped = fit.skipped
    _good(fit, rng, 300, fast)
    assert fit.restarts == 1
    assert fit.skipped == skipped + fit.min_steps - 1  # the run before the restart
    assert _worst(fit, fast) < 0.10


def test_long_and_short_outliers_make_one_run() -> None:
    """A run of outliers is broken only by a step that is used, not by an outlier on the
    other side: 8 far longer and 8 far shorter steps in a row restart the fit."""
    rng = np.random.default_rng(4)
    fit = MeasuredStepTime(PRESETS["cpu-smollm2"])
    _good(fit, rng, 300)
    for i in range(fit.min_steps):
        scale = 50.0 if i % 2 else 0.02
        fit.observe(16, 8000, TRUE.step_time(16, 8000) * scale)
    assert fit.restarts == 1


# -- the running sums ---------------------------------------------------------------------


def test_the_fit_sums_stay_finite() -> None:
    """Each of two steps passed the one-step overflow test, and together they made the sums
    inf: every later solve NaN, every refit dropped, the fit frozen for good. The second
    is not used now; the first (taken before any step could be compared with it) is
    followed by a restart once the real steps arrive."""
    rng = np.random.default_rng(0)
    fit = MeasuredStepTime(PRESETS["cpu-smollm2"])
    assert fit.observe(1, 0, 1e-154) is True  # nothing to compare the first steps with
    assert fit.observe(1, 0, 1e-154) is False  # w2 = 1e308 twice: the sums would be inf
    assert (fit.observed, fit.skipped) == (1, 1)
    assert all(map(math.isfinite, fit._xx)) and all(map(math.isfinite, fit._xy))
    _good(fit, rng, 400)
    assert all(map(math.isfinite, fit._xx)) and all(map(math.isfinite, fit._xy))
    assert fit.restarts == 1
    assert _worst(fit) < 0.05


def test_the_fit_sums_stay_finite_after_normal_steps() -> None:
    """The reviewer's case: the same two steps after 100 good ones (outliers now)."""
    rng = np.random.default_rng(0)
    fit = MeasuredStepTime(PRESETS["cpu-smollm2"])
    _good(fit, rng, 100)
    fit.observe(1, 0, 1e-154)
    fit.observe(1, 0, 1e-154)
    assert all(map(math.isfinite, fit._xx)) and all(map(math.isfinite, fit._xy))


# -- settings and rejected fits -----------------------------------------------------------


@pytest.mark.parametrize("min_steps", [0, -1])
def test_min_steps_is_validated(min_steps: int) -> None:
    """``min_steps = 0`` restarted the fit at every step and kept the unscaled prior."""
    with pytest.raises(ValueError, match="min_steps"):
        MeasuredStepTime(PRESETS["llama8b-h100"], min_steps=min_steps)


def test_min_steps_one_is_accepted() -> None:
    fit = MeasuredStepTime(PRESETS["llama8b-h100"], min_steps=1)
    rng = np.random.default_rng(5)
    _good(fit, rng, 200)
    assert fit.restarts == 0 and _worst(fit) < 0.10


def test_a_rejected_fit_is_counted_and_shown() -> None:
    """A fit that prices a one-token step at no time keeps the current model, as before,
    but is counted (:attr:`MeasuredStepTime.rejected_fits`) and shown by ``describe``."""
    rng = np.random.default_rng(6)
    fit = MeasuredStepTime(PRESETS["cpu-smollm2"])
    _good(fit, rng, 50)
    assert fit.rejected_fits == 0 and "rejected" not in fit.describe()
    model = fit.model
    with fit._lock:
        fit._model = fit._adopt(np.zeros(fit._d))
    assert fit.model is model
    coef = np.full(fit._d, 1e-3)
    coef[0] = math.nan
    with fit._lock:
        fit._model = fit._adopt(coef)
    assert fit.model is model
    assert fit.rejected_fits == 2
    assert "2 rejected fits" in fit.describe()
