"""Does a calibration cell's acceptance move during a run? Predictions against the counts.

Replays one trace with AgentSpec (its own schedule) and follows every position the
proposer counts for calibration (its picked candidate's positions up to the first miss,
drafted or not: ``kernels.apply_extends``), keyed by the position's fine cell. Per source
it prints, over the fine cells with at least ``--min-count`` counted positions:

* ``drafted``: the drafted positions' mean prediction (``Draft.probs``) and realised
  acceptance; the same for the counted positions that were not drafted — those of a
  candidate the budget drafted nothing of (``no draft``) and the position right after a
  wholly accepted draft (``past a draft``: the budget's margin) — with, in brackets, their
  acceptance in the drafted ones' cells (reweighted to the drafted counts): whether a
  selection within a cell explains a gap;
* ``first half`` / ``second half``: each cell's counted positions split at its median
  event, the drafted ones' mean prediction and realised acceptance in each half — whether
  the cell's acceptance falls (or rises) as the run goes on, which a cumulative count
  follows late;
* ``after 8 events``: the drafted positions with at least 8 counted before them in their
  fine cell, their mean prediction against the fine cell's acceptance over those earlier
  positions — what the prediction adds to the cell's own record (its pull toward the coarse
  cell and the prior).

It checks its tally of each fine cell against the proposer's own counts at the end (exit 1
if over 0.1 % of the positions differ: a request given no candidate at a step goes on
being counted on its previous one while the emitted tokens still match it, which this
tally does not follow, and a step whose token budget cuts a draft verifies fewer
positions than were drafted). Deterministic.

    python benchmarks/cell_drift.py --trace ../shared/traces/tot_parallel_sampling.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 8 --max-calls-per-run 10
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from _replay_setup import Observed, load_trace, trace_parser

from agentspec_mw.agentspec import SOURCES, AgentSpecProposer
from agentspec_mw.agentspec import kernels as K
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload

DRAFTED, NO_DRAFT, PAST_DRAFT = 0, 1, 2


class Events(Observed):
    """AgentSpec driving the replay; every counted position is kept as
    ``(kind, prediction, accepted)`` per ``(source, fine cell)``, in order (an undrafted
    position's prediction: its fine cell's estimate at that step); ``kind``
    is :data:`DRAFTED`, :data:`NO_DRAFT` (the budget drafted none of the candidate) or
    :data:`PAST_DRAFT` (the position right after a draft, reached when all of it was
    accepted)."""

    def __init__(self, a: AgentSpecProposer, outputs: dict[str, np.ndarray]) -> None:
        super().__init__(a)
        self.outputs = outputs
        self.events: defaultdict[tuple[int, int], list[tuple[int, float, bool]]] = defaultdict(list)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.a.propose(req_ids, k, step)
        pick = (self.a.candidates or {}).get("pick")
        if pick is None:
            return drafts
        n = len(req_ids)
        slots = self.a._slots
        sc, strength = self.a._scopes, self.a._calib.strength
        for i, r in enumerate(req_ids):
            slot = self.a._reqs[r]
            kept = int(slots.si[slot, K.C_DLEN])  # the positions kept for calibration
            if int(pick[i]) < 0 or kept <= 0 or int(slots.si[slot, K.C_DDONE]) != 0:
                continue  # no candidate this step (an older one may still be counted)
            truth = self.outputs[r][self.pos[r] :]
            d = drafts[i]
            # the positions the next extend counts: up to the first miss, at most one past
            # the draft (the token the verifier emits after it)
            for j in range(min(len(d) + 1, kept, len(truth))):
                ok = int(truth[j]) == int(slots.dtok[slot, j])
                f = int(slots.dcell[slot, j])
                if j < len(d):
                    p = d.probs[j]
                else:  # the fine cell's estimate now, as score read it (kernels._acceptance)
                    cs = int(slots.si[slot, K.C_CAL])
                    base = strength * sc.table[cs, f // K.NF]
                    p = float((sc.fsucc[cs, f] + base) / (sc.ftot[cs, f] + strength))
                kind = DRAFTED if j < len(d) else NO_DRAFT if not len(d) else PAST_DRAFT
                self.events[(int(pick[i]) // n, f)].append((kind, p, ok))
                if not ok:
                    break
        return drafts


def summary(events: Any, source: int, min_count: int) -> str:
    """One source's line (see the module doc)."""
    dr = np.zeros(3)  # drafted: prediction sum, accepted, n
    kinds = np.zeros((3, 3))  # per kind, every cell: prediction sum, accepted, n
    und = np.zeros((3, 2))  # per kind, in the same cells, reweighted: accepted, n
    half = np.zeros((2, 3))  # per half: drafted prediction sum, accepted, n
    run = np.zeros(3)  # drafted after 8 earlier events: prediction sum, the cell's rate so far, n
    for (src, _f), ev in events.items():
        if src != source or len(ev) < min_count:
            continue
        a = np.array(ev, dtype=np.float64)
        drafted = a[:, 0] == DRAFTED
        for kind in (NO_DRAFT, PAST_DRAFT):
            m = a[:, 0] == kind
            kinds[kind] += (a[m, 1].sum(), a[m, 2].sum(), m.sum())
        if drafted.any():
            dr += (a[drafted, 1].sum(), a[drafted, 2].sum(), drafted.sum())
            for kind in (NO_DRAFT, PAST_DRAFT):
                other = a[:, 0] == kind
                if other.any():
                    und[kind] += (drafted.sum() * a[other, 2].mean(), drafted.sum())
        before = np.concatenate(([0.0], np.cumsum(a[:-1, 2])))  # accepted before each event
        seen = np.arange(len(a), dtype=np.float64)
        m = drafted & (seen >= 8)
        run += (a[m, 1].sum(), (before[m] / seen[m]).sum(), m.sum())
        mid = len(a) // 2
        for h, part in enumerate((a[:mid], a[mid:])):
            m = part[:, 0] == DRAFTED
            half[h] += (part[m, 1].sum(), part[m, 2].sum(), m.sum())
    if not dr[2]:
        return f"{SOURCES[source]:>6}: no cell with {min_count} counted positions"
    line = (
        f"{SOURCES[source]:>6}: drafted {dr[2]:,.0f} predicted {dr[0] / dr[2]:.3f} "
        f"realised {dr[1] / dr[2]:.3f}"
    )
    for kind, name in ((NO_DRAFT, "no draft"), (PAST_DRAFT, "past a draft")):
        if kinds[kind, 2]:
            p, acc, m = kinds[kind]
            line += f"; {name} {m:,.0f} predicted {p / m:.3f} realised {acc / m:.3f}"
        if und[kind, 1]:
            line += f" (in the drafted ones' cells {und[kind, 0] / und[kind, 1]:.3f})"
    if run[2]:
        psum, rate, cnt = run
        line += f"; after 8 events: predicted {psum / cnt:.3f}, cell's rate so far {rate / cnt:.3f}"
    for h, name in enumerate(("first half", "second half")):
        if half[h, 2]:
            p, acc, m = half[h]
            line += f"; {name} {p / m:.3f} / {acc / m:.3f}"
    return line


def main(argv: list[str] | None = None) -> int:
    ap = trace_parser(__doc__, batch="8")
    ap.add_argument("--min-count", type=int, default=64, help="counted positions per fine cell")
    args = ap.parse_args(argv)
    one = load_trace(args)
    ok = True
    for batch in one.batches:
        a = make_proposer("agentspec", one.setup.env)
        assert isinstance(a, AgentSpecProposer)
        ev = Events(a, one.outputs)
        replay_workload(one.calls, ev, batch=batch, k=args.k, cost_model=one.setup.cost)
        print(
            f"\n{one.workload}, batch {batch}, k {args.k}: per source, fine cells with "
            f"≥ {args.min_count} counted positions; halves: predicted / realised (drafted)"
        )
        for s in range(len(SOURCES)):
            print(summary(ev.events, s, args.min_count))
        # the tally must be the proposer's own counts, once the run's last extends (queued
        # until a propose that never comes) are applied
        a._flush()
        sc = a._scopes
        fsucc, ftot = sc.fsucc[1:].sum(axis=0), sc.ftot[1:].sum(axis=0)
        mine = np.zeros_like(ftot)
        mine_ok = np.zeros_like(ftot)
        for (_s, f), e in ev.events.items():
            mine[f] += len(e)
            mine_ok[f] += sum(x[2] for x in e)
        # a few positions a run differ (the module doc)
        off = float(np.abs(mine - ftot).sum() + np.abs(mine_ok - fsucc).sum())
        print(f"tally vs the proposer's counts: {off:.0f} of {ftot.sum():,.0f} positions differ")
        ok = ok and off <= 1e-3 * ftot.sum()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
