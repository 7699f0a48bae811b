"""The per-step arrays of ``AgentSpecProposer.propose``, named.

A step for ``n`` requests has ``N_HIST * n`` index lookup rows (``iso``, ``agent``,
``scope``: ``n`` each, in that order) and ``n`` ``local`` rows after them; every candidate
row is ``source * n + r``. The arrays are leading rows of buffers reused across steps
(contents left over from earlier steps, written before they are read), and the views are
kept per ``(n, k)`` so a step builds none.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from agentspec_mw.agentspec.kernels import N_HIST
from agentspec_mw.agentspec.ngram_index import MAX_N

__all__ = ["Candidates", "StepWorkspace", "Workspaces"]

_MAX_VIEWS = 1024  # views (with the buffers) kept before the cache is rebuilt


class Candidates(NamedTuple):
    """Candidate drafts, one per row: ``tok[r, :lens[r]]`` with their count ratios
    ``prob`` (``c / n``), match length and support ``n``."""

    tok: np.ndarray
    prob: np.ndarray
    lens: np.ndarray
    match: np.ndarray
    support: np.ndarray

    def head(self, n: int) -> Candidates:
        return Candidates(*(a[:n] for a in self))

    def tail(self, n: int) -> Candidates:
        return Candidates(*(a[n:] for a in self))


class StepWorkspace(NamedTuple):
    """One step's arrays (see the module docstring)."""

    ctx: np.ndarray  # lookup rows: the last MAX_N context tokens
    ctx_len: np.ndarray  # lookup rows: how many of them
    keys: np.ndarray  # lookup rows: index key (negative: skip the row)
    ks: np.ndarray  # lookup rows: how deep the row's candidates are walked
    cand: Candidates  # every candidate row (index rows, then local rows)
    hist: Candidates  # the index rows of cand
    loc: Candidates  # the local rows of cand
    rec: np.ndarray  # per request: its record bucket
    blk: np.ndarray  # per request: the block kind it is in
    pick: np.ndarray  # per request: its chosen candidate row
    sel_len: np.ndarray  # per request: that candidate's length
    sel_cell: np.ndarray  # per request: that candidate's fine calibration cells
    n_ok: np.ndarray  # per request: its leading positions at or above the admission bound
    flat: np.ndarray  # those positions' survivals, request after request
    score_cells: np.ndarray  # scratch of `kernels.score`: one request's fine cells per source
    score_surv: np.ndarray  # scratch of `kernels.score`: its survivals per source


def _buffers(cap: int, kk: int) -> StepWorkspace:
    nh, nr = N_HIST * cap, (N_HIST + 1) * cap
    cand = Candidates(
        np.zeros((nr, kk), np.int32),
        np.zeros((nr, kk), np.float64),
        np.zeros(nr, np.int64),
        np.zeros(nr, np.int64),
        np.zeros(nr, np.int64),
    )
    return StepWorkspace(
        ctx=np.zeros((nh, MAX_N), np.int32),
        ctx_len=np.zeros(nh, np.int64),
        keys=np.zeros(nh, np.int64),
        ks=np.zeros(nh, np.int64),
        cand=cand,
        hist=cand,
        loc=cand,
        rec=np.zeros(cap, np.int64),
        blk=np.zeros(cap, np.int64),
        pick=np.zeros(cap, np.int64),
        sel_len=np.zeros(cap, np.int64),
        sel_cell=np.zeros((cap, kk), np.int64),
        n_ok=np.zeros(cap, np.int64),
        flat=np.zeros(cap * kk, np.float64),
        score_cells=np.zeros((N_HIST + 1, kk), np.int64),
        score_surv=np.zeros((N_HIST + 1, kk), np.float64),
    )


class Workspaces:
    """Step workspaces by ``(requests, candidate width)``, sharing one set of buffers
    (reallocated with twice the rows when a step needs more, with as many for another
    width: a caller alternating ``k`` once doubled them every step)."""

    def __init__(self) -> None:
        self._views: dict[tuple[int, int], StepWorkspace] = {}
        self._base: StepWorkspace | None = None
        self._kk = -1
        self._cap = 0

    def get(self, n_req: int, kk: int) -> StepWorkspace:
        """The workspace of a step for ``n_req`` requests and candidates of ``kk``
        tokens."""
        ws = self._views.get((n_req, kk))
        if ws is not None:
            return ws
        base = self._base
        if base is None or kk != self._kk or n_req > self._cap:
            if n_req > self._cap:  # more rows: twice as many; another width: as many
                self._cap = max(n_req, 2 * self._cap, 64)
            base = self._base = _buffers(self._cap, kk)
            self._kk = kk
            self._views = {}
        elif len(self._views) >= _MAX_VIEWS:  # the views' cache is full, not the buffers
            self._views = {}
        nh = N_HIST * n_req
        cand = base.cand.head(nh + n_req)
        ws = StepWorkspace(
            ctx=base.ctx[:nh],
            ctx_len=base.ctx_len[:nh],
            keys=base.keys[:nh],
            ks=base.ks[:nh],
            cand=cand,
            hist=cand.head(nh),
            loc=cand.tail(nh),
            rec=base.rec[:n_req],
            blk=base.blk[:n_req],
            pick=base.pick[:n_req],
            sel_len=base.sel_len[:n_req],
            sel_cell=base.sel_cell[:n_req],
            n_ok=base.n_ok[:n_req],
            flat=base.flat[: n_req * kk],
            score_cells=base.score_cells,
            score_surv=base.score_surv,
        )
        self._views[(n_req, kk)] = ws
        return ws
