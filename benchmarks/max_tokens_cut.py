"""Replay A/B: drafts cut at a request's ``max_tokens`` (as the vLLM adapter does) or not.

vLLM verifies draft tokens past a request's ``max_tokens`` and discards them; since
``a96221d`` the adapter cuts each AgentSpec draft to the output tokens left less one. The
replay does not know ``max_tokens`` (a call's recorded output is its end), so this script
wraps the proposer: for each call whose recorded output reached ``--max-tokens`` (it ended
by length, not by its own stop), every draft is cut to the tokens left less one — what the
adapter does. The engine recordings in ``benchmarks/traces/`` were made with 32 (demo,
``map_reduce``) and 48 (the others) tokens per call. Prints, per trace and batch, each
proposer's predicted speedup over no speculation, drafted / accepted tokens and rejection,
uncut and cut. Deterministic.

    python benchmarks/max_tokens_cut.py --batch 1,32
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from _replay_setup import engine_ab_parser, load_workloads

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import Draft, Proposer, StepContext, TokenIds
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import ReplayCall, replay_workload
from agentspec_mw.tags import StructureTags

_HERE = Path(__file__).parent / "traces"
#: the engine recordings and the max_tokens each was recorded with (traces/README.md)
_TRACES = {
    "engine_demo": 32,
    "engine_map_reduce": 32,
    "engine_supervisor_team": 48,
    "engine_tool_loop": 48,
    "engine_reflect": 48,
}


class CutAtLimit:
    """``inner``'s drafts, cut to the tokens a call may still emit less one when its
    recorded output reached ``limit`` (the replay's emitted count, from ``extend``)."""

    def __init__(self, inner: Proposer, calls: Sequence[ReplayCall], limit: int) -> None:
        self.inner = inner
        self.name = inner.name
        self._left_at_start = {c.req_id: len(c.output) for c in calls if len(c.output) >= limit}
        self._left: dict[str, int] = {}

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        if req_id in self._left_at_start:
            self._left[req_id] = self._left_at_start[req_id]
        self.inner.start(req_id, prompt_ids, tags)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        if req_id in self._left:
            self._left[req_id] -= len(token_ids)
        self.inner.extend(req_id, token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.inner.propose(req_ids, k, step)
        out = []
        for rid, d in zip(req_ids, drafts, strict=True):
            left = self._left.get(rid)
            if left is not None and len(d) > left - 1:
                cut = max(0, left - 1)
                d = Draft(d.token_ids[:cut], d.probs[:cut])
            out.append(d)
        return out

    def stop(self, req_id: str) -> None:
        self._left.pop(req_id, None)
        self.inner.stop(req_id)


def main(argv: list[str] | None = None) -> int:
    ap = engine_ab_parser(__doc__, batch="1,32")
    ap.add_argument("--traces", nargs="+", default=list(_TRACES))
    ap.add_argument("--proposers", default="agentspec,suffix,ngram")
    args = ap.parse_args(argv)
    unknown = [t for t in args.traces if t not in _TRACES]
    if unknown:
        ap.error(f"unknown traces {unknown}: choose from {list(_TRACES)}")
    cost = get_cost_model(args.cost_model)
    print(f"cost model {args.cost_model}, k = {args.k}; speedup over none, accepted / drafted")
    header = f"{'trace':24s} {'b':>3s} {'proposer':10s} {'uncut':>26s} {'cut at max_tokens':>26s}"
    print(header)
    for trace in args.traces:
        path = str(_HERE / f"{trace}.jsonl.xz")
        setup = load_workloads([path], args.tokenizer, max_k=args.k, cost_model=args.cost_model)
        ((_, calls),) = setup.workloads.items()
        for b in (int(x) for x in args.batch.split(",")):
            base = replay_workload(
                calls, make_proposer("none", setup.env), batch=b, k=0, cost_model=cost
            )
            for name in args.proposers.split(","):
                cells = []
                for cut in (False, True):
                    prop: Proposer = make_proposer(name, setup.env)
                    if cut:
                        prop = CutAtLimit(prop, calls, _TRACES[trace])
                    run = replay_workload(calls, prop, batch=b, k=args.k, cost_model=cost)
                    rej = 1 - run.accepted / run.drafted if run.drafted else 0.0
                    cells.append(
                        f"{base.sim_time_s / run.sim_time_s:6.3f}x "
                        f"{run.accepted:5d}/{run.drafted:5d} r{rej:.2f}"
                    )
                print(f"{trace:24s} {b:3d} {name:10s} {cells[0]:>26s} {cells[1]:>26s}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
