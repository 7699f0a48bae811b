"""Refit the engine steps a live ``agentspec bench`` run timed (``<out>.steps.jsonl``).

The measured cost model (:class:`agentspec_mw.costfit.MeasuredStepTime`) learns the step
time online from the engine's own steps. This script takes the steps one bench run gave
it (AgentSpec with the measured model writes them: ``num_batched, num_kv, spec_kv,
draft_kv, emitted, seconds`` per step) and asks what the features explain:

* an offline, non-negative, relative-error least-squares fit (as
  :func:`~agentspec_mw.costfit.fit_step_times`) of ``c_fix + c_tok N_batched + c_kv N_kv +
  f (c_spec_kv N_spec_kv + c_draft_kv N_draft_kv)`` (``f``: one factor on the prior's draft
  shape) with and without ``c_emit N_emitted``: the coefficients and the median / p90
  relative error;
* the online fit itself, replayed over the same steps in their order from the prior
  (default ``cpu-smollm2``), with the emitted tokens and with them zeroed (the fit before
  it had the term): the draft factor and the KV price it ends at.

    python benchmarks/fit_live_steps.py out/bench.steps.jsonl [--label agentspec] [--by-n]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from agentspec_mw.costfit import MeasuredStepTime, _nonnegative_lstsq
from agentspec_mw.costmodel import get_cost_model


def load_steps(path: Path, label: str | None) -> dict[tuple[str, str, int], np.ndarray]:
    """``(label, app, n) -> steps`` (rows ``[nb, kv, spec_kv, draft_kv, emitted, s]``, in
    run order; repeats concatenated)."""
    out: dict[tuple[str, str, int], list[list[float]]] = {}
    for line in path.read_text().splitlines():
        run = json.loads(line)
        if label is not None and run["label"] != label:
            continue
        out.setdefault((run["label"], run["app"], run["n"]), []).extend(run["steps"])
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items() if v}


def offline(steps: np.ndarray, shape: tuple[float, float], emitted: bool) -> dict[str, float]:
    """The weighted (1 / seconds) non-negative least-squares fit of the steps."""
    nb, kv, spec, draft, emit, y = steps.T
    cols = [np.ones_like(y), nb, kv, shape[0] * spec + shape[1] * draft]
    if emitted:
        cols.append(emit)
    x = np.column_stack(cols)
    w = 1.0 / y
    coef = _nonnegative_lstsq(x * w[:, None], y * w)
    err = np.abs(x @ coef - y) / y
    return {
        "fix_ms": coef[0] * 1e3,
        "tok_ms": coef[1] * 1e3,
        "kv_us": coef[2] * 1e6,
        "draft_factor": coef[3],
        "emit_ms": coef[4] * 1e3 if emitted else 0.0,
        "err_p50": float(np.median(err)),
        "err_p90": float(np.quantile(err, 0.9)),
    }


def online(steps: np.ndarray, prior: str, emitted: bool) -> dict[str, float]:
    """The online fit replayed over the steps (emitted tokens zeroed unless ``emitted``)."""
    fit = MeasuredStepTime(prior=get_cost_model(prior))
    for nb, kv, spec, draft, emit, s in steps:
        fit.observe(nb, kv, s, spec, draft, emit if emitted else 0.0)
    m = fit.model
    p = fit.prior
    return {
        "tok_ms": m.c_tok * 1e3,
        "kv_us": m.c_kv * 1e6,
        "draft_factor": m.c_spec_kv / p.c_spec_kv if p.c_spec_kv else float("nan"),
        "emit_ms": fit.emitted_cost * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=Path, help="<out>.steps.jsonl of agentspec bench")
    ap.add_argument("--label", default=None, help="one method's steps (default: each)")
    ap.add_argument("--prior", default="cpu-smollm2", help="the online fit's prior preset")
    ap.add_argument("--by-n", action="store_true", help="one fit per N (default: pooled)")
    args = ap.parse_args()
    prior = get_cost_model(args.prior)
    shape = (prior.c_spec_kv, prior.c_draft_kv)
    groups = load_steps(args.steps, args.label)
    if not args.by_n:
        pooled: dict[tuple[str, str, int], np.ndarray] = {}
        for (label, app, _n), v in groups.items():
            key = (label, app, 0)
            pooled[key] = np.concatenate([pooled[key], v]) if key in pooled else v
        groups = pooled
    print(
        "group | steps | fit | c_fix ms | c_tok ms | c_kv us | draft factor | c_emit ms | "
        "err p50 | err p90"
    )
    for (label, app, n), steps in sorted(groups.items()):
        name = f"{label} {app}" + (f" N={n}" if n else "")
        for emitted in (False, True):
            r = offline(steps, shape, emitted)
            print(
                f"{name} | {len(steps)} | offline{' + emitted' if emitted else ''} | "
                f"{r['fix_ms']:.2f} | {r['tok_ms']:.3f} | {r['kv_us']:.2f} | "
                f"{r['draft_factor']:.2f} | {r['emit_ms']:.3f} | {r['err_p50']:.1%} | "
                f"{r['err_p90']:.1%}"
            )
        for emitted in (False, True):
            o = online(steps, args.prior, emitted)
            print(
                f"{name} | {len(steps)} | online{' + emitted' if emitted else ''} | - | "
                f"{o['tok_ms']:.3f} | {o['kv_us']:.2f} | {o['draft_factor']:.2f} | "
                f"{o['emit_ms']:.3f} | - | -"
            )


if __name__ == "__main__":
    main()
