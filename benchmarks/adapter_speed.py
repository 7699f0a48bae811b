"""Adapter speed: what one vLLM draft call costs inside the engine, and where it goes.

Drives :class:`~agentspec_mw_vllm.session.DraftSession` as
:class:`~agentspec_mw_vllm.adapter.AgentSpecDrafter` builds it (the proposer from the
registry on a :class:`~agentspec_mw.proposer.ProposerEnv` of the tokenizer's token bytes,
``cost_model="measured"``: a :class:`~agentspec_mw.costfit.MeasuredStepTime` with the
``--cost-prior`` preset as prior, the session's step timer; the process's
:class:`~agentspec_mw_vllm.metrics.DrafterMetrics` with its Prometheus mirror; the
model's vocabulary size) from a recorded trace, with a synthetic engine around it:
``--batch`` calls in flight (each run's calls one after another, as the replay runs
them), each step one row per request in vLLM's condensed row order, the rows' token
buffer (``token_ids_cpu``) and ``num_tokens_no_spec`` kept as vLLM keeps them, and each
request's last draft verified against its recorded output (accepted = the common prefix;
the row samples ``accepted + 1`` tokens; a new request's first row is its prefill's
token). Each call's :class:`~agentspec_mw_vllm.context.BatchContext` is read by the
plugin's :func:`~agentspec_mw_vllm.plugin.build_batch_context` off a stand-in model runner
(its input batch, and one request state per row whose ``SamplingParams`` hold the wire tags
and a ``max_tokens`` of the recorded output + ``k`` + 1, so that no draft is cut by it) and
a stand-in ``SchedulerOutput`` (the drafts verified and the tokens scheduled), inside the
timed call, as vLLM's patched runner does before each draft call.

The engine's step time the session measures between draft calls comes from a simulated
clock advanced by the ``--cost-prior`` preset's step time of each step (the adapter uses
``time.thread_time`` on vLLM's CPU build; a simulated clock keeps the fit, and so the
drafts, the same from run to run): the ``drafts sha256`` printed per batch size is
identical for two code versions that draft identically.

Printed per batch size: per step p50 / p90 / mean (microseconds) of the whole draft call
(the context read, then ``DraftSession.step``) and of ``propose`` inside it (``--mode plain``:
nothing else wrapped); with ``--mode parts`` every other part is bracketed too (``perf_counter``
wrappers set on the objects by this script, not in the library): ``context`` (the plugin's
read of the batch), ``start`` (with
``decode_tags``), ``feed`` (the session's ``_extend``: the call's new tokens gathered and
given to the proposer; of which ``extend``, its ``extend`` and ``extend_many`` calls),
``stop``, ``block_of``,
``_time_step`` (of which ``observe``, the fit, and ``record_step_model``),
``record_verified_many``, ``record_step``,
``_bad_ids``, and ``rest`` = step - all of those (the session's own loop: numpy
conversions, ``StepContext``, bookkeeping, and the wrappers' own cost). ``--mode kernels``
(AgentSpec) also brackets the parts of ``propose``: ``flush`` (the queued starts, stops and
new tokens applied, ``kernels.apply_extends`` among them; a flush from ``block_of`` stays in
``block_of``), ``gather``, ``lookup`` (the
history index), ``local_drafts``, ``score``, ``admission_bounds``, ``allocate``,
``keep_candidates``, ``emit_drafts``, and ``propose_own`` = ``propose`` - those. ``--profile``
adds ``cProfile``'s top 25 functions (by own time) after each run.

``--thrash-kib N`` touches an N KiB buffer between draft calls, as a model forward
evicts the CPU caches (0: off). ``--refit-every N`` sets the step-time fit's cadence (to
price it; any value but the default changes the fit between refits, so the drafts).

    python benchmarks/adapter_speed.py --trace benchmarks/traces/engine_demo.jsonl.xz \\
        --tokenizer default --batch 1,8,32 --k 8 --repeat 3

Before/after a change: run the same script in a snapshot of the old tree (``git archive
HEAD | tar -x -C DIR``, this script copied in) and here, alternately; ``--json`` keeps
each run's rows.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from _replay_setup import load_workloads

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "integrations" / "vllm"))

import agentspec_mw_vllm.session as session_mod  # noqa: E402
from agentspec_mw.costfit import MeasuredStepTime  # noqa: E402
from agentspec_mw.costmodel import get_cost_model  # noqa: E402
from agentspec_mw.proposer import ProposerEnv  # noqa: E402
from agentspec_mw.registry import make_proposer  # noqa: E402
from agentspec_mw.replay.sim import ReplayCall, accepted_length  # noqa: E402
from agentspec_mw.tags import tags_to_wire  # noqa: E402
from agentspec_mw_vllm.metrics import DrafterMetrics  # noqa: E402
from agentspec_mw_vllm.plugin import build_batch_context  # noqa: E402
from agentspec_mw_vllm.session import DraftSession  # noqa: E402

PARTS = (
    "context",
    "propose",
    "start",
    "feed",
    "extend",
    "stop",
    "block_of",
    "time_step",
    "observe",
    "record_step_model",
    "record_verified_many",
    "record_step",
    "bad_ids",
    "rest",
)
#: the parts of AgentSpec's ``propose`` (``--mode kernels``): its queued-call flush, the
#: kernels (module :mod:`agentspec_mw.agentspec.kernels`), the index lookup and the budget
KERNEL_PARTS = (
    "flush",
    "gather",
    "lookup",
    "local_drafts",
    "score",
    "admission_bounds",
    "allocate",
    "keep_candidates",
    "emit_drafts",
)
#: parts timed inside another part (not subtracted again for ``rest``) -> that part
NESTED = {
    "observe": "time_step",
    "record_step_model": "time_step",
    "extend": "feed",
} | dict.fromkeys(KERNEL_PARTS, "propose")


class SimClock:
    """The engine's step clock: advanced by the simulated step times."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Timers:
    """Per-step sums of the bracketed parts."""

    def __init__(self) -> None:
        self.cur: dict[str, float] = dict.fromkeys((*PARTS, *KERNEL_PARTS), 0.0)
        self.steps: list[dict[str, float]] = []

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        cur = self.cur
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                cur[part] += clock() - t0

        return timed

    def close_step(self, whole: float) -> None:
        row = dict(self.cur)
        row["rest"] = whole - sum(v for k, v in row.items() if k not in NESTED and k != "rest")
        row["step"] = whole
        row["propose_own"] = row["propose"] - sum(row[k] for k in KERNEL_PARTS)
        self.steps.append(row)
        for k in self.cur:
            self.cur[k] = 0.0


class _Live:
    """A call in the synthetic engine."""

    __slots__ = ("call", "draft", "pos", "run", "wire")

    def __init__(self, call: ReplayCall, run: deque[ReplayCall]) -> None:
        self.call = call
        self.run = run
        self.pos = 0  # output tokens emitted
        self.draft: list[int] = []
        self.wire = tags_to_wire(call.tags) if call.tags is not None else None


def build_session(
    name: str,
    token_bytes: list[bytes],
    k: int,
    prior: str,
    max_len: int,
    clock: SimClock,
    refit_every: int | None = None,
) -> DraftSession:
    """The session as the adapter builds it with ``cost_model="measured"`` (``refit_every``:
    the fit's cadence, ``None`` for its default)."""
    opts = {} if refit_every is None else {"refit_every": refit_every}
    step_timer = MeasuredStepTime(prior=get_cost_model(prior), **opts)
    env = ProposerEnv(token_bytes=token_bytes, cost_model=step_timer, max_k=k)
    proposer = make_proposer(name, env)
    return DraftSession(
        proposer,
        k,
        max_model_len=max_len,
        metrics=DrafterMetrics(),
        step_timer=step_timer,
        step_clock=clock,
        vocab_size=len(token_bytes),
    )


def instrument(session: DraftSession, timers: Timers) -> None:
    """Bracket every part of ``session.step`` (instance attributes and the session
    module's two helper functions)."""
    p = session.proposer
    for verb in ("propose", "start", "extend", "stop"):
        setattr(p, verb, timers.wrap(verb, getattr(p, verb)))
    if getattr(p, "extend_many", None) is not None:
        p.extend_many = timers.wrap("extend", p.extend_many)
    session._extend = timers.wrap("feed", session._extend)  # type: ignore[method-assign]
    if session._block_of is not None:
        session._block_of = timers.wrap("block_of", session._block_of)
    session._time_step = timers.wrap("time_step", session._time_step)  # type: ignore[method-assign]
    if session.step_timer is not None:
        st = session.step_timer
        st.observe = timers.wrap("observe", st.observe)  # type: ignore[method-assign]
    m = session.metrics
    for part in ("record_step_model", "record_verified_many", "record_step"):
        setattr(m, part, timers.wrap(part, getattr(m, part)))
    session_mod._bad_ids = timers.wrap("bad_ids", session_mod._bad_ids)
    session_mod.decode_tags = timers.wrap("start", session_mod.decode_tags)


def instrument_kernels(session: DraftSession, timers: Timers) -> Callable[[], None]:
    """Bracket the parts of AgentSpec's ``propose`` (:data:`KERNEL_PARTS`); returns the
    undo (the kernels and the budget functions are module attributes)."""
    from agentspec_mw.agentspec import kernels
    from agentspec_mw.agentspec import proposer as proposer_mod

    p: Any = session.proposer
    inside = [False]  # in propose: a flush elsewhere (block_of's) stays its caller's time
    flush, timed_flush = p._flush, timers.wrap("flush", p._flush)
    p._flush = lambda: timed_flush() if inside[0] else flush()
    propose = p.propose

    def flagged(*args: Any, **kwargs: Any) -> Any:
        inside[0] = True
        try:
            return propose(*args, **kwargs)
        finally:
            inside[0] = False

    p.propose = flagged
    p._index.lookup = timers.wrap("lookup", p._index.lookup)
    saved = []
    for module, names in (
        (kernels, ("gather", "local_drafts", "score", "keep_candidates", "emit_drafts")),
        (proposer_mod, ("admission_bounds", "allocate")),
    ):
        for name in names:
            fn = getattr(module, name)
            saved.append((module, name, fn))
            setattr(module, name, timers.wrap(name, fn))

    def undo() -> None:
        for module, name, fn in saved:
            setattr(module, name, fn)

    return undo


def drive(
    calls: list[ReplayCall],
    session: DraftSession,
    clock: SimClock,
    *,
    batch: int,
    max_len: int,
    max_batched: int,
    prior: str,
    thrash_kib: int,
    timers: Timers | None,
    max_steps: int | None,
) -> tuple[list[float], str, int]:
    """Run the synthetic engine; returns per-step ``step`` seconds, the drafts' digest
    and the tokens accepted."""
    cost = get_cost_model(prior)
    runs: dict[str, deque[ReplayCall]] = {}
    for c in calls:
        if len(c.prompt) + len(c.output) + 2 <= max_len and len(c.output):
            runs.setdefault(c.run_id, deque()).append(c)
    pending = deque(runs.values())
    buf = np.zeros((batch, max_len), dtype=np.int32)
    num = np.zeros(batch, dtype=np.int32)
    rows: list[_Live] = []
    thrash = np.zeros(thrash_kib * 128, dtype=np.float64) if thrash_kib else None
    digest = hashlib.sha256()
    whole: list[float] = []
    accepted_total = 0
    ready: deque[deque[ReplayCall]] = deque()  # runs whose next call may start
    # vLLM's request states, as the plugin reads them (one per live request)
    states: dict[str, SimpleNamespace] = {}
    step_no = 0
    while rows or pending or ready:
        if max_steps is not None and step_no >= max_steps:
            break
        # leavers go (vLLM condenses: the last row fills the hole); their run goes on
        i = 0
        while i < len(rows):
            if rows[i].pos >= len(rows[i].call.output):
                if rows[i].run:
                    ready.append(rows[i].run)
                del states[rows[i].call.req_id]
                last = len(rows) - 1
                if i != last:
                    rows[i] = rows[last]
                    buf[i] = buf[last]
                    num[i] = num[last]
                rows.pop()
                continue
            i += 1
        sampled: list[list[int]] = []
        spec: dict[str, list[int]] = {}
        scheduled: dict[str, int] = {}
        for r, live in enumerate(rows):  # verify each row's draft against its recording
            out = live.call.output
            d = live.draft
            acc = accepted_length(d, out[live.pos :]) if d else 0
            new = [int(t) for t in out[live.pos : live.pos + acc + 1]]
            if d:
                spec[live.call.req_id] = d
            scheduled[live.call.req_id] = 1 + len(d)
            accepted_total += acc
            base = len(live.call.prompt) + live.pos
            buf[r, base : base + len(new)] = new
            num[r] = base + len(new)
            live.pos += len(new)
            sampled.append(new)
        while len(rows) < batch and (ready or pending):  # arrivals: prefill in one step
            run = ready.popleft() if ready else pending.popleft()
            call = run.popleft()
            live = _Live(call, run)
            limit = len(call.output) + session.k + 1  # never cuts a draft (module doc)
            params = SimpleNamespace(extra_args=live.wire, max_tokens=limit)
            states[call.req_id] = SimpleNamespace(sampling_params=params)
            r = len(rows)
            rows.append(live)
            plen = len(call.prompt)
            buf[r, :plen] = call.prompt
            buf[r, plen] = call.output[0]
            num[r] = plen + 1
            live.pos = 1
            sampled.append([int(call.output[0])])
            scheduled[call.req_id] = plen
        if not rows:
            continue
        runner = SimpleNamespace(
            input_batch=SimpleNamespace(
                num_reqs=len(rows),
                req_ids=[x.call.req_id for x in rows],
                num_prompt_tokens=np.array([len(x.call.prompt) for x in rows], dtype=np.int32),
            ),
            requests=states,
            scheduler_config=SimpleNamespace(max_num_batched_tokens=max_batched),
            max_model_len=max_len,
        )
        sched = SimpleNamespace(
            scheduled_spec_decode_tokens=spec,
            num_scheduled_tokens=scheduled,
            finished_req_ids=frozenset(),
        )
        clock.now += cost.step_time(float(sum(scheduled.values())), float(np.sum(num[: len(rows)])))
        if thrash is not None:
            thrash += 1.0
        t0 = time.perf_counter()
        ctx = build_batch_context(runner, sched)
        if timers is not None:
            timers.cur["context"] += time.perf_counter() - t0
        drafts = session.step(ctx, sampled, num, buf)
        dt = time.perf_counter() - t0
        whole.append(dt)
        if timers is not None:
            timers.close_step(dt)
        for r, live in enumerate(rows):
            live.draft = drafts[r]
            digest.update(f"{step_no}:{live.call.req_id}:{drafts[r]};".encode())
        step_no += 1
    session.close()
    return whole, digest.hexdigest(), accepted_total


def _pct(xs: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1e6, q)) if len(xs) else float("nan")


def _commit() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--proposer", default="agentspec")
    ap.add_argument("--batch", default="1,8,32", help="comma list")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--cost-prior", default="cpu-smollm2")
    ap.add_argument("--tags", choices=("trace", "none"), default="trace")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-steps", type=int, default=None, help="per batch size")
    ap.add_argument("--repeat", type=int, default=1, help="runs per batch size (fresh session)")
    ap.add_argument("--mode", choices=("plain", "parts", "kernels"), default="plain")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--thrash-kib", type=int, default=0)
    ap.add_argument(
        "--refit-every",
        type=int,
        default=None,
        help="the step-time fit's cadence (default: MeasuredStepTime's; another changes drafts)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    setup = load_workloads(  # serial: a step of batch N has N requests (as timed before)
        [args.trace],
        args.tokenizer,
        max_k=args.k,
        cost_model=args.cost_prior,
        tags=args.tags,
        serial_runs=True,
    )
    ((workload, calls),) = setup.workloads.items()
    token_bytes = list(setup.env.token_bytes or [])
    print(
        f"adapter_speed: {workload}, {len(calls)} calls, proposer {args.proposer}, k {args.k}, "
        f"mode {args.mode}, code {_commit()} ({Path(session_mod.__file__).parent}), "
        f"load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    head = ("batch", "run", "steps", "step p50", "p90", "mean", "propose p50", "mean", "sha256")
    print("".join(f"{h:>{w}}" for h, w in zip(head, (6, 4, 7, 10, 8, 8, 12, 8, 18), strict=True)))
    report: list[dict[str, Any]] = []
    for b in (int(x) for x in args.batch.split(",")):
        for rep in range(args.repeat):
            clock = SimClock()
            session = build_session(
                args.proposer,
                token_bytes,
                args.k,
                args.cost_prior,
                args.max_model_len,
                clock,
                args.refit_every,
            )
            timers = Timers()
            undo_kernels: Callable[[], None] | None = None
            if args.mode in ("parts", "kernels"):
                instrument(session, timers)
                if args.mode == "kernels":
                    undo_kernels = instrument_kernels(session, timers)
            else:
                p = session.proposer
                p.propose = timers.wrap("propose", p.propose)  # type: ignore[method-assign]
            prof = cProfile.Profile() if args.profile else None
            if prof is not None:
                prof.enable()
            whole, sha, accepted = drive(
                calls,
                session,
                clock,
                batch=b,
                max_len=args.max_model_len,
                max_batched=args.max_batched_tokens,
                prior=args.cost_prior,
                thrash_kib=args.thrash_kib,
                timers=timers,
                max_steps=args.max_steps,
            )
            if prof is not None:
                prof.disable()
            if args.mode != "plain":  # restore the module's helpers for the next session
                session_mod._bad_ids = _BAD_IDS
                session_mod.decode_tags = _DECODE_TAGS
            if undo_kernels is not None:
                undo_kernels()
            prop = [s["propose"] for s in timers.steps]
            print(
                f"{b:>6}{rep:>4}{len(whole):>7}{_pct(whole, 50):>10.1f}{_pct(whole, 90):>8.1f}"
                f"{1e6 * float(np.mean(whole)):>8.1f}{_pct(prop, 50):>12.1f}"
                f"{1e6 * float(np.mean(prop)):>8.1f}{sha[:16]:>18}",
                flush=True,
            )
            row: dict[str, Any] = {
                "batch": b,
                "run": rep,
                "steps": len(whole),
                "accepted": accepted,
                "sha256": sha,
                "step_us": {"p50": _pct(whole, 50), "p90": _pct(whole, 90)},
                "load": os.getloadavg()[0],
            }
            if args.mode != "plain":
                shown = (*PARTS, "step")
                if args.mode == "kernels":
                    shown = (*PARTS, *KERNEL_PARTS, "propose_own", "step")
                parts = {
                    part: {
                        "p50": _pct([s[part] for s in timers.steps], 50),
                        "p90": _pct([s[part] for s in timers.steps], 90),
                        "mean": 1e6 * float(np.mean([s[part] for s in timers.steps])),
                    }
                    for part in shown
                }
                row["parts_us"] = parts
                print("      part                   p50      p90     mean (us per step)")
                for part, v in parts.items():
                    parent = NESTED.get(part, "propose" if part == "propose_own" else None)
                    nest = f"  (in {parent})" if parent else ""
                    print(
                        f"      {part:<20}{v['p50']:>8.1f} {v['p90']:>8.1f} {v['mean']:>8.1f}{nest}"
                    )
            report.append(row)
            if prof is not None:
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
                print(s.getvalue())
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"commit": _commit(), "args": vars(args), "rows": report}, indent=1)
        )


_BAD_IDS = session_mod._bad_ids
_DECODE_TAGS = session_mod.decode_tags

if __name__ == "__main__":
    main()
