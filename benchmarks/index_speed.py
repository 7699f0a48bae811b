"""Per-call cost of the history index: arctic-inference's SuffixTree vs our NgramIndex.

Why the AgentSpec proposer does not keep one SuffixTree per key: from Python, each tree
call costs microseconds, and a 256-request step needs hundreds of them. This builds a
history of 300 similar sequences (like an agent's repeated outputs), then times a
2-token insert and a 16-token lookup per call for the tree, and the same work as one
batched call for 256 requests on the NgramIndex.

    python benchmarks/index_speed.py
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from agentspec_mw.agentspec.ngram_index import MAX_N, NgramIndex
from agentspec_mw.errors import MissingDependencyError


def new_tree(depth: int) -> Any:
    """A fresh arctic-inference native suffix tree (the structure SuffixDecoding uses,
    ``suffix_decoding._C.SuffixTree``; this project pins arctic-inference 0.3.0)."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as exc:
        raise MissingDependencyError(
            "arctic-inference",
            "arctic-inference's suffix tree",
            "pip install arctic-inference==0.3.0",
        ) from exc
    return SuffixTree(depth)


def main() -> None:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2000, 300).astype(np.int32)
    seqs = []
    for _ in range(300):
        s = base.copy()
        s[rng.integers(0, 300, 30)] = rng.integers(0, 2000, 30)
        seqs.append(s)
    tree = new_tree(24)
    t0 = time.perf_counter()
    n = 0
    for i, s in enumerate(seqs):
        for j in range(0, 300, 2):
            tree.extend_ndarray(i, s[j : j + 2])
            n += 1
    insert_tree = (time.perf_counter() - t0) / n * 1e6
    ctx = base[100:124].copy()
    t0 = time.perf_counter()
    for _ in range(5000):
        tree.speculate_ndarray(ctx, 16, 1.0, 0.0, 0.1, False)
    lookup_tree = (time.perf_counter() - t0) / 5000 * 1e6

    ix = NgramIndex(capacity=1 << 20)
    keys = np.zeros(300 * 300, dtype=np.int64)
    seq_ids = np.repeat(np.array([ix.new_seq() for _ in range(300)]), 300)
    ix.insert(keys[:10], seq_ids[:10], np.concatenate(seqs)[:10])  # compile
    t0 = time.perf_counter()
    toks = np.concatenate(seqs)
    for j in range(10, len(toks), 512):  # 256 requests x 2 tokens per step
        ix.insert(keys[j : j + 512], seq_ids[j : j + 512], toks[j : j + 512])
    steps = (len(toks) - 10) / 512
    insert_ix = (time.perf_counter() - t0) / steps * 1e6
    b = 256
    c = np.zeros((b, MAX_N), dtype=np.int32)
    for r in range(b):
        st = int(rng.integers(0, 280))
        c[r] = base[st : st + MAX_N]
    k_arr, lens = np.zeros(b, dtype=np.int64), np.full(b, MAX_N)
    ix.lookup(k_arr, c, lens, 16)
    t0 = time.perf_counter()
    for _ in range(50):
        ix.lookup(k_arr, c, lens, 16)
    lookup_ix = (time.perf_counter() - t0) / 50 * 1e6
    print("per call, from Python (µs):")
    print(f"  SuffixTree  insert 2 tokens {insert_tree:8.2f}   lookup 16 tokens {lookup_tree:8.2f}")
    print(f"  => 256 requests/step: ~{256 * (insert_tree + lookup_tree) / 1e3:.2f} ms")
    print(
        f"  NgramIndex  insert 512 tokens {insert_ix:6.1f}   lookup 256 requests {lookup_ix:8.1f}"
    )
    print(f"  => 256 requests/step: ~{(insert_ix + lookup_ix) / 1e3:.2f} ms")


if __name__ == "__main__":
    main()
