"""Step-time models of an LLM engine: how long one batched decoding step takes.

Every constant lives here. ``T_step = c_fix + c_tok * N_batched + c_kv * N_kv + c_oh``
(the *linear* form) with ``N_batched`` the tokens the step processes (1 + draft length per
request) and ``N_kv`` the KV-cache tokens resident (summed over the batch).

Sources and limits:

* ``llama8b-h100`` — the fit for Llama-3.1-8B on one H100 in vLLM 0.10.1 reported by
  SpecDecode-Bench (arXiv 2601.11580): c_fix = 5.886 ms, c_tok = 21.0 µs per batched
  token, c_kv = 39.3 ns per resident KV token, c_oh = 1.207 ms. Its constants match a
  roofline. This is the pessimistic form: every extra token costs c_tok.
* ``llama8b-h200`` — *inferred, not measured*: same compute as the H100, memory bandwidth
  4.8 vs 3.35 TB/s scales the memory-bound terms: c_fix = 4.11 ms, c_kv = 27.4 ns.
* ``llama8b-h100-roofline`` — the optimistic bound, ``T = c_oh + max(c_fix + c_kv N_kv,
  c_tok N_batched)``: batched tokens are free until the step becomes compute-bound (the
  ridge, ``c_fix / c_tok`` ≈ 280 tokens at zero context).

The model is pluggable: anything with ``step_time(num_batched, num_kv) -> seconds`` works;
:class:`agentspec_mw.costfit.MeasuredStepTime` (``cost_model="measured"`` in the vLLM
adapter) fits a linear model to the engine's own measured steps.
"""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PRESETS", "StepTimeModel", "StepTimeFn", "get_cost_model"]


class StepTimeFn(Protocol):
    """Anything that predicts the seconds one engine step takes."""

    def step_time(self, num_batched: float, num_kv: float) -> float: ...

    def marginal_token_cost(self, num_batched: float, num_kv: float) -> float: ...


class StepTimeModel(BaseModel):
    """A linear or roofline step-time model; all times in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    form: Literal["linear", "roofline"] = "linear"
    c_fix: float = Field(ge=0.0, description="fixed time per step (weights read), s")
    c_tok: float = Field(ge=0.0, description="time per batched token, s")
    c_kv: float = Field(ge=0.0, description="time per resident KV-cache token, s")
    c_oh: float = Field(ge=0.0, description="per-step engine overhead (scheduling, sampling), s")

    def step_time(self, num_batched: float, num_kv: float) -> float:
        """Seconds for one step with ``num_batched`` tokens and ``num_kv`` KV tokens."""
        if self.form == "linear":
            return self.c_fix + self.c_tok * num_batched + self.c_kv * num_kv + self.c_oh
        return self.c_oh + max(self.c_fix + self.c_kv * num_kv, self.c_tok * num_batched)

    def step_time_array(self, num_batched: np.ndarray, num_kv: float) -> np.ndarray:
        """Vectorised :meth:`step_time` over an array of batched-token counts."""
        nb = np.asarray(num_batched, dtype=np.float64)
        if self.form == "linear":
            return self.c_fix + self.c_tok * nb + self.c_kv * num_kv + self.c_oh
        return self.c_oh + np.maximum(self.c_fix + self.c_kv * num_kv, self.c_tok * nb)

    def marginal_token_cost(self, num_batched: float, num_kv: float) -> float:
        """Seconds one more batched token adds to a step of this shape."""
        return self.step_time(num_batched + 1, num_kv) - self.step_time(num_batched, num_kv)

    def linear_coefficients(self) -> np.ndarray | None:
        """``(c_fix, c_tok, c_kv, c_oh)`` for the linear form (budgets evaluate it in a
        kernel); ``None`` for the roofline form."""
        if self.form != "linear":
            return None
        return np.array([self.c_fix, self.c_tok, self.c_kv, self.c_oh], dtype=np.float64)

    def ridge_tokens(self) -> float:
        """Batched tokens at which a step turns compute-bound (``c_fix / c_tok``): the
        arithmetic-intensity ridge ``AI`` of the brief (≈280 for the H100 preset, ≈196 H200)."""
        return self.c_fix / self.c_tok if self.c_tok > 0 else float("inf")


PRESETS: dict[str, StepTimeModel] = {
    "llama8b-h100": StepTimeModel(
        name="llama8b-h100", c_fix=5.886e-3, c_tok=21.0e-6, c_kv=39.3e-9, c_oh=1.207e-3
    ),
    "llama8b-h200": StepTimeModel(
        name="llama8b-h200", c_fix=4.11e-3, c_tok=21.0e-6, c_kv=27.4e-9, c_oh=1.207e-3
    ),
    "llama8b-h100-roofline": StepTimeModel(
        name="llama8b-h100-roofline",
        form="roofline",
        c_fix=5.886e-3,
        c_tok=21.0e-6,
        c_kv=39.3e-9,
        c_oh=1.207e-3,
    ),
}


def get_cost_model(name: str) -> StepTimeModel:
    """Return a preset by name; raises ``ValueError`` listing the presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"cost_model={name!r} is not a preset; choose one of {sorted(PRESETS)}"
        ) from None
