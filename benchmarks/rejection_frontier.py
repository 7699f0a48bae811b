"""How much speed AgentSpec's rejection target buys: its speed/rejection frontier.

AgentSpec's budget holds busy steps' drafts to a rejection target
(``budget_max_rejection``, moved by the rejection ledger). This script replays the traces
once per target (``none`` = no target and no floor: the cost model alone decides; every
run without ``budget_rejection_cap``, so the target alone is measured), plus
once with SuffixDecoding, and prints per workload the rejection rate, tokens per step and
predicted speedup of each, with AgentSpec / SuffixDecoding; it draws speedup against
rejection (``frontier.png``: one panel per workload, SuffixDecoding as a star, the
issue's 20 % rejection bar as a line). The JSON report of each run stays in ``--out-dir``.

Without ``--add-proposer-time`` (the default here) the counts are deterministic, so the
frontier is the drafting's, not the machine's.

    T=../shared/traces
    python benchmarks/rejection_frontier.py --traces $T/chatdev_multi_agent.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --out-dir /tmp/frontier

Extra options after ``--`` go to every ``agentspec replay`` call (e.g. ``-- --max-calls 200``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _replay_setup import replay_cli, save_figure, split_passthrough, sweep_parser

Row = dict  # type: ignore[type-arg]


def _target_args(target: str) -> list[str]:
    """``--set`` options for one rejection target (``none``: no target, no floor)."""
    if target == "none":
        return [
            "--set",
            "agentspec.budget_max_rejection=null",
            "--set",
            "agentspec.budget_floor=0",
            "--set",
            "agentspec.budget_rejection_cap=null",
        ]
    try:
        value = float(target)
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:
        raise SystemExit(f"rejection target {target!r} is not in (0, 1) or 'none'")
    return [
        "--set",
        f"agentspec.budget_max_rejection={value}",
        "--set",
        "agentspec.budget_rejection_cap=null",
    ]


def _replay(args: argparse.Namespace, proposers: str, path: Path, extra: list[str]) -> Path:
    opts = ["--traces", *args.traces, "--tokenizer", args.tokenizer, "--proposers", proposers]
    opts += ["--batch", str(args.batch), "--k", str(args.k)]
    return replay_cli([*opts, *extra], path)


def run(args: argparse.Namespace, extra: list[str]) -> tuple[dict[str, Path], Path]:
    """One replay per target and one with SuffixDecoding; their JSON reports."""
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reports = {}
    for target in args.targets.split(","):
        print(f"== rejection target {target}", file=sys.stderr, flush=True)
        path = out / f"frontier_{target}.json"
        reports[target] = _replay(args, "none,agentspec", path, [*_target_args(target), *extra])
    print("== SuffixDecoding", file=sys.stderr, flush=True)
    suffix = _replay(args, "none,suffix", out / "frontier_suffix.json", extra)
    return reports, suffix


def _rows(path: Path, proposer: str) -> dict[str, Row]:
    return {
        r["workload"]: r
        for r in json.loads(path.read_text())["results"]
        if r["proposer"] == proposer and r["workload"] != "ALL"
    }


def table(reports: dict[str, Path], suffix: Path) -> dict[str, dict[str, Row]]:
    """Print one markdown table per workload; return ``{label: {workload: row}}``."""
    rows = {t: _rows(p, "agentspec") for t, p in reports.items()}
    rows["suffix"] = _rows(suffix, "suffix")
    for w in rows["suffix"]:
        ref = rows["suffix"][w]["speedup"]
        print(f"\n#### {w}\n")
        print("| rejection target | rejection | tokens/step | speedup | vs SuffixDecoding |")
        print("| --- | --- | --- | --- | --- |")
        for label, by_wl in rows.items():
            r = by_wl.get(w)
            if r is None:
                continue
            name = "SuffixDecoding" if label == "suffix" else label
            print(
                f"| {name} | {r['rejection_rate']:.3f} | {r['mat']:.3f} | "
                f"{r['speedup']:.3f} | {r['speedup'] / ref:.3f} |"
            )
    return rows


def plot(rows: dict[str, dict[str, Row]], path: Path, bar: float = 0.20) -> None:
    """Speedup against rejection per workload: AgentSpec's targets as a line, SuffixDecoding
    as a star, the rejection bar as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(rows["suffix"])
    targets = [t for t in rows if t != "suffix"]
    ncols = min(3, len(workloads))
    nrows = -(-len(workloads) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.9 * nrows), squeeze=False)
    flat = axes.ravel()
    for ax in flat[len(workloads) :]:
        ax.set_visible(False)
    for ax, w in zip(flat, workloads, strict=False):
        pts = [(rows[t][w]["rejection_rate"], rows[t][w]["speedup"], t) for t in targets]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="AgentSpec")
        for x, y, t in pts:
            ax.annotate(t, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
        s = rows["suffix"][w]
        ax.plot([s["rejection_rate"]], [s["speedup"]], "*", markersize=12, label="SuffixDecoding")
        ax.axvline(bar, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(w.split("_")[0])
        ax.set_xlabel("rejection rate")
        ax.set_ylabel("predicted speedup vs no speculation")
    flat[0].legend(loc="lower right")
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    ap = sweep_parser(__doc__.splitlines()[0], batch="256", out_dir="frontier")
    ap.add_argument("--targets", default="0.1,0.15,0.2,0.25,none")
    args = ap.parse_args(argv)
    if not args.batch.isdigit():
        raise SystemExit(f"--batch takes one batch size here, not {args.batch!r}")
    for t in args.targets.split(","):
        _target_args(t)  # a bad target fails before any replay
    reports, suffix = run(args, extra)
    plot(table(reports, suffix), Path(args.out_dir) / "frontier.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
