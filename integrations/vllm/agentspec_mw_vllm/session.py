"""Drive a core :class:`~agentspec_mw.proposer.Proposer` from vLLM's draft calls (no vLLM import).

:class:`DraftSession` turns each draft call (rows of token buffers plus the plugin's
:class:`~agentspec_mw_vllm.context.BatchContext`) into the proposer's lifecycle:

* a request id seen for the first time (or again after it left the batch, e.g. after
  preemption) is ``start``-ed with its prompt and its decoded wire tags, then ``extend``-ed
  with every output token it already has;
* each step, a request is ``extend``-ed with the tokens vLLM accepted since the last call
  (read from ``token_ids_cpu`` up to ``num_tokens_no_spec``, so nothing is lost or doubled),
  every request of the call in one ``extend_many`` where the proposer has it (AgentSpec),
  after the call's new requests have started;
* requests no longer in the batch are ``stop``-ped before anything new starts — not one
  the runner still holds (``BatchContext.live_req_ids``): vLLM takes a request out of the
  batch for a step it does not schedule (prefill chunks spent the token budget, or it was
  preempted), and it comes back with its history, which a restart would feed the shared
  index again — and so is a request vLLM reports finished
  (``BatchContext.finished_req_ids``) or whose row holds fewer tokens than were fed: its
  id now names a new request (ids the host chose, reused), which starts afresh with its
  own prompt and tags;
* ``propose`` gets the rows that want drafts, and every row is cut to
  ``min(k, max_model_len - num_tokens - 1)`` tokens (more than ``k`` crashes vLLM) and to
  the request's output tokens left less one (``max_tokens``: a step emits at most the
  draft + 1 tokens, and vLLM verifies draft tokens past a request's ``max_tokens``, counts
  them as accepted and throws them away); a request with one token left asks none;
* every draft row is checked before vLLM sees it: its ids must be integers (Python or
  numpy, not ``bool``) in ``[0, vocab_size)`` — an id outside the model's vocabulary
  makes vLLM raise inside the step and kills the engine. A bad row is dropped (that
  request drafts nothing this step), counted as the fault ``propose:bad_draft`` and
  logged once; the other rows keep their drafts.

Drafts verified in a step without a draft call: the draft last sent to a request is
verified in the next step that schedules it. Where that step's draft call was skipped (the
step numbers jumped at any call since the draft was sent, and the request has tokens from
a step the session did not see), its verification is dropped, not counted: that step's
schedule never reaches the drafter, so how much of the draft the scheduler kept is not
known; and the zeros vLLM scheduled in the draft's place after the skipped call are never
taken for it. A request vLLM left out of the skipped steps is verified after them as usual,
and counted. The jump is looked for since the draft was sent, not only since the last call:
a request need not be in every call (under pipeline parallelism vLLM alternates disjoint
micro-batches, so a request's calls are two or more apart, and the jump before one
micro-batch's call is the other's skipped step). Without step numbers (no or an older
scheduler wrap) the session counts as before.

Live calibration: when a draft carries the proposer's per-token estimates (``Draft.probs``),
its tokens' predicted survivals go with the verified count to the metrics (the call's
verified rows in one ``record_verified_many`` at its end: the expected against the accepted
tokens, and a reliability table by tenth of predicted survival).

Step timing: given a ``step_timer`` (the adapter's
:class:`~agentspec_mw.costfit.MeasuredStepTime` when ``cost_model="measured"``), the
session times the engine between two draft calls — from the end of one to the start of
the next, which is one engine step without the proposer's own time — and reports it with
the step's scheduled tokens (``BatchContext.num_scheduled_tokens``, prefill included),
resident KV tokens (a prompt part way through its chunks: what it has computed, from
``BatchContext.num_computed_tokens``), drafts and emitted tokens (the call's sampled
tokens). A gap after which no request of the previous call is still in the batch is not
reported: the engine may have been idle in it; nor is one in which vLLM ran steps without a
draft call (the scheduler's step numbers, ``BatchContext.scheduler_step``, not consecutive:
vLLM skips the call for the whole batch while a row is within ``k`` tokens of
``max_model_len``), which spans several steps. The gap is read on
``step_clock`` (default ``clock``, wall time); with a per-thread clock (the adapter passes
``time.thread_time`` on vLLM's CPU build) a gap between calls on two threads is not
reported either. The emitted tokens are the interval's own step's: vLLM calls the drafter
in ``sample_tokens`` after that step's model run, sampling, rejection sampler and
bookkeeping, with the tokens the step sampled; what of the step before lands in the
interval (its scheduler update and output processing, after the draft call) cost ~10 µs per
emitted token on the demo's CPU engine. Where vLLM runs several batches at once (pipeline
parallelism) the adapter passes no ``step_timer``: the gap is not one step.

Error policy: wire tags that fail to decode make that request tag-free (a warning and
``tag_rejections``); a proposer exception is caught, logged once per kind (verb and
exception type), counted in ``faults``, and costs only drafts: a failing ``propose`` gives
the whole step no drafts; a failing ``start``/``extend`` gives that request no drafts for
the rest of its life (a failing ``extend_many``, all or nothing, is counted and the call's
requests are fed one ``extend`` each, so only a request whose own ``extend`` fails is lost);
a bad draft row costs that row's drafts for the step; a failing metrics update is counted
(``metrics:<type>``) and keeps the step's drafts. The engine never sees the exception or the
bad row.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from agentspec_mw.costfit import MeasuredStepTime
from agentspec_mw.errors import TagError
from agentspec_mw.proposer import Decoding, Proposer, StepContext
from agentspec_mw.tags import StructureTags, tags_from_wire
from agentspec_mw_vllm.context import BatchContext
from agentspec_mw_vllm.metrics import DrafterMetrics, Verified, get_metrics

__all__ = ["BAD_DRAFT", "DraftSession", "decode_tags"]

logger = logging.getLogger("agentspec_mw_vllm.session")
_MAX_TAG_WARNINGS = 20
BAD_DRAFT = "propose:bad_draft"
"""Fault kind of a draft row with an id that is not an integer in ``[0, vocab_size)``."""


@dataclass(slots=True)
class _Request:
    """What the session keeps per live request."""

    fed: int
    """Tokens of prompt + output the proposer has seen."""
    agent: str
    """Metrics label of the request's agent."""
    segment: str | None
    broken: bool = False
    """A start/extend raised: no drafts for this request any more."""
    scope: str | None = None
    """Metrics label of the request's scope (``None``: scope labels are off)."""
    probs: Sequence[float] | None = None
    """The per-token estimates (``Draft.probs``) of the draft last returned for the
    request, for the live calibration counters (read only once vLLM verified it)."""
    sent: list[int] | None = None
    """The draft last returned for the request: a step's scheduled drafts are counted as
    its verification only where they are (a prefix of) it — vLLM hands every request zeros
    for a step whose draft call it skipped (a row near the context limit) — and only when
    no step without a draft call scheduled the request since (see the module doc)."""
    sent_gaps: int = 0
    """The session's count of gaps in the step numbers when :attr:`sent` was returned: a
    gap since (this one or a later call's) means steps without a draft call ran after it."""
    end: int | None = None
    """Prompt + ``max_tokens``: the request's tokens can never pass this (``None``: no
    limit known). Read once, when the request is admitted; its sampling params are fixed."""
    prompt_len: int = 0
    """The request's prompt length: a row of the same id with another prompt length is a
    new request under a finished one's id."""


def _bad_ids(ids: Sequence[Any], vocab_size: int | None) -> str | None:
    """Why a draft row (already cut to its cap) cannot go to vLLM, or ``None``.

    Runs on every row of every step: the common row (a tuple of Python ints) costs a
    ``set(map(type, ...))`` and a ``min``/``max``, all in C."""
    if not len(ids):
        return None
    if not set(map(type, ids)) <= _PLAIN_INT:
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int | np.integer):
                return f"token id {t!r} ({type(t).__name__}) is not an integer"
    lo, hi = min(ids), max(ids)
    if lo < 0:
        return f"token id {int(lo)} is negative"
    if vocab_size is not None and hi >= vocab_size:
        return f"token id {int(hi)} is outside the vocabulary [0, {vocab_size})"
    return None


_PLAIN_INT = frozenset({int})


def _all_plain_ids(rows: Sequence[Any], vocab_size: int | None) -> bool:
    """Whether every id of the readable ``rows`` (``None``: unreadable, skipped) is a
    plain ``int`` in ``[0, vocab_size)``: one pass in C over the whole call instead of a
    :func:`_bad_ids` per row. ``False`` (the rows are then checked one by one) also where a
    row cannot be read so."""
    try:
        flat = list(chain.from_iterable(r for r in rows if r is not None))
        if not flat:
            return True
        return (
            set(map(type, flat)) <= _PLAIN_INT
            and min(flat) >= 0
            and (vocab_size is None or max(flat) < vocab_size)
        )
    except Exception:
        return False


_GATHER_ROWS = 48
"""From this many rows, :func:`_gather` indexes the buffer once instead of slicing each row:
at 256 rows of 1-2 tokens 24 µs instead of 65, at 32 rows 9 µs either way (the crossover is
at ~40 rows on this 2-core VM, 2026-12-06)."""


def _gather(
    buf: np.ndarray, rows: list[int], lo: list[int], hi: list[int], lens: list[int]
) -> np.ndarray:
    """``buf[rows[j], lo[j]:hi[j]]`` of every ``j``, one after another, as a new int32 array."""
    if len(rows) < _GATHER_ROWS:
        return np.concatenate(
            [buf[r, a:b] for r, a, b in zip(rows, lo, hi, strict=True)], dtype=np.int32
        )
    n = np.asarray(lens, dtype=np.intp)
    # each token's column: its row's start plus its place within the row's run
    start = np.repeat(np.asarray(lo, dtype=np.intp) - (np.cumsum(n) - n), n)
    cols = start + np.arange(start.shape[0], dtype=np.intp)
    return np.asarray(buf[np.repeat(np.asarray(rows, dtype=np.intp), n), cols], dtype=np.int32)


def _rejection_reason(exc: TagError) -> str:
    text = str(exc)
    if "version" in text:
        return "version"
    if "chars on the wire" in text:
        return "oversized"
    return "invalid"


def _takes_keyword(method: Any, name: str) -> bool:
    """Whether ``method`` takes keyword ``name`` (named, not only ``**kwargs``)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin, a C extension)
        return False
    param = params.get(name)
    return param is not None and param.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def _kv_rows(ctx: BatchContext, counts: list[int]) -> list[int]:
    """Each row's KV tokens after the step: its token count, or where that runs ahead of
    the cache (a prompt part way through its chunks: vLLM counts the whole prompt from the
    start) the tokens computed before the step plus the chunk scheduled in it."""
    computed = ctx.num_computed_tokens
    if len(computed) < len(counts):
        return counts
    sched = ctx.num_scheduled_tokens
    return [
        min(c, k + sched.get(rid, 0))
        for c, k, rid in zip(counts, computed, ctx.req_ids, strict=False)
    ]


def _survival(probs: Sequence[float], n: int) -> list[float] | None:
    """The survival of each of a draft's first ``n`` tokens from its per-token ``probs``
    (each given the earlier tokens right), or ``None`` where there are not ``n`` usable
    ones (a proposer's ``probs`` are not checked before this)."""
    try:
        if len(probs) < n:
            return None
        out: list[float] = []
        s = 1.0
        for p in probs[:n]:
            p = float(p)
            if not 0.0 <= p <= 1.0:
                return None
            s *= p
            out.append(s)
        return out
    except (TypeError, ValueError):
        return None


def decode_tags(
    extra: Mapping[str, Any] | None, metrics: DrafterMetrics, req_id: str = "?"
) -> StructureTags | None:
    """Decode a request's wire tags; on :class:`TagError` warn, count and return ``None``."""
    try:
        return tags_from_wire(extra)
    except TagError as exc:
        reason = _rejection_reason(exc)
        metrics.record_tag_rejection(reason)
        if sum(metrics.snapshot().tag_rejections.values()) <= _MAX_TAG_WARNINGS:
            logger.warning("request %s runs tag-free: %s", req_id, exc)
        return None


class DraftSession:
    """Per-request bookkeeping between vLLM's rows and one proposer (see module doc)."""

    def __init__(
        self,
        proposer: Proposer,
        k: int,
        *,
        max_model_len: int | None = None,
        metrics: DrafterMetrics | None = None,
        step_timer: MeasuredStepTime | None = None,
        clock: Callable[[], float] = time.perf_counter,
        step_clock: Callable[[], float] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if k < 1:
            raise ValueError(f"k={k} must be >= 1")
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size} must be >= 1 (the model's vocabulary)")
        self.proposer = proposer
        self.k = k
        self.vocab_size = vocab_size
        """Draft ids must be under this (the model's vocabulary; ``None``: not checked
        from above, only that ids are non-negative integers)."""
        self.max_model_len = max_model_len
        self.metrics = metrics or get_metrics()
        self._reqs: dict[str, _Request] = {}
        self._logged: set[str] = set()
        self.step_timer = step_timer
        self._clock = clock
        self._step_clock = step_clock
        self._last_end: float | None = None
        self._last_step_end: tuple[int, float] | None = None  # (thread, step clock)
        self._last_ids: frozenset[str] = frozenset()
        self._last_sched_step: int | None = None  # BatchContext.scheduler_step, last call
        self._gaps = 0  # gaps in the step numbers so far (steps without a draft call ran)
        self._fit_model: object = None  # the step timer's model last published
        self._fit_coef = (0.0, 0.0, 0.0)
        self._fit_draft = (0.0, 0.0, 0.0)  # c_spec_kv, c_draft_kv, seconds per emitted token
        self._next_blocks: dict[str, str] = {}
        """The block of each request drafted for by the last call, read after its propose."""
        block_of = getattr(proposer, "block_of", None)
        self._block_of: Callable[[str], str | None] | None = (
            block_of if callable(block_of) else None
        )
        self._takes_decoding = _takes_keyword(proposer.start, "decoding")
        """Whether the proposer's ``start`` takes the request's decoding regime."""

    @property
    def live_requests(self) -> frozenset[str]:
        """Request ids the proposer currently holds state for."""
        return frozenset(self._reqs)

    def _count_fault(self, kind: str) -> None:
        """``metrics.record_fault``, never raising into vLLM's engine loop (a metrics
        backend that fails is logged once)."""
        try:
            self.metrics.record_fault(kind)
        except Exception as exc:  # noqa: BLE001 - the step must go on
            if "record_fault" not in self._logged:
                self._logged.add("record_fault")
                logger.error("agentspec: counting a proposer fault failed: %r", exc)

    def _fault(self, verb: str, exc: BaseException) -> None:
        kind = f"{verb}:{type(exc).__name__}"
        self._count_fault(kind)
        if kind not in self._logged:
            self._logged.add(kind)
            logger.error(
                "proposer %r raised in %s (no drafts; logged once per kind, counted in "
                "agentspec_proposer_faults_total{kind=%r}): %r",
                getattr(self.proposer, "name", type(self.proposer).__name__),
                verb,
                kind,
                exc,
                exc_info=exc,
            )

    def _stop(self, req_id: str) -> None:
        self._reqs.pop(req_id, None)
        try:
            self.proposer.stop(req_id)
        except Exception as exc:
            self._fault("stop", exc)

    def _admit(
        self,
        req_id: str,
        extra: Mapping[str, Any] | None,
        prompt: np.ndarray,
        max_tokens: int | None,
        decoding: Decoding | None = None,
    ) -> _Request:
        tags = decode_tags(extra, self.metrics, req_id)
        state = _Request(
            fed=len(prompt),
            agent=self.metrics.agent_label(tags.agent_id if tags else None),
            segment=tags.segment if tags else None,
            scope=self.metrics.scope_label(tags.scope if tags else None),
            end=None if max_tokens is None else len(prompt) + max_tokens,
            prompt_len=len(prompt),
        )
        self._reqs[req_id] = state
        try:
            if decoding is None:
                self.proposer.start(req_id, prompt, tags)
            else:  # only for a proposer whose start takes it
                self.proposer.start(req_id, prompt, tags, decoding=decoding)  # type: ignore[call-arg]
        except Exception as exc:
            state.broken = True
            self._fault("start", exc)
        return state

    def _block(self, req_id: str, state: _Request) -> str:
        if self._block_of is not None:
            try:
                block = self._block_of(req_id)
            except Exception as exc:
                self._fault("block_of", exc)
                block = None
            if block:
                return block
        return state.segment or "none"

    def _keep_blocks(self, ask_ids: list[str], ask_rows: list[int], out: list[list[int]]) -> None:
        """Read the block of every request that got a draft whose ``Draft.block`` did not
        say it, for the metrics of its verification at the next call.

        ``block_of`` first applies the proposer's queued calls (AgentSpec's ``_flush``);
        right after ``propose`` there are none, so this is a plain lookup per row, made
        while the proposer's data is still in the CPU caches. At the next call a request's
        block is read before its own new tokens are fed, so it is the block read here (and
        the one a draft's ``block`` names: the block as the draft starts).
        What a lookup at verification did besides: its flush applied the queued calls
        early. For queued tokens and starts that changes nothing but cost (each request's
        own state, the index in call order); for queued stops it frees their slots before
        the call's later new requests start, which decides the slots they get (and so can
        change drafts): in a call with stops, the first verified row still asks the
        proposer, as every row did before. A lookup that raises here is left to the
        verification's own lookup (counted there, as before)."""
        block_of = self._block_of
        if block_of is None:
            return
        keep = self._next_blocks
        for rid, row in zip(ask_ids, ask_rows, strict=True):
            if not out[row] or rid in keep:
                continue
            try:
                block = block_of(rid)
            except Exception:
                continue
            state = self._reqs.get(rid)
            if state is not None:
                keep[rid] = block or state.segment or "none"

    def close(self) -> None:
        """Stop every live request."""
        for rid in list(self._reqs):
            self._stop(rid)

    def step(
        self,
        ctx: BatchContext | None,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
    ) -> list[list[int]]:
        """One vLLM draft call: returns one draft (at most ``k`` ids, or the step's
        ``ctx.num_spec_tokens`` where vLLM asks for fewer) per row."""
        t0 = self._clock()
        n = len(sampled_token_ids)
        timed = self.step_timer is not None and ctx is not None
        start = t0 if not timed or self._step_clock is None else self._step_clock()
        out: list[list[int]] = [[] for _ in range(n)]
        offered = 0
        blocks, self._next_blocks = self._next_blocks, {}
        stops_queued = False  # stops queued that no block lookup has applied yet
        verified: list[Verified] = []  # the rows' verified drafts, counted at the end
        try:
            if ctx is None:
                raise RuntimeError(
                    "no batch context: the agentspec vLLM plugin did not wrap this runner"
                )
            # engine steps ran since the last call without a draft call (vLLM skipped it
            # for the whole batch: a row within k tokens of max_model_len); not known
            # without the scheduler's step numbers
            sched_step, last_step = ctx.scheduler_step, self._last_sched_step
            self._last_sched_step = sched_step
            skipped = (
                sched_step is not None and last_step is not None and sched_step != last_step + 1
            )
            if skipped:
                self._gaps += 1
            # the rows' ids and token counts (as Python ints: a numpy scalar costs per
            # access), read once for the step timer and the rows
            present = frozenset(ctx.req_ids[:n])
            counts: list[int] = num_tokens_no_spec[:n].tolist()
            if timed:
                emitted = sum(len(row) for row in sampled_token_ids)
                self._time_step(ctx, present, counts, emitted, start, skipped)
            if len(ctx.req_ids) < n:
                raise RuntimeError(f"batch context has {len(ctx.req_ids)} rows, call has {n}")
            finished = ctx.finished_req_ids
            live = ctx.live_req_ids
            # an id vLLM finished may come back as a new request's; one the runner still
            # holds was only not scheduled this step: kept (a restart would insert its
            # history into the shared index again and lose what it learned)
            leavers = [
                r
                for r in self._reqs
                if r in finished or (r not in present and (live is None or r not in live))
            ]
            for rid in leavers:
                self._stop(rid)
            stops_queued = bool(leavers)
            max_len = self.max_model_len or ctx.max_model_len
            # names read once, not per row
            req_ids = ctx.req_ids
            spec = ctx.scheduled_spec_decode_tokens
            limits = ctx.max_tokens
            n_limits = len(limits)
            decodings = ctx.decoding if self._takes_decoding else ()
            n_decodings = len(decodings)
            get_state = self._reqs.get
            prompt_lens = ctx.num_prompt_tokens
            k = self.k if ctx.num_spec_tokens is None else max(0, min(self.k, ctx.num_spec_tokens))
            ask_ids: list[str] = []
            ask_rows: list[int] = []
            caps: list[int] = []
            # the rows' new tokens, fed in one extend_many after the loop
            ext_ids: list[str] = []
            ext_rows: list[int] = []
            ext_from: list[int] = []
            ext_to: list[int] = []
            ext_states: list[_Request] = []
            n_decoding = kv_decoding = 0  # every decoding row, asked for a draft or not
            for i in range(n):
                sampled = sampled_token_ids[i]
                if not sampled:  # a partial prefill, or a discarded row
                    continue
                rid = req_ids[i]
                num_tokens = counts[i]
                state = get_state(rid)
                if state is not None and (
                    num_tokens < state.fed or prompt_lens[i] != state.prompt_len
                ):
                    # fewer tokens than were fed, or another prompt: a new request under a
                    # finished one's id (its finish fell in a step without a draft call)
                    self._stop(rid)
                    stops_queued = True
                    state = None
                if state is None:
                    prompt = np.array(token_ids_cpu[i, : prompt_lens[i]], dtype=np.int32)
                    limit = limits[i] if i < n_limits else None
                    decoding = decodings[i] if i < n_decodings else None
                    state = self._admit(rid, ctx.extra_args[i], prompt, limit, decoding)
                else:
                    scheduled = spec.get(rid, ())
                    drafted = len(scheduled)
                    sent = state.sent
                    if (
                        sent is not None
                        and state.sent_gaps != self._gaps
                        and num_tokens - len(sampled) > state.fed
                    ):
                        # steps without a draft call ran since the draft was sent (at this
                        # call or one in between: under pipeline parallelism the request's
                        # last call was two or more calls ago), and the request emitted
                        # tokens in one (fed: its tokens when the draft was sent): the draft
                        # was verified there, in a step whose draft call vLLM skipped, and
                        # this step verified the zeros vLLM put in its place. Dropped, not
                        # counted: that step's schedule never reaches the drafter, so how
                        # much of the draft the scheduler kept (token budget, grammar) is not
                        # known — a rejection and a cut read alike in the tokens — and with
                        # several steps between the calls neither is the draft's own emitted
                        # count.
                        drafted = 0
                    if drafted and sent is not None and list(scheduled) == sent[:drafted]:
                        accepted = min(drafted, max(0, len(sampled) - 1))
                        block = None if stops_queued else blocks.get(rid)
                        if block is None:
                            block = self._block(rid, state)
                            stops_queued = False
                        # the scheduler may have cut the draft: the verified positions only
                        survival = None if state.probs is None else _survival(state.probs, drafted)
                        verified.append(
                            (state.agent, block, drafted, accepted, state.scope, survival)
                        )
                    state.probs = None
                    state.sent = None
                # the rows of the next step: not one that reached its length limit here
                if num_tokens < max_len and (state.end is None or num_tokens < state.end):
                    n_decoding += 1
                    kv_decoding += num_tokens
                if state.broken:
                    continue
                if num_tokens > state.fed:
                    ext_ids.append(rid)
                    ext_rows.append(i)
                    ext_from.append(state.fed)
                    ext_to.append(num_tokens)
                    ext_states.append(state)
                cap = min(k, max_len - num_tokens - 1)
                if state.end is not None:  # the step emits at most the tokens left, draft + 1
                    cap = min(cap, state.end - num_tokens - 1)
                if cap <= 0:
                    continue
                ask_ids.append(rid)
                ask_rows.append(i)
                caps.append(cap)
            if ext_ids and self._extend(
                ext_ids, ext_rows, ext_from, ext_to, ext_states, token_ids_cpu
            ):
                # a request whose extend raised drafts no more (from this step on)
                keep = [j for j, rid in enumerate(ask_ids) if not self._reqs[rid].broken]
                ask_ids = [ask_ids[j] for j in keep]
                ask_rows = [ask_rows[j] for j in keep]
                caps = [caps[j] for j in keep]
            if ask_ids:
                offered = sum(caps)
                context = StepContext(
                    batch_size=n_decoding,
                    num_kv_tokens=kv_decoding,
                    max_num_batched_tokens=ctx.max_num_batched_tokens,
                    num_decode_tokens=n_decoding,
                    # the scheduler's count, when the plugin's scheduler wrap made it
                    num_prefill_tokens=ctx.num_waiting_prompt_tokens,
                )
                out = self._propose(ask_ids, ask_rows, caps, k, context, out)
                self._keep_blocks(ask_ids, ask_rows, out)
        except Exception as exc:
            self._fault("adapter", exc)
            out = [[] for _ in range(n)]
        if verified:
            try:
                self.metrics.record_verified_many(verified)
            except Exception as exc:
                self._fault("metrics", exc)
        self._last_end = self._clock()
        if self.step_timer is not None:
            end = self._last_end if self._step_clock is None else self._step_clock()
            self._last_step_end = (threading.get_ident(), end)
        try:
            self.metrics.record_step(offered, sum(map(len, out)), self._last_end - t0)
        except Exception as exc:
            self._fault("metrics", exc)
        return out

    def _extend(
        self,
        rids: list[str],
        rows: list[int],
        lo: list[int],
        hi: list[int],
        states: list[_Request],
        token_ids_cpu: np.ndarray,
    ) -> bool:
        """Feed request ``rids[j]`` its tokens ``lo[j]:hi[j]`` of row ``rows[j]`` of
        ``token_ids_cpu``, copied into one fresh read-only array, in one ``extend_many``
        where the proposer has it (all or nothing: if it raises, each request is fed alone,
        so only a request whose own ``extend`` raises is lost), else one ``extend`` per
        request. Returns whether a request broke."""
        lens = [b - a for a, b in zip(lo, hi, strict=True)]
        toks = _gather(token_ids_cpu, rows, lo, hi, lens)
        # a fresh copy nobody writes: read-only, a proposer may keep it uncopied
        toks.flags.writeable = False
        many = getattr(self.proposer, "extend_many", None)
        if many is not None:
            try:
                many(rids, toks, lens)
            except Exception as exc:
                self._fault("extend_many", exc)
            else:
                for state, end in zip(states, hi, strict=True):
                    state.fed = end
                return False
        broke = False
        b = 0
        for rid, state, n, end in zip(rids, states, lens, hi, strict=True):
            a, b = b, b + n
            try:
                self.proposer.extend(rid, toks[a:b])
            except Exception as exc:
                state.broken = broke = True
                self._fault("extend", exc)
                continue
            state.fed = end
        return broke

    def _time_step(
        self,
        ctx: BatchContext,
        ids: frozenset[str],
        counts: list[int],
        emitted: int,
        t0: float,
        skipped: bool = False,
    ) -> None:
        """Report the engine step that ran since the last draft call (see module doc):
        ``ids`` are the call's request ids, ``counts`` its rows' token counts, ``emitted``
        the tokens the step sampled (accepted drafts included); ``skipped``: steps without
        a draft call ran since the last call (the gap spans them: not reported)."""
        timer = self.step_timer
        assert timer is not None
        try:
            last = self._last_step_end
            if (
                last is not None
                and not skipped
                and last[0] == threading.get_ident()  # a per-thread step clock: same thread
                and not ids.isdisjoint(self._last_ids)
            ):
                # the drafts of the step priced by their request's context (costmodel):
                # the drafting requests' KV tokens, and Σ drafts x KV tokens
                spec_kv = draft_kv = 0
                spec = ctx.scheduled_spec_decode_tokens
                kv = _kv_rows(ctx, counts)
                if spec:
                    for rid, num in zip(ctx.req_ids, kv, strict=False):
                        nd = len(spec.get(rid, ()))
                        if nd:
                            spec_kv += num
                            draft_kv += nd * num
                used = timer.observe(
                    sum(ctx.num_scheduled_tokens.values()),
                    sum(kv),
                    t0 - last[1],
                    spec_kv,
                    draft_kv,
                    emitted,
                )
                if used:
                    model = timer.model  # replaced at each refit: its floats read once
                    if model is not self._fit_model:
                        c = timer.linear_coefficients()
                        self._fit_model = model
                        self._fit_coef = (float(c[0]), float(c[1]), float(c[2]))
                        self._fit_draft = (
                            model.c_spec_kv,
                            model.c_draft_kv,
                            timer.emitted_cost,
                        )
                    self.metrics.record_step_model(
                        *self._fit_coef, timer.observed, *self._fit_draft
                    )
            self._last_ids = ids
        except Exception as exc:
            self._fault("step_timer", exc)

    def _propose(
        self,
        ask_ids: list[str],
        ask_rows: list[int],
        caps: list[int],
        k: int,
        context: StepContext,
        out: list[list[int]],
    ) -> list[list[int]]:
        try:
            drafts = self.proposer.propose(ask_ids, k, context)
            if len(drafts) != len(ask_ids):
                raise ValueError(f"propose returned {len(drafts)} drafts for {len(ask_ids)} rows")
        except Exception as exc:
            self._fault("propose", exc)
            return [[] for _ in out]
        cut: list[Any] = []  # each row's ids cut to its cap (None: unreadable)
        for rid, cap, draft in zip(ask_ids, caps, drafts, strict=True):
            try:
                ids = draft.token_ids[:cap]
                len(ids)
            except Exception as exc:  # not a Draft, or token_ids not a sequence
                self._bad_draft(rid, f"unreadable draft {draft!r}: {exc!r}")
                ids = None
            cut.append(ids)
        # the common call: every id a plain int in range, checked once for all rows
        checked = _all_plain_ids(cut, self.vocab_size)
        for rid, row, draft, ids in zip(ask_ids, ask_rows, drafts, cut, strict=True):
            if ids is None:
                continue
            if checked:
                out[row] = list(ids)
            else:
                try:
                    problem = _bad_ids(ids, self.vocab_size)
                except Exception as exc:  # e.g. ids that cannot be compared
                    problem = f"unreadable draft {draft!r}: {exc!r}"
                if problem is not None:
                    self._bad_draft(rid, problem)
                    continue
                out[row] = list(map(int, ids))
            if len(ids):
                state = self._reqs.get(rid)
                if state is not None:
                    state.sent = out[row]
                    state.sent_gaps = self._gaps
                    state.probs = getattr(draft, "probs", None)  # optional: estimates
                    block = getattr(draft, "block", None)
                    if block and self._block_of is not None:  # else looked up (_keep_blocks)
                        self._next_blocks[rid] = str(block)
        return out

    def _bad_draft(self, req_id: str, problem: str) -> None:
        """Count (and log once) a dropped draft row."""
        self._count_fault(BAD_DRAFT)
        if BAD_DRAFT not in self._logged:
            self._logged.add(BAD_DRAFT)
            logger.error(
                "proposer %r returned a bad draft for request %s, dropped (no drafts for that "
                "row; logged once, counted in agentspec_proposer_faults_total{kind=%r}): %s",
                getattr(self.proposer, "name", type(self.proposer).__name__),
                req_id,
                BAD_DRAFT,
                problem,
            )
