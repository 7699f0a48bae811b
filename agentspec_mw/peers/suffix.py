"""``suffix``: SuffixDecoding through arctic-inference's ``SuffixDecodingCache``.

Driven as vLLM 0.32's ``SuffixDecodingProposer`` (``vllm/v1/spec_decode/suffix_decoding.py``)
drives it: a request's prompt starts a per-request tree (an id seen before is evicted
first) and takes a response slot in the global tree (``max_cached_requests`` slots, FIFO);
every accepted token is added with ``add_active_response``, which extends both the
request's tree and its response in the global tree, so other requests draft from a
response while it is still being generated; the pattern is the last ``max_tree_depth``
tokens of prompt + output; ``speculate`` gets ``max_spec_tokens = k``, ``max_spec_factor``
and ``min_token_prob``; ``stop_request`` drops the request's tree, and its response stays
in the global tree. Defaults are vLLM's: depth 24, spec factor 1.0, min prob 0.1, 10,000
cached requests.

One difference: vLLM stops a request whenever a step does not schedule it (preempted, or
skipped once the step's token budget is spent: ``GPUModelRunner._update_states`` drops it
from the input batch) and, when it next samples, evicts its response from the global tree
and restarts its tree from the prompt alone; here a request keeps both until it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from agentspec_mw.errors import MissingDependencyError
from agentspec_mw.peers._buffer import TokenBuffer
from agentspec_mw.proposer import EMPTY_DRAFT, Draft, StepContext, TokenIds

if TYPE_CHECKING:
    from agentspec_mw.tags import StructureTags


#: Bounds of :class:`SuffixConfig`'s numbers: arctic-inference computes a draft's cap,
#: ``max_spec_factor`` × match length (at most ``max_tree_depth``), and holds depths and
#: request counts as 32-bit C++ ints; past 2^31 they overflow and the cache silently
#: drafts nothing. These keep the product under 2^26.
MAX_TREE_DEPTH = 1 << 16
MAX_SPEC_FACTOR = 1024.0
MAX_CACHED_REQUESTS = 0x7FFFFFFF


class SuffixConfig(BaseModel):
    """Options of the SuffixDecoding peer (vLLM's ``suffix_decoding_*`` names)."""

    model_config = ConfigDict(extra="forbid")

    max_tree_depth: int = Field(default=24, ge=1, le=MAX_TREE_DEPTH)
    """Longest pattern / draft the trees hold (at most 65,536: arctic-inference's trees
    take 32-bit depths, and the draft cap is computed from it, see ``max_spec_factor``)."""
    max_spec_factor: float = Field(default=1.0, gt=0, le=MAX_SPEC_FACTOR)
    """Draft length cap as a multiple of the match length; finite, at most 1024: a draft
    never exceeds ``k`` and a match is at least a token, so a factor of ``k`` or more
    never binds, while a huge one (>= ~2.2e9, or Infinity) overflows arctic-inference's
    32-bit cap and it drafts nothing."""
    min_token_prob: float = Field(default=0.1, ge=0, le=1)
    """Stop the draft at a token whose estimated probability is lower."""
    max_cached_requests: int = Field(default=10000, ge=0, le=MAX_CACHED_REQUESTS)
    """Responses kept in the global tree (FIFO eviction; at most 2^31 - 1, arctic-inference's
    32-bit limit)."""


def new_suffix_cache(max_tree_depth: int, max_cached_requests: int) -> Any:
    """Build an arctic-inference ``SuffixDecodingCache`` (clear error when missing)."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise MissingDependencyError(
            "arctic-inference", "SuffixDecoding", "pip install 'arctic-inference==0.3.0'"
        ) from exc
    return SuffixDecodingCache(
        max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests
    )


class SuffixProposer:
    """SuffixDecoding: per-request tree (prompt + own output) + global tree over the
    responses of earlier and in-flight requests."""

    name = "suffix"

    def __init__(self, **options: Any) -> None:
        self.config = SuffixConfig(**options)
        self._cache = new_suffix_cache(self.config.max_tree_depth, self.config.max_cached_requests)
        self._ctx: dict[str, TokenBuffer] = {}

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        """Start the request's prompt tree (evicting a cached response of the same id)."""
        if req_id in self._cache.active_requests:
            self._cache.stop_request(req_id)
        if req_id in self._cache.cached_requests:
            self._cache.evict_cached_response(req_id)
        # A private, writable, contiguous copy: the C++ tree rejects read-only views.
        prompt = np.array(prompt_ids, dtype=np.int32)
        self._cache.start_request(req_id, prompt)
        self._ctx[req_id] = TokenBuffer(prompt)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        """Add accepted tokens to the request's response."""
        self._cache.add_active_response(req_id, np.array(token_ids, dtype=np.int32))
        self._ctx[req_id].extend(token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        """Speculate from the last ``max_tree_depth`` tokens of each request."""
        cfg = self.config
        out: list[Draft] = []
        for rid in req_ids:
            pattern = self._ctx[rid].tail(cfg.max_tree_depth)
            draft = self._cache.speculate(
                rid,
                pattern,
                max_spec_tokens=k,
                max_spec_factor=cfg.max_spec_factor,
                min_token_prob=cfg.min_token_prob,
            )
            ids = tuple(draft.token_ids[:k])
            out.append(Draft(ids, tuple(draft.probs[: len(ids)])) if ids else EMPTY_DRAFT)
        return out

    def stop(self, req_id: str) -> None:
        """Stop the request: its response stays in the global tree."""
        if req_id in self._cache.active_requests:
            self._cache.stop_request(req_id)
        self._ctx.pop(req_id, None)
