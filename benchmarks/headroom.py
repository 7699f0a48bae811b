"""Where a replay's simulated time goes, and the ceiling for any drafter.

Replays each workload at each batch with ``none``, the given proposers and an **oracle**
(drafts the recorded next ``k`` tokens: always accepted, the most a drafter of length ``k``
can be accepted for) on ``agentspec replay``'s scheduler and cost model, no proposer time.
Every engine step is recorded as the scheduler built it: prompt tokens prefilled (chunks
and recomputation), decode tokens (one per decoding request), draft tokens kept, resident
KV, whether a waiting call found no KV room, and its simulated time. Per run it prints:

* the time split: steps carrying a prefill chunk vs pure decode steps, and (linear presets)
  the step-time model's terms — fixed per step, per prefill / decode / draft token, per
  resident KV token — which add up to the run's time exactly;
* speedups over ``none``, the oracle's, and the ceiling ``oracle / suffix``;
* for each pair of proposers, the *gap arithmetic*: the difference of their times as the
  sum of the terms above (fewer steps, fewer KV reads, more drafts, more or less prefill),
  in % of the slower one's time, beside their accepted tokens per decode call-step.

    python benchmarks/headroom.py --traces ../shared/traces/tau_bench_airline.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 32,64,256 --k 16

The per-step record comes from the replay's ``on_step`` hook
(:class:`agentspec_mw.replay.sim.StepRecord`; ``test_headroom.py`` checks that the steps'
times add up to the replay's own). Deterministic: no wall-clock time enters the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from _replay_setup import load_workloads  # noqa: F401  (puts this checkout first on sys.path)

from agentspec_mw.costmodel import StepTimeModel, get_cost_model
from agentspec_mw.proposer import Draft, Proposer, ProposerEnv, StepContext, TokenIds
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.run import build_calls
from agentspec_mw.replay.sim import (
    ReplayCall,
    StepRecord,
    WorkloadRun,
    accepted_length,
    replay_workload,
)
from agentspec_mw.tags import StructureTags
from agentspec_mw.tokens import token_bytes_table
from agentspec_mw.traces.tokenized import load_tokenizer, tokenize_trace

ORACLE = "oracle"
#: The ways :class:`BestOf` combines drafters (``MODE:a+b`` proposer names).
MODES = ("best", "trim", "shadow", "tree")
#: The step-time terms of a linear preset, in the order :func:`terms` returns them.
TERMS = ("fixed", "prefill", "decode", "draft", "kv")


class OracleProposer:
    """Drafts the recorded continuation of each call: every drafted token is accepted
    (the tests' ``Oracle`` in ``tests/test_replay.py``, keyed by the calls' ids)."""

    name = ORACLE

    def __init__(self, calls: Sequence[ReplayCall]) -> None:
        self.truth = {c.req_id: c.output for c in calls}
        self.pos: dict[str, int] = {}

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        self.pos[req_id] = 0

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        self.pos[req_id] += len(token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        out = []
        for r in req_ids:
            p = self.pos[r]
            out.append(Draft(tuple(int(t) for t in self.truth[r][p : p + k])))
        return out

    def stop(self, req_id: str) -> None:
        self.pos.pop(req_id, None)


class BestOf:
    """Runs several proposers on the same calls (each sees every ``start``/``extend``/
    ``stop``) and scores each one's draft against the recorded output at every step.

    ``best:a+b`` drafts, per request and step, the draft of theirs the output accepts most
    of (ties: the shorter): the ceiling of *choosing* between those drafters, not of
    drafting better. ``trim:a+b`` (or ``trim:a``) drafts that one cut to its accepted
    prefix: a perfect choice *and* a perfect length (no rejected token is drafted), the
    ceiling of any budget over those drafts as they come. ``shadow:a+b`` drafts ``a``'s;
    ``b`` only shadows it: its accepted tokens are counted at ``a``'s positions
    (``parts_accepted``), which is how a per-call-step comparison made on one drafter's
    steps reads the other. ``tree:a+b`` verifies both drafts as a two-branch token tree
    (no oracle: the engine accepts the branch the output follows further): it costs a
    token per tree node (``a``'s tokens, then ``b``'s past their common prefix, ``b`` cut
    so that the tree holds at most ``k``) and is accepted for the longer accepted branch;
    it is drafted here as that branch's accepted tokens, then rejected filler up to the
    tree's size — what a tree-attention verifier would cost and emit, had the engine one
    for these drafters."""

    def __init__(self, parts: Sequence[Proposer], calls: Sequence[ReplayCall], mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        self.parts, self.mode = list(parts), mode
        self.name = f"{mode}:" + "+".join(p.name for p in parts)
        self.truth = OracleProposer(calls)
        self.accepted = np.zeros(len(self.parts))
        """Per part: tokens of its drafts (whole, before the scheduler's trim) accepted."""
        self.slots = 0
        """Drafts asked for (decoding requests × steps)."""

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        self.truth.start(req_id, prompt_ids, tags)
        for p in self.parts:
            p.start(req_id, prompt_ids, tags)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        self.truth.extend(req_id, token_ids)
        for p in self.parts:
            p.extend(req_id, token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        truths = [np.asarray(t.token_ids) for t in self.truth.propose(req_ids, k, step)]
        each = [p.propose(req_ids, k, step) for p in self.parts]
        out = []
        self.slots += len(req_ids)
        for i, t in enumerate(truths):
            acc = [accepted_length(d[i].token_ids, t) for d in each]
            self.accepted += acc
            if self.mode == "shadow":
                out.append(each[0][i])
                continue
            if self.mode == "tree":
                out.append(_tree_draft([d[i] for d in each[:2]], t, k))
                continue
            j = max(range(len(each)), key=lambda j: (acc[j], -len(each[j][i])))
            d = each[j][i]
            if self.mode == "trim" and len(d) > acc[j]:
                d = Draft(d.token_ids[: acc[j]], d.probs[: acc[j]])
            out.append(d)
        return out

    def stop(self, req_id: str) -> None:
        self.truth.stop(req_id)
        for p in self.parts:
            p.stop(req_id)


def _tree_draft(branches: Sequence[Draft], truth: np.ndarray, k: int) -> Draft:
    """Two drafts as a tree of at most ``k`` nodes, as a linear draft of the same size
    that the output accepts as far as the better branch (``BestOf``'s ``tree`` mode)."""
    a = np.asarray(branches[0].token_ids, dtype=np.int64)
    b = np.asarray(branches[1].token_ids, dtype=np.int64)
    m = min(len(a), len(b))
    differ = np.flatnonzero(a[:m] != b[:m])
    shared = int(differ[0]) if len(differ) else m  # their common prefix
    b = b[: max(shared, k - len(a) + shared)]
    size = len(a) + len(b) - shared
    acc, win = max(((accepted_length(x, truth), x) for x in (a, b)), key=lambda p: p[0])
    toks = [int(v) for v in win[:acc]]
    if size > acc:
        nxt = int(truth[acc]) if acc < len(truth) else 0
        toks += [nxt + 1 if nxt == 0 else nxt - 1] * (size - acc)  # rejected at once
    return Draft(tuple(toks))


@dataclass
class Steps:
    """One replay's engine steps as the scheduler built them (parallel lists)."""

    prefill: list[int] = field(default_factory=list)
    """Prompt tokens computed (chunks, recomputation after preemption)."""
    decode: list[int] = field(default_factory=list)
    """Decoding requests scheduled (one decode token each)."""
    draft: list[int] = field(default_factory=list)
    """Draft tokens kept by the scheduler."""
    kv: list[int] = field(default_factory=list)
    """Resident KV tokens of the scheduled requests after the step (the model's N_kv)."""
    rows: list[int] = field(default_factory=list)
    """Logits rows (decode and draft tokens, one per prefill chunk)."""
    kv_wait: list[bool] = field(default_factory=list)
    """A waiting call found no KV room in this step."""
    time_s: list[float] = field(default_factory=list)
    spec_kv: list[int] = field(default_factory=list)
    """KV tokens of the drafting requests (models that price drafts by context)."""
    draft_kv: list[int] = field(default_factory=list)
    """Σ draft tokens × their request's KV tokens (as ``spec_kv``)."""


def recorder(steps: Steps) -> Callable[[StepRecord], None]:
    """An ``on_step`` hook for :func:`replay_workload` that appends each step to ``steps``."""

    def on_step(st: StepRecord) -> None:
        steps.prefill.append(st.prefill_tokens)
        steps.decode.append(st.decoding)
        steps.draft.append(st.draft_tokens)
        steps.kv.append(st.kv_tokens)
        steps.rows.append(st.rows)
        steps.kv_wait.append(st.kv_wait)
        steps.time_s.append(st.time_s)
        steps.spec_kv.append(st.spec_kv)
        steps.draft_kv.append(st.draft_kv)

    return on_step


def terms(cost: StepTimeModel, s: Steps) -> dict[str, float] | None:
    """Seconds of each step-time term over the run (linear presets; ``None`` otherwise)."""
    if cost.form != "linear":
        return None
    c_row = cost.c_row  # a logits row: each decode and draft token, one per prefill chunk
    chunks = sum(s.rows) - sum(s.decode) - sum(s.draft)
    return {
        "fixed": (cost.c_fix + cost.c_oh) * len(s.time_s),
        "prefill": cost.c_tok * sum(s.prefill) + c_row * chunks,
        "decode": (cost.c_tok + c_row) * sum(s.decode),
        "draft": (cost.c_tok + c_row) * sum(s.draft)
        + cost.c_spec_kv * float(sum(s.spec_kv))
        + cost.c_draft_kv * float(sum(s.draft_kv)),
        "kv": cost.c_kv * float(sum(s.kv)),
    }


@dataclass
class Run:
    """The decomposition of one proposer × workload × batch replay."""

    proposer: str
    workload: str
    batch: int
    k: int
    time_s: float
    speedup: float
    steps: int
    prefill_steps: int
    """Steps carrying at least one prefill chunk."""
    prefill_step_time_s: float
    decode_step_time_s: float
    kv_wait_steps: int
    kv_wait_time_s: float
    prefill_tokens: int
    decode_tokens: int
    """Decode call-steps (one token each, plus what the drafts add)."""
    draft_tokens: int
    accepted: int
    output_tokens: int
    call_steps: int
    """Call-steps that emitted tokens (prefill completions included)."""
    mean_decode_batch: float
    """Decoding requests per pure decode step."""
    terms_s: dict[str, float] | None
    parts_accepted: dict[str, float] | None = None
    """``best:``/``shadow:`` runs: each part's draft, whole, accepted tokens per draft
    asked for, at this run's positions."""

    @property
    def accepted_per_decode_step(self) -> float:
        return self.accepted / self.decode_tokens if self.decode_tokens else 0.0


def decompose(
    name: str, wl: str, batch: int, k: int, r: WorkloadRun, s: Steps, cost: StepTimeModel
) -> Run:
    t = np.asarray(s.time_s)
    has_pre = np.asarray(s.prefill) > 0
    waits = np.asarray(s.kv_wait, dtype=bool)
    dec = np.asarray(s.decode)
    pure = ~has_pre
    return Run(
        proposer=name,
        workload=wl,
        batch=batch,
        k=k,
        time_s=float(t.sum()),
        speedup=math.nan,
        steps=len(t),
        prefill_steps=int(has_pre.sum()),
        prefill_step_time_s=float(t[has_pre].sum()),
        decode_step_time_s=float(t[pure].sum()),
        kv_wait_steps=int(waits.sum()),
        kv_wait_time_s=float(t[waits].sum()),
        prefill_tokens=int(sum(s.prefill)),
        decode_tokens=int(dec.sum()),
        draft_tokens=int(sum(s.draft)),
        accepted=r.accepted,
        output_tokens=r.output_tokens,
        call_steps=r.steps,
        mean_decode_batch=float(dec[pure].mean()) if pure.any() else 0.0,
        terms_s=terms(cost, s),
    )


def replay_one(
    name: str,
    calls: list[ReplayCall],
    env: ProposerEnv,
    cost: StepTimeModel,
    batch: int,
    k: int,
    wl: str,
) -> Run:
    """Replay ``calls`` with proposer ``name``: ``oracle``, ``best:a+b``, ``trim:a+b``,
    ``shadow:a+b`` (see :class:`BestOf`) or a registry name."""
    prop: Proposer
    if name == ORACLE:
        prop = OracleProposer(calls)
    elif name.partition(":")[0] in MODES:
        mode, _, parts = name.partition(":")
        prop = BestOf([make_proposer(p, env) for p in parts.split("+")], calls, mode)
    else:
        prop = make_proposer(name, env)
    steps = Steps()
    r = replay_workload(
        calls,
        prop,
        batch=batch,
        k=0 if name == "none" else k,
        cost_model=cost,
        on_step=recorder(steps),
    )
    if not math.isclose(sum(steps.time_s), r.sim_time_s, rel_tol=1e-9, abs_tol=1e-9):
        raise RuntimeError(
            f"{name} {wl} b={batch}: recorded steps add to {sum(steps.time_s)} s, the replay "
            f"to {r.sim_time_s} s (proposer time added?)"
        )
    run = decompose(name, wl, batch, k, r, steps, cost)
    if isinstance(prop, BestOf):
        slots = max(prop.slots, 1)
        run.parts_accepted = {
            p.name: float(a) / slots for p, a in zip(prop.parts, prop.accepted, strict=True)
        }
    return run


def gap(slow: Run, fast: Run) -> dict[str, float]:
    """``slow.time - fast.time`` as the sum of its terms, each in % of ``slow.time``:
    the linear terms where there are, else prefill-step and decode-step time."""
    base = slow.time_s
    if slow.terms_s is not None and fast.terms_s is not None:
        out = {t: 100 * (slow.terms_s[t] - fast.terms_s[t]) / base for t in TERMS}
    else:
        out = {
            "prefill_steps": 100 * (slow.prefill_step_time_s - fast.prefill_step_time_s) / base,
            "decode_steps": 100 * (slow.decode_step_time_s - fast.decode_step_time_s) / base,
        }
    out["total"] = 100 * (base - fast.time_s) / base
    return out


def geomean(xs: Sequence[float]) -> float:
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs))) if xs else math.nan


def time_table(runs: Sequence[Run]) -> list[str]:
    """Markdown: one row per run, where its time goes."""
    rows = [
        "| workload | b | proposer | speedup | time s | prefill-step share | steps (prefill) "
        "| decode batch | acc./decode step | tok/call-step | draft/decode step | KV-wait share "
        "| terms: fixed / prefill / decode / draft / kv (%) |",
        "| --- " * 13 + "|",
    ]
    for r in runs:
        tm = r.terms_s
        split = " / ".join(f"{100 * tm[t] / r.time_s:.1f}" for t in TERMS) if tm else "–"
        rows.append(
            f"| {r.workload} | {r.batch} | {r.proposer} | {r.speedup:.3f} | {r.time_s:.1f} | "
            f"{r.prefill_step_time_s / r.time_s:.3f} | {r.steps} ({r.prefill_steps}) | "
            f"{r.mean_decode_batch:.1f} | {r.accepted_per_decode_step:.3f} | "
            f"{r.output_tokens / max(r.call_steps, 1):.3f} | "
            f"{r.draft_tokens / max(r.decode_tokens, 1):.2f} | "
            f"{r.kv_wait_time_s / r.time_s:.3f} | {split} |"
        )
    return rows


def parts_rows(runs: Sequence[Run]) -> list[str]:
    """Markdown: for ``best:``/``shadow:`` runs, each part's whole draft, accepted tokens
    per draft asked for at that run's positions, beside each part's own run."""
    own = {(r.workload, r.batch, r.proposer): r.accepted_per_decode_step for r in runs}
    rows = [
        "| workload | b | run (positions) | part | accepted per draft there | in its own run |",
        "| --- " * 6 + "|",
    ]
    for r in runs:
        for part, acc in (r.parts_accepted or {}).items():
            mine = own.get((r.workload, r.batch, part))
            rows.append(
                f"| {r.workload} | {r.batch} | {r.proposer} | {part} | {acc:.3f} | "
                f"{'–' if mine is None else f'{mine:.3f}'} |"
            )
    return rows if len(rows) > 2 else []


def gap_rows(runs: Sequence[Run], pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Markdown: per workload and batch, ``slow`` vs ``fast``: the time gap by term."""
    by = {(r.workload, r.batch, r.proposer): r for r in runs}
    rows: list[str] = []
    for slow_name, fast_name in pairs:
        for (wl, b, p), slow in by.items():
            fast = by.get((wl, b, fast_name))
            if p != slow_name or fast is None:
                continue
            g = gap(slow, fast)
            if not rows:
                keys = [t for t in g if t != "total"]
                rows = [
                    f"| workload | b | {slow_name} → other | acc./decode step | decode steps "
                    f"| engine steps | {' | '.join(keys)} | time saved (%) |",
                    "| --- " * (7 + len(keys)) + "|",
                ]
            parts = " | ".join(f"{v:+.1f}" for t, v in g.items() if t != "total")
            rows.append(
                f"| {wl} | {b} | {slow_name} → {fast_name} | "
                f"{slow.accepted_per_decode_step:.3f} → {fast.accepted_per_decode_step:.3f} | "
                f"{fast.decode_tokens / max(slow.decode_tokens, 1) - 1:+.1%} | "
                f"{fast.steps / max(slow.steps, 1) - 1:+.1%} | {parts} | {g['total']:+.1f} |"
            )
    return rows


def ratio_rows(runs: Sequence[Run], names: Sequence[str]) -> list[str]:
    """Markdown: per batch, per workload and geometric mean, the speedup ratios."""
    by = {(r.workload, r.batch, r.proposer): r for r in runs}
    wls = list(dict.fromkeys(r.workload for r in runs))
    batches = sorted({r.batch for r in runs})
    pairs = [(a, "none") for a in names if a != "none"]
    if "suffix" in names:
        pairs += [(a, "suffix") for a in names if a not in ("none", "suffix")]
    head = " | ".join(f"{a}/{b}" for a, b in pairs)
    rows = [f"| b | workload | {head} | share of headroom |", "| --- " * (3 + len(pairs)) + "|"]
    for b in batches:
        per_wl: dict[str, list[float]] = {}
        for wl in wls:
            vals = []
            for a, c in pairs:
                ra, rc = by.get((wl, b, a)), by.get((wl, b, c))
                vals.append(rc.time_s / ra.time_s if ra and rc else math.nan)
            per_wl[wl] = vals
        # the geometric means over the workloads with every ratio at this batch: one set
        # for every column (a column's mean over fewer workloads would not compare)
        full = [v for v in per_wl.values() if not any(math.isnan(x) for x in v)]
        means = [geomean([v[j] for v in full]) for j in range(len(pairs))]
        label = "geomean" if len(full) == len(wls) else f"geomean ({len(full)} of {len(wls)})"
        for wl, vals in [*per_wl.items(), (label, means)]:
            share = "–"
            named = dict(zip(pairs, vals, strict=True))
            got, top = named.get(("agentspec", "suffix")), named.get((ORACLE, "suffix"))
            if got and top and top > 1:
                share = f"{math.log(got) / math.log(top):.0%}"
            cells = " | ".join(f"{v:.3f}" for v in vals)
            name = f"**{wl}**" if wl == label else wl
            rows.append(f"| {b} | {name} | {cells} | {share} |")
    return rows


def first_order(ref: Run, other: Run) -> tuple[float, float]:
    """``(predicted, actual)`` speedup of ``other`` over ``ref`` from the first-order model:
    the step-proportional terms (fixed, KV, decode) scale with decode call-steps, i.e. by
    ``(1 + a_ref) / (1 + a_other)`` with ``a`` accepted per decode call-step; prefill is
    unchanged; drafts cost what ``other`` drafted. Linear presets only (``nan`` else)."""
    if ref.terms_s is None or other.terms_s is None or ref.accepted_per_decode_step <= -1:
        return math.nan, ref.time_s / other.time_s
    tr = ref.terms_s
    scale = (1 + ref.accepted_per_decode_step) / (1 + other.accepted_per_decode_step)
    step_part = tr["fixed"] + tr["kv"] + tr["decode"]
    draft = tr["draft"] * (other.draft_tokens / ref.draft_tokens if ref.draft_tokens else 0.0)
    pred = step_part * scale + tr["prefill"] + draft
    return ref.time_s / pred, ref.time_s / other.time_s


def needed_rows(runs: Sequence[Run], ref: str, other: str, target: float) -> list[str]:
    """Markdown: what ``other`` needs to reach ``target`` times ``ref``'s speed, first order:
    the share of ``ref``'s time that scales with steps, the cut in steps and the accepted
    tokens per decode call-step that gives (drafting cost held at ``ref``'s)."""
    by = {(r.workload, r.batch, r.proposer): r for r in runs}
    rows = [
        f"| workload | b | step-scaled share of {ref} | steps to cut | accepted/decode step "
        f"needed ({ref} has) | {other} has | {other}/{ref}: first-order, actual |",
        "| --- " * 7 + "|",
    ]
    for (wl, b, p), r in by.items():
        o = by.get((wl, b, other))
        if p != ref or o is None or r.terms_s is None:
            continue
        e = (r.terms_s["fixed"] + r.terms_s["kv"] + r.terms_s["decode"]) / r.time_s
        cut = (1 - 1 / target) / e
        need = (1 + r.accepted_per_decode_step) / (1 - cut) - 1 if cut < 1 else math.inf
        pred, act = first_order(r, o)
        rows.append(
            f"| {wl} | {b} | {e:.3f} | {cut:.1%} | {need:.3f} ({r.accepted_per_decode_step:.3f}) "
            f"| {o.accepted_per_decode_step:.3f} | {pred:.3f}, {act:.3f} |"
        )
    return rows


def load(
    traces: Sequence[str],
    tokenizer: str,
    *,
    max_k: int,
    cost: StepTimeModel,
    max_calls: int | None,
    max_calls_per_run: int | None,
    max_runs: int | None,
) -> tuple[dict[str, list[ReplayCall]], ProposerEnv]:
    """Tokenize (cached) and build the calls as ``agentspec replay`` does."""
    tok = load_tokenizer(tokenizer)
    env = ProposerEnv(token_bytes=token_bytes_table(tok), cost_model=cost, max_k=max(max_k, 1))
    tokenized = [tokenize_trace(p, tok) for p in traces]
    workloads = build_calls(
        tokenized,
        max_calls=max_calls,
        max_calls_per_run=max_calls_per_run,
        max_runs=max_runs,
    )
    return workloads, env


def report(runs: Sequence[Run], names: Sequence[str], preset: str, k: int, target: float) -> None:
    """Print the three tables (and the first-order one on linear presets)."""
    print(f"\n{preset}, k = {k}, no proposer time\n")
    print("\n".join(time_table(runs)))
    print("\n" + "\n".join(parts_rows(runs)))
    names = [n for n in names if not n.startswith("shadow:")]  # the driver's replay again
    print("\n" + "\n".join(ratio_rows(runs, names)))
    pairs = [("none", n) for n in names if n != "none"]
    if "suffix" in names:
        pairs += [("suffix", n) for n in names if n not in ("none", "suffix")]
    print("\n" + "\n".join(gap_rows(runs, pairs)))
    if "suffix" in names and "agentspec" in names and get_cost_model(preset).form == "linear":
        print(f"\nWhat agentspec needs for {target}x suffix (first order)\n")
        print("\n".join(needed_rows(runs, "suffix", "agentspec", target)))


def merge(paths: Sequence[str], target: float) -> int:
    """Print the tables of several ``--json`` reports as one (same preset and k). A file
    given twice is read once; two files with a run of the same workload, batch and
    proposer are refused (the ratio table would keep one of them, the time table both)."""
    runs: list[Run] = []
    names: list[str] = []
    presets, ks = set(), set()
    seen: set[Path] = set()
    where: dict[tuple[str, int, str], str] = {}
    for path in paths:
        if Path(path).resolve() in seen:
            print(f"headroom: {path} given again: read once", file=sys.stderr)
            continue
        seen.add(Path(path).resolve())
        with open(path) as fh:
            rep = json.load(fh)
        presets.add(rep["config"]["cost_model"])
        ks.add(rep["config"]["k"])
        names += [n for n in rep["config"]["names"] if n not in names]
        for r in rep["runs"]:
            r.pop("accepted_per_decode_step", None)
            run = Run(**r)
            key = (run.workload, run.batch, run.proposer)
            if key in where:
                raise SystemExit(
                    f"--merge: {run.proposer} on {run.workload} at b={run.batch} is in both "
                    f"{where[key]} and {path}: merge reports of different runs only"
                )
            where[key] = path
            runs.append(run)
    if len(presets) != 1 or len(ks) != 1:
        raise SystemExit(f"--merge: reports mix presets {presets} or k {ks}")
    names.remove(ORACLE)
    report(runs, [*names, ORACLE], presets.pop(), ks.pop(), target)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--traces", nargs="+", default=[])
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument(
        "--merge", nargs="+", default=[], help="print the tables of earlier --json files, together"
    )
    ap.add_argument("--proposers", default="suffix,agentspec", help="besides none and oracle")
    ap.add_argument("--batch", default="32,64,256", help="comma list")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--cost-model", default="llama8b-h100")
    ap.add_argument("--max-calls", type=int, default=None)
    ap.add_argument("--max-calls-per-run", type=int, default=None)
    ap.add_argument("--max-runs", type=int, default=None)
    ap.add_argument("--target", type=float, default=1.10, help="the speedup over suffix asked")
    ap.add_argument("--json", default=None, help="write every run's decomposition here")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.target)
    if not args.traces or not args.tokenizer:
        ap.error("--traces and --tokenizer are required (or --merge)")
    cost = get_cost_model(args.cost_model)
    names = ["none", *[p for p in args.proposers.split(",") if p not in ("none", ORACLE)], ORACLE]
    batches = sorted({int(b) for b in args.batch.split(",")})
    workloads, env = load(
        args.traces,
        args.tokenizer,
        max_k=args.k,
        cost=cost,
        max_calls=args.max_calls,
        max_calls_per_run=args.max_calls_per_run,
        max_runs=args.max_runs,
    )
    runs: list[Run] = []
    for wl, calls in workloads.items():
        for b in batches:
            base: Run | None = None
            for name in names:
                run = replay_one(name, calls, env, cost, b, args.k, wl)
                base = base or run
                run.speedup = base.time_s / run.time_s
                runs.append(run)
                print(
                    f"{wl} b={b} {name}: speedup {run.speedup:.3f}, "
                    f"acc./decode step {run.accepted_per_decode_step:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
    report(runs, names, args.cost_model, args.k, args.target)
    if args.json:
        out = {
            "config": {**vars(args), "names": names},
            "runs": [
                {**asdict(r), "accepted_per_decode_step": r.accepted_per_decode_step} for r in runs
            ],
        }
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
