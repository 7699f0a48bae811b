"""What the engine-backed chat model needs from an engine, and the vLLM implementation.

:class:`EngineBackend` is two methods: the tokenizer, and ``generate`` for a batch of
token-id prompts. :class:`VLLMBackend` wraps an in-process ``vllm.LLM`` (from
``agentspec_mw_vllm.engine.build_llm`` or your own): requests from concurrent threads are
combined into one ``LLM.generate`` batch (:class:`~.batching.BatchCombiner`), and each
request's structure tags travel as ``SamplingParams(extra_args=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentspec_mw_langgraph.batching import BatchCombiner

__all__ = [
    "EngineBackend",
    "GenerationRequest",
    "GenerationResult",
    "VLLMBackend",
    "sampling_params",
]


@dataclass(frozen=True)
class GenerationRequest:
    """One completion request (token ids in, sampling settings, wire tags)."""

    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    extra_args: dict[str, str | int | float] | None = None


@dataclass(frozen=True)
class GenerationResult:
    """What the engine produced for one request."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None


@runtime_checkable
class EngineBackend(Protocol):
    """An engine the chat model can drive."""

    def get_tokenizer(self) -> Any:
        """A Hugging Face tokenizer (``encode``, ``decode``, ``apply_chat_template``)."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate every request (thread-safe)."""
        ...

    @property
    def model_name(self) -> str:
        """The model's name or path."""
        ...


def sampling_params(r: GenerationRequest) -> Any:
    """vLLM ``SamplingParams`` for one request (tags travel in ``extra_args``)."""
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        seed=r.seed,
        stop=list(r.stop) or None,
        extra_args=dict(r.extra_args) if r.extra_args else None,
    )


class VLLMBackend:
    """An :class:`EngineBackend` over an in-process ``vllm.LLM``."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self._combiner: BatchCombiner[GenerationRequest, GenerationResult] = BatchCombiner(
            self._run_batch
        )

    @property
    def model_name(self) -> str:
        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        return str(getattr(config, "model", None) or "vllm")

    @property
    def batches(self) -> int:
        """``LLM.generate`` calls made so far."""
        return self._combiner.batches

    def get_tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return [self._combiner.submit(r) for r in requests]

    def _run_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        params = [sampling_params(r) for r in requests]
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for req, out in zip(requests, outputs, strict=True):
            comp = out.outputs[0]
            self._observe(req, comp)
            results.append(
                GenerationResult(
                    text=comp.text,
                    token_ids=tuple(comp.token_ids),
                    finish_reason=comp.finish_reason,
                )
            )
        return results

    def _observe(self, request: GenerationRequest, completion: Any) -> None:
        """Hook: called with each request and its vLLM ``CompletionOutput`` (no-op)."""
