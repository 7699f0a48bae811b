"""A KV cache of fixed-size blocks with prefix caching, as vLLM V1's block pool keeps it.

Memory is ``capacity_blocks`` blocks of ``block_size`` tokens. A request holds blocks for
the tokens it has computed (and is about to compute). A *full* block whose tokens are
known is registered under the hash of its whole prefix (a chain: the parent block's hash
and its own tokens), so another request whose tokens start the same way reuses it instead
of recomputing it — the same run's next call (its prompt repeats the previous prompt and
output) or another run with an identical system prompt. When a request finishes or is
preempted its registered blocks stay cached but become *evictable*; they are evicted
least-recently-freed first when a request needs room. Blocks a request computes whose
hash is already cached (two requests computing the same prefix at once) stay private to
it, as in vLLM (the duplicate is freed with the request, not shared); here so do that
request's later blocks (vLLM would still cache them).

A request's blocks are freed tail first, as vLLM's ``KVCacheManager.free`` does, so under
memory pressure a cached prompt loses its end before its start and a later request can
still reuse the start. Simplified from vLLM: no per-layer groups, no sliding windows, no
KV connectors.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

__all__ = ["BlockHashes", "PrefixKVCache", "block_hashes"]

BlockHashes = tuple[int, ...]


def block_hashes(tokens: np.ndarray, block_size: int) -> BlockHashes:
    """Chained hashes of the full blocks of ``tokens`` (the last partial block has none)."""
    out: list[int] = []
    h = 0
    n = len(tokens) // block_size
    data = np.ascontiguousarray(tokens[: n * block_size], dtype=np.int64)
    for i in range(n):
        h = hash((h, data[i * block_size : (i + 1) * block_size].tobytes()))
        out.append(h)
    return tuple(out)


class _Holder:
    __slots__ = ("anon", "shared")

    def __init__(self) -> None:
        self.shared: list[int] = []  # hashes of the leading blocks it references
        self.anon = 0  # blocks it holds that are not in the cache


class PrefixKVCache:
    """Block accounting for the requests of one replay (see the module doc).

    ``capacity_blocks=None`` means unlimited memory (blocks are still cached, never
    evicted).
    """

    def __init__(self, block_size: int, capacity_blocks: int | None) -> None:
        if block_size < 1 or (capacity_blocks is not None and capacity_blocks < 1):
            raise ValueError(
                f"block_size={block_size} and capacity_blocks={capacity_blocks} must be >= 1"
            )
        self.block_size = block_size
        self.capacity = capacity_blocks
        self._ref: dict[int, int] = {}  # cached hash -> requests referencing it
        self._free: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced (LRU first)
        self._anon = 0
        self._holders: dict[str, _Holder] = {}

    @property
    def used_blocks(self) -> int:
        """Blocks referenced by requests (cached or private)."""
        return len(self._ref) - len(self._free) + self._anon

    @property
    def free_blocks(self) -> int | None:
        """Blocks a request could still get (evictable cached blocks count as free)."""
        return None if self.capacity is None else self.capacity - self.used_blocks

    def held_blocks(self, req_id: str) -> int:
        """Blocks ``req_id`` holds now."""
        h = self._holders.get(req_id)
        return 0 if h is None else len(h.shared) + h.anon

    def peek_hit(self, hashes: BlockHashes, num_tokens: int) -> int:
        """Tokens of a request's first ``num_tokens`` that the cache holds (whole blocks;
        at most ``num_tokens - 1``: the last token is always computed, to sample from)."""
        limit = max(num_tokens - 1, 0) // self.block_size
        n = 0
        while n < limit and n < len(hashes) and hashes[n] in self._ref:
            n += 1
        return n * self.block_size

    def admit(
        self,
        req_id: str,
        hashes: BlockHashes,
        hit_tokens: int,
        num_tokens: int,
        must_fit_tokens: int = 0,
    ) -> bool:
        """Admit a request that holds nothing yet: reference its ``hit_tokens`` cached
        leading tokens (from :meth:`peek_hit`) and allocate blocks up to ``num_tokens``;
        ``False`` (nothing changed) when memory is short — also when blocks for
        ``must_fit_tokens`` would not fit (vLLM's admission gate,
        ``scheduler_reserve_full_isl``: a prefill chunk is admitted only when the whole
        request fits, though only the chunk's blocks are allocated)."""
        assert req_id not in self._holders, f"{req_id} already holds blocks"
        hit = list(hashes[: hit_tokens // self.block_size])
        if self.capacity is not None:
            revived = sum(1 for bh in hit if self._ref[bh] == 0)
            need = -(-max(num_tokens, must_fit_tokens) // self.block_size) - len(hit)
            if need > self.capacity - self.used_blocks - revived:
                return False
        h = self._holders[req_id] = _Holder()
        for bh in hit:
            self._take(bh)
            h.shared.append(bh)
        ok = self.allocate(req_id, num_tokens)
        assert ok
        return True

    def allocate(self, req_id: str, num_tokens: int) -> bool:
        """Make ``req_id`` hold enough blocks for ``num_tokens`` tokens, evicting cached
        free blocks if needed; ``False`` (nothing changed) when memory is short."""
        h = self._holders.setdefault(req_id, _Holder())
        need = -(-num_tokens // self.block_size) - len(h.shared) - h.anon
        if need <= 0:
            return True
        if self.capacity is not None:
            short = need - (self.capacity - self.used_blocks - len(self._free))
            if short > len(self._free):
                return False
            for _ in range(max(short, 0)):
                bh, _ = self._free.popitem(last=False)
                del self._ref[bh]
        h.anon += need
        self._anon += need
        return True

    def register(self, req_id: str, hashes: BlockHashes, num_computed: int) -> None:
        """Cache the request's full blocks among its first ``num_computed`` tokens."""
        h = self._holders[req_id]
        full = min(num_computed // self.block_size, len(hashes))
        i = len(h.shared)
        while i < full and h.anon > 0:
            bh = hashes[i]
            if bh in self._ref:  # computed twice at once: this copy stays private
                break
            self._ref[bh] = 1
            h.shared.append(bh)
            h.anon -= 1
            self._anon -= 1
            i += 1

    def release(self, req_id: str) -> None:
        """The request finished or was preempted: its cached blocks become evictable,
        tail first (evicted before its head), its private blocks are freed."""
        h = self._holders.pop(req_id, None)
        if h is None:
            return
        for bh in reversed(h.shared):
            self._ref[bh] -= 1
            if self._ref[bh] == 0:
                self._free[bh] = None
        self._anon -= h.anon

    def _take(self, bh: int) -> None:
        if self._ref[bh] == 0:
            del self._free[bh]
        self._ref[bh] += 1
