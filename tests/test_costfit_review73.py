"""Session 73's review: why the online fit found ~0.15 ms per emitted token in the 400 steps
of ``tests/vllm/test_session_review72c.py`` (40 ms + 0.4 ms per emitted token, 8 batched
tokens every step, 2-7 emitted, no noise) where the offline fit finds 0.4 ms.

The cause is the emitted-token term's prior, as the module doc describes it: mean 0,
standard deviation a batched token's *scaled* cost, weighed against a 10 % step noise,
with a weight that does not grow with the steps. That test's timer has the default
``llama8b-h100`` prior, whose token costs 0.3 % of a step: scaled to 42 ms steps, 0.12 ms.
0.4 ms is 3.3 of those from the prior's mean, and 399 steps of 2-7 emitted tokens identify
it (at the assumed noise) about as well as the prior does: the posterior mean is ~0.38 x
0.4 ms. Not outliers, forgetting or the refit cadence: without a prior the same online fit
is exact, and with the adapter's CPU prior (``cpu-smollm2``, a token ~1 ms) it is within a
few %. No code change: these tests pin the cause, and what the shrunk term does to the
draft price (it leaks into ``c_tok`` and ``c_draft_kv``, which the budget prices).
"""

from __future__ import annotations

import numpy as np
import pytest

from agentspec_mw.costfit import MeasuredStepTime, fit_observed_steps
from agentspec_mw.costmodel import PRESETS

C_EMIT = 0.4e-3


def _steps_72c(n: int) -> np.ndarray:
    """Rows ``[batched, kv, spec_kv, draft_kv, emitted, seconds]`` as review 72c's test
    reports them: two decoding requests, 8 scheduled tokens, 2-7 emitted per step."""
    kv, rows = 100.0, []
    for i in range(n):
        emitted = 2 + (i * 7) % 4 + (i * 5) % 3
        kv += emitted
        rows.append([8.0, kv, 0.0, 0.0, float(emitted), 0.040 + C_EMIT * emitted])
    return np.array(rows)


def _online(
    rows: np.ndarray, prior: str = "llama8b-h100", prior_spread: float = 1.0
) -> MeasuredStepTime:
    fit = MeasuredStepTime(prior=PRESETS[prior], prior_spread=prior_spread)
    for r in rows:
        assert fit.observe(r[0], r[1], r[5], r[2], r[3], r[4])
    return fit


def _ridge_posterior(rows: np.ndarray, prior: str = "llama8b-h100") -> float:
    """The c_emit the module doc's prior predicts, computed apart from the fit: the
    data's information on c_emit (the decayed ``1 / seconds^2``-weighted spread of the
    emitted tokens about their mean) against the prior's ``noise^2 / sd^2``, with ``sd``
    the preset's per-token cost scaled by measured / preset time."""
    p = PRESETS[prior]
    n = len(rows)
    w = 2.0 ** (-np.arange(n - 1, -1, -1) / 4096.0) / rows[:, 5] ** 2  # default half-life
    preset = p.c_fix + p.c_oh + (p.c_tok + p.c_row) * rows[:, 0] + p.c_kv * rows[:, 1]
    sd = (p.c_tok + p.c_row) * float(w @ rows[:, 5] / (w @ preset))
    e = rows[:, 4]
    info = float(w @ (e - (w @ e) / w.sum()) ** 2)
    return C_EMIT * info / (info + 0.1**2 / sd**2)


def test_the_offline_fit_and_a_prior_free_online_fit_are_exact() -> None:
    rows = _steps_72c(400)
    assert fit_observed_steps(rows)[5] == pytest.approx(C_EMIT, rel=1e-6)
    flat = _online(rows, prior_spread=float("inf"))
    assert flat.emitted_cost == pytest.approx(C_EMIT, rel=1e-3)
    assert flat.skipped == flat.restarts == 0


@pytest.mark.parametrize(("n", "want"), [(400, 0.153e-3), (2000, 0.288e-3)])
def test_the_online_c_emit_is_the_priors_posterior(n: int, want: float) -> None:
    """0.15 ms at 400 steps, 0.29 ms at 2,000 (0.05 ms at 100): the ridge's shrinkage
    toward 0, as the closed form computes it from the prior and the steps (to 0.1 %)."""
    rows = _steps_72c(n)
    fit = _online(rows)
    assert fit.emitted_cost == pytest.approx(want, rel=0.03)
    assert fit.emitted_cost == pytest.approx(_ridge_posterior(rows), rel=0.01)
    assert fit.skipped == fit.restarts == 0


def test_the_adapters_cpu_prior_recovers_the_term() -> None:
    """The adapter's prior on a CPU build (``cpu-smollm2``: ~1 ms a token scaled) leaves
    0.4 ms within a standard deviation of its mean: the same steps give it to ~3 %."""
    rows = _steps_72c(400)
    assert _online(rows, "cpu-smollm2").emitted_cost == pytest.approx(C_EMIT, rel=0.05)
    assert _ridge_posterior(rows, "cpu-smollm2") > 0.9 * C_EMIT


def _drafting_steps(n: int, seed: int) -> np.ndarray:
    """Two requests (500 and 800 KV tokens, growing), each drafting 0-3 tokens and
    emitting its accepted drafts plus one; 40 ms + 0.1 ms a token + 50 ns a KV token +
    0.4 ms an emitted token, no draft terms, 1 % noise."""
    rng = np.random.default_rng(seed)
    ctx = np.array([500.0, 800.0])
    rows = []
    for _ in range(n):
        d = rng.integers(0, 4, 2).astype(float)
        a = np.minimum(d, np.floor(d * rng.uniform(0, 1, 2) + 0.5 * rng.uniform(0, 1, 2)))
        tokens, e = float((d + 1).sum()), float((a + 1).sum())
        sec = (0.040 + 0.1e-3 * tokens + 50e-9 * ctx.sum() + C_EMIT * e) * rng.normal(1, 0.01)
        rows.append([tokens, ctx.sum(), ctx[d > 0].sum(), (d * ctx).sum(), e, sec])
        ctx += a + 1
    return np.array(rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_shrunk_term_leaks_into_the_draft_price(seed: int) -> None:
    """Accepted drafts are emitted, so what the prior keeps out of c_emit goes to the terms
    that grow with drafts: a draft token (``c_tok + c_draft_kv x 650 KV tokens``, truth
    0.1 ms) is priced 1.7-2x under the ``llama8b-h100`` prior at 400 steps, within 30 %
    of the truth without the prior. A documented limitation of that prior on an engine
    whose host work per emitted token is several of its scaled token costs."""
    rows = _drafting_steps(400, seed)
    fit, flat = _online(rows), _online(rows, prior_spread=float("inf"))

    def draft_token(f: MeasuredStepTime) -> float:
        return f.model.c_tok + f.model.c_draft_kv * 650.0

    assert fit.emitted_cost < 0.3 * C_EMIT
    assert flat.emitted_cost == pytest.approx(C_EMIT, rel=0.15)
    assert draft_token(fit) > 1.6 * 0.1e-3
    assert draft_token(flat) == pytest.approx(0.1e-3, rel=0.3)
