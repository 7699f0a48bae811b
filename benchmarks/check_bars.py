"""Check issue 28's bars on `agentspec replay --json` reports.

For each cost-model preset, k and mode (the drafts alone, or with ``--add-proposer-time``;
read from each report's config): AgentSpec's predicted speedup over SuffixDecoding's
(the ratio of their speedups over no speculation) per workload and batch, and its
geometric mean over the workloads per batch. The bars:

* drafts alone: the geometric mean >= 1.10 at every batch >= 32 and >= 1.02 below
  (batch 1 and 8); every workload >= 0.97 at every batch;
* everywhere: AgentSpec >= 1.0x no speculation;
* with proposer time: AgentSpec >= 1.0x SuffixDecoding on every workload and batch.

Rejection is not a bar (``--rejection`` prints it as a diagnostic). A row whose workload
does not fill its batch (``batch_filled`` false: the mean requests emitting per step,
``effective_batch``, is under 80 % of the batch) is a replay at that smaller batch, and a
row whose runs fan out (calls issued together: ``effective_batch`` over
:data:`OVER_BATCH` × the batch) one at a larger batch: either cell shows ``[effective
batch]``, and the geometric mean is also printed over the rows at their batch only. The
issue counts such rows at their effective batch: the geometric-mean bars are checked twice,
over each batch's rows as replayed, and with each row in the bar of the batch it ran at
(its effective batch where it did not run at its own: ToT's fanned-out rows at batch 8 are
held to the 1.10 of batch >= 32, rows that fill 17 of 32 to the 1.02).

Every workload and batch replayed by AgentSpec in any report must have an AgentSpec and a
SuffixDecoding row in every scope, and the two rows must be of the same work (same calls,
output tokens and no-speculation time where the rows carry them): a scope that lacks a row,
or pairs rows of different work, misses; a bar with nothing to check misses too.
``agentspec replay --replicas`` reports are refused (their rows are per routing).
Prints markdown tables and one PASS/MISS line per bar; exits 1 if a bar misses.

    python benchmarks/check_bars.py docs/results/issue28/*.json

Several reports are read as one, so a workload's none/suffix and agentspec rows may come
from separate commands (the ``none`` replay has no proposer and takes no time of its own,
so every command's speedups share the same baseline; without proposer time no speedup
depends on the host's timing). Where two reports hold the same row the later one wins.
``ALL`` rows (a command's pooled workloads) are ignored.

With ``--median`` the reports are repeats of the same commands: each row's speedup is the
median over the reports that hold it (with ``--add-proposer-time`` the speedups depend on
each proposer's measured CPU time, which drifts between runs).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GEO_BIG = 1.10
"""Geometric mean of AgentSpec / SuffixDecoding over the workloads, at batch >= BIG_BATCH."""
GEO_SMALL = 1.02
"""The same below BIG_BATCH (the issue's batch 1 and 8)."""
BIG_BATCH = 32
PER_WORKLOAD = 0.97
"""AgentSpec / SuffixDecoding on every workload at every batch (drafts alone)."""
VS_NONE = 1.0
"""AgentSpec / no speculation, everywhere."""
VS_SUFFIX_TIMED = 1.0
"""AgentSpec / SuffixDecoding everywhere, with each proposer's time on the step."""
OVER_BATCH = 1.25
"""A row whose effective batch is above this many times its batch ran busier than it says
(its runs fan out: ToT's samples; a row under ``batch_filled``'s 80 % ran less busy)."""

SAME_WORK_RTOL = 1e-6
"""Relative tolerance on the no-speculation time two paired rows imply (``sim_time_s ×
speedup``: both speedups divide the same baseline only if these agree)."""

Row = dict[str, Any]
Key = tuple[str, bool, int]
"""A table's scope: (cost-model preset, with proposer time, k)."""


def load_rows(paths: Iterable[str], median: bool = False) -> list[Row]:
    """Every report's per-workload rows, each with its report's ``preset`` and ``timed``
    (``--add-proposer-time``); one row per (preset, timed, proposer, workload, batch, k):
    the last report's, or with ``median`` the median speedup over the reports."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for p in paths:
        try:
            report = json.loads(Path(p).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(
                f"{p}: not a readable `agentspec replay --json` report ({exc})"
            ) from exc
        if "replicas" in report:
            raise SystemExit(
                f"{p}: an `agentspec replay --replicas` report (rows per replica count and "
                "routing); issue 28's bars are on single-engine replays"
            )
        cfg = report.get("config", {})
        preset = str(cfg.get("cost_model", "?"))
        timed = bool(cfg.get("add_proposer_time", False))
        for r in report["results"]:
            if r["workload"] == "ALL":
                continue
            r = {**r, "preset": preset, "timed": timed}
            key = (preset, timed, r["proposer"], r["workload"], r["batch"], r["k"])
            groups.setdefault(key, []).append(r)
    if not median:
        return [g[-1] for g in groups.values()]
    return [
        {**g[-1], "speedup": statistics.median(r["speedup"] for r in g), "repeats": len(g)}
        for g in groups.values()
    ]


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def at_batch(row: Row) -> bool:
    """Whether ``row`` ran at its batch: it fills it (``batch_filled``) and its effective
    batch is not over :data:`OVER_BATCH` times it."""
    eff = float(row.get("effective_batch", row["batch"]))
    return bool(row.get("batch_filled", True)) and eff <= OVER_BATCH * row["batch"]


def bar_batch(row: Row) -> float:
    """The batch ``row`` counts at: its own where it ran at it (:func:`at_batch`), else its
    effective batch."""
    return float(row["batch"]) if at_batch(row) else float(row.get("effective_batch", 0.0))


def different_work(a: Row, s: Row) -> str | None:
    """Why AgentSpec's row ``a`` and SuffixDecoding's ``s`` are not of the same work (calls,
    output tokens, or the no-speculation time their speedups divide), or ``None``; fields
    a row lacks are not compared."""
    for field in ("calls", "output_tokens"):
        if field in a and field in s and a[field] != s[field]:
            return f"{field} {a[field]} vs {s[field]}"
    if all("sim_time_s" in r for r in (a, s)):
        base_a, base_s = a["sim_time_s"] * a["speedup"], s["sim_time_s"] * s["speedup"]
        if not math.isclose(base_a, base_s, rel_tol=SAME_WORK_RTOL):
            return f"no-speculation time {base_a:.6g} vs {base_s:.6g} s"
    return None


def _cell(x: float, row: Row, miss: bool) -> str:
    s = f"{x:.3f}" if not math.isnan(x) else "–"
    if not at_batch(row):
        s += f" [{float(row.get('effective_batch', row['batch'])):.0f}]"
    return s + (" ✗" if miss else "")


@dataclass
class Bar:
    """One bar's verdict: what it checks, its worst value and where."""

    scope: str
    what: str
    ok: bool
    worst: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'MISS'}  {self.scope}: {self.what} (worst {self.worst})"


def check_scope(
    rows: list[Row],
    key: Key,
    rejection: bool = False,
    wls: list[str] | None = None,
    batches: list[int] | None = None,
) -> list[Bar]:
    """Print the tables of one (preset, timed, k) and return its bars' verdicts: over
    ``wls`` × ``batches`` (default: the scope's AgentSpec rows'), each needing both rows."""
    preset, timed, k = key
    mine = [r for r in rows if (r["preset"], r["timed"], r["k"]) == key]
    by = {(r["proposer"], r["workload"], r["batch"]): r for r in mine}
    ours = [r for r in mine if r["proposer"] == "agentspec"]
    wls = wls if wls is not None else list(dict.fromkeys(r["workload"] for r in ours))
    batches = batches if batches is not None else sorted({r["batch"] for r in ours})
    mode = "with proposer time" if timed else "drafts alone"
    scope = f"{preset}, k = {k}, {mode}"
    head = "| " + " | ".join(f"b={b}" for b in batches) + " |"
    rule = "| --- | " + " | ".join("---" for _ in batches) + " |"
    print(f"\n### {scope}\n")
    print("AgentSpec / SuffixDecoding (`[n]`: the row ran at n requests, not at its batch)\n")
    print("| workload " + head + "\n" + rule)
    ratio: dict[tuple[str, int], float] = {}
    unpaired: list[str] = []
    per_floor = VS_SUFFIX_TIMED if timed else PER_WORKLOAD
    for wl in wls:
        cells = []
        for b in batches:
            a, s = by.get(("agentspec", wl, b)), by.get(("suffix", wl, b))
            if a is None or s is None:
                cells.append("–")
                continue
            why = different_work(a, s)
            if why is not None:
                unpaired.append(f"{wl} b={b} ({why})")
                cells.append("≠")
                continue
            x = ratio[wl, b] = a["speedup"] / s["speedup"]
            cells.append(_cell(x, a, x < per_floor))
        print(f"| {wl} | " + " | ".join(cells) + " |")
    geo: dict[int, float] = {}
    geo_big_eff: dict[int, float] = {}  # by nominal batch: its rows that ran at >= BIG_BATCH
    geo_small_eff: dict[int, float] = {}
    geo_cells, filled_cells, eff_cells = [], [], []
    for b in batches:
        xs = [ratio[w, b] for w in wls if (w, b) in ratio]
        if not xs:
            geo_cells.append("–")
            filled_cells.append("–")
            continue
        geo[b] = geomean(xs)
        bar = GEO_BIG if b >= BIG_BATCH else GEO_SMALL
        miss = not timed and not geo[b] >= bar
        geo_cells.append(f"**{geo[b]:.3f}**" + (" ✗" if miss else "") + f" ({len(xs)})")
        full = [ratio[w, b] for w in wls if (w, b) in ratio and at_batch(by["agentspec", w, b])]
        filled_cells.append(f"{geomean(full):.3f} ({len(full)})" if full else "–")
        here = [w for w in wls if (w, b) in ratio]
        big_x = [ratio[w, b] for w in here if bar_batch(by["agentspec", w, b]) >= BIG_BATCH]
        small_x = [ratio[w, b] for w in here if bar_batch(by["agentspec", w, b]) < BIG_BATCH]
        parts = []
        for xs_eff, out, bar, sign in (
            (big_x, geo_big_eff, GEO_BIG, ">="),
            (small_x, geo_small_eff, GEO_SMALL, "<"),
        ):
            if xs_eff:
                out[b] = geomean(xs_eff)
                miss = not timed and not out[b] >= bar
                parts.append(f"{sign}{BIG_BATCH}: {out[b]:.3f}" + (" ✗" if miss else ""))
                parts[-1] += f" ({len(xs_eff)})"
        eff_cells.append(", ".join(parts) or "–")
    print("| **geometric mean** (workloads) | " + " | ".join(geo_cells) + " |")
    print("| geometric mean, rows at their batch only | " + " | ".join(filled_cells) + " |")
    print("| geometric mean, rows by the batch they ran at | " + " | ".join(eff_cells) + " |")

    print("\nPredicted speedup over no speculation: AgentSpec / SuffixDecoding\n")
    print("| workload " + head + "\n" + rule)
    vs_none: dict[tuple[str, int], float] = {}
    for wl in wls:
        cells = []
        for b in batches:
            a, s = by.get(("agentspec", wl, b)), by.get(("suffix", wl, b))
            if a is None:
                cells.append("–")
                continue
            x = vs_none[wl, b] = a["speedup"]
            cell = f"{x:.3f}" + (" ✗" if x < VS_NONE else "")
            cells.append(cell + (f" / {s['speedup']:.3f}" if s else ""))
        print(f"| {wl} | " + " | ".join(cells) + " |")
    geo_none = []
    for b in batches:
        a_x = [by["agentspec", w, b]["speedup"] for w in wls if ("agentspec", w, b) in by]
        s_x = [by["suffix", w, b]["speedup"] for w in wls if ("suffix", w, b) in by]
        cell = f"{geomean(a_x):.3f}" if a_x else "–"
        geo_none.append(cell + (f" / {geomean(s_x):.3f}" if s_x else ""))
    print("| **geometric mean** (workloads) | " + " | ".join(geo_none) + " |")
    if rejection:
        print("\nRejection rate (diagnostic, not a bar): AgentSpec / SuffixDecoding\n")
        print("| workload " + head + "\n" + rule)
        for wl in wls:
            cells = []
            for b in batches:
                a, s = by.get(("agentspec", wl, b)), by.get(("suffix", wl, b))
                cells.append(
                    f"{a['rejection_rate']:.2f} / {s['rejection_rate']:.2f}" if a and s else "–"
                )
            print(f"| {wl} | " + " | ".join(cells) + " |")

    missing = [
        f"{w} b={b}"
        for w in wls
        for b in batches
        if ("agentspec", w, b) not in by or ("suffix", w, b) not in by
    ]
    if missing:
        print(f"\nnot replayed (agentspec or suffix row missing): {', '.join(missing)}")
    if unpaired:
        print(f"\nnot of the same work (left out of every bar): {'; '.join(unpaired)}")
    gaps = [*missing, *unpaired]
    listed = ", ".join(gaps[:4]) + (" …" if len(gaps) > 4 else "")
    bars: list[Bar] = [
        Bar(
            scope,
            "every workload and batch replayed by both, on the same work",
            not gaps,
            listed or "none missing",
        )
    ]

    def add(what: str, values: dict[Any, float], floor: float) -> None:
        """One bar: the lowest of ``values`` (keyed by batch or by (workload, batch));
        nothing to check misses."""
        if not values:
            bars.append(Bar(scope, what, False, "no rows"))
            return
        at = min(values, key=lambda kk: values[kk])
        where = f"b={at}" if isinstance(at, int) else f"{at[0]} b={at[1]}"
        bars.append(Bar(scope, what, values[at] >= floor, f"{values[at]:.3f} at {where}"))

    if timed:
        add(f"AgentSpec >= {VS_SUFFIX_TIMED}x SuffixDecoding everywhere", ratio, VS_SUFFIX_TIMED)
    else:
        big = {b: g for b, g in geo.items() if b >= BIG_BATCH}
        small = {b: g for b, g in geo.items() if b < BIG_BATCH}
        if big:
            add(
                f"geometric mean >= {GEO_BIG}x SuffixDecoding at batch >= {BIG_BATCH}", big, GEO_BIG
            )
        if small:
            add(
                f"geometric mean >= {GEO_SMALL}x SuffixDecoding at batch < {BIG_BATCH}",
                small,
                GEO_SMALL,
            )
        if geo_big_eff:
            add(
                f"geometric mean >= {GEO_BIG}x SuffixDecoding over the rows that ran at "
                f"batch >= {BIG_BATCH}",
                geo_big_eff,
                GEO_BIG,
            )
        if geo_small_eff:
            add(
                f"geometric mean >= {GEO_SMALL}x SuffixDecoding over the rows that ran at "
                f"batch < {BIG_BATCH}",
                geo_small_eff,
                GEO_SMALL,
            )
        add(f"every workload >= {PER_WORKLOAD}x SuffixDecoding at every batch", ratio, PER_WORKLOAD)
    add(f"AgentSpec >= {VS_NONE}x no speculation everywhere", vs_none, VS_NONE)
    return bars


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("reports", nargs="+", help="`agentspec replay --json` files")
    ap.add_argument("--median", action="store_true", help="the reports are repeats")
    ap.add_argument("--rejection", action="store_true", help="also print rejection rates")
    args = ap.parse_args(argv)
    rows = load_rows(args.reports, args.median)
    if args.median:
        n = sorted({r["repeats"] for r in rows})
        print(f"speedups: median over {'/'.join(map(str, n))} reports per row")
    keys = sorted({(r["preset"], r["timed"], r["k"]) for r in rows if r["proposer"] == "agentspec"})
    if not keys:
        print("no agentspec rows")
        return 1
    ours = [r for r in rows if r["proposer"] == "agentspec"]
    wls = list(dict.fromkeys(r["workload"] for r in ours))  # every scope needs all of them
    batches = sorted({r["batch"] for r in ours})
    bars = [bar for key in keys for bar in check_scope(rows, key, args.rejection, wls, batches)]
    print("\n" + "\n".join(bar.line() for bar in bars))
    ok = all(bar.ok for bar in bars)
    print("\nall bars hold" if ok else "\nsome bars miss")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
