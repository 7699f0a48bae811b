"""Where AgentSpec's per-step time goes: wall-clock timers around each kernel call.

Replays one trace at a batch size twice with the AgentSpec proposer (the first pass
compiles and warms up) and prints, per engine step averaged over all steps of the second
pass, the time inside each kernel and public method (nested: ``propose`` includes
``_flush``, which includes ``apply_extends`` and ``insert_outputs``). Each step's timers
cover what the replay's proposer time of that step covers (its ``propose``, then the
``start``, ``extend`` and ``stop`` calls after it). With ``--full-steps`` only the steps
with ``--batch`` requests running count: the steps ``benchmarks/proposer_speed.py``'s
median is over.

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

STEP: collections.defaultdict[str, float] = collections.defaultdict(float)
"""The timers' totals since the last step ended (the replay's ``on_tokens``)."""
STEPS: list[dict[str, float]] = []
"""Each ended step's totals, aligned with the replay's ``propose_us``."""
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
            STEP[name] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def _end_step(_tokens: int) -> None:
    """The replay ended a step (called once per ``propose_us`` entry, after the step's
    ``extend`` and ``stop`` calls)."""
    STEPS.append(dict(STEP))
    STEP.clear()


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
    setup = load_workloads([args.trace], args.tokenizer, max_k=args.k)
    env, cost = setup.env, setup.cost
    calls = next(iter(setup.workloads.values()))
    for _ in range(2):
        STEP.clear()
        STEPS.clear()
        r = replay_workload(
            calls,
            make_proposer("agentspec", env),
            batch=args.batch,
            k=args.k,
            cost_model=cost,
            on_tokens=_end_step,
        )
    assert len(STEPS) == len(r.propose_us), "one timer record per replay step"
    us = np.asarray(r.propose_us)
    counted = np.ones(len(us), dtype=bool)
    if args.full_steps:
        counted = np.asarray(r.step_batch) >= args.batch
    steps = int(counted.sum())
    totals: collections.defaultdict[str, float] = collections.defaultdict(float)
    for rec in (s for s, c in zip(STEPS, counted.tolist(), strict=True) if c):
        for name, t in rec.items():
            totals[name] += t
    what = "full engine steps" if args.full_steps else "engine steps"
    print(f"{steps} {what}; mean proposer time {np.mean(us[counted]) / 1e3:.3f} ms/step")
    for name, total in sorted(totals.items(), key=lambda x: -x[1]):
        print(f"{name:>15} {total / steps * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
