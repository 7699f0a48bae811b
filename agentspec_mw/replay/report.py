"""Render replay results: a text table and a PNG plot (speedup vs batch size)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from agentspec_mw.replay.run import ResultRow

__all__ = ["format_table", "plot_path", "plot_speedup"]

_COLS = [
    ("proposer", "{}"),
    ("workload", "{}"),
    ("batch", "{}"),
    ("max_in_flight", "{}"),
    ("k", "{}"),
    ("calls", "{}"),
    ("output_tokens", "{}"),
    ("steps", "{}"),
    ("mat", "{:.3f}"),
    ("rejection_rate", "{:.3f}"),
    ("drafted_per_step", "{:.2f}"),
    ("propose_us_p50", "{:.1f}"),
    ("propose_us_p99", "{:.1f}"),
    ("propose_steps", "{}"),
    ("speedup", "{:.3f}"),
    ("effective_batch", "{:.1f}"),
    ("throughput_tok_s", "{:.1f}"),
    ("ttft_p50_s", "{:.3f}"),
    ("ttft_p99_s", "{:.3f}"),
    ("tpot_p50_s", "{:.4f}"),
    ("tpot_p99_s", "{:.4f}"),
    ("prefill_tokens", "{}"),
    ("prefix_hit_rate", "{:.3f}"),
]
_SHORT = {
    "effective_batch": "eff_batch",
    "throughput_tok_s": "tok/s",
    "ttft_p50_s": "ttft_p50",
    "ttft_p99_s": "ttft_p99",
    "tpot_p50_s": "tpot_p50",
    "tpot_p99_s": "tpot_p99",
    "prefill_tokens": "prefill_tok",
    "prefix_hit_rate": "hit_rate",
    "propose_steps": "prop_steps",
}
#: Marks an effective batch under 80 % of the nominal batch (``batch_filled`` false).
UNFILLED_MARK = "*"


def _cell(row: ResultRow, col: str, fmt: str) -> str:
    text = fmt.format(getattr(row, col))
    if col == "effective_batch" and not row.batch_filled:
        text += UNFILLED_MARK
    return text


def format_table(rows: Sequence[ResultRow]) -> str:
    """A fixed-width table with one line per row; times in seconds. An effective batch
    marked ``*`` is under 80 % of the row's batch (``batch_filled`` is false)."""
    header = [_SHORT.get(c, c) for c, _ in _COLS]
    body = [[_cell(r, c, fmt) for c, fmt in _COLS] for r in rows]
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def plot_path(path: str | Path) -> Path:
    """The file a plot asked for at ``path`` is written to: ``path``, with ``.png`` added
    when its extension is none of the formats matplotlib writes (``myplot`` ->
    ``myplot.png``, ``run.v2`` -> ``run.v2.png``; matplotlib would write ``myplot.png``
    for ``myplot`` itself, and refuse ``run.v2``).

    Raises:
        ValueError: ``path`` is a folder.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    out = Path(path)
    if out.is_dir():
        raise ValueError(
            f"plot path {str(out)!r} is a folder: give a file name, e.g. "
            f"{str(out / 'replay.png')!r}"
        )
    if out.suffix.lower().removeprefix(".") not in FigureCanvasBase.get_supported_filetypes():
        out = out.with_name(out.name + ".png")
    return out


def plot_speedup(rows: Sequence[ResultRow], path: str | Path, title: str = "") -> Path:
    """Speedup vs batch size: a panel per workload, a line per proposer (and k); returns
    the file written (:func:`plot_path` of ``path``).

    Raises:
        ValueError: no rows to plot, or ``path`` is a folder.
    """
    if not rows:
        raise ValueError("no replay results to plot")
    out = plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in rows))
    series = list(dict.fromkeys((r.proposer, r.k) for r in rows))
    ks = sorted({k for _, k in series})
    proposers = list(dict.fromkeys(p for p, _ in series))
    colors = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(proposers)}
    styles = {k: ("-", "--", ":", "-.")[i % 4] for i, k in enumerate(ks)}
    ncols = min(3, len(workloads))
    nrows = math.ceil(len(workloads) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False, sharey=False
    )
    for ax, wl in zip(axes.flat, workloads, strict=False):
        for prop, k in series:
            pts = sorted(
                (r.batch, r.speedup)
                for r in rows
                if r.workload == wl and (r.proposer, r.k) == (prop, k)
            )
            if not pts:
                continue
            label = prop if len(ks) == 1 else f"{prop} k={k}"
            ax.plot(
                [b for b, _ in pts],
                [s for _, s in pts],
                marker="o",
                ms=3,
                color=colors[prop],
                ls=styles[k],
                label=label,
            )
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(wl, fontsize=10)
        ax.set_xlabel("batch size (runs in flight)")
        ax.set_ylabel("predicted speedup vs none")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    ncol = max(1, min(len(labels), len(proposers)))
    legend_rows = -(-len(labels) // ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    bottom = min(0.3, 0.045 * legend_rows / nrows + 0.03)
    fig.tight_layout(rect=(0, bottom, 1, 0.97 if title else 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
