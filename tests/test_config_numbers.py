"""Non-finite and impossible numbers are rejected where they enter: the online step-time
fit, the step-time model, the draft budget and the proposer's config."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from agentspec_mw.agentspec.budget import StepShape, admission_bound, admission_bounds
from agentspec_mw.agentspec.config import AgentSpecConfig
from agentspec_mw.cli import _parse_set
from agentspec_mw.costfit import MeasuredStepTime
from agentspec_mw.costmodel import PRESETS, StepTimeModel, get_cost_model

NAN, INF = float("nan"), float("inf")


def _steps(n: int) -> list[tuple[float, float, float]]:
    return [(100.0 + i, 1000.0 + 10 * i, 0.01 + 0.0001 * i) for i in range(n)]


def _fitted(steps: list[tuple[float, float, float]]) -> MeasuredStepTime:
    fit = MeasuredStepTime(min_steps=4, refit_every=1)
    for step in steps:
        assert fit.observe(*step)
    return fit


# -- MeasuredStepTime.observe ------------------------------------------------------------


@pytest.mark.parametrize("bad", [NAN, INF, -1.0])
@pytest.mark.parametrize("feature", ["num_batched", "num_kv", "spec_kv", "draft_kv", "emitted"])
def test_a_step_with_a_bad_feature_is_skipped_and_the_fit_goes_on(feature: str, bad: float) -> None:
    good = _steps(10)
    fit, twin = _fitted(good[:8]), _fitted(good[:8])
    step: dict[str, float] = {"num_batched": 101.0, "num_kv": 1000.0, "seconds": 0.0101}
    step[feature] = bad
    assert fit.observe(**step) is False
    assert (fit.observed, fit.skipped) == (8, 1)
    # the skipped step left no trace: the fit goes on exactly as one that never saw it
    for s in good[8:]:
        assert fit.observe(*s) and twin.observe(*s)
    assert fit.linear_coefficients().tolist() == twin.linear_coefficients().tolist()
    assert math.isfinite(fit.step_time(100, 1000))


@pytest.mark.parametrize("seconds", [NAN, INF, 0.0, -0.01, 1e-170])
def test_a_step_with_a_bad_time_is_skipped(seconds: float) -> None:
    fit = _fitted(_steps(8))
    before = fit.linear_coefficients().tolist()
    assert fit.observe(101, 1000, seconds) is False
    assert fit.skipped == 1 and fit.linear_coefficients().tolist() == before
    assert fit.observe(101, 1000, 0.0101)


def test_a_step_whose_sums_would_overflow_is_skipped() -> None:
    fit = _fitted(_steps(8))
    assert fit.observe(1e200, 1000, 0.01) is False
    assert fit.observe(101, 1e200, 0.01, spec_kv=1e200, draft_kv=1e200) is False
    assert fit.skipped == 2
    assert fit.observe(101, 1000, 0.0101)
    assert all(math.isfinite(c) for c in fit.linear_coefficients())


def test_a_fit_without_a_one_token_time_keeps_the_current_model() -> None:
    fit = _fitted(_steps(8))
    model, emitted = fit.model, fit.emitted_cost
    d = len(fit._p)
    for coef in (np.zeros(d), np.full(d, NAN), np.array([INF] + [0.0] * (d - 1))):
        assert fit._adopt(coef) is model and fit.emitted_cost == emitted


# -- MeasuredStepTime options -------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("half_life_steps", NAN),
        ("half_life_steps", INF),
        ("half_life_steps", -1.0),
        ("outlier_ratio", NAN),
        ("outlier_ratio", INF),
        ("outlier_ratio", 0.5),
        ("noise", NAN),
        ("noise", INF),
        ("prior_spread", NAN),
    ],
)
def test_the_fits_options_must_be_finite(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"MeasuredStepTime needs .*{option}={value!r}"):
        MeasuredStepTime(**{option: value})  # type: ignore[arg-type]


def test_an_infinite_prior_spread_still_means_no_prior() -> None:
    fit = MeasuredStepTime(prior_spread=INF, min_steps=4, refit_every=1)
    for step in _steps(8):
        assert fit.observe(*step)
    assert all(math.isfinite(c) for c in fit.linear_coefficients())


# -- StepTimeModel ------------------------------------------------------------------------

_BASE: dict[str, Any] = {"c_fix": 5e-3, "c_tok": 2e-5, "c_kv": 4e-8, "c_oh": 1e-3}


@pytest.mark.parametrize("value", [INF, NAN])
@pytest.mark.parametrize(
    "field", ["c_fix", "c_tok", "c_kv", "c_oh", "c_row", "c_spec_kv", "c_draft_kv"]
)
def test_a_step_time_coefficient_must_be_finite(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=rf"{field}\n  Input should be a finite number"):
        StepTimeModel(**{**_BASE, field: value})


@pytest.mark.parametrize("form", ["linear", "ridge", "roofline"])
def test_a_one_token_step_must_take_time(form: str) -> None:
    zero = {"c_fix": 0.0, "c_tok": 0.0, "c_kv": 4e-8, "c_oh": 0.0, "c_row": 0.0}
    with pytest.raises(ValidationError, match="one-token step must take a positive"):
        StepTimeModel(form=form, **zero)
    # any one of the terms of a one-token step is enough
    for term in ("c_fix", "c_tok", "c_row", "c_oh"):
        model = StepTimeModel(form=form, **{**zero, term: 1e-3})
        assert model.step_time(1, 0) > 0


def test_the_presets_are_valid_models() -> None:
    for name, preset in PRESETS.items():
        assert StepTimeModel.model_validate(preset.model_dump()) == preset, name


# -- the draft budget ---------------------------------------------------------------------


class _Free:
    """A step-time function (not a validated model) that prices every step at 0 s."""

    def step_time(self, num_batched: float, num_kv: float) -> float:
        return 0.0

    def marginal_token_cost(self, num_batched: float, num_kv: float) -> float:
        return 0.0


class _FreeLinear(_Free):
    """The same, as linear coefficients (the budget's fast path), pricing drafts by context."""

    def linear_coefficients(self) -> np.ndarray:
        return np.zeros(4)

    def draft_coefficients(self) -> tuple[float, float]:
        return (1e-6, 1e-7)


@pytest.mark.parametrize("cost", [_Free(), _FreeLinear()])
def test_the_budget_rejects_a_step_of_no_time(cost: _Free) -> None:
    shape = StepShape(batch_size=4, num_kv=300.0)
    with pytest.raises(ValueError, match="positive, finite step time"):
        admission_bound(cost, shape)
    with pytest.raises(ValueError, match="positive, finite step time"):
        admission_bounds(cost, shape, np.array([100.0, 200.0]))


def test_the_budget_is_unchanged_for_a_model() -> None:
    cost = get_cost_model("cpu-smollm2")
    shape = StepShape(batch_size=4, num_kv=1200.0)
    coef = cost.linear_coefficients()
    assert coef is not None
    t_dec = coef[0] + coef[1] * 4 + coef[2] * 1200.0 + coef[3]
    assert admission_bound(cost, shape) == 4 / float(t_dec) * float(coef[1])
    lens = np.array([100.0, 1000.0])
    expected = 4 / float(t_dec) * (coef[1] + cost.c_draft_kv * lens)
    assert admission_bounds(cost, shape, lens).tolist() == expected.tolist()


# -- AgentSpecConfig ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [INF, -INF, NAN])
@pytest.mark.parametrize(
    "option", ["calib_prior_strength", "calib_prior_scale", "redundancy_g_min"]
)
def test_an_experimental_number_must_be_finite(option: str, value: float) -> None:
    match = rf"experimental\.{option}\n  Input should be a finite number"
    with pytest.raises(ValidationError, match=match):
        AgentSpecConfig(experimental={option: value})
    with pytest.raises(ValidationError, match=match):
        AgentSpecConfig(**{f"experimental.{option}": value})


def test_infinity_from_the_command_line_is_rejected() -> None:
    options = _parse_set(["agentspec.experimental.calib_prior_strength=Infinity"])
    assert options["agentspec"] == {"experimental.calib_prior_strength": INF}
    with pytest.raises(ValidationError, match="calib_prior_strength"):
        AgentSpecConfig(**options["agentspec"])
    ok = _parse_set(["agentspec.experimental.calib_prior_strength=4.5"])
    assert AgentSpecConfig(**ok["agentspec"]).experimental.calib_prior_strength == 4.5


@pytest.mark.parametrize("experimental", [None, 5, "iso", [1, 2]])
def test_experimental_options_that_are_not_options_raise_a_validation_error(
    experimental: object,
) -> None:
    with pytest.raises(ValidationError, match="experimental"):
        AgentSpecConfig(**{"experimental": experimental, "experimental.index_walk_min": 4})
    with pytest.raises(ValidationError, match="experimental"):
        AgentSpecConfig(experimental=experimental)  # type: ignore[arg-type]


def test_experimental_options_merge_with_dotted_keys() -> None:
    base = AgentSpecConfig(experimental={"calib_prior_strength": 2.0})
    for given in (base.experimental, {"calib_prior_strength": 2.0}):
        cfg = AgentSpecConfig(**{"experimental": given, "experimental.index_walk_min": 4})
        assert cfg.experimental.index_walk_min == 4
        assert cfg.experimental.calib_prior_strength == 2.0
