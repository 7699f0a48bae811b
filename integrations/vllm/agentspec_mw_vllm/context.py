"""The batch context the plugin hands the adapter before each draft call (no vLLM import).

vLLM's ``custom_class`` drafter is called with token buffers only — no request ids, no
sampling params. :mod:`agentspec_mw_vllm.plugin` reads them off the model runner and the
step's ``SchedulerOutput`` into this record, row-aligned with the draft call's rows.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentspec_mw.proposer import Decoding

__all__ = ["BatchContext", "decoding_of"]


@dataclass(frozen=True, slots=True)
class BatchContext:
    """One draft call's batch, as the plugin read it from vLLM.

    Attributes:
        req_ids: vLLM's request id of each row (the caller's id plus a random suffix).
        num_prompt_tokens: prompt length of each row.
        extra_args: ``SamplingParams.extra_args`` of each row (our wire tags live there).
        scheduled_spec_decode_tokens: the drafts the scheduler actually put in the step
            just verified, per request id (after trimming to the token budget).
        num_scheduled_tokens: tokens scheduled per request id in that step.
        finished_req_ids: requests that finished in the step before.
        max_num_batched_tokens: the scheduler's token budget per step.
        max_model_len: the engine's context limit.
        max_tokens: ``SamplingParams.max_tokens`` of each row (``None``: no limit known);
            empty when the host does not read it. A request emits at most this many
            output tokens, so draft tokens past it are verified and thrown away.
        num_waiting_prompt_tokens: prompt tokens the scheduler still had to compute after
            scheduling the step (waiting requests less their prefix-cache hits, and the
            rest of partly prefilled ones: :mod:`agentspec_mw_vllm.queue`); ``None`` when
            the scheduler did not count them.
        decoding: each row's decoding regime (``"greedy"``, ``"sampled"``,
            ``"constrained"``: :func:`decoding_of` its ``SamplingParams``; ``None``: not
            known); empty when the host does not read it.
        num_spec_tokens: the draft length vLLM asks for next (``SchedulerOutput.
            num_spec_tokens_to_schedule``: the configured ``k``, or less where vLLM's
            dynamic speculative decoding picks it by batch size; it passes the same to its
            own n-gram drafter); ``None`` when not known (the drafter's ``k`` applies).
        live_req_ids: the requests the runner still holds (``runner.requests``): one
            absent from the rows but among these was not scheduled in the step (vLLM
            takes it out of the batch while prefill chunks use the token budget, or
            preempts it) and comes back later with its history; ``None`` when not
            known (a request absent from the rows is taken to have left).
        num_computed_tokens: each row's tokens in the KV cache before the step
            (``input_batch.num_computed_tokens_cpu``); empty when not known. A row part
            way through its prompt holds that plus its scheduled chunk, not the whole
            prompt that its token count already holds.
        scheduler_step: the scheduler's number of the step just run (from 1, counted by
            the plugin's wrap of ``Scheduler.schedule``); ``None`` when not counted (no
            or an older scheduler wrap). Two draft calls whose numbers are not
            consecutive had engine steps between them without a draft call: vLLM skips
            the call for the whole batch while a row is within ``k`` tokens of
            ``max_model_len``. Under pipeline parallelism every scheduled batch still
            gets its call (on the last stage, in the order scheduled), but successive
            batches hold disjoint requests: a request's calls are two or more apart.

    ``extra_args``, ``max_tokens`` and ``decoding`` are indexed by row; the plugin's read
    a row's ``SamplingParams`` only when indexed, and the session indexes them once per
    request, when it first sees it (a request's sampling params do not change).
    """

    req_ids: Sequence[str]
    num_prompt_tokens: Sequence[int]
    extra_args: Sequence[Mapping[str, Any] | None]
    scheduled_spec_decode_tokens: Mapping[str, Sequence[int]] = field(default_factory=dict)
    num_scheduled_tokens: Mapping[str, int] = field(default_factory=dict)
    finished_req_ids: frozenset[str] = frozenset()
    max_num_batched_tokens: int | None = None
    max_model_len: int = 1 << 30
    max_tokens: Sequence[int | None] = ()
    num_waiting_prompt_tokens: int | None = None
    num_spec_tokens: int | None = None
    decoding: Sequence[Decoding | None] = ()
    live_req_ids: Container[str] | None = None
    num_computed_tokens: Sequence[int] = ()
    scheduler_step: int | None = None


_SAMPLING_EPS = 1e-5  # vLLM's: a temperature under it is greedy (vllm/sampling_params.py)


def decoding_of(params: Any) -> Decoding | None:
    """A request's decoding regime from its ``SamplingParams`` (read by attribute, so no
    vLLM import): ``sampled`` at a temperature vLLM samples at (unless ``top_k`` is 1: the
    argmax, whose drafts are accepted exactly as greedy ones), else ``constrained`` with
    structured outputs, else ``greedy``; ``None`` for no params."""
    if params is None:
        return None
    temperature = getattr(params, "temperature", 0.0)
    if (
        isinstance(temperature, (int, float))
        and temperature >= _SAMPLING_EPS
        and getattr(params, "top_k", 0) != 1
    ):
        return "sampled"
    if getattr(params, "structured_outputs", None) is not None:
        return "constrained"
    return "greedy"
