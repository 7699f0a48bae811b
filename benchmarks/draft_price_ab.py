"""Replay A/B: AgentSpec's budget with and without drafts priced by their request's context.

The replay charges every step by ``--cost-model`` (default ``cpu-smollm2``, whose
``c_spec_kv`` and ``c_draft_kv`` were measured on the embedded CPU engine with
``fit_step_time.py --drafts``); the budget of ``agentspec`` reads the same model, that of
``agentspec-unpriced`` the model without those two terms (what the budget assumed before
they were measured: a draft costs ``c_tok + c_row`` whatever its request's context). The
peers run under the same charges. Prints each method's predicted speedup over no
speculation per trace and batch, and the drafted / accepted tokens, for ``--k`` (8, the
engine's default). Deterministic.

    python benchmarks/draft_price_ab.py --batch 1,16,32
"""

from __future__ import annotations

import sys
from pathlib import Path

from _replay_setup import engine_ab_parser, load_workloads

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload

_TRACES = sorted(str(p) for p in (Path(__file__).parent / "traces").glob("engine_*.jsonl.xz"))


def main(argv: list[str] | None = None) -> int:
    ap = engine_ab_parser(__doc__, batch="1,16,32")
    ap.add_argument("--traces", nargs="+", default=_TRACES)
    ap.add_argument("--methods", default="ngram,suffix,agentspec-unpriced,agentspec")
    args = ap.parse_args(argv)
    cost = get_cost_model(args.cost_model)
    if cost.draft_coefficients() is None:
        ap.error(f"{args.cost_model} has no draft terms (c_spec_kv, c_draft_kv): nothing to A/B")
    unpriced = cost.model_copy(update={"c_spec_kv": 0.0, "c_draft_kv": 0.0})
    methods = args.methods.split(",")
    print(f"cost model {args.cost_model}: {cost!r}")
    print(f"{'trace':22s} {'b':>3s} " + " ".join(f"{m:>20s}" for m in methods))
    for trace in args.traces:
        setup = load_workloads([trace], args.tokenizer, max_k=args.k, cost_model=args.cost_model)
        ((name, calls),) = setup.workloads.items()
        for b in (int(x) for x in args.batch.split(",")):
            base = replay_workload(
                calls, make_proposer("none", setup.env), batch=b, k=0, cost_model=cost
            )
            cells = []
            for m in methods:
                env = setup.env
                if m == "agentspec-unpriced":
                    env = ProposerEnv(
                        token_bytes=setup.env.token_bytes, cost_model=unpriced, max_k=args.k
                    )
                prop = make_proposer(m.split("-")[0], env)
                run = replay_workload(calls, prop, batch=b, k=args.k, cost_model=cost)
                cells.append(
                    f"{base.sim_time_s / run.sim_time_s:6.3f}x {run.accepted:5d}/{run.drafted:5d}"
                )
            print(f"{name[:22]:22s} {b:3d} " + " ".join(f"{c:>20s}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
