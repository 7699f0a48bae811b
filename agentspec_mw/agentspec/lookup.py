"""Own-context lookup: the longest recent match of a request's suffix in its own tokens.

The ``local`` source of the AgentSpec proposer. Building a suffix tree over every prompt
(what SuffixDecoding does on ``start``) costs milliseconds for long agent prompts — more
than an engine step at large batch — so the own context is searched directly instead,
as vLLM's n-gram proposer does, with a numba function over the int32 context (called
from :func:`~agentspec_mw.agentspec.kernels.local_drafts`). It returns the match length
too, which calibrates the draft.
"""

from __future__ import annotations

import numpy as np

from agentspec_mw.agentspec.jit import kernel

__all__ = ["match_tail"]


@kernel(nogil=True)
def match_tail(ctx: np.ndarray, min_n: int, max_n: int) -> tuple[int, int]:  # pragma: no cover
    """Where the most recent longest match (``min_n..max_n``) of the suffix continues.

    Returns ``(pos, length)``: the draft is ``ctx[pos : pos + k]``; ``(-1, 0)`` when no
    match of ``min_n`` tokens exists. Among equally long matches the most recent wins.
    """
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
