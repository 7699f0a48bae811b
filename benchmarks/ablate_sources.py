"""Which candidate sources pay, at batch 1 and at batch 256: an ablation of AgentSpec.

Runs ``agentspec replay`` once per source set (``iso`` alone is the paper's isolated
cache; ``agent``, ``local`` and ``scope`` widen it), with ``none`` as the baseline in the same run,
then prints a markdown table (speedup / mean accepted tokens per step / rejection rate per
workload and source set) and draws one bar chart per batch size (``sources.png``; the
JSON report of each run stays in ``--out-dir``).

    python benchmarks/ablate_sources.py --traces ../shared/traces/tau_bench_airline.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --out-dir /tmp/ablation

Extra options after ``--`` go to every ``agentspec replay`` call (e.g. ``-- --max-calls 200``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _replay_setup import replay_cli, save_figure, split_passthrough, sweep_parser

SOURCE_SETS = (
    ("iso",),
    ("iso", "agent"),
    ("iso", "local"),
    ("iso", "agent", "local"),
    ("iso", "agent", "scope", "local"),
)


def _name(sources: tuple[str, ...]) -> str:
    return "+".join(sources)


def run(args: argparse.Namespace, extra: list[str]) -> dict[str, Path]:
    """One replay per source set; returns the JSON report of each."""
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reports = {}
    for sources in SOURCE_SETS:
        print(f"== sources {_name(sources)}", file=sys.stderr, flush=True)
        opts = ["--traces", *args.traces, "--tokenizer", args.tokenizer]
        opts += ["--proposers", "none,agentspec", "--batch", args.batch, "--k", str(args.k)]
        chosen = f"agentspec.experimental.sources={json.dumps(list(sources))}"
        opts += ["--add-proposer-time", "--set", chosen]
        path = out / f"sources_{'_'.join(sources)}.json"
        reports[_name(sources)] = replay_cli([*opts, *extra], path)
    return reports


def table(reports: dict[str, Path]) -> dict[tuple[str, str, int], dict]:  # type: ignore[type-arg]
    """Print the markdown tables; return the AgentSpec rows by (sources, workload, batch)."""
    rows: dict[tuple[str, str, int], dict] = {}  # type: ignore[type-arg]
    for name, path in reports.items():
        for r in json.loads(path.read_text())["results"]:
            if r["proposer"] == "agentspec":
                rows[(name, r["workload"], r["batch"])] = r
    names = list(reports)
    workloads = list(dict.fromkeys(w for _, w, _ in rows))
    for b in sorted({b for *_, b in rows}):
        print(f"\n#### Batch {b}: speedup / mean accepted tokens per step / rejection rate\n")
        print("| workload | " + " | ".join(names) + " |")
        print("| --- | " + " | ".join("---" for _ in names) + " |")
        for w in workloads:
            cells = [rows.get((n, w, b)) for n in names]
            print(
                f"| {w} | "
                + " | ".join(
                    f"{c['speedup']:.3f} / {c['mat']:.3f} / {c['rejection_rate']:.3f}" if c else "–"
                    for c in cells
                )
                + " |"
            )
    return rows


def plot(rows: dict[tuple[str, str, int], dict], path: Path) -> None:  # type: ignore[type-arg]
    """Grouped bars: speedup per workload, one bar per source set, a panel per batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(n for n, _, _ in rows))
    workloads = list(dict.fromkeys(w for _, w, _ in rows))
    batches = sorted({b for *_, b in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4.6), squeeze=False)
    width = 0.8 / len(names)
    for ax, b in zip(axes[0], batches, strict=True):
        for i, n in enumerate(names):
            ys = [rows[(n, w, b)]["speedup"] if (n, w, b) in rows else 0.0 for w in workloads]
            ax.bar([x + i * width for x in range(len(workloads))], ys, width, label=n)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))])
        ax.set_xticklabels([w.split("_")[0] for w in workloads], rotation=30)
        ax.set_title(f"batch {b}")
        ax.set_ylabel("predicted speedup vs no speculation")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="sources", loc="lower center", ncol=len(names))
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    ap = sweep_parser(__doc__.splitlines()[0], batch="1,256", out_dir="ablation")
    args = ap.parse_args(argv)
    rows = table(run(args, extra))
    plot(rows, Path(args.out_dir) / "sources.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
