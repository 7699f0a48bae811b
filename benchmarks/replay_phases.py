"""Where a replay's rejections happen: rejection by how full the batch was.

A replay at "batch 256" fills the batch, runs busy, then drains: its last steps have few
calls in flight, where drafting is nearly free and AgentSpec drafts freely by design. This
script replays each workload once per proposer and splits the drafted/accepted tokens by
the step's batch size relative to the largest one seen: full (>= 90 %), middle (50-90 %)
and drain (< 50 %). Where the proposer gives per-token probabilities, it also prints the
rejection they predicted (1 - Σ survival / drafted), a check of the calibration.

    python benchmarks/replay_phases.py --traces ../shared/traces/chatdev_multi_agent.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --proposers agentspec,suffix --batch 256 --k 16

Deterministic except the "with proposer time" speedup (wall-clock of this machine).
``--set agentspec.index_walk_batch=null`` passes proposer options as ``agentspec replay`` does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from _replay_setup import load_workloads, replay_parser

from agentspec_mw.cli import _parse_set
from agentspec_mw.proposer import Draft, Proposer, StepContext, TokenIds
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import accepted_length, replay_workload
from agentspec_mw.tags import StructureTags

PHASES = (("full", 0.9, 2.0), ("middle", 0.5, 0.9), ("drain", 0.0, 0.5))


class Recorder:
    """Wraps a proposer; records (batch size, drafted, accepted, predicted accepted)."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.name = inner.name
        self.rows: list[tuple[int, int, int, float]] = []
        self._open: dict[str, tuple[int, Draft]] = {}

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        self.inner.start(req_id, prompt_ids, tags)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        got = self._open.pop(req_id, None)
        if got is not None:
            batch, d = got
            acc = accepted_length(d.token_ids, np.asarray(token_ids))
            pred = float(np.cumprod(d.probs).sum()) if d.probs else float("nan")
            self.rows.append((batch, len(d), acc, pred))
        self.inner.extend(req_id, token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.inner.propose(req_ids, k, step)
        for rid, d in zip(req_ids, drafts, strict=True):
            if len(d):
                self._open[rid] = (step.batch_size, d)
        return drafts

    def stop(self, req_id: str) -> None:
        self._open.pop(req_id, None)
        self.inner.stop(req_id)


def main() -> None:
    ap = replay_parser(__doc__, proposers="agentspec,suffix")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--max-calls-per-run", type=int, default=None)
    ap.add_argument("--cost-model", default="llama8b-h100")
    ap.add_argument("--set", action="append", default=[], metavar="PROPOSER.OPTION=VALUE")
    args = ap.parse_args()
    options: dict[str, dict[str, Any]] = _parse_set(args.set)
    setup = load_workloads(
        args.traces,
        args.tokenizer,
        max_k=args.k,
        cost_model=args.cost_model,
        max_calls_per_run=args.max_calls_per_run,
    )
    env, cost = setup.env, setup.cost
    for wl, calls in setup.workloads.items():
        base = replay_workload(
            calls, make_proposer("none", env), batch=args.batch, k=0, cost_model=cost
        )
        for name in args.proposers.split(","):
            rec = Recorder(make_proposer(name, env, **options.get(name, {})))
            t0 = time.perf_counter()
            r = replay_workload(calls, rec, batch=args.batch, k=args.k, cost_model=cost)
            wall = time.perf_counter() - t0
            print(
                f"{wl} {name} b={args.batch} k={args.k}: tokens/step {r.mat:.3f}, rejection "
                f"{r.rejection_rate:.3f}, speedup {base.sim_time_s / r.sim_time_s:.3f} "
                f"({base.sim_time_s / (r.sim_time_s + r.proposer_time_s):.3f} with proposer "
                f"time), {wall:.0f} s"
            )
            if not rec.rows:
                continue
            rows = np.asarray(rec.rows, dtype=np.float64)
            steps = np.asarray(r.step_batch, dtype=np.float64)
            top = float(steps.max())
            for phase, lo, hi in PHASES:
                m = (rows[:, 0] >= lo * top) & (rows[:, 0] < hi * top)
                drafted, acc, pred = rows[m, 1].sum(), rows[m, 2].sum(), rows[m, 3].sum()
                n_steps = int(((steps >= lo * top) & (steps < hi * top)).sum())
                print(
                    f"  {phase:>6} (batch {lo:.0%}-{min(hi, 1.0):.0%} of {top:.0f}): "
                    f"{n_steps} steps, drafted {int(drafted)}, rejection "
                    f"{(drafted - acc) / max(drafted, 1):.3f} (predicted "
                    f"{(drafted - pred) / max(drafted, 1):.3f}), accepted/draft "
                    f"{acc / max(int(m.sum()), 1):.2f}"
                )


if __name__ == "__main__":
    main()
