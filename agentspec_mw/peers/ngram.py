"""``ngram``: vLLM's n-gram prompt-lookup proposer, its own numba kernel.

The matching kernel is ``_find_longest_matched_ngram_and_propose_tokens`` from
``vllm/v1/spec_decode/ngram_proposer.py`` — the function vLLM's ``batch_propose_numba``
runs for each row — imported, not re-implemented. The window bounds resolve as vLLM's
``SpeculativeConfig`` resolves them: neither given → ``prompt_lookup_min =
prompt_lookup_max = 5``; only one given → the other equals it (``{"prompt_lookup_min": 2}``
runs ``[2, 2]``, ``{"prompt_lookup_max": 3}`` runs ``[3, 3]``); ``min > max`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentspec_mw.errors import MissingDependencyError
from agentspec_mw.peers._buffer import TokenBuffer
from agentspec_mw.proposer import EMPTY_DRAFT, Draft, StepContext, TokenIds

if TYPE_CHECKING:
    from agentspec_mw.tags import StructureTags

_MAX_MODEL_LEN = 1 << 30


class NgramConfig(BaseModel):
    """Options of the n-gram peer (vLLM's names, resolved by vLLM's rule: neither bound
    given → both 5; only one given → the other equals it; ``min > max`` is an error). After
    validation both fields hold ints."""

    model_config = ConfigDict(extra="forbid")

    prompt_lookup_min: int | None = Field(default=None, ge=1, le=1024)
    """Shortest suffix n-gram that may match (at most 1,024, as the longest). Unset: equal
    to ``prompt_lookup_max`` when that is given, else 5 (vLLM's ``SpeculativeConfig``
    rule); must be <= ``prompt_lookup_max``."""
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=1024)
    """Longest suffix n-gram tried (at most 1,024: vLLM's kernel allocates an array of this
    size on every call — 10^9 asked for 4 GB a call — and n-grams past a few dozen tokens
    never change a draft in practice). Unset: equal to ``prompt_lookup_min`` when that is
    given, else 5 (vLLM's rule)."""

    @model_validator(mode="after")
    def _resolve_bounds(self) -> NgramConfig:
        """vLLM's ``SpeculativeConfig`` resolution of the two bounds, and its check."""
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None:
            lo = 5 if hi is None else hi
        if hi is None:
            hi = lo
        if lo > hi:
            raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        # plain attribute writes: no validate_assignment, so no re-entry into this validator
        self.prompt_lookup_min, self.prompt_lookup_max = lo, hi
        return self

    @property
    def window(self) -> tuple[int, int]:
        """The resolved ``(prompt_lookup_min, prompt_lookup_max)``."""
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        assert lo is not None and hi is not None  # resolved by the validator
        return lo, hi


def _load_kernel() -> Callable[..., Any]:
    try:
        from vllm.v1.spec_decode.ngram_proposer import (
            _find_longest_matched_ngram_and_propose_tokens,
        )
    except ImportError as exc:
        raise MissingDependencyError(
            "vllm", "the ngram peer (vLLM's n-gram kernel)", "bash scripts/bootstrap.sh"
        ) from exc
    return _find_longest_matched_ngram_and_propose_tokens  # type: ignore[no-any-return]


class NgramProposer:
    """vLLM's n-gram prompt lookup over each request's own prompt + output."""

    name = "ngram"

    def __init__(self, **options: Any) -> None:
        self.config = NgramConfig(**options)  # resolves the bounds as vLLM does
        self._min, self._max = self.config.window
        self._kernel = _load_kernel()
        # compiled here, as vLLM's NgramProposer does, not inside the first timed propose
        self._kernel(np.zeros(8, dtype=np.int32), 1, 1, _MAX_MODEL_LEN, 1)
        self._ctx: dict[str, TokenBuffer] = {}

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        """Keep the prompt as the lookup context."""
        self._ctx[req_id] = TokenBuffer(prompt_ids)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        """Append accepted tokens to the lookup context."""
        self._ctx[req_id].extend(token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        """Longest suffix n-gram match in the request's own context, up to ``k`` tokens."""
        out: list[Draft] = []
        for rid in req_ids:
            ctx = self._ctx[rid].view()
            ids = self._kernel(ctx, self._min, self._max, _MAX_MODEL_LEN, k)
            out.append(Draft(tuple(ids[:k].tolist())) if len(ids) else EMPTY_DRAFT)
        return out

    def stop(self, req_id: str) -> None:
        """Drop the request's context."""
        self._ctx.pop(req_id, None)
