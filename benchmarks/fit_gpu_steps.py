"""Fit the presets' step-time forms to GPU steps timed by ``benchmarks/gpu_step_time.py``.

    python benchmarks/fit_gpu_steps.py docs/results/gpu_steps_h200_2026-12-04.json \\
        docs/results/gpu_steps_h200_2026-12-04b.json

Each step's time is the faster of its two attention variants. Fits the linear form
(:func:`agentspec_mw.costfit.fit_step_times`) and the ridge form
(:func:`agentspec_mw.costfit.fit_ridge_step_times`) on the relative error, and prints
each one's coefficients and its error overall, by batch, for steps with drafts and for
steps that carry a prefill chunk. ``--json`` writes the coefficients and errors.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from agentspec_mw.costfit import fit_ridge_step_times, fit_step_times


def load(paths: list[Path]) -> dict[str, np.ndarray]:
    """The steps of every file as arrays: requests, query, chunk, tokens, kv, rows, seconds."""
    rows: list[list[float]] = []
    for path in paths:
        data = json.loads(path.read_text())
        cols = data["columns"]
        for step in data["steps"]:
            r = dict(zip(cols, step, strict=True))
            if "chunk" not in r:  # the first run's format: query 0 = a prefill chunk alone
                chunk = r["context"] if r["query"] == 0 else 0
                r["chunk"], r["requests"] = chunk, 0 if chunk else r["requests"]
            best = r["sdpa_s"] if r["bmm_s"] is None else min(r["sdpa_s"], r["bmm_s"])
            rows.append(
                [r["requests"], r["query"], r["chunk"], r["tokens"], r["kv"], r["rows"], best]
            )
    a = np.array(rows, dtype=np.float64)
    names = ("requests", "query", "chunk", "tokens", "kv", "rows", "seconds")
    return {name: a[:, i] for i, name in enumerate(names)}


def report(name: str, err: np.ndarray, s: dict[str, np.ndarray]) -> dict[str, float]:
    """Print and return the relative error's median and p90, and the median signed error
    by batch and kind of step."""
    out = {
        "median_abs": float(np.median(np.abs(err))),
        "p90_abs": float(np.quantile(np.abs(err), 0.9)),
    }
    groups = {
        f"B={int(b)}": (s["requests"] == b) & (s["chunk"] == 0)
        for b in np.unique(s["requests"])
        if b
    }
    groups["drafts"] = (s["query"] > 1) & (s["chunk"] == 0)
    groups["chunk+decodes"] = (s["chunk"] > 0) & (s["requests"] > 0)
    groups["chunk alone"] = (s["chunk"] > 0) & (s["requests"] == 0)
    for g, m in groups.items():
        if m.any():
            out[g] = float(np.median(err[m]))
    print(
        f"{name}: |error| median {out['median_abs']:.1%}, p90 {out['p90_abs']:.1%}; signed median "
        + ", ".join(f"{g} {v:+.1%}" for g, v in out.items() if g not in ("median_abs", "p90_abs"))
    )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", nargs="+", type=Path, help="JSON files of gpu_step_time.py")
    ap.add_argument("--json", type=Path, help="write the fits here")
    a = ap.parse_args(argv)
    s = load(a.steps)
    y = s["seconds"]
    print(f"{y.size} steps from {len(a.steps)} file(s)")
    lin = fit_step_times(s["tokens"], s["kv"], s["rows"], y)
    lin_err = (lin[0] + lin[1] * s["tokens"] + lin[2] * s["kv"] + lin[3] * s["rows"] - y) / y
    print(
        f"linear: c_fix {lin[0] * 1e3:.3f} ms, c_tok {lin[1] * 1e6:.2f} µs, "
        f"c_kv {lin[2] * 1e9:.2f} ns, c_row {lin[3] * 1e6:.2f} µs"
    )
    out = {"linear": {"coef": lin.tolist(), **report("  linear", lin_err, s)}}
    ridge, _ = fit_ridge_step_times(s["tokens"], s["kv"], s["rows"], y)
    c_fix, c_tok, c_kv, c_row, c_oh = ridge.tolist()
    pred = c_oh + c_kv * s["kv"] + c_row * s["rows"] + np.maximum(c_fix, c_tok * s["tokens"])
    print(
        f"ridge: c_fix {c_fix * 1e3:.3f} ms, c_tok {c_tok * 1e6:.2f} µs (ridge at "
        f"{c_fix / c_tok:.0f} tokens), c_kv {c_kv * 1e9:.2f} ns, c_row {c_row * 1e6:.2f} µs, "
        f"c_oh {c_oh * 1e3:.3f} ms"
    )
    out["ridge"] = {"coef": ridge.tolist(), **report("  ridge", (pred - y) / y, s)}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
