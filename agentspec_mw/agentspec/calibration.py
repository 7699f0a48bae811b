"""Calibrated acceptance: the bucket layout, the fixed prior, and each scope's state.

Each draft token carries ``c / n`` — of the ``n`` continuations found, ``c`` agree. What
it is worth is *learned*: every verified draft updates its isolation scope's acceptance
table (:mod:`.scopes`; each scope learns only from its own drafts, from a fixed prior),
bucketed by (source, agreement between sources, match length, support ``n``, draft
position, ``c / n``) — a *cell*. Each cell's prior is, by default, the acceptance
learned for it on recorded agent traces (:func:`stored_prior`); else the paper's redundancy
score ``g(c, n) = (c/n)·p(n)`` (:func:`redundancy_score`) over the support ``n``, times
``calib_prior_scale`` (:func:`prior_table`). Each
cell is split into *fine* cells by the drafted token's text class, whether the draft
crossed a line break before it, and the request's record (:mod:`.token_classes`,
``kernels._fine``); a fine cell's acceptance is its counts shrunk toward its cell's
(``kernels._acceptance``). The counting is done by ``kernels.apply_extends``, the reading
by ``kernels.score`` and ``kernels.emit_drafts``.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Sequence
from importlib import resources
from typing import Any, NamedTuple

import numpy as np

from agentspec_mw.agentspec import kernels as K
from agentspec_mw.agentspec.ngram_index import LEVELS
from agentspec_mw.agentspec.scopes import ScopeStates
from agentspec_mw.agentspec.token_classes import token_classes
from agentspec_mw.errors import AgentSpecError

__all__ = [
    "MATCH_EDGES",
    "N_ML",
    "N_Q",
    "N_SUP",
    "SOURCES",
    "SUPPORT_EDGES",
    "Calibration",
    "FineCells",
    "load_prior",
    "prior_table",
    "redundancy_score",
    "stored_prior",
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
    ``(source, agree, match, support, position, c/n)``: ``scale · g(c, n) / n`` — the
    paper's score over the support, falling as ``n`` grows — at the bucket's middle ``c/n``
    and representative support, raised when sources agree. The paper's ``g`` itself (rising
    with ``n``, as the verified acceptance does) was refitted into the stored prior on
    2026-12-06: even on ../shared, 0.4–1.0 % slower on the held-out engine recordings at
    batch ≥ 32 (docs/agentspec.md), so this shape stays."""
    shape = cell_shape()
    q_mid = (np.arange(N_Q) + 0.5) / N_Q
    p_n = np.array([redundancy_score(1, n, g_min) for n in _SUPPORT_MID])  # p(n) / n
    base = scale * q_mid[None, None, :] * p_n[:, None, None]
    prior = np.broadcast_to(base, shape).copy()
    prior[:, 1] = np.minimum(1.0, prior[:, 1] * _AGREE_BOOST)
    return prior.reshape(-1)


PRIOR_FILE = "calibration_prior.npz"
"""The stored prior in ``agentspec_mw/data`` (:func:`stored_prior`)."""


def cell_shape() -> tuple[int, ...]:
    """The calibration table's axes, in the kernels' order: source, agreement, match
    length, support, position, ``c/n``."""
    return (len(SOURCES), 2, N_ML, N_SUP, K.N_POS, N_Q)


def load_prior(path: str | os.PathLike[str]) -> tuple[np.ndarray, dict[str, Any]]:
    """A calibration prior file (``benchmarks/fit_calibration_prior.py``): one acceptance
    per cell (read-only) and its metadata (the traces, command and date it was fitted with).

    Raises:
        AgentSpecError: the file cannot be read, was fitted for another cell layout, or
            holds values outside ``[0, 1]``.
    """
    try:
        with np.load(path) as npz:
            prior = np.array(npz["prior"], dtype=np.float64)
            shape = tuple(int(x) for x in npz["shape"])
            meta = json.loads(str(npz["meta"]))
    except (OSError, KeyError, ValueError) as exc:
        raise AgentSpecError(
            f"the calibration prior {os.fspath(path)} cannot be read ({exc}); reinstall the "
            "package, or set AgentSpecConfig(experimental={'calib_prior': 'redundancy'})"
        ) from exc
    if shape != cell_shape() or prior.shape != (math.prod(shape),):
        raise AgentSpecError(
            f"the calibration prior {os.fspath(path)} has cells {shape}, this proposer's "
            f"layout is {cell_shape()}: refit it with benchmarks/fit_calibration_prior.py"
        )
    if not np.all((prior >= 0.0) & (prior <= 1.0)):
        raise AgentSpecError(f"the calibration prior {os.fspath(path)} has values outside [0, 1]")
    prior.flags.writeable = False
    return prior, meta


@functools.cache
def stored_prior() -> tuple[np.ndarray, dict[str, Any]]:
    """The package's stored prior (``agentspec_mw/data``, :func:`load_prior`), read once
    per process."""
    ref = resources.files("agentspec_mw").joinpath("data", PRIOR_FILE)
    with resources.as_file(ref) as path:
        return load_prior(path)


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
    the shrinkage weight is 0. ``stored=True``: the cells start from :func:`stored_prior`,
    else from :func:`prior_table` (``g_min``, ``prior_scale``).
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
        stored: bool = False,
    ) -> None:
        # a writable copy: the kernels are compiled for writable arrays
        self.prior = stored_prior()[0].copy() if stored else prior_table(g_min, prior_scale)
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
