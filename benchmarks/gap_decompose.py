"""Decompose AgentSpec's distance to its own perfect-length drafts, in step time.

Replays one trace with AgentSpec driving the schedule and SuffixDecoding as a shadow (as
``candidate_gap.py``), and charges each request-step's losses against the recorded
output at the step's own prices under the cost model (first order: the schedule is
AgentSpec's own, every other step held as it was):

* ``c`` — what one more draft position costs the step, ``T(1) − T(0)``
  (:func:`agentspec_mw.agentspec.budget.step_times`);
* ``v`` — what one more emitted token is worth: the step's decode time with its drafts
  (the conserved prefill chunk left out, :func:`~agentspec_mw.agentspec.budget.prefill_time`)
  over the tokens it emits, ``b + Σ accepted``.

The four terms, each in % of the run's simulated time:

1. ``rejected`` — admitted positions that were rejected: ``(drafted − accepted) · c``;
2. ``cut`` — accepted tokens of the picked candidate the budget did not admit:
   ``(picked − accepted) · (v − c)``;
3. ``coverage`` — steps where no source had a candidate but SuffixDecoding's draft was
   accepted: its accepted tokens ``· (v − c)``;
4. ``choice`` — a better candidate among AgentSpec's own sources: ``(best − picked) ·
   (v − c)``.

Drafts are counted as proposed (a step whose token budget cuts a draft is rare).
(1) + (2) is what ``headroom.py``'s ``trim:agentspec`` recovers. Deterministic; no
wall-clock time enters the numbers.

    python benchmarks/gap_decompose.py --trace ../shared/traces/tau_bench_airline.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 32,256 --k 16
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from _replay_setup import Observed, load_trace, trace_parser

from agentspec_mw.agentspec import SOURCES, AgentSpecProposer
from agentspec_mw.agentspec.budget import prefill_time, step_shape, step_times
from agentspec_mw.costmodel import StepTimeFn
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import accepted_length, replay_workload

TERMS = ("rejected", "cut", "coverage", "choice")


class Decomposed(Observed):
    """AgentSpec (drafts, schedule) with SuffixDecoding as a shadow; sums the terms."""

    def __init__(
        self, a: AgentSpecProposer, s: Any, outputs: dict[str, np.ndarray], cost: StepTimeFn
    ) -> None:
        super().__init__(a, s)
        self.s, self.cost = s, cost
        self.outputs = outputs
        self.secs = dict.fromkeys(TERMS, 0.0)
        self.toks = dict.fromkeys(TERMS, 0)
        self.steps_nocand = 0
        self.call_steps = 0

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.a.propose(req_ids, k, step)
        cands = dict(self.a.candidates or {})
        shadow = self.s.propose(req_ids, k, step)
        n = len(req_ids)
        shape = step_shape(step)
        t0, t1 = step_times(self.cost, shape, np.array([0.0, 1.0])).tolist()
        c = t1 - t0
        drafted = [len(d.token_ids) for d in drafts]
        truths = [self.outputs[r][self.pos[r] :] for r in req_ids]
        acc = [accepted_length(d.token_ids, t) for d, t in zip(drafts, truths, strict=True)]
        nd = sum(drafted)
        t_dec = float(step_times(self.cost, shape, np.array([float(nd)]))[0])
        t_dec -= prefill_time(self.cost, shape)
        v = t_dec / (step.batch_size + sum(acc))
        gain = max(0.0, v - c)
        self.call_steps += n
        for i in range(n):
            truth = truths[i]
            self._add("rejected", drafted[i] - acc[i], c)
            if not cands:
                picked = best = 0
                has = False
            else:
                tok, lens = cands["tok"], cands["lens"]
                has = any(lens[src * n + i] > 0 for src in range(len(SOURCES)))
                best = max(
                    accepted_length(tok[src * n + i, : lens[src * n + i]], truth)
                    for src in range(len(SOURCES))
                )
                p = cands["pick"][i]
                picked = accepted_length(tok[p, : lens[p]], truth)
            if not has:
                self.steps_nocand += 1
                self._add("coverage", accepted_length(shadow[i].token_ids, truth), gain)
            self._add("cut", picked - acc[i], gain)
            self._add("choice", best - picked, gain)
        return drafts

    def _add(self, term: str, tokens: int, price: float) -> None:
        self.toks[term] += tokens
        self.secs[term] += tokens * price


def main(argv: list[str] | None = None) -> int:
    args = trace_parser(__doc__, batch="32,256").parse_args(argv)
    t = load_trace(args)
    workload, calls, outputs, setup = t.workload, t.calls, t.outputs, t.setup
    print(
        "| workload | batch | run s | call-steps | no candidate | "
        + " | ".join(f"{t} % (tokens)" for t in TERMS)
        + " |"
    )
    print("| --- " * (5 + len(TERMS)) + "|")
    for b in t.batches:
        a = make_proposer("agentspec", setup.env)
        assert isinstance(a, AgentSpecProposer)
        d = Decomposed(a, make_proposer("suffix", setup.env), outputs, setup.cost)
        run = replay_workload(calls, d, batch=b, k=args.k, cost_model=setup.cost)
        total = run.sim_time_s
        cells = " | ".join(f"{100 * d.secs[t] / total:.2f} ({d.toks[t]})" for t in TERMS)
        print(
            f"| {workload} | {b} | {total:.1f} | {d.call_steps} | "
            f"{d.steps_nocand / max(1, d.call_steps):.3f} | {cells} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
