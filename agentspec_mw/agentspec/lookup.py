"""Own-context lookup: the longest recent match of a request's suffix in its own tokens.

The ``local`` source of the AgentSpec proposer. Building a suffix tree over every prompt
(what SuffixDecoding does on ``start``) costs milliseconds for long agent prompts — more
than an engine step at large batch — so the own context is searched directly instead,
as vLLM's n-gram proposer does, with a numba kernel over the int32 context. It returns the
match length too, which calibrates the draft.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["match_own_context", "match_tail"]


@njit(cache=True, nogil=True)
def match_tail(ctx: np.ndarray, min_n: int, max_n: int) -> tuple[int, int]:  # pragma: no cover
    """``(pos, length)``: where the most recent longest match of the suffix continues."""
    n = ctx.shape[0]
    best_len = 0
    best_pos = -1
    if n < min_n + 1:
        return -1, 0
    last = ctx[n - 1]
    p = n - 1
    while p >= 1:
        if ctx[p - 1] == last:
            length = 1
            while length < max_n and length < p and ctx[p - 1 - length] == ctx[n - 1 - length]:
                length += 1
            if length > best_len:
                best_len = length
                best_pos = p
                if length == max_n:
                    break
        p -= 1
    if best_len < min_n:
        return -1, 0
    return best_pos, best_len


def match_own_context(
    ctx: np.ndarray, min_n: int, max_n: int, k: int
) -> tuple[np.ndarray, int, int]:
    """Tokens following the most recent longest match (``min_n..max_n``) of the suffix.

    Returns ``(draft, match_len, pos)`` with ``draft = ctx[pos : pos + k]``; an empty draft
    (``pos = -1``) when no match of ``min_n`` tokens exists. Among equally long matches the
    most recent wins.
    """
    pos, length = match_tail(ctx, min_n, max_n)
    if pos < 0:
        return ctx[:0], 0, -1
    return ctx[pos : pos + k], int(length), int(pos)
