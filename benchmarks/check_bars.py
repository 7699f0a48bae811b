"""Check the AgentSpec acceptance bars on `agentspec replay --json` reports.

For each k and workload: rejection rate at the largest batch, the lowest predicted speedup
over all batch sizes, speedup vs SuffixDecoding at the largest batch (and the geometric
mean over workloads), and mean accepted tokens per step vs SuffixDecoding at batch 1.
Prints a markdown table per k; exits 1 if any bar fails.

    python benchmarks/check_bars.py [--median] docs/results/replay_main.json [more.json ...]

Several reports are read as one; where two hold the same (proposer, workload, batch, k)
the later one wins, so a workload may be pieced together from several runs (put the run
whose AgentSpec and SuffixDecoding rows at the largest batch belong together last; the
batch-1 bar compares tokens per step, which do not depend on timing). A workload replayed
without batch 1 has no batch-1 bar.

With ``--median`` the reports are repeats of one command instead: each row's speedup is
the median over the reports that hold it (with ``--add-proposer-time`` the speedups
depend on the proposers' measured CPU time, which drifts between runs; the other
columns do not), and the pooled ``ALL`` rows are kept under one name.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

BARS = {"rej": 0.20, "min_speedup": 1.0, "vs_suffix": 1.1, "geo": 1.3, "mat1": 0.95}


def speedup_tables(rows: list[dict]) -> None:  # type: ignore[type-arg]
    """Print predicted speedup vs none: a row per workload × proposer, a column per batch."""
    batches = sorted({r["batch"] for r in rows})
    for k in sorted({r["k"] for r in rows}):
        print(f"\n#### Predicted speedup vs no speculation, k = {k}\n")
        print("| workload | proposer | " + " | ".join(f"b={b}" for b in batches) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in batches) + " |")
        seen = dict.fromkeys((r["workload"], r["proposer"]) for r in rows if r["k"] == k)
        for wl, prop in seen:
            if prop == "none":
                continue
            cells = {
                r["batch"]: r["speedup"]
                for r in rows
                if r["k"] == k and r["workload"] == wl and r["proposer"] == prop
            }
            print(
                f"| {wl} | {prop} | "
                + " | ".join(f"{cells[b]:.3f}" if b in cells else "–" for b in batches)
                + " |"
            )


def _load(paths: list[str], median: bool = False) -> list[dict]:  # type: ignore[type-arg]
    """Rows of every report; each report's pooled ``ALL`` rows are named after its file
    when there are several (they pool different workloads). ``median``: one row per
    (proposer, workload, batch, k), its speedup the median over the reports."""
    rows = []
    for p in paths:
        for r in json.loads(Path(p).read_text())["results"]:
            if r["workload"] == "ALL" and len(paths) > 1 and not median:
                r = {**r, "workload": f"ALL ({Path(p).stem})"}
            rows.append(r)
    if not median:
        return rows
    groups: dict[tuple[str, str, int, int], list[dict]] = {}  # type: ignore[type-arg]
    for r in rows:
        groups.setdefault((r["proposer"], r["workload"], r["batch"], r["k"]), []).append(r)
    return [
        {**g[-1], "speedup": statistics.median(r["speedup"] for r in g), "repeats": len(g)}
        for g in groups.values()
    ]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("reports", nargs="+", help="`agentspec replay --json` files")
    ap.add_argument("--median", action="store_true", help="the reports are repeats")
    args = ap.parse_args(argv)
    median, paths = args.median, args.reports
    rows = _load(paths, median)
    if median:
        n = sorted({r["repeats"] for r in rows})
        print(f"speedups: median over {'/'.join(map(str, n))} reports per row")
    speedup_tables(rows)
    by = {(r["proposer"], r["workload"], r["batch"], r["k"]): r for r in rows}
    ks = sorted({r["k"] for r in rows if r["proposer"] == "agentspec"})
    if not ks or not any(r["proposer"] == "suffix" for r in rows):
        print("no agentspec and suffix rows to compare")
        return 1
    ok = True
    for k in ks:
        wls = sorted(
            {r["workload"] for r in rows if r["k"] == k and not r["workload"].startswith("ALL")}
        )
        big = max(r["batch"] for r in rows if r["k"] == k)
        print(f"\n### k = {k} (largest batch {big})\n")
        print(
            "| workload | rejection @max | min speedup (batch) | agentspec / suffix @max | "
            "MAT @1 agentspec / suffix |"
        )
        print("| --- | --- | --- | --- | --- |")
        ratios = []
        for wl in wls:
            a = {
                b: by[("agentspec", wl, b, k)]
                for (p, w, b, kk) in by
                if p == "agentspec" and w == wl and kk == k
            }
            s = {
                b: by[("suffix", wl, b, k)]
                for (p, w, b, kk) in by
                if p == "suffix" and w == wl and kk == k
            }
            rej = a[big]["rejection_rate"]
            mins = min(a.values(), key=lambda r: r["speedup"])
            ratio = a[big]["speedup"] / s[big]["speedup"]
            ratios.append(ratio)
            has1 = 1 in a and 1 in s
            mat = a[1]["mat"] / s[1]["mat"] if has1 else float("nan")
            flags = [
                rej <= BARS["rej"],
                mins["speedup"] >= BARS["min_speedup"],
                ratio >= BARS["vs_suffix"],
                not mat < BARS["mat1"],
            ]
            ok &= all(flags)
            mark = lambda good: "" if good else " ✗"  # noqa: E731
            print(
                f"| {wl} | {rej:.3f}{mark(flags[0])} | {mins['speedup']:.3f} ({mins['batch']})"
                f"{mark(flags[1])} | {a[big]['speedup']:.3f} / {s[big]['speedup']:.3f} = "
                f"{ratio:.2f}{mark(flags[2])} | "
                + (
                    f"{a[1]['mat']:.3f} / {s[1]['mat']:.3f} = {mat:.3f}{mark(flags[3])} |"
                    if has1
                    else "not replayed at batch 1 |"
                )
            )
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        ok &= geo >= BARS["geo"]
        print(
            f"\ngeometric mean of agentspec / suffix at batch {big}: {geo:.2f}"
            f"{'' if geo >= BARS['geo'] else ' ✗'}"
        )
    print("\nall bars hold" if ok else "\nsome bars fail (✗)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
