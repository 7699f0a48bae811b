"""Pick, at run time, between a serial and a threaded version of the same kernel.

A threaded kernel only pays when the cores it fans out to are free. On a busy host
(other processes, the engine's own threads) a ``prange`` over two threads can take
several times the serial time, because the call waits for its slowest thread. Both
versions give identical results, so the choice is pure speed, and it is made by
measuring: :class:`ModeChooser` keeps a moving average of the time per row of each mode,
uses the threaded one unless it is measured slower than the serial one by more than a
margin (single timings are noisy — p90/p50 ≈ 1.5–1.8 here — and on free cores the
threaded lookup is only ~20 % faster, so without a margin noise flips the choice), and
re-times the other one every :attr:`explore_every` calls so that a change of load is
noticed. The first timing of each mode is discarded (it may include numba's compilation
or cache load).
"""

from __future__ import annotations

import math

__all__ = ["SERIAL", "THREADED", "ModeChooser"]

SERIAL, THREADED = 0, 1


class ModeChooser:
    """Moving-average cost per row of a serial and a threaded mode; the cheaper one wins."""

    __slots__ = ("alpha", "cost", "explore_every", "margin", "_calls", "_seen")

    def __init__(self, explore_every: int = 64, alpha: float = 0.1, margin: float = 1.25) -> None:
        if explore_every < 2:
            raise ValueError(f"explore_every={explore_every} must be >= 2")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must be in (0, 1]")
        if margin < 1.0:
            raise ValueError(f"margin={margin} must be >= 1")
        self.margin = margin
        self.explore_every = explore_every
        self.alpha = alpha
        self.cost = [math.nan, math.nan]  # seconds per row: serial, threaded
        self._seen = [0, 0]
        self._calls = 0

    def pick(self) -> int:
        """The mode to run now: an untimed mode first; else threaded unless it costs more
        than ``margin`` × serial; every ``explore_every``-th call runs the other one."""
        self._calls += 1
        for mode in (THREADED, SERIAL):
            if self._seen[mode] < 2:  # the first timing is discarded
                return mode
        slow = self.cost[THREADED] > self.margin * self.cost[SERIAL]
        best = SERIAL if slow else THREADED
        if self._calls % self.explore_every == 0:
            return 1 - best
        return best

    def observe(self, mode: int, seconds: float, rows: int) -> None:
        """Record that ``mode`` took ``seconds`` for ``rows`` rows."""
        self._seen[mode] += 1
        if self._seen[mode] == 1 or rows <= 0:
            return
        per_row = seconds / rows
        old = self.cost[mode]
        self.cost[mode] = per_row if math.isnan(old) else old + self.alpha * (per_row - old)
