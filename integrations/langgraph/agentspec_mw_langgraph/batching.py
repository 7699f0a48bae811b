"""Combine concurrent generate calls into one engine batch (flat combining).

``vllm.LLM`` is not thread-safe, and an agent graph calls it from several threads at once
(parallel branches). :class:`BatchCombiner` makes every caller enqueue its request; the
caller that gets the engine lock takes *all* queued requests and runs them as one
``generate`` batch, filling in every caller's result; the others find their result done
when they get the lock. Parallel branches therefore share engine steps, which is what
batch speculation is about.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["BatchCombiner"]

Req = TypeVar("Req")
Res = TypeVar("Res")


@dataclass
class _Slot(Generic[Req, Res]):
    request: Req
    result: Res | None = None
    error: BaseException | None = None
    done: bool = False


class BatchCombiner(Generic[Req, Res]):
    """Run ``batch_fn`` over the requests of concurrent :meth:`submit` calls."""

    def __init__(self, batch_fn: Callable[[Sequence[Req]], Sequence[Res]]) -> None:
        self._batch_fn = batch_fn
        self._queue_lock = threading.Lock()
        self._engine_lock = threading.Lock()
        self._queue: list[_Slot[Req, Res]] = []
        self.batches = 0
        """``batch_fn`` calls made so far."""

    def submit(self, request: Req) -> Res:
        """Run ``request`` (possibly batched with others) and return its result."""
        slot: _Slot[Req, Res] = _Slot(request)
        with self._queue_lock:
            self._queue.append(slot)
        with self._engine_lock:
            if not slot.done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                try:
                    results = self._batch_fn([s.request for s in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(
                            f"batch function returned {len(results)} results for "
                            f"{len(batch)} requests"
                        )
                    for s, r in zip(batch, results, strict=True):
                        s.result = r
                except BaseException as exc:  # noqa: BLE001 - handed to every caller
                    for s in batch:
                        s.error = exc
                finally:
                    self.batches += 1
                    for s in batch:
                        s.done = True
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return slot.result
