"""How much of a tagged / untagged throughput ratio is the engines' speed, not their drafts.

``agentspec bench`` writes each AgentSpec engine's timed steps next to its JSON
(``<out>.steps.jsonl``). This script reads a bench JSON and its steps file (either may
be ``.xz``), fits one step-time model to every engine's steps of a shape and N
(:func:`agentspec_mw_langgraph.bench.engine_slowness`) and prints, per repeat, each
engine's slowness (Σ measured / Σ predicted step time) and the tagged / untagged
throughput ratio as measured and with both slownesses divided out
(:func:`~agentspec_mw_langgraph.bench.speed_adjusted_ratio`). Benches since this
script compute the same themselves (``step_slowness_repeats`` in the JSON); this serves
the ones before, several runs at once, and ``--plot`` draws every repeat::

    python benchmarks/engine_speed.py docs/results/bench_X.json \
        docs/results/bench_X.steps.jsonl.xz [more pairs] [--plot speed.png]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from agentspec_mw.traces.loader import open_text
from agentspec_mw_langgraph.bench import (
    BenchRow,
    engine_slowness,
    paired_ratio,
    read_report,
    repeat_ratios,
    speed_adjusted_ratio,
)


def _read(path: Path) -> str:
    with open_text(path) as f:  # .json / .jsonl, plain or .xz / .gz
        return f.read()


def analyse(report_rows: list[BenchRow], steps_text: str) -> list[dict[str, Any]]:
    """Per (app, N) with both AgentSpec engines: the per-repeat slownesses and ratios."""
    steps: dict[tuple[str, int], dict[str, dict[int, list[list[float]]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for line in steps_text.splitlines():
        if line.strip():
            rec = json.loads(line)
            steps[(rec["app"], rec["n"])][rec["label"]][rec["repeat"]] = rec["steps"]
    out = []
    for (app, n), by_label in sorted(steps.items()):
        rows = {r.label: r for r in report_rows if (r.app, r.n) == (app, n)}
        if "agentspec" not in rows or "agentspec-untagged" not in rows:
            continue
        repeats = rows["agentspec"].repeats
        slow = engine_slowness(
            {lab: [reps.get(r, []) for r in range(repeats)] for lab, reps in by_label.items()}
        )
        t = rows["agentspec"].model_copy(
            update={"step_slowness_repeats": slow.get("agentspec", [])}
        )
        u = rows["agentspec-untagged"].model_copy(
            update={"step_slowness_repeats": slow.get("agentspec-untagged", [])}
        )
        per = repeat_ratios(t, u)
        out.append(
            {
                "app": app,
                "n": n,
                "tput_ratio_repeats": per,
                "slowness_tagged": t.step_slowness_repeats,
                "slowness_untagged": u.step_slowness_repeats,
                "tput_ratio": paired_ratio(t, u),
                "speed_adjusted_ratio": speed_adjusted_ratio(t, u),
                "drafted_ratio": t.drafted / u.drafted if u.drafted else None,
            }
        )
    return out


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Each repeat's measured tagged / untagged throughput against the two engines'
    slowness ratio; on the curve ``y = 1 / x`` the whole ratio is the engines' speed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    points: dict[str, tuple[list[float], list[float]]] = {}
    for r in results:  # one colour per shape and N, over every run
        x = [a / b for a, b in zip(r["slowness_tagged"], r["slowness_untagged"], strict=False)]
        px, py = points.setdefault(f"{r['app'].split(':')[0]} N={r['n']}", ([], []))
        px += x
        py += r["tput_ratio_repeats"][: len(x)]
    xs = [v for px, _ in points.values() for v in px]
    for label, (px, py) in sorted(points.items()):
        ax.scatter(px, py, s=18, label=label)
    if xs:
        grid = np.linspace(min(xs) - 0.01, max(xs) + 0.01, 50)
        ax.plot(grid, 1 / grid, color="grey", lw=1, label="all speed: y = 1 / x")
    ax.axhline(1.0, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("tagged engine's slowness / untagged's (per repeat)")
    ax.set_ylabel("tagged / untagged tok/s (per repeat)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "files",
        type=Path,
        nargs="+",
        help="pairs: a bench JSON (--json) and its <out>.steps.jsonl, either optionally .xz",
    )
    ap.add_argument("--plot", type=Path, help="write every repeat of every pair to this PNG")
    args = ap.parse_args(argv)
    if len(args.files) % 2:
        ap.error("give the files in pairs: REPORT.json STEPS.jsonl [REPORT.json STEPS.jsonl ...]")
    everything: list[dict[str, Any]] = []
    for report_path, steps_path in zip(args.files[::2], args.files[1::2], strict=True):
        try:
            report = read_report(report_path)
            results = analyse(report.rows, _read(steps_path))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # JSON, pydantic: ValueError
            ap.error(f"{report_path} / {steps_path}: not a bench report and its steps ({exc!r})")
        print(f"{report_path.name} ({report.date}): tagged / untagged AgentSpec")
        if not results:
            print("  no shape and N with both agentspec and agentspec-untagged timed steps")
        for r in results:
            adj = r["speed_adjusted_ratio"]
            per = ", ".join(
                f"{x:.3f} (slowness {a:.3f} / {b:.3f})"
                for x, a, b in zip(
                    r["tput_ratio_repeats"],
                    r["slowness_tagged"],
                    r["slowness_untagged"],
                    strict=False,
                )
            )
            print(
                f"  {r['app']} N={r['n']}: tok/s {r['tput_ratio']:.3f}x, "
                f"speed-adjusted {'-' if adj is None else format(adj, '.3f')}x, "
                f"drafted {np.nan if r['drafted_ratio'] is None else r['drafted_ratio']:.2f}x; "
                f"per repeat {per}"
            )
        everything += results
    if args.plot is not None and everything:
        plot(everything, args.plot)
        print(f"wrote {args.plot}")
    return 0 if everything else 1


if __name__ == "__main__":
    raise SystemExit(main())
