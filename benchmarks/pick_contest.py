"""Where two sources disagree: which one is right, and what the pick loses there.

Replays one trace with AgentSpec (its own schedule) and, at every request-step, looks at
its four sources' candidates (``AgentSpecProposer.candidates``). For every pair of sources
whose candidates both draft position ``d`` and first differ there (a *contest*), it counts
whether the recorded output goes on with the first's token, the second's, or neither; and,
over all request-steps, how many tokens the whole picked candidate would be accepted for
against the best of the four (the ``choice`` term of ``gap_decompose.py``, in tokens),
split by whether the picked candidate was contested. Deterministic.

    python benchmarks/pick_contest.py --trace ../shared/traces/tau_bench_airline.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 64 --k 16
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence

import numpy as np
from _replay_setup import Observed, load_trace, trace_parser

from agentspec_mw.agentspec import SOURCES, AgentSpecProposer
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import accepted_length, replay_workload


def first_difference(x: np.ndarray, y: np.ndarray) -> int:
    """First position both draft where ``x`` and ``y`` differ; ``-1`` if none."""
    m = min(len(x), len(y))
    neq = np.flatnonzero(x[:m] != y[:m])
    return int(neq[0]) if len(neq) else -1


class Contests(Observed):
    """AgentSpec with a tally of its sources' contests and of the pick's losses."""

    def __init__(self, a: AgentSpecProposer, outputs: dict[str, np.ndarray]) -> None:
        super().__init__(a)
        self.outputs = outputs
        self.right: Counter[tuple[str, str, str]] = Counter()  # (x, y, who) -> pairs
        self.loss: Counter[str] = Counter()  # contested / alone -> tokens
        self.steps: Counter[str] = Counter()
        self.flips: Counter[tuple[str, str]] = Counter()  # (picked, best) -> tokens

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.a.propose(req_ids, k, step)
        cands = self.a.candidates or {}
        if not cands:
            return drafts
        tok, lens, pick = cands["tok"], cands["lens"], cands["pick"]
        n = len(req_ids)
        for i, r in enumerate(req_ids):
            truth = self.outputs[r][self.pos[r] :]
            rows = [tok[s * n + i, : lens[s * n + i]] for s in range(len(SOURCES))]
            if sum(len(x) > 0 for x in rows) == 0:
                continue
            acc = [accepted_length(x, truth) for x in rows]
            p = int(pick[i]) // n
            contested = False
            for s in range(len(SOURCES)):
                for u in range(s + 1, len(SOURCES)):
                    d = first_difference(rows[s], rows[u])
                    if d < 0:
                        continue
                    if p in (s, u):
                        contested = True
                    who = (
                        "first"
                        if d < len(truth) and rows[s][d] == truth[d]
                        else "second"
                        if d < len(truth) and rows[u][d] == truth[d]
                        else "neither"
                    )
                    self.right[(SOURCES[s], SOURCES[u], who)] += 1
            key = "contested" if contested else "alone"
            best = int(np.argmax(acc))
            self.steps[key] += 1
            self.loss[key] += acc[best] - acc[p]
            if acc[best] > acc[p]:
                self.flips[(SOURCES[p], SOURCES[best])] += acc[best] - acc[p]
        return drafts


def main(argv: list[str] | None = None) -> int:
    args = trace_parser(__doc__, batch="64").parse_args(argv)
    t = load_trace(args)
    workload, calls, outputs, setup = t.workload, t.calls, t.outputs, t.setup
    for b in t.batches:
        a = make_proposer("agentspec", setup.env)
        assert isinstance(a, AgentSpecProposer)
        c = Contests(a, outputs)
        replay_workload(calls, c, batch=b, k=args.k, cost_model=setup.cost)
        print(f"## {workload}, batch {b}")
        for key in ("contested", "alone"):
            print(f"{key}: request-steps {c.steps[key]}, choice loss {c.loss[key]} tokens")
        print("| pair | first right | second right | neither |")
        print("| --- | --- | --- | --- |")
        pairs = sorted({(x, y) for x, y, _ in c.right})
        for x, y in pairs:
            row = [c.right[(x, y, w)] for w in ("first", "second", "neither")]
            print(f"| {x} vs {y} | " + " | ".join(str(v) for v in row) + " |")
        print("choice loss by (picked → best), tokens:")
        for (x, y), v in c.flips.most_common(8):
            print(f"  {x} → {y}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
