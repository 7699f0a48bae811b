"""Fit AgentSpec's stored calibration prior: each cell's acceptance on recorded traces.

Replays each trace with AgentSpec starting from the paper's redundancy prior
(``calib_prior="redundancy"``, so the result never depends on an earlier stored prior),
sums every scope's calibration counts (the picked candidates' positions, counted as the
proposer counts them online) over the traces, and writes, per cell, the counts shrunk
toward the redundancy prior with ``calib_prior_strength``:
``(successes + S * g) / (trials + S)``. A cell the traces never reached keeps ``g``.
The file (``agentspec_mw/data/calibration_prior.npz``) holds the prior, the counts, the
cell layout and the command, traces and date; the proposer refuses a file made for
another layout. Deterministic (no wall-clock time in the counts).

The shipped prior was fitted on three ../shared traces (τ-bench, Reflexion, ReAct; the
issue-28 tuning set without ToT); ChatDev, SWE, ToT and the engine recordings in
``benchmarks/traces/`` are held out of it:

    python benchmarks/fit_calibration_prior.py \\
        --traces ../shared/traces/tau_bench_airline.jsonl.xz \\
                 ../shared/traces/reflexion_hotpotqa.jsonl.xz \\
                 ../shared/traces/react_fever_webshop.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 32 --k 16 --cost-model llama8b-h100
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _replay_setup import load_workloads
from tqdm import tqdm

from agentspec_mw.agentspec.calibration import PRIOR_FILE, cell_shape, prior_table
from agentspec_mw.agentspec.config import AgentSpecConfig
from agentspec_mw.agentspec.proposer import AgentSpecProposer
from agentspec_mw.costmodel import StepTimeFn
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.replay.sim import ReplayCall, replay_workload

_OUT = Path(__file__).parents[1] / "agentspec_mw" / "data" / PRIOR_FILE


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


_OPTIONS = {"experimental": {"calib_prior": "redundancy"}}


def count_cells(
    calls: Sequence[ReplayCall], env: ProposerEnv, cost: StepTimeFn, *, batch: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Successes and trials per cell, summed over every scope, of one replay of ``calls``
    by AgentSpec from the redundancy prior."""
    proposer = AgentSpecProposer(env, **_OPTIONS)
    replay_workload(calls, proposer, batch=batch, k=k, cost_model=cost)
    scopes = proposer._scopes  # the learned counts of every scope row
    return scopes.succ[1:].sum(axis=0), scopes.tot[1:].sum(axis=0)  # row 0: the frozen prior


def prior_from_counts(succ: np.ndarray, tot: np.ndarray) -> tuple[np.ndarray, float]:
    """``(successes + S * g) / (trials + S)`` per cell (``g``: the redundancy prior, ``S``:
    ``calib_prior_strength``), and ``S``."""
    exp = AgentSpecConfig(**_OPTIONS).experimental
    base = prior_table(exp.redundancy_g_min, exp.calib_prior_scale)
    strength = exp.calib_prior_strength
    return (succ + strength * base) / (tot + strength), strength


def fit(
    traces: list[str],
    tokenizer: str,
    *,
    batch: int,
    k: int,
    cost_model: str,
    max_calls_per_run: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The prior, the summed successes and trials per cell, and the shrinkage weight."""
    n = math.prod(cell_shape())
    succ, tot = np.zeros(n), np.zeros(n)
    for path in tqdm(traces, desc="traces", unit="trace", file=sys.stderr):
        setup = load_workloads(
            [path], tokenizer, max_k=k, cost_model=cost_model, max_calls_per_run=max_calls_per_run
        )
        for calls in setup.workloads.values():
            s, t = count_cells(calls, setup.env, setup.cost, batch=batch, k=k)
            succ += s
            tot += t
    prior, strength = prior_from_counts(succ, tot)
    return prior, succ, tot, strength


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--cost-model", default="llama8b-h100")
    ap.add_argument("--max-calls-per-run", type=int, default=None)
    ap.add_argument("--out", default=str(_OUT))
    args = ap.parse_args(argv)
    prior, succ, tot, strength = fit(
        args.traces,
        args.tokenizer,
        batch=args.batch,
        k=args.k,
        cost_model=args.cost_model,
        max_calls_per_run=args.max_calls_per_run,
    )
    meta = {
        "traces": [Path(t).name for t in args.traces],
        "batch": args.batch,
        "k": args.k,
        "cost_model": args.cost_model,
        "max_calls_per_run": args.max_calls_per_run,
        "strength": strength,
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/fit_calibration_prior.py " + " ".join(argv or sys.argv[1:]),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        prior=prior,
        successes=succ,
        trials=tot,
        shape=np.array(cell_shape(), dtype=np.int64),
        meta=np.array(json.dumps(meta)),
    )
    reached = int((tot > 0).sum())
    print(
        f"wrote {out}: {len(prior)} cells, {reached} reached, {tot.sum():.0f} counted tokens, "
        f"mean prior {prior.mean():.3f} (redundancy prior's cells kept where unreached)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
