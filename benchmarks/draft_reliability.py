"""Replay's side of the live calibration check: AgentSpec's drafted tokens, expected vs accepted.

The vLLM adapter counts, for every verified draft token, the survival AgentSpec predicted for
it (the product of the draft's ``probs`` up to it) against vLLM's verdict
(``agentspec_expected_accepted_tokens_total``, ``MetricsSnapshot.reliability``, printed by
``agentspec bench``). This replays one trace with AgentSpec (its own schedule) and counts
the same: per drafted position its predicted survival, and whether the replay's verifier
accepted it (the draft's longest prefix the recorded output confirms). It prints, per
batch, the expected and the accepted share of the drafted tokens and both per tenth of
predicted survival — so a gap seen on the live engine can be looked for in a recording of
the same app (``benchmarks/traces/``). Deterministic.

    python benchmarks/draft_reliability.py --trace benchmarks/traces/engine_map_reduce.jsonl.xz \\
        --tokenizer default --batch 32 --k 8 --cost-model cpu-smollm2
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from _replay_setup import load_trace, trace_parser

from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import accepted_length, replay_workload

BINS = 10


class Reliability:
    """A proposer passed through: each request's last draft, scored at its next extend."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.bins = np.zeros((BINS, 3))  # positions, Σ predicted survival, accepted
        self._last: dict[str, tuple[tuple[int, ...], np.ndarray]] = {}

    def start(self, req_id: str, prompt: Any, tags: Any = None) -> None:
        self.inner.start(req_id, prompt, tags)

    def extend(self, req_id: str, ids: Any) -> None:
        last = self._last.pop(req_id, None)
        if last is not None:
            toks, surv = last
            accepted = accepted_length(toks, np.asarray(ids))
            for j, s in enumerate(surv):
                row = self.bins[min(BINS - 1, int(s * BINS))]
                row += (1.0, s, float(j < accepted))
        self.inner.extend(req_id, ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts: list[Draft] = self.inner.propose(req_ids, k, step)
        for rid, d in zip(req_ids, drafts, strict=True):
            if len(d) and len(d.probs) >= len(d):
                self._last[rid] = (d.token_ids, np.cumprod(d.probs[: len(d)]))
            else:
                self._last.pop(rid, None)
        return drafts

    def stop(self, req_id: str) -> None:
        self._last.pop(req_id, None)
        self.inner.stop(req_id)


def summary(bins: np.ndarray, min_positions: int = 1) -> str:
    """``expected E accepted, got A`` over all drafted positions, then per tenth."""
    n, x, a = bins.sum(axis=0)
    if not n:
        return "no drafted positions"
    cells = [
        f"{i / BINS:.1f}-{(i + 1) / BINS:.1f}: {r[1] / r[0]:.3f} vs {r[2] / r[0]:.3f} "
        f"({r[2] / r[0] - r[1] / r[0]:+.3f}, {r[0]:.0f})"
        for i, r in enumerate(bins)
        if r[0] >= min_positions
    ]
    return (
        f"{n:.0f} drafted positions: expected {x / n:.3f} accepted, got {a / n:.3f}\n"
        "  per tenth of predicted survival, predicted vs accepted (gap, positions): "
        + "; ".join(cells)
    )


def main(argv: list[str] | None = None) -> int:
    ap = trace_parser(__doc__, batch="32")
    ap.add_argument("--min-positions", type=int, default=50, help="per tenth printed")
    args = ap.parse_args(argv)
    one = load_trace(args)
    for batch in one.batches:
        probe = Reliability(make_proposer("agentspec", one.setup.env))
        replay_workload(one.calls, probe, batch=batch, k=args.k, cost_model=one.setup.cost)
        print(f"{one.workload}, batch {batch}, k {args.k}, {args.cost_model}:")
        print(summary(probe.bins, args.min_positions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
