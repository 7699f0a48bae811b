"""MeasuredStepTime's Python-float sums fit exactly what its numpy sums fitted, to the bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentspec_mw.costfit import MeasuredStepTime, _nonnegative_normal_solve
from agentspec_mw.costmodel import get_cost_model


class _NumpySums(MeasuredStepTime):
    """The fit written with numpy vectors (the reference)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._nxx = np.zeros((self._d, self._d))
        self._nxy = np.zeros(self._d)
        self._npy = 0.0

    def observe(
        self,
        num_batched: float,
        num_kv: float,
        seconds: float,
        spec_kv: float = 0.0,
        draft_kv: float = 0.0,
        emitted: float = 0.0,
    ) -> bool:
        if not (seconds > 0.0 and math.isfinite(seconds)) or min(num_batched, num_kv) < 0:
            self.skipped += 1
            return False
        if self.observed >= self.min_steps:
            typical = self._model.step_time(num_batched, num_kv, None, spec_kv, draft_kv)
            typical += self.emitted_cost * emitted
        else:
            self._early.append(seconds)
            typical = float(np.median(self._early)) if len(self._early) >= 4 else math.inf
        if seconds > self.outlier_ratio * typical:
            self.skipped += 1
            return False
        x = np.array(
            [1.0, num_batched, num_kv, *self._draft_features(spec_kv, draft_kv), emitted],
            dtype=np.float64,
        )
        w2 = 1.0 / (seconds * seconds)
        self._nxx *= self._decay
        self._nxy *= self._decay
        self._npy *= self._decay
        self._nxx += w2 * np.outer(x, x)
        self._nxy += w2 * x * seconds
        self._npy += w2 * float(self._p @ x)
        self.observed += 1
        self._since_fit += 1
        if self._since_fit >= self.refit_every or self.observed <= self.min_steps:
            self._model = self._adopt(self._numpy_solve())
            self._since_fit = 0
        return True

    def _numpy_solve(self) -> np.ndarray:
        weight = self._nxx[0, 0]
        scaled = self._p * (self._nxy[0] / self._npy) if self._npy > 0 else self._p
        if self.observed < self.min_steps:
            return scaled
        mean = self._nxx[0] / weight
        mean_step = self._nxy[0] / weight
        floor = 0.01 * mean_step / np.maximum(mean, 1.0)
        sd = self.prior_spread * np.maximum(scaled, floor)
        sd[-1] = self.prior_spread * scaled[1]  # the emitted tokens' prior sd
        ridge = self.noise**2 / np.maximum(sd, 1e-30) ** 2
        ridge[0] = 0.0
        a = self._nxx + np.diag(ridge)
        b = self._nxy + ridge * scaled
        return _nonnegative_normal_solve(a, b)  # the active set is shared, unchanged


@pytest.mark.parametrize(
    ("prior", "seed", "refit_every"),
    [("cpu-smollm2", 0, 8), ("llama8b-h100", 1, 1), ("cpu-smollm2", 2, 3)],
)
def test_python_sums_fit_as_the_numpy_sums(prior: str, seed: int, refit_every: int) -> None:
    kw = {"prior": get_cost_model(prior), "refit_every": refit_every, "half_life_steps": 64.0}
    fit, ref = MeasuredStepTime(**kw), _NumpySums(**kw)  # type: ignore[arg-type]
    rng = np.random.default_rng(seed)
    for i in range(600):
        # engine-like steps (a busy phase, a drifting host), outliers and a bad reading
        n = float(rng.integers(1, 64 if i < 300 else 600))
        kv = float(rng.integers(0, 40_000))
        # half the steps carry drafts on some of their requests
        spec = float(rng.integers(0, kv + 1)) if i % 2 else 0.0
        draft = spec * float(rng.integers(1, 8)) if spec else 0.0
        seconds = 0.045 + 4e-4 * n + 2e-9 * kv * (1 + i / 300) + rng.normal(0, 0.004)
        emitted = n + float(rng.integers(0, 3 * n + 1)) if spec else n
        seconds += 3e-9 * spec + 1e-9 * draft + 2e-4 * emitted
        if i % 97 == 13:
            seconds *= 9.0
        if i == 50:
            seconds = -1.0
        used = fit.observe(n, kv, seconds, spec, draft, emitted)
        assert used == ref.observe(n, kv, seconds, spec, draft, emitted)
        assert fit.linear_coefficients().tolist() == ref.linear_coefficients().tolist(), i
        assert fit.draft_coefficients() == ref.draft_coefficients(), i
        assert fit.emitted_cost == ref.emitted_cost, i
    assert (fit.observed, fit.skipped) == (ref.observed, ref.skipped)
    assert fit.observed > 500 and fit.skipped >= 6
