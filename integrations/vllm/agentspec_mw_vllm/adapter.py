"""The vLLM ``custom_class`` drafter that runs any core proposer inside the engine loop.

Use::

    speculative_config={"method": "custom_class",
                        "model": "agentspec_mw_vllm.adapter.AgentSpecDrafter",
                        "num_speculative_tokens": k}

(:func:`agentspec_mw_vllm.engine.build_llm` and ``agentspec serve`` do this). vLLM builds
it as ``AgentSpecDrafter(vllm_config)`` in the engine-core process; which proposer it
drives comes from :class:`~agentspec_mw_vllm.config.DrafterConfig` (``additional_config``
or ``AGENTSPEC_*`` environment variables). The proposer gets a
:class:`~agentspec_mw.proposer.ProposerEnv` built once: the model tokenizer's token-id →
bytes table, the step-time model (by default ``cost_model="measured"``: a fit to the
engine's own timed steps, warm-started from a stored fit, ``cpu-smollm2`` on vLLM's CPU
build; or a fixed preset) and ``max_k = k``. The session checks every draft
against the model's vocabulary size (``model_config.get_vocab_size()``) before vLLM sees
it.

Where vLLM keeps several scheduled batches in flight (``vllm_config.max_concurrent_batches
> 1``: pipeline parallelism; vLLM turns async scheduling off for a ``custom_class``
drafter), the time between two draft calls is not one step of the batch the second call
sees, so ``cost_model="measured"`` is not fitted: the budget prices drafts by the prior
preset (``cost_prior``, else the platform's), and a warning says so
(:func:`_concurrent_batches`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentspec_mw.costfit import MeasuredStepTime
from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import Proposer, ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.tokens import token_bytes_table
from agentspec_mw_vllm.config import MEASURED, DrafterConfig
from agentspec_mw_vllm.context import BatchContext
from agentspec_mw_vllm.plugin import ensure_installed
from agentspec_mw_vllm.session import DraftSession

__all__ = ["AgentSpecDrafter"]

logger = logging.getLogger("agentspec_mw_vllm.adapter")


def _token_bytes(model_config: Any) -> list[bytes]:
    """The bytes of each token of the engine's tokenizer (:func:`token_bytes_table`).

    The tokenizer is the one vLLM keeps per process (``cached_tokenizer_from_config``) when
    it is a Hugging Face one: the embedded engine's front end has loaded it already in this
    process (loading it again took ~0.4-0.7 s of every engine start); in an engine process
    of its own this loads it the way vLLM does and leaves it there for vLLM's later use.
    A tokenizer of another kind (vLLM's Mistral-format ones) or ``skip_tokenizer_init``:
    Hugging Face's ``AutoTokenizer`` loads it here.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    if not getattr(model_config, "skip_tokenizer_init", False):
        from vllm.tokenizers import cached_tokenizer_from_config

        cached = cached_tokenizer_from_config(model_config)
        if isinstance(cached, PreTrainedTokenizerBase):
            return token_bytes_table(cached)
    tokenizer = AutoTokenizer.from_pretrained(
        model_config.tokenizer,
        revision=getattr(model_config, "tokenizer_revision", None),
        trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
    )
    return token_bytes_table(tokenizer)


def _prior(config: DrafterConfig) -> str:
    """The preset the measured model starts from (``cost_prior``, else by platform)."""
    if config.cost_prior is not None:
        return config.cost_prior
    from agentspec_mw_vllm.engine import is_cpu_build

    return "cpu-smollm2" if is_cpu_build() else "llama8b-h100"


def _step_clock() -> Callable[[], float] | None:
    """The clock the measured cost model times steps on: on vLLM's CPU build, the engine
    thread's CPU time (it runs the step, and with more OpenMP threads it is their master,
    busy until the slowest finishes; its wall time also counts the time other processes
    held the cores, which made the fit's error 50-200 % on a busy 2-core host with one
    thread, and 70 % at N = 1 with two, where the draft terms fitted to zero); elsewhere
    ``None`` (wall time: CPU time would miss the GPU's work)."""
    from agentspec_mw_vllm.engine import is_cpu_build

    if is_cpu_build():
        return time.thread_time
    return None


def _concurrent_batches(vllm_config: Any) -> int:
    """How many scheduled batches vLLM keeps in flight (``max_concurrent_batches``: the
    pipeline-parallel size, 2 under async scheduling; 1 where the config does not say).

    With more than one, vLLM's engine core schedules the next batch while earlier ones run
    (``EngineCore.step_with_batch_queue``); under pipeline parallelism the scheduler does
    not schedule a request again until its batch's output is back, so successive batches
    hold disjoint requests, and the drafter (on the last pipeline stage only) is called once
    per batch as it leaves that stage. The time between two draft calls is then about one
    stage's share of the next batch, not its step: the session times no such gap as the
    step of the batch its call sees (the two calls share no request, so it drops nearly
    every gap, and keeps only those of a lone batch, whose requests waited out the whole
    pipeline), and a fit of them would price drafts for another engine."""
    try:
        return max(1, int(getattr(vllm_config, "max_concurrent_batches", 1)))
    except (TypeError, ValueError):
        return 1


def _vocab_size(model_config: Any) -> int:
    """The model's vocabulary (its logits' width): every draft id must be under it."""
    return int(model_config.get_vocab_size())


class AgentSpecDrafter:
    """vLLM's ``custom_class`` drafter: the plugin's batch context + a core proposer.

    Raises at construction (so the engine does not start) when the installed vLLM is not
    the supported one, or the configured proposer cannot be built.
    """

    def __init__(self, vllm_config: Any, proposer: Proposer | None = None) -> None:
        ensure_installed()
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.config = DrafterConfig.from_sources(
            getattr(vllm_config, "additional_config", None) or {}
        )
        self.step_timer: MeasuredStepTime | None = None
        concurrent = _concurrent_batches(vllm_config)
        cost_label = self.config.cost_model  # the cost model the budget reads, for the log
        if self.config.cost_model == MEASURED and concurrent > 1:
            prior = cost_label = _prior(self.config)
            logger.warning(
                "agentspec drafter: cost_model=%r is not fitted: vLLM runs %d batches at once "
                "(pipeline parallel size %s), so the time between two draft calls is not one "
                "step; drafts are priced by the preset %r instead (set cost_model to the "
                "preset that describes this engine)",
                MEASURED,
                concurrent,
                getattr(
                    getattr(vllm_config, "parallel_config", None), "pipeline_parallel_size", "?"
                ),
                prior,
            )
            cost_model: object = get_cost_model(prior)
        elif self.config.cost_model == MEASURED:
            self.step_timer = MeasuredStepTime(prior=get_cost_model(_prior(self.config)))
            cost_model = self.step_timer
        else:
            cost_model = get_cost_model(self.config.cost_model)
        if proposer is None:
            env = ProposerEnv(
                token_bytes=_token_bytes(vllm_config.model_config),
                cost_model=cost_model,
                max_k=self.k,
            )
            proposer = make_proposer(self.config.proposer, env, **self.config.options)
        self.proposer = proposer
        self.session = DraftSession(
            proposer,
            self.k,
            max_model_len=int(vllm_config.model_config.max_model_len),
            step_timer=self.step_timer,
            step_clock=_step_clock(),
            vocab_size=_vocab_size(vllm_config.model_config),
        )
        self._batch: BatchContext | None = None
        logger.info(
            "agentspec drafter: proposer %r (%s), k=%d, cost model %s",
            self.config.proposer,
            type(proposer).__qualname__,
            self.k,
            cost_label,
        )

    def set_batch_context(self, ctx: BatchContext | None) -> None:
        """Called by the plugin's wrapper around every draft call (``None`` after it)."""
        self._batch = ctx

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No draft model to load (vLLM's CPU runner always calls this)."""

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """vLLM's ``custom_class`` call: one draft (at most ``k`` ids) per batch row."""
        return self.session.step(self._batch, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
