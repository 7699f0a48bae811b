"""Per-scope learned state of the AgentSpec proposer: calibration and verified counts.

Everything the proposer *learns* from verified drafts — the calibration counts and
tables (:mod:`.kernels`, ``apply_extends``) and the counts of verified drafted and
accepted tokens (reported, not acted on) — is kept per isolation scope, as one row of
each array here. A request reads and updates only its scope's row (slot column
``C_CAL``), so one tenant's traffic, however badly it is rejected, never moves another
tenant's drafting. Every row starts from the same *fixed* prior (the stored prior by
default, ``calib_prior="redundancy"``: the paper's redundancy score), never from other
scopes' counts.

Memory is bounded: at most ``max_scopes`` scopes have a row (about 3.4 MB each with the
default calibration split; rows are allocated as scopes arrive, doubling). When a new
scope arrives and every row is taken, the least recently started scope with no live
request loses its row (its learned state is forgotten; it starts again from the prior if
it comes back). If every row's scope has live requests, the newcomer gets row
:data:`FROZEN`: the fixed prior, which learns nothing (its requests draft with the
prior's calibration until a row frees up for their scope's
next request); a request of a decoding regime whose row cannot be had takes its scope's
greedy row if that has one. The ``default`` scope (tag-free traffic) holds its row of each
regime for good from the first request that gets one (:meth:`ScopeStates.keep`): tenants'
traffic cannot evict it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import NamedTuple

import numpy as np

__all__ = ["FROZEN", "CalibArrays", "ScopeStates"]

FROZEN = 0
"""Row of the fixed prior: read by overflow scopes, never updated."""


class CalibArrays(NamedTuple):
    """The calibration arrays ``kernels.apply_extends`` updates (row = scope, except
    ``prior``: one row, fixed)."""

    succ: np.ndarray
    tot: np.ndarray
    table: np.ndarray
    prior: np.ndarray
    fsucc: np.ndarray
    ftot: np.ndarray


class ScopeStates:
    """Rows of per-scope learned state (see the module docstring).

    Arrays (row = scope): ``succ``/``tot``/``table`` (calibration cells), ``fsucc``/
    ``ftot`` (fine cells) and ``ledger`` (accepted, drafted: the verified drafts).
    ``prior`` (one row) is shared and fixed.
    """

    succ: np.ndarray
    tot: np.ndarray
    table: np.ndarray
    fsucc: np.ndarray
    ftot: np.ndarray
    ledger: np.ndarray
    live: list[int]

    def __init__(self, prior: np.ndarray, n_fine: int, max_scopes: int) -> None:
        if max_scopes < 1:
            raise ValueError(f"max_scopes={max_scopes} must be >= 1")
        self.prior = prior
        self.n_fine = n_fine
        self.max_scopes = max_scopes
        self._rows: OrderedDict[Hashable, int] = OrderedDict()  # key -> row, least recent first
        self.overflows = 0
        """Requests that got :data:`FROZEN` because every row was in use."""
        self._kept: set[Hashable] = set()  # scopes whose row is held for good (keep)
        self._free: list[int] = []  # allocated rows without a scope (popped lowest first)
        self._alloc(2)

    def _alloc(self, rows: int) -> None:
        """(Re)allocate ``rows`` rows, keeping the existing ones; new rows are free."""
        n_old = self.rows if hasattr(self, "succ") else 0
        n = len(self.prior)
        shapes = {
            "succ": (n,),
            "tot": (n,),
            "table": (n,),
            "fsucc": (self.n_fine,),
            "ftot": (self.n_fine,),
            "ledger": (2,),
        }
        for name, shape in shapes.items():
            out = np.zeros((rows, *shape), dtype=np.float64)
            if n_old:
                out[:n_old] = getattr(self, name)
            setattr(self, name, out)
        self.table[n_old:] = self.prior
        self.live = (self.live if n_old else []) + [0] * (rows - n_old)
        """Live requests per row (a row with live requests is never given away)."""
        self._free.extend(range(rows - 1, max(n_old, FROZEN + 1) - 1, -1))

    @property
    def calib(self) -> CalibArrays:
        """What the kernels take (rebuilt: rows may grow)."""
        return CalibArrays(self.succ, self.tot, self.table, self.prior, self.fsucc, self.ftot)

    @property
    def rows(self) -> int:
        """Rows allocated (:data:`FROZEN` included)."""
        return len(self.succ)

    def __contains__(self, scope: object) -> bool:
        """Whether ``scope`` holds a row."""
        return scope in self._rows

    def acquire(self, scope: Hashable, fallback: Hashable | None = None) -> int:
        """The row of ``scope`` for one more live request (see the module docstring): a
        scope name, or a scope and a decoding regime (the proposer's calibration key).
        When ``scope`` can get no row, the row of ``fallback`` if it holds one (the same
        tenant's greedy row for another regime: its own traffic, closer than the frozen
        prior), else :data:`FROZEN`."""
        row = self._rows.get(scope)
        if row is None:
            row = self._new_row()
            if row == FROZEN:
                row = FROZEN if fallback is None else self._rows.get(fallback, FROZEN)
                if row == FROZEN:
                    self.overflows += 1
                    return FROZEN
            else:
                self._rows[scope] = row
        else:
            self._rows.move_to_end(scope)
        self.live[row] += 1
        return row

    def keep(self, scope: Hashable) -> None:
        """Hold the row ``scope`` has now for good (one more live request, which never
        stops): the ``default`` scope's row of each decoding regime, from its first
        request, so that tag-free traffic keeps what it learned whatever the tenants' traffic
        does (its greedy row is held from the start). A scope without a row is left alone."""
        row = self._rows.get(scope)
        if row is not None and scope not in self._kept:
            self._kept.add(scope)
            self.live[row] += 1

    def release(self, rows: np.ndarray) -> None:
        """The live requests of ``rows`` (one entry per request) stopped."""
        live = self.live
        for r in rows.tolist():
            if r != FROZEN:
                live[r] -= 1

    def _new_row(self) -> int:
        if not self._free and self.rows - 1 < self.max_scopes:
            self._alloc(min(2 * self.rows, self.max_scopes + 1))
        if self._free:
            return self._free.pop()
        for scope, row in self._rows.items():  # least recently started first
            if self.live[row] == 0:
                del self._rows[scope]
                self._reset(row)
                return row
        return FROZEN

    def _reset(self, row: int) -> None:
        self.succ[row] = 0.0
        self.tot[row] = 0.0
        self.table[row] = self.prior
        self.fsucc[row] = 0.0
        self.ftot[row] = 0.0
        self.ledger[row] = 0.0
