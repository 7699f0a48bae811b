"""AgentSpec on the embedded engine with a fixed cost-model preset vs the measured one.

Runs the demo's multi-agent LangGraph workflow (``agentspec demo``'s graph, two queries
at once) on fresh embedded engines — no speculation, SuffixDecoding, AgentSpec with the
``llama8b-h100`` preset, AgentSpec with ``cost_model="measured"`` (the step time fitted
to this engine's own steps) — in that order, ``--repeats`` times. The four runs of one
repeat sit side by side in time, so each repeat's speedups (no speculation's wall time /
the run's) are paired; the medians over the repeats are printed with the drafted and
accepted tokens and, for the measured runs, the fitted step time. Outputs must be
identical across all runs (checked).

    python benchmarks/cost_model_ab.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from agentspec_mw_langgraph.demo import DEFAULT_TOPICS, outputs_identical, run_engine
from agentspec_mw_vllm.metrics import get_metrics

#: (label, speculative method, cost model of our adapter or None)
CONFIGS: tuple[tuple[str, str | None, str | None], ...] = (
    ("none", None, None),
    ("suffix", "suffix", None),
    ("agentspec/llama8b-h100", "agentspec", "llama8b-h100"),
    ("agentspec/measured", "agentspec", "measured"),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--topics", default=",".join(DEFAULT_TOPICS))
    args = p.parse_args(argv)
    topics = [t for t in args.topics.split(",") if t]
    speedups: dict[str, list[float]] = {label: [] for label, _, _ in CONFIGS}
    counts: dict[str, list[tuple[int, int]]] = {label: [] for label, _, _ in CONFIGS}
    fits: list[dict[str, float]] = []
    runs = []
    for rep in range(args.repeats):
        base = None
        for label, spec, cost in CONFIGS:
            options: dict[str, Any] = {"cost_model": cost} if cost else {}
            run = run_engine(
                label,
                spec,
                k=args.k,
                max_tokens=args.max_tokens,
                topics=topics,
                progress=lambda _msg: None,
                **options,
            )
            runs.append(run)
            base = run.wall_s if base is None else base
            speedups[label].append(base / run.wall_s)
            counts[label].append((run.total.drafted, run.total.accepted))
            if cost == "measured":
                fits.append(get_metrics().snapshot().step_model)
            print(
                f"repeat {rep + 1}: {label:<24} {run.wall_s:6.1f} s  "
                f"speedup {base / run.wall_s:5.2f}x  drafted {run.total.drafted:4d}  "
                f"accepted {run.total.accepted:4d}",
                flush=True,
            )
    print(f"\nmedians over {args.repeats} repeats (speedup vs no speculation, same repeat):")
    for label, _, _ in CONFIGS:
        drafted = statistics.median(d for d, _ in counts[label])
        accepted = statistics.median(a for _, a in counts[label])
        print(
            f"  {label:<24} speedup {statistics.median(speedups[label]):5.2f}x "
            f"(runs {', '.join(f'{s:.2f}' for s in speedups[label])})  "
            f"drafted {drafted:.0f}  accepted {accepted:.0f}"
        )
    for i, fit in enumerate(fits, 1):
        if fit:
            print(
                f"  measured fit, repeat {i}: {fit['fixed'] * 1e3:.1f} ms/step + "
                f"{fit['token'] * 1e3:.2f} ms/token + {fit['kv_token'] * 1e9:.0f} ns/KV token "
                f"({fit['steps']:.0f} steps)"
            )
    same = outputs_identical(runs)
    print(f"outputs identical across all runs: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
