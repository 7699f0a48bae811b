"""Where AgentSpec's per-step time goes: wall-clock timers around each kernel call.

Replays one trace at a batch size twice with the AgentSpec proposer (the first pass
compiles and warms up) and prints, per engine step averaged over all steps of the second
pass, the time inside each kernel and public method (nested: ``propose`` includes
``_flush``, which includes ``apply_extends`` and ``insert_outputs``). With
``--full-steps`` only the steps with ``--batch`` requests count (the steps the proposer
benchmark's median is over): the calls after a step's ``propose`` (its ``extend`` and
``stop``) count with that step, the next step's ``start`` calls (made before its
``propose``) with it too.

    python benchmarks/proposer_profile.py --trace ../shared/traces/tot_parallel_sampling.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 256 --k 16
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _replay_setup import load_workloads

import agentspec_mw.agentspec.kernels as K
import agentspec_mw.agentspec.proposer as P
from agentspec_mw.agentspec.ngram_index import NgramIndex
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload

TOTALS: collections.defaultdict[str, float] = collections.defaultdict(float)
COUNTING = [True]
"""Whether the timers count now (``--full-steps``: set by each ``propose`` call)."""
ORIGINALS: list[tuple[Any, dict[str, Any]]] = []
"""``(owner, {name: original})`` of every function the timers replaced."""


def _timed(owner: Any, name: str) -> None:
    fn: Callable[..., Any] = getattr(owner, name)
    saved = next((d for o, d in ORIGINALS if o is owner), None)
    if saved is None:
        saved = {}
        ORIGINALS.append((owner, saved))
    saved.setdefault(name, fn)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if COUNTING[0]:
                TOTALS[name] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument(
        "--full-steps", action="store_true", help="count only steps with --batch requests"
    )
    args = ap.parse_args()
    kernels = ("apply_extends", "gather", "local_drafts", "score", "insert_outputs")
    kernels += ("scan_prompts", "keep_candidates", "room_needed", "release_rows", "emit_drafts")
    for name in kernels:
        _timed(K, name)
    _timed(P, "allocate")
    _timed(NgramIndex, "lookup")
    for name in ("propose", "_flush", "extend", "start", "stop"):
        _timed(P.AgentSpecProposer, name)
    if args.full_steps:
        timed_propose = P.AgentSpecProposer.propose

        def propose(self: Any, req_ids: Any, k: int, step: Any) -> Any:
            COUNTING[0] = step.batch_size >= args.batch
            return timed_propose(self, req_ids, k, step)

        P.AgentSpecProposer.propose = propose  # type: ignore[method-assign]
    setup = load_workloads([args.trace], args.tokenizer, max_k=args.k)
    env, cost = setup.env, setup.cost
    calls = next(iter(setup.workloads.values()))
    for _ in range(2):
        TOTALS.clear()
        COUNTING[0] = not args.full_steps  # the first step's starts: no step before them
        r = replay_workload(
            calls, make_proposer("agentspec", env), batch=args.batch, k=args.k, cost_model=cost
        )
    us = np.asarray(r.propose_us)
    if args.full_steps:
        us = us[np.asarray(r.step_batch) >= args.batch]
    steps = len(us)
    what = "full engine steps" if args.full_steps else "engine steps"
    print(f"{steps} {what}; mean proposer time {np.mean(us) / 1e3:.3f} ms/step")
    for name, total in sorted(TOTALS.items(), key=lambda x: -x[1]):
        print(f"{name:>15} {total / steps * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
