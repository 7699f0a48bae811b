"""Is AgentSpec's calibration right while a workload is young? Predicted vs realised.

Replays the first ``--max-calls`` calls of each trace (the whole trace without it) with
AgentSpec under each ``--priors`` entry (``experimental.calib_prior``) and prints, over
every draft the budget sent, the accepted tokens the proposer predicted (each draft's
sum of survivals: the products of its per-token probabilities) against those the
verification accepted, and their ratio (1: calibrated; under 1: under-confident). A cold
scope's estimates come from the prior alone, so this is where the prior shows.
Deterministic.

    python benchmarks/cold_calibration.py --traces benchmarks/traces/engine_demo.jsonl.xz \\
        --tokenizer default --max-calls 16 --batch 1 --k 8 --cost-model cpu-smollm2
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _replay_setup import load_workloads

from agentspec_mw.agentspec.proposer import AgentSpecProposer
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.replay.sim import replay_workload


class _Counting(AgentSpecProposer):
    """AgentSpec that adds up what its drafts predict."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.predicted = 0.0
        self.sent = 0

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = super().propose(req_ids, k, step)
        for d in drafts:
            s = 1.0
            for p in d.probs:
                s *= p
                self.predicted += s
            self.sent += len(d.token_ids)
        return drafts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--max-calls", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--cost-model", default="cpu-smollm2")
    ap.add_argument("--priors", default="stored,redundancy", help="comma list")
    args = ap.parse_args(argv)
    print(
        f"{'trace':<32} {'prior':<11} {'drafted':>8} {'predicted':>9} {'accepted':>8} {'ratio':>6}"
    )
    for path in args.traces:
        setup = load_workloads(
            [path], args.tokenizer, max_k=args.k, cost_model=args.cost_model,
            max_calls=args.max_calls,
        )  # fmt: skip
        for calls in setup.workloads.values():
            for prior in args.priors.split(","):
                p = _Counting(setup.env, experimental={"calib_prior": prior})
                replay_workload(calls, p, batch=args.batch, k=args.k, cost_model=setup.cost)
                accepted, _drafted = p.verified
                ratio = p.predicted / accepted if accepted else float("nan")
                print(
                    f"{Path(path).name[:32]:<32} {prior:<11} {p.sent:>8} {p.predicted:>9.0f} "
                    f"{accepted:>8.0f} {ratio:>6.2f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
