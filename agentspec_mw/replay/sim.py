"""Greedy-oracle replay of agent traces through a proposer on a model of vLLM's V1 scheduler.

The recorded output of each call is what the target model emits; a draft is verified
against it (accepted = the longest common prefix with the remaining truth; the call
advances ``accepted + 1`` tokens). ``batch`` runs are in flight at once: each run's
calls are sequential (its next call arrives when the previous one finishes, with no
think time) except those issued together (``ReplayCall.with_previous``: fan-out siblings,
the samples of one request), which arrive together and are followed when the last of them
finishes; when a run ends the next run in file order arrives. So a run may hold several
requests in flight: ``batch`` counts runs, the effective batch requests.

Each engine step is scheduled as vLLM 0.32's ``Scheduler.schedule`` does
(``vllm/v1/core/sched/scheduler.py``), with the limits of the cost model's hardware
(:class:`agentspec_mw.costmodel.ServingLimits`):

1. **Running requests first**, in the order they were admitted: a decoding request asks
   for ``1 + len(draft)`` tokens, a request still prefilling for the rest of its prompt;
   each gets ``min(asked, budget left)``, so drafts are trimmed from the tail when the
   budget runs out (and a request is skipped once it is 0). Its KV blocks must fit; when
   they do not, the most recently admitted running request is preempted (its blocks
   freed, its progress recomputed later, first in the waiting queue) until they do.
2. **Then waiting requests** in arrival order (FCFS), unless a request was preempted in
   this step: each first looks up its prefix in the cache (whole blocks; at most all but
   its last token), then gets ``min(uncached tokens, budget left)`` — chunked prefill — if
   the blocks of its whole sequence fit (vLLM's ``scheduler_reserve_full_isl``, on by
   default; only the chunk's are allocated) and fewer than ``max_num_seqs`` requests run;
   the first that does not fit stops admission for this step (a *KV wait*).
3. The step takes ``cost_model.step_time(N_batched, N_kv, N_rows)`` with ``N_batched``
   every token scheduled (prefill chunks + decodes + drafts), ``N_kv`` the context the
   scheduled requests hold after it and ``N_rows`` its logits rows (each decode and draft
   token, one per prefill chunk; models without a row term get the first two) — and, for a
   model that prices drafts by context, the drafting requests' KV tokens and Σ drafts ×
   their request's KV tokens (:class:`~agentspec_mw.costmodel.StepTimeModel`). A request
   whose prompt is fully computed samples its first token (TTFT ends); a decoding request
   advances by its accepted drafts + 1.

Simplified from vLLM: one KV group; no ``long_prefill_token_threshold`` (off by default),
no async scheduling, no structured output, encoder or connector paths; a call's whole
output is known, so stop strings and max_tokens are its recorded end. Drafts are proposed
at the start of the step they are verified in, for every decoding request (vLLM proposes
them at the end of the previous step — the same inputs); a draft is counted as drafted
only for the tokens the scheduler kept. Prefix caching: :mod:`agentspec_mw.replay.kvcache`.

``none`` therefore gives exactly 1.0 token per call-step, and a perfect proposer ``k + 1``
until a call's tail (while the budget allows). The proposer sees ``start(prompt, tags)``
and ``extend([token 0])`` when a call's prefill completes, ``propose`` once per step for
all decoding calls with a :class:`StepContext` of what the scheduler knows, ``extend``
with each step's advanced tokens (one ``extend_many`` for the step where the proposer has
it, as the vLLM adapter calls it) and ``stop`` at the end of a call.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from agentspec_mw.costmodel import ServingLimits, StepTimeFn, step_time_of
from agentspec_mw.proposer import Proposer, StepContext
from agentspec_mw.replay.kvcache import BlockHashes, PrefixKVCache, block_hashes
from agentspec_mw.tags import StructureTags

__all__ = ["ReplayCall", "StepRecord", "WorkloadRun", "accepted_length", "replay_workload"]


@dataclass(frozen=True, slots=True)
class ReplayCall:
    """One call to replay: ids, token arrays and the tags its request would carry."""

    req_id: str
    run_id: str
    prompt: np.ndarray
    output: np.ndarray
    tags: StructureTags | None = None
    with_previous: bool = False
    """Issued together with the previous call of its run (it arrives with it, not after it
    ends): :func:`agentspec_mw.replay.run.issued_together`."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as the replay scheduled it (``replay_workload(on_step=...)``)."""

    prefill_tokens: int
    """Prompt tokens prefilled in chunks this step."""
    decoding: int
    """Decoding requests (one verified token each)."""
    draft_tokens: int
    """Draft tokens the scheduler kept."""
    kv_tokens: int
    """Context the scheduled requests hold after the step."""
    rows: int
    """Logits rows (each decode and draft token, one per prefill chunk)."""
    kv_wait: bool
    """A waiting call found no KV room in this step."""
    time_s: float
    """The step's time from the cost model (without proposer time)."""
    spec_kv: int = 0
    """KV tokens of the requests that carried drafts (counted for models that price
    drafts by context, else 0)."""
    draft_kv: int = 0
    """Σ over draft tokens of their request's KV tokens (as ``spec_kv``)."""


@dataclass
class WorkloadRun:
    """Counts and simulated time of one replay."""

    calls: int = 0
    """Calls replayed (those without output are left out: they never reach the engine)."""
    output_tokens: int = 0
    steps: int = 0
    """Call-steps that emitted tokens (a prefill chunk that does not finish the prompt
    emits none and is not counted)."""
    drafted: int = 0
    accepted: int = 0
    engine_steps: int = 0
    sim_time_s: float = 0.0
    """Simulated time from the first arrival to the last call's end."""
    proposer_time_s: float = 0.0
    """The proposer's wall-clock time summed over every engine step (what
    ``add_proposer_time`` adds to the simulated time)."""
    propose_us: list[float] = field(default_factory=list)
    """The proposer's time at each engine step, µs: its start, propose, extend and stop
    calls of that step (0-ish at a step with none of them)."""
    step_proposed: list[bool] = field(default_factory=list)
    """Whether ``propose`` ran at each engine step (aligned with ``propose_us``): a step
    with a decoding request and ``k >= 1``. Prefill-only steps and ``k = 0`` have none."""
    step_batch: list[int] = field(default_factory=list)
    """Requests running at each engine step (aligned with ``propose_us``)."""
    step_decoding: list[int] = field(default_factory=list)
    """Requests that emitted tokens at each engine step."""
    ttft_s: list[float] = field(default_factory=list)
    """Per call: arrival to first token."""
    tpot_s: list[float] = field(default_factory=list)
    """Per call with more than one output token: (end - first token) / (tokens - 1)."""
    prompt_tokens: int = 0
    """Prompt tokens of the calls (each counted once)."""
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache when a call was first admitted."""
    prefill_tokens: int = 0
    """Tokens prefilled (prompt tokens not cached, and recomputation after preemption)."""
    preemptions: int = 0
    kv_waits: int = 0
    """Steps in which the next waiting call did not fit in the KV cache."""

    @property
    def propose_steps(self) -> int:
        """Engine steps at which ``propose`` ran."""
        return sum(self.step_proposed)

    @property
    def proposed_us(self) -> list[float]:
        """``propose_us`` of the steps at which ``propose`` ran (their percentiles are the
        report's ``propose_us_p50``/``p99``)."""
        return [us for us, ran in zip(self.propose_us, self.step_proposed, strict=True) if ran]

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

    @property
    def effective_batch(self) -> float:
        """Mean requests emitting tokens per engine step."""
        return float(np.mean(self.step_decoding)) if self.step_decoding else 0.0

    @property
    def throughput(self) -> float:
        """Output tokens per simulated second."""
        return self.output_tokens / self.sim_time_s if self.sim_time_s > 0 else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def accepted_length(draft: Sequence[int] | np.ndarray, truth: np.ndarray) -> int:
    """Tokens of ``draft`` a greedy verifier accepts: its common prefix with ``truth``."""
    n = min(len(draft), len(truth))
    i = 0
    while i < n and draft[i] == truth[i]:
        i += 1
    return i


class _Req:
    """One call in the engine: its progress, KV blocks and pending draft."""

    __slots__ = (
        "arrival",
        "call",
        "computed",
        "draft",
        "draftless",
        "emitted",
        "first_token_s",
        "hashes",
        "hit_at_arrival",
        "prompt_len",
        "run",
        "seen_cache",
    )

    def __init__(self, call: ReplayCall, run: deque[ReplayCall], arrival: float, bs: int):
        self.call = call
        self.run = run
        self.arrival = arrival
        self.prompt_len = len(call.prompt)
        self.computed = 0
        self.emitted = 0
        self.draft: tuple[int, ...] = ()
        self.first_token_s = 0.0
        self.seen_cache = False
        #: a resumed call's prefill chunk ended at its last token: it samples in the next
        #: step without a draft (vLLM drafts only for rows that sampled)
        self.draftless = False
        self.hit_at_arrival = 0
        self.hashes: BlockHashes = block_hashes(np.concatenate([call.prompt, call.output]), bs)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.emitted

    @property
    def decoding(self) -> bool:
        return self.emitted > 0 and self.computed == self.num_tokens - 1


def _runs_in_order(calls: Sequence[ReplayCall]) -> deque[deque[ReplayCall]]:
    """The runs in order of first appearance, without calls of no output (a group whose
    first call has none is led by its next)."""
    runs: dict[str, deque[ReplayCall]] = {}
    led: dict[str, bool] = {}  # run -> its current group has a call kept
    for c in calls:
        if not c.with_previous:
            led[c.run_id] = False
        if len(c.output) == 0:
            continue
        if c.with_previous and not led.get(c.run_id, False):
            c = replace(c, with_previous=False)
        led[c.run_id] = True
        runs.setdefault(c.run_id, deque()).append(c)
    return deque(runs.values())


def replay_workload(
    calls: Sequence[ReplayCall],
    proposer: Proposer,
    *,
    batch: int,
    k: int,
    cost_model: StepTimeFn,
    limits: ServingLimits | None = None,
    add_proposer_time: bool = False,
    on_tokens: Callable[[int], None] | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
) -> WorkloadRun:
    """Replay ``calls`` (in file order) at ``batch`` runs in flight; see the module doc.

    ``on_tokens`` gets the tokens each step advanced (progress bars); ``on_step`` each
    step's :class:`StepRecord` (analyses of where the time goes, ``benchmarks/headroom.py``).

    ``limits`` default to the cost model's (``cost_model.limits``), else
    :class:`ServingLimits`' defaults.

    Raises:
        ValueError: ``batch < 1`` or ``k < 0``, or a call that cannot fit in the KV cache
            even alone.
    """
    if batch < 1 or k < 0:
        raise ValueError(f"batch={batch} must be >= 1 and k={k} >= 0")
    lim = limits or getattr(cost_model, "limits", None) or ServingLimits()
    bs = lim.block_size
    cap_blocks = None if lim.kv_capacity_tokens is None else lim.kv_capacity_tokens // bs
    kv = PrefixKVCache(bs, cap_blocks)
    pending = _runs_in_order(calls)
    # the calls replayed: one without output never reaches the engine
    res = WorkloadRun(calls=sum(map(len, pending)))
    res.output_tokens = int(sum(len(c.output) for c in calls))
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    now = 0.0

    in_flight: dict[int, int] = {}  # id(run) -> its calls in the engine

    def arrive(run: deque[ReplayCall]) -> None:
        """The run's next call, and the calls issued together with it."""
        while True:
            req = _Req(run.popleft(), run, now, bs)
            need = req.prompt_len + len(req.call.output) + k
            if cap_blocks is not None and -(-need // bs) > cap_blocks:
                raise ValueError(
                    f"call {req.call.req_id} needs {need} tokens of KV cache (prompt + output"
                    f" + k), more than the {lim.kv_capacity_tokens} the cost model's hardware"
                    " holds: pick a preset with more KV capacity or leave such calls out"
                )
            res.prompt_tokens += req.prompt_len
            req.hit_at_arrival = kv.peek_hit(req.hashes, req.num_tokens)
            waiting.append(req)
            in_flight[id(run)] = in_flight.get(id(run), 0) + 1
            if not (run and run[0].with_previous):
                return

    for _ in range(min(batch, len(pending))):
        arrive(pending.popleft())
    draft_terms = getattr(cost_model, "draft_coefficients", None)
    priced_drafts = draft_terms is not None and draft_terms() is not None
    clock = time.perf_counter_ns
    # a step's accepted tokens in one call where the proposer takes them so (its time
    # includes gathering them)
    extend_many = getattr(proposer, "extend_many", None)
    carried_ns = 0  # proposer time of a step that then scheduled nothing
    while waiting or running:
        # drafts for the decoding requests (vLLM: proposed after the previous step)
        t_prop = carried_ns
        carried_ns = 0
        decoding = [r for r in running if r.decoding and not r.draftless]
        proposed = bool(decoding) and k > 0
        if proposed:
            prefill_left = sum(r.num_tokens - r.computed for r in running if not r.decoding)
            prefill_left += sum(r.num_tokens - r.hit_at_arrival for r in waiting)
            free = kv.free_blocks
            ctx = StepContext(
                batch_size=len(decoding),
                num_kv_tokens=sum(r.num_tokens for r in decoding),
                max_num_batched_tokens=lim.max_num_batched_tokens,
                num_decode_tokens=len(decoding),
                num_prefill_tokens=prefill_left,
                kv_capacity_tokens=lim.kv_capacity_tokens,
                num_free_kv_tokens=None if free is None else free * bs,
            )
            t0 = clock()
            drafts = proposer.propose([r.call.req_id for r in decoding], k, ctx)
            t_prop += clock() - t0
            if len(drafts) != len(decoding):
                raise RuntimeError(
                    f"{proposer.name}.propose returned {len(drafts)} drafts for "
                    f"{len(decoding)} requests"
                )
            for r, draft in zip(decoding, drafts, strict=True):
                if len(draft.token_ids) > k:
                    raise RuntimeError(
                        f"{proposer.name} drafted {len(draft.token_ids)} > k={k} tokens"
                    )
                r.draft = tuple(draft.token_ids)

        waits_before = res.kv_waits
        scheduled = _schedule(running, waiting, kv, lim, res)
        if not scheduled:  # every running request was preempted: admit next step
            assert running or kv.used_blocks == 0, "an empty step with blocks held"
            carried_ns = t_prop  # spent all the same: charged to the next step
            continue

        num_batched = sum(scheduled.values())
        num_kv = sum(r.computed + n for r, n in scheduled.items())
        # logits rows: every decode and draft token, a prefill chunk's last position
        num_rows = sum(n if r.decoding else 1 for r, n in scheduled.items())
        # drafts priced by their request's context (models with c_spec_kv / c_draft_kv)
        spec_kv = draft_kv = 0
        if priced_drafts:
            for r, n in scheduled.items():
                if r.decoding and n > 1:
                    spec_kv += r.computed + n
                    draft_kv += (n - 1) * (r.computed + n)
        step_s = step_time_of(cost_model, num_batched, num_kv, num_rows, spec_kv, draft_kv)
        if on_step is not None:
            decoding_n = sum(1 for r in scheduled if r.decoding)
            prefill_n = sum(n for r, n in scheduled.items() if not r.decoding)
            on_step(
                StepRecord(
                    prefill_tokens=prefill_n,
                    decoding=decoding_n,
                    draft_tokens=num_batched - prefill_n - decoding_n,
                    kv_tokens=num_kv,
                    rows=num_rows,
                    kv_wait=res.kv_waits > waits_before,
                    time_s=step_s,
                    spec_kv=spec_kv,
                    draft_kv=draft_kv,
                )
            )

        # verify, advance, finish
        emitting = advanced_total = 0
        extends: list[tuple[str, np.ndarray]] = []
        t_extra = 0
        finished: list[_Req] = []
        now_after = now + step_s
        for r, n in scheduled.items():
            out = r.call.output
            if r.decoding:
                d = r.draft[: n - 1]
                acc = accepted_length(d, out[r.emitted :])
                adv = min(acc + 1, len(out) - r.emitted)
                res.drafted += len(d)
                res.accepted += acc
                extends.append((r.call.req_id, out[r.emitted : r.emitted + adv]))
                r.emitted += adv
                r.computed = r.num_tokens - 1
            else:
                r.computed += n
                res.prefill_tokens += n
                if r.computed < r.num_tokens:
                    r.draft = ()
                    r.draftless = r.emitted > 0
                    kv.register(r.call.req_id, r.hashes, r.computed)
                    continue
                adv = 1
                if r.emitted == 0:  # first token
                    ta = clock()
                    proposer.start(r.call.req_id, r.call.prompt, r.call.tags)
                    t_extra += clock() - ta
                    r.first_token_s = now_after
                    res.ttft_s.append(now_after - r.arrival)
                extends.append((r.call.req_id, out[r.emitted : r.emitted + 1]))
                r.emitted += 1
            r.draft = ()
            r.draftless = False
            emitting += 1
            advanced_total += adv
            res.steps += 1
            kv.register(r.call.req_id, r.hashes, r.computed)
            if r.emitted >= len(out):
                finished.append(r)
        ta = clock()
        if extend_many is not None and extends:
            ids_of = [e[1] for e in extends]
            extend_many(
                [e[0] for e in extends],
                np.concatenate(ids_of),
                np.fromiter(map(len, ids_of), np.int64, len(ids_of)),
            )
        else:
            for req_id, ids in extends:
                proposer.extend(req_id, ids)
        for r in finished:
            proposer.stop(r.call.req_id)
        t_extra += clock() - ta
        prop_s = (t_prop + t_extra) * 1e-9
        now = now_after + (prop_s if add_proposer_time else 0.0)
        for r in finished:
            kv.release(r.call.req_id)
            running.remove(r)
            n_out = len(r.call.output)
            if n_out > 1:
                res.tpot_s.append((now_after - r.first_token_s) / (n_out - 1))
            in_flight[id(r.run)] -= 1
            if in_flight[id(r.run)]:
                continue  # a call issued with it is still in the engine
            del in_flight[id(r.run)]
            if r.run:
                arrive(r.run)
            elif pending:
                arrive(pending.popleft())
        res.propose_us.append(prop_s * 1e6)
        res.step_proposed.append(proposed or t_prop > 0)
        res.step_batch.append(len(running) + len(finished))
        res.step_decoding.append(emitting)
        res.proposer_time_s += prop_s
        res.engine_steps += 1
        if on_tokens is not None:
            on_tokens(advanced_total)
    res.sim_time_s = now
    return res


def _schedule(
    running: list[_Req],
    waiting: deque[_Req],
    kv: PrefixKVCache,
    lim: ServingLimits,
    res: WorkloadRun,
) -> dict[_Req, int]:
    """One step of vLLM's ``Scheduler.schedule``: tokens per scheduled request, in order.
    Moves admitted requests into ``running`` and preempted ones to the front of
    ``waiting``."""
    budget = lim.max_num_batched_tokens
    scheduled: dict[_Req, int] = {}
    preempted = False
    i = 0
    while i < len(running) and budget > 0:
        r = running[i]
        want = 1 + len(r.draft) if r.decoding else r.num_tokens - r.computed
        n = min(want, budget)
        ok = kv.allocate(r.call.req_id, r.computed + n)
        while not ok:
            victim = running.pop()
            budget += scheduled.pop(victim, 0)
            kv.release(victim.call.req_id)
            victim.computed = 0
            victim.draft = ()
            waiting.appendleft(victim)
            res.preemptions += 1
            preempted = True
            if victim is r:
                break
            ok = kv.allocate(r.call.req_id, r.computed + n)
        if not ok:
            break
        scheduled[r] = n
        budget -= n
        i += 1
    if preempted:  # vLLM admits no waiting request in a step that preempted
        return scheduled
    while budget > 0 and waiting and len(running) < lim.max_num_seqs:
        r = waiting[0]
        hit = kv.peek_hit(r.hashes, r.num_tokens)
        n = min(r.num_tokens - hit, budget)
        if not kv.admit(r.call.req_id, r.hashes, hit, hit + n, must_fit_tokens=r.num_tokens):
            res.kv_waits += 1
            break
        waiting.popleft()
        if not r.seen_cache:
            r.seen_cache = True
            res.cached_tokens += min(hit, r.prompt_len)
        r.computed = hit
        running.append(r)
        scheduled[r] = n
        budget -= n
    return scheduled
