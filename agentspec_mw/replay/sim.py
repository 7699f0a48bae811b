"""Greedy-oracle replay of agent traces through a proposer (one workload, one batch size).

The recorded output of each call is what the target model emits. Calls of one run are
sequential; ``batch`` runs are in flight at once, each holding its slot until its calls
are done (the agent continues after its tool returns), after which the next run in file
order takes the slot. One engine *step* advances every call in flight:

* a call's first step is its prefill: it emits output token 0 and drafts nothing; the
  proposer sees ``start(prompt, tags)`` then ``extend([token 0])``;
* every later step is a verification: the proposer drafts up to ``k`` tokens (one batched
  ``propose`` call for all decoding calls); accepted = longest common prefix of draft and
  the remaining truth; the call advances ``accepted + 1`` tokens (capped at its end).

So ``none`` gives exactly 1.0 token per step, and a perfect proposer ``k + 1`` until the
tail. The simulated time of a step comes from the step-time model with
``N_batched = Σ (1 + len(draft))`` and ``N_kv = Σ (prompt + emitted)`` over the calls in
flight; prompt processing is left out (it is the same with and without speculation).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agentspec_mw.costmodel import StepTimeFn
from agentspec_mw.proposer import Proposer, StepContext
from agentspec_mw.tags import StructureTags

__all__ = ["ReplayCall", "WorkloadRun", "accepted_length", "replay_workload"]


@dataclass(frozen=True, slots=True)
class ReplayCall:
    """One call to replay: ids, token arrays and the tags its request would carry."""

    req_id: str
    run_id: str
    prompt: np.ndarray
    output: np.ndarray
    tags: StructureTags | None = None


@dataclass
class WorkloadRun:
    """Counts and simulated time of one replay."""

    calls: int = 0
    output_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    engine_steps: int = 0
    sim_time_s: float = 0.0
    proposer_time_s: float = 0.0
    propose_us: list[float] = field(default_factory=list)
    step_batch: list[int] = field(default_factory=list)
    """Calls in flight at each engine step (aligned with ``propose_us``)."""

    @property
    def mat(self) -> float:
        """Mean accepted tokens per step: output tokens / steps."""
        return self.output_tokens / self.steps if self.steps else 0.0

    @property
    def rejection_rate(self) -> float:
        """1 - accepted / drafted (0 when nothing was drafted)."""
        return 1.0 - self.accepted / self.drafted if self.drafted else 0.0

    @property
    def drafted_per_step(self) -> float:
        """Drafted tokens per call-step."""
        return self.drafted / self.steps if self.steps else 0.0


def accepted_length(draft: Sequence[int] | np.ndarray, truth: np.ndarray) -> int:
    """Tokens of ``draft`` a greedy verifier accepts: its common prefix with ``truth``."""
    n = min(len(draft), len(truth))
    i = 0
    while i < n and draft[i] == truth[i]:
        i += 1
    return i


class _Slot:
    __slots__ = ("call", "pos")

    def __init__(self, call: ReplayCall) -> None:
        self.call = call
        self.pos = 0


def _runs_in_order(calls: Sequence[ReplayCall]) -> deque[deque[ReplayCall]]:
    runs: dict[str, deque[ReplayCall]] = {}
    for c in calls:
        runs.setdefault(c.run_id, deque()).append(c)
    return deque(runs.values())


def replay_workload(
    calls: Sequence[ReplayCall],
    proposer: Proposer,
    *,
    batch: int,
    k: int,
    cost_model: StepTimeFn,
    add_proposer_time: bool = False,
    on_tokens: Callable[[int], None] | None = None,
) -> WorkloadRun:
    """Replay ``calls`` (in file order) at ``batch`` runs in flight; see the module doc."""
    if batch < 1 or k < 0:
        raise ValueError(f"batch={batch} must be >= 1 and k={k} >= 0")
    res = WorkloadRun(calls=len(calls))
    pending = _runs_in_order(c for c in calls if len(c.output) > 0)  # type: ignore[arg-type]
    res.output_tokens = int(sum(len(c.output) for c in calls))
    slots: list[tuple[deque[ReplayCall], _Slot]] = []
    clock = time.perf_counter_ns
    step_index = 0
    while pending or slots:
        while len(slots) < batch and pending:
            run = pending.popleft()
            slots.append((run, _Slot(run.popleft())))
        t_admit = 0
        decoding: list[_Slot] = []
        for _, slot in slots:
            c = slot.call
            if slot.pos == 0:
                first = c.output[:1]
                ta = clock()
                proposer.start(c.req_id, c.prompt, c.tags)
                proposer.extend(c.req_id, first)
                t_admit += clock() - ta
            else:
                decoding.append(slot)
        drafts = []
        if decoding:
            ctx_lens = [len(s.call.prompt) + s.pos for s in decoding]
            req_ids = [s.call.req_id for s in decoding]
            ctx = StepContext(
                batch_size=len(slots),
                num_kv_tokens=int(sum(ctx_lens)),
                step_index=step_index,
                context_lens=ctx_lens,
            )
            t0 = clock()
            drafts = proposer.propose(req_ids, k, ctx)
            t2 = clock()
            if len(drafts) != len(decoding):
                raise RuntimeError(
                    f"{proposer.name}.propose returned {len(drafts)} drafts for "
                    f"{len(decoding)} requests"
                )
        else:
            t0 = t2 = 0
        in_flight = num_batched = len(slots)
        num_kv = 0
        for _, slot in slots:
            num_kv += len(slot.call.prompt) + slot.pos
        advanced_total = 0
        # the step's extend calls, timed as one block after the verification (a clock
        # pair around each call would add ~0.15 µs per request to the proposer's time)
        extends: list[tuple[str, np.ndarray]] = []
        for slot, draft in zip(decoding, drafts, strict=True):
            ids = draft.token_ids
            if len(ids) > k:
                raise RuntimeError(f"{proposer.name} drafted {len(ids)} > k={k} tokens")
            out = slot.call.output
            acc = accepted_length(ids, out[slot.pos :])
            adv = min(acc + 1, len(out) - slot.pos)
            res.drafted += len(ids)
            res.accepted += acc
            num_batched += len(ids)
            extends.append((slot.call.req_id, out[slot.pos : slot.pos + adv]))
            slot.pos += adv
            advanced_total += adv
        ta = clock()
        for req_id, accepted_ids in extends:
            proposer.extend(req_id, accepted_ids)
        t_extra = clock() - ta
        still: list[tuple[deque[ReplayCall], _Slot]] = []
        for run, slot in slots:
            if slot.pos == 0:
                slot.pos = 1
                advanced_total += 1
            res.steps += 1
            if slot.pos >= len(slot.call.output):
                ta = clock()
                proposer.stop(slot.call.req_id)
                t_extra += clock() - ta
                if run:
                    still.append((run, _Slot(run.popleft())))
            else:
                still.append((run, slot))
        slots = still
        prop_s = ((t2 - t0) + t_admit + t_extra) * 1e-9
        res.propose_us.append(prop_s * 1e6)
        res.step_batch.append(in_flight)
        res.proposer_time_s += prop_s
        res.sim_time_s += cost_model.step_time(num_batched, num_kv)
        if add_proposer_time:
            res.sim_time_s += prop_s
        res.engine_steps += 1
        step_index += 1
        if on_tokens is not None:
            on_tokens(advanced_total)
    return res
