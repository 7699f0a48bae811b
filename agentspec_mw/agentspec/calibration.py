"""Calibrated acceptance: the bucket layout, the fixed prior, and each scope's state.

Each draft token carries ``c / n`` — of the ``n`` continuations found, ``c`` agree. What
it is worth is *learned*: every verified draft updates its isolation scope's acceptance
table (:mod:`.scopes`; each scope learns only from its own drafts, from a fixed prior),
bucketed by (source, agreement between sources, match length, support ``n``, draft
position, ``c / n``) — a *cell*. Each cell's prior is the paper's redundancy score
``g(c, n) = (c/n)·p(n)`` (:func:`redundancy_score`) times ``calib_prior_scale``. Each
cell is split into *fine* cells by the drafted token's text class, whether the draft
crossed a line break before it, and the request's record (:mod:`.token_classes`,
``kernels._fine``); a fine cell's acceptance is its counts shrunk toward its cell's
(``kernels._acceptance``). The counting is done by ``kernels.apply_extends``, the reading
by ``kernels.score`` and ``kernels.emit_drafts``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from agentspec_mw.agentspec import kernels as K
from agentspec_mw.agentspec.ngram_index import LEVELS
from agentspec_mw.agentspec.scopes import ScopeStates
from agentspec_mw.agentspec.token_classes import token_classes

__all__ = [
    "MATCH_EDGES",
    "N_ML",
    "N_Q",
    "N_SUP",
    "SOURCES",
    "SUPPORT_EDGES",
    "Calibration",
    "FineCells",
    "redundancy_score",
]

SOURCES = ("iso", "agent", "scope", "local")
"""Candidate sources, in candidate-row order (the first three are index lookups)."""
N_Q = 10  # buckets of c/n
MATCH_EDGES = np.unique(np.array([1, *LEVELS], dtype=np.int64))
"""Match-length buckets: the index levels (``local`` also drafts after a 1-token match);
a cell is per source, so ``local``'s and the index's 1-token matches learn apart."""
N_ML = len(MATCH_EDGES)
SUPPORT_EDGES = np.array([2, 4, 8], dtype=np.int64)  # support buckets: 1, 2-3, 4-7, 8+
N_SUP = len(SUPPORT_EDGES) + 1
_AGREE_BOOST = 1.1  # prior of a cell whose sources agree: 10% more trust (capped at 1)
_SUPPORT_MID = (1, 2, 5, 10)  # a representative support n of each support bucket


def redundancy_score(c: int, n: int, g_min: float) -> float:
    """The paper's ``g(c, n) = (c/n)·p(n)`` with ``p(n) = g_min + (1-g_min)(1-e^(1-n))``.

    The paper's two formulas for ``p`` disagree (``e^(-n)`` vs ``e^(1-n)``); ``e^(1-n)`` is
    used so that a single candidate gets exactly ``g_min``.
    """
    if n <= 0 or c <= 0:
        return 0.0
    return (c / n) * (g_min + (1.0 - g_min) * (1.0 - math.exp(1 - n)))


def prior_table(g_min: float, scale: float) -> np.ndarray:
    """The fixed prior acceptance of every cell, flattened in the kernels' order
    ``(source, agree, match, support, position, c/n)``: ``scale · g`` at the bucket's
    middle ``c/n`` and representative support, raised when sources agree."""
    shape = (len(SOURCES), 2, N_ML, N_SUP, K.N_POS, N_Q)
    q_mid = (np.arange(N_Q) + 0.5) / N_Q
    p_n = np.array([redundancy_score(1, n, g_min) for n in _SUPPORT_MID])
    base = scale * q_mid[None, None, :] * p_n[:, None, None]
    prior = np.broadcast_to(base, shape).copy()
    prior[:, 1] = np.minimum(1.0, prior[:, 1] * _AGREE_BOOST)
    return prior.reshape(-1)


class FineCells(NamedTuple):
    """What the kernels read of the fine cells: counts of every scope row, the token
    codes (:func:`~agentspec_mw.agentspec.token_classes.token_classes`) and the
    shrinkage weight toward the cell (``0``: the cell's acceptance only)."""

    fsucc: np.ndarray
    ftot: np.ndarray
    codes: np.ndarray
    strength: float


class Calibration:
    """The per-scope learned state and how the kernels read it.

    ``token_classes=False`` (an ablation) reads cells only: every token gets code 0 and
    the shrinkage weight is 0.
    """

    def __init__(
        self,
        token_bytes: Sequence[bytes],
        *,
        g_min: float,
        prior_scale: float,
        prior_strength: float,
        max_scopes: int,
        token_classes_on: bool = True,
    ) -> None:
        self.prior = prior_table(g_min, prior_scale)
        self.prior_strength = float(prior_strength)
        self.scopes = ScopeStates(self.prior, len(self.prior) * K.NF, max_scopes)
        self.default_row = self.scopes.acquire("default")  # tag-free traffic: kept for good
        codes = token_classes(token_bytes)
        self.codes = codes if token_classes_on else np.zeros_like(codes)
        self.strength = self.prior_strength if token_classes_on else 0.0

    @property
    def fine(self) -> FineCells:
        """The fine cells as the kernels take them (rebuilt: scope rows may grow)."""
        sc = self.scopes
        return FineCells(sc.fsucc, sc.ftot, self.codes, self.strength)

    @property
    def verified(self) -> tuple[float, float]:
        """Accepted and drafted tokens of the verified drafts, every scope together."""
        acc, dr = self.scopes.ledger.sum(axis=0).tolist()
        return acc, dr
