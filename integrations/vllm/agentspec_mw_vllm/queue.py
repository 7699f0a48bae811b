"""The scheduler's waiting prompts, handed to the drafter with each step.

vLLM's model runner, where the drafter runs, sees the requests scheduled in a step but not
the ones waiting: yet a draft token of the next step takes a place in the scheduler's token
budget that a waiting prompt's chunk would otherwise have (vLLM schedules running requests,
drafts included, before waiting ones). AgentSpec's budget prices a draft by what it
displaces (:func:`agentspec_mw.agentspec.budget.step_shape`); without the queue it must
assume prompts always wait, which over-prices drafts whenever the queue is empty (in the
replay under the ``llama8b-h100-roofline`` preset at batch 32, the budget blind to the
queue was 0.966x the one that sees it: ``benchmarks/_blind_queue.py``, 2026-12-06).

:func:`read_waiting_tokens` counts, right after the scheduler scheduled a step, the prompt
tokens still to compute — the queue the next step's drafts compete with, as the replay
counts it (:mod:`agentspec_mw.replay.sim`):

* each waiting request's tokens not yet computed, less its prefix-cache hit, looked up once
  when the request is first seen waiting (the replay's hit at arrival; at most
  :data:`LOOKUP_BLOCKS_PER_STEP` blocks a step); a preempted request counts its output
  too, as vLLM recomputes it; a streaming session waiting for its client's input is not
  counted;
* each running request still prefilling after this step's chunk: its tokens left;

up to the scheduler's token budget (``max_num_scheduled_tokens``): more fills the next
step just the same (:func:`agentspec_mw.agentspec.budget.step_shape` prices by the share
of the budget the queue can take).

:mod:`agentspec_mw_vllm.plugin` wraps ``Scheduler.schedule`` to attach the count to the
step's ``SchedulerOutput`` as :data:`WAITING_ATTR` (the object reaches the runner as is,
or pickled by a multi-process executor, attributes included) when the engine's drafter is
a ``custom_class`` one. Any error in the count is logged once and the scheduler's count
stops; the drafter then sees ``None`` and prices drafts as if the queue were full, as
before. Nothing here changes what vLLM schedules.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["LOOKUP_BLOCKS_PER_STEP", "WAITING_ATTR", "QueueReader", "read_waiting_tokens"]

logger = logging.getLogger("agentspec_mw_vllm.queue")

#: The ``SchedulerOutput`` attribute that carries the count (absent: not counted).
WAITING_ATTR = "agentspec_waiting_prompt_tokens"


def _prefix_hit(scheduler: Any, request: Any) -> int:
    """Tokens of ``request``'s prompt the prefix cache holds now (vLLM's own lookup, which
    reads the cache and changes nothing; 0 where caching is off for it)."""
    kv = scheduler.kv_cache_manager
    if not kv.prefix_cache_lookup_enabled(request):
        return 0
    # vLLM recomputes the last token of a fully cached prompt (its logits are needed)
    hit = kv.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
    return int(hit[1])


#: Prefix-cache blocks looked up per step at most (vLLM's lookup walks ~1.3 µs a block on
#: this project's 2-core VM): a burst of long new prompts is looked up over several steps,
#: each counted whole until then (over-pricing drafts is the cheaper error).
LOOKUP_BLOCKS_PER_STEP = 1024


def _requests(queue: Any) -> Any:
    """A waiting queue's requests in any order: a priority queue's heap of requests as it
    is (its own iterator copies and pops the heap, Python comparisons each step), else the
    queue."""
    heap = getattr(queue, "_heap", None)
    return queue if heap is None else heap


def read_waiting_tokens(
    scheduler: Any,
    hits: dict[Any, int],
    *,
    limit: int | None = None,
    skip_status: Any = None,
) -> tuple[int, dict[Any, int]]:
    """Prompt tokens left to compute after ``scheduler`` scheduled its step (see the
    module docstring), and the prefix-cache hits of the requests waiting now, by request
    object (``hits`` holds the previous step's: a request keeps the hit it was first seen
    with; an id reused by a new request is a new object).

    The count stops once it reaches ``limit`` (the token budget: a larger queue fills the
    next step all the same); at most :data:`LOOKUP_BLOCKS_PER_STEP` blocks are looked up
    (a request not looked up yet counts whole). Requests whose status is
    ``skip_status`` (a streaming session waiting for its client's input) are not counted.
    """
    total = 0
    seen: dict[Any, int] = {}
    counted: set[Any] = set()
    lookups = 0
    for queue in (getattr(scheduler, "kv_holding_waiting", ()), scheduler.waiting):
        for request in _requests(queue):
            if limit is not None and total >= limit:
                break
            counted.add(request)
            if skip_status is not None and request.status == skip_status:
                continue
            computed = request.num_computed_tokens
            left = request.num_tokens - computed
            if computed == 0:
                hit = hits.get(request)
                if hit is None:
                    blocks = len(request.block_hashes)
                    if lookups and lookups + blocks > LOOKUP_BLOCKS_PER_STEP:
                        hit = 0  # looked up at a later step
                    else:
                        lookups += blocks
                        hit = seen[request] = _prefix_hit(scheduler, request)
                else:
                    seen[request] = hit
                left -= hit
            if left > 0:
                total += left
    # running requests still prefilling after this step's chunk (vLLM tracks them; a
    # request loading its KV from elsewhere is in it while it waits: counted above)
    for request in scheduler._inflight_prefills:
        if limit is not None and total >= limit:
            break
        left = request.num_tokens - request.num_computed_tokens
        if left > 0 and request not in counted:
            total += left
    return total, seen


class QueueReader:
    """One scheduler's count, step after step (keeps the hits of the requests waiting)."""

    __slots__ = ("_hits", "_failed", "_skip")

    def __init__(self) -> None:
        self._hits: dict[Any, int] = {}
        self._failed = False
        try:
            from vllm.v1.request import RequestStatus

            self._skip: Any = getattr(RequestStatus, "WAITING_FOR_STREAMING_REQ", None)
        except ImportError:  # the unit tests' fake schedulers
            self._skip = None

    def read(self, scheduler: Any) -> int | None:
        """The count for the step just scheduled; ``None`` once a count has failed."""
        if self._failed:
            return None
        try:
            limit = getattr(scheduler, "max_num_scheduled_tokens", None)
            total, self._hits = read_waiting_tokens(
                scheduler,
                self._hits,
                limit=limit if isinstance(limit, int) else None,
                skip_status=self._skip,
            )
        except Exception:  # the count is advice: it never takes the scheduler down
            self._failed = True
            self._hits = {}
            logger.exception(
                "agentspec: counting the scheduler's waiting prompts failed; the drafter "
                "prices drafts as if prompts always waited from now on"
            )
            return None
        return total
