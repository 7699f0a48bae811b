"""Per-request state of the AgentSpec proposer as rows of arrays, and the context arena.

Each live request owns a *slot*: a row of the int64 table :attr:`SlotTable.si` (columns
``C_*`` of :mod:`.kernels`), its block automaton (``stack``, ``tail``, ``bst``), its last
candidate draft (``dtok``, ``dcell``) and a segment of one shared int32 context *arena*
(``ctx[start : start + len]``, capacity ``cap``). The kernels read and write these rows for
the whole batch at once. A segment that would overflow is moved to the end of the arena
with doubled capacity; when the arena is full it is compacted (live segments only) or
grown. Slots are reused after release.
"""

from __future__ import annotations

import numpy as np

from agentspec_mw.agentspec.blocks import HASH_RING, MAX_DEPTH
from agentspec_mw.agentspec.jit import kernel
from agentspec_mw.agentspec.kernels import C_CCAP, C_CLEN, C_CSTART, N_COLS

__all__ = ["SlotTable"]

_HEADROOM = 256  # output tokens a new segment holds before it moves


class SlotTable:
    """Rows of per-request state (see the module docstring)."""

    def __init__(self, rows: int = 64, draft_width: int = 16, arena: int = 1 << 16) -> None:
        self.si = np.zeros((rows, N_COLS), dtype=np.int64)
        self.stack = np.zeros((rows, MAX_DEPTH), dtype=np.int64)
        self.tail = np.zeros((rows, HASH_RING), dtype=np.uint64)
        self.bst = np.zeros((rows, 2), dtype=np.int64)
        self.dtok = np.zeros((rows, draft_width), dtype=np.int32)
        self.dcell = np.zeros((rows, draft_width), dtype=np.int64)
        self.ctx = np.zeros(arena, dtype=np.int32)
        self.live = np.zeros(rows, dtype=np.bool_)
        self._top = 0
        self._free = list(range(rows - 1, -1, -1))

    def __len__(self) -> int:
        return int(self.live.sum())

    # -- rows ----------------------------------------------------------------------------
    def acquire(self, prompt: np.ndarray) -> int:
        """A fresh row holding ``prompt`` as its context."""
        if not self._free:
            self._grow_rows()
        s = self._free.pop()
        self.si[s] = 0
        self.live[s] = True
        cap = len(prompt) + _HEADROOM
        start = self._alloc(cap)
        self.ctx[start : start + len(prompt)] = prompt
        self.si[s, C_CSTART] = start
        self.si[s, C_CLEN] = len(prompt)
        self.si[s, C_CCAP] = cap
        return s

    def release(self, slots: list[int]) -> None:
        """Return rows (their arena segments are reclaimed at the next compaction)."""
        for s in slots:
            self.live[s] = False
            self._free.append(s)

    def _grow_rows(self) -> None:
        n = len(self.si)

        def grow(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a, np.zeros_like(a)])

        self.si, self.stack, self.tail, self.bst = (
            grow(a) for a in (self.si, self.stack, self.tail, self.bst)
        )
        self.dtok, self.dcell, self.live = grow(self.dtok), grow(self.dcell), grow(self.live)
        self._free.extend(range(2 * n - 1, n - 1, -1))

    def widen_drafts(self, width: int) -> None:
        """Make room for candidate drafts of ``width`` tokens."""
        if width > self.dtok.shape[1]:
            pad = width - self.dtok.shape[1]
            self.dtok = np.pad(self.dtok, ((0, 0), (0, pad)))
            self.dcell = np.pad(self.dcell, ((0, 0), (0, pad)))

    # -- the context arena ---------------------------------------------------------------
    def reserve(self, slots: np.ndarray, extra: np.ndarray) -> None:
        """Ensure each ``slots[i]`` can take ``extra[i]`` more tokens (slots unique)."""
        si = self.si
        need = si[slots, C_CLEN] + extra
        for i in np.flatnonzero(need > si[slots, C_CCAP]).tolist():
            s = int(slots[i])
            cap = max(2 * int(si[s, C_CCAP]), int(need[i]))
            start = self._alloc(cap)  # may compact: read the old start afterwards
            old, n = int(si[s, C_CSTART]), int(si[s, C_CLEN])
            self.ctx[start : start + n] = self.ctx[old : old + n]
            si[s, C_CSTART] = start
            si[s, C_CCAP] = cap

    def _alloc(self, n: int) -> int:
        if self._top + n > len(self.ctx):
            self._compact(n)
        start = self._top
        self._top += n
        return start

    def compact(self) -> None:
        """Reclaim the arena space of released rows now (it otherwise happens when the
        arena fills)."""
        self._compact(0)

    def _compact(self, n: int) -> None:
        si = self.si
        live = np.flatnonzero(self.live)
        used = int(si[live, C_CCAP].sum())
        size = len(self.ctx)
        if 2 * (used + n) > size:
            size = max(2 * size, 2 * (used + n))
        new = np.zeros(size, dtype=np.int32)
        self._top = _move_segments(live, si, self.ctx, new)
        self.ctx = new


@kernel(nogil=True)
def _move_segments(
    live: np.ndarray, si: np.ndarray, old: np.ndarray, new: np.ndarray
) -> int:  # pragma: no cover
    """Copy the live rows' context segments to the front of ``new``, in row order, each
    keeping its capacity; repoint their starts. Returns the end of the last segment."""
    top = 0
    for i in range(live.shape[0]):
        s = live[i]
        a = si[s, C_CSTART]
        ln = si[s, C_CLEN]
        new[top : top + ln] = old[a : a + ln]
        si[s, C_CSTART] = top
        top += si[s, C_CCAP]
    return top
