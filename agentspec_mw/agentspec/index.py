"""History indexes: one suffix tree per key, with token and key caps (LRU eviction).

Each index is arctic-inference's native ``SuffixTree`` (the C++ tree behind
``SuffixDecodingCache``; arctic-inference exposes it as ``suffix_decoding._C.SuffixTree``
and this project pins arctic-inference 0.3.0). A tree holds several sequences; a
sequence never matches across its end, so each *block occurrence* is its own sequence and
drafts never bridge two blocks. Lookups return the most frequent continuation of the
longest suffix match with per-token probabilities from continuation counts.

Why this library: it is the structure SuffixDecoding is measured with, its per-token
insert and lookup are C++ (a few µs per call), and it already yields count-based
probabilities. Keys embed the isolation scope, so two scopes never share a tree.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import numpy as np

from agentspec_mw.errors import MissingDependencyError

__all__ = ["HistoryIndex", "IndexStore", "new_tree"]


def new_tree(depth: int) -> Any:
    """A fresh native suffix tree of the given depth."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as exc:
        raise MissingDependencyError(
            "arctic-inference",
            "the AgentSpec proposer's indexes",
            "pip install arctic-inference==0.3.0",
        ) from exc
    return SuffixTree(depth)


class HistoryIndex:
    """One key's tree and its bookkeeping."""

    __slots__ = ("tree", "tokens", "next_seq")

    def __init__(self, depth: int) -> None:
        self.tree = new_tree(depth)
        self.tokens = 0
        self.next_seq = 0

    def new_seq(self) -> int:
        """Allocate a sequence id (one per block occurrence)."""
        seq = self.next_seq
        self.next_seq = (seq + 1) & 0x7FFFFFFF
        return seq

    def extend(self, seq: int, ids: np.ndarray) -> None:
        """Append int32 tokens to sequence ``seq``."""
        self.tree.extend_ndarray(seq, ids)
        self.tokens += len(ids)


class IndexStore:
    """Keyed indexes with caps on total tokens and on keys; least recently used go first."""

    def __init__(self, depth: int, max_tokens: int, max_keys: int) -> None:
        self.depth = depth
        self.max_tokens = max_tokens
        self.max_keys = max_keys
        self._indexes: OrderedDict[Hashable, HistoryIndex] = OrderedDict()
        self.tokens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._indexes)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._indexes

    def peek(self, key: Hashable) -> HistoryIndex | None:
        """The index of ``key`` if it exists (marks it recently used)."""
        idx = self._indexes.get(key)
        if idx is not None:
            self._indexes.move_to_end(key)
        return idx

    def get(self, key: Hashable) -> HistoryIndex:
        """The index of ``key``, created if missing."""
        idx = self._indexes.get(key)
        if idx is None:
            idx = self._indexes[key] = HistoryIndex(self.depth)
            self._evict()
        else:
            self._indexes.move_to_end(key)
        return idx

    def extend(self, key: Hashable, idx: HistoryIndex, seq: int, ids: np.ndarray) -> None:
        """Append to ``idx`` (found under ``key``) and enforce the token cap."""
        idx.extend(seq, ids)
        if key in self._indexes:
            self.tokens += len(ids)
            if self.tokens > self.max_tokens:
                self._evict()

    def _evict(self) -> None:
        while len(self._indexes) > 1 and (
            len(self._indexes) > self.max_keys or self.tokens > self.max_tokens
        ):
            _, old = self._indexes.popitem(last=False)
            self.tokens -= old.tokens
            self.evictions += 1
