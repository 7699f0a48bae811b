"""Issue 29's bars over several ``agentspec bench --json`` reports, per run and pooled.

Per report, per (app, N): AgentSpec (tagged) over no speculation, over the better peer
(n-gram or SuffixDecoding, whichever AgentSpec beats by least in that run, by the paired
ratio: :func:`~agentspec_mw_langgraph.bench_report.better_peer`, the verdict's rule) and
over untagged AgentSpec, each the median of the per-repeat ratios
(:func:`~agentspec_mw_langgraph.bench.paired_ratio`; every method of a repeat ran back to
back), and both AgentSpec engines' acceptance. Then the same ratios pooled: every repeat of
every report of one configuration — the app, N, tokens per call, workflows per run (a
report from before ``min_workflows`` ran N per run), temperature, model, ``k`` and whether
vLLM's CPU preload was on (``<method>/no-preload`` rows pool apart) — with its count, range
and median.
The bars (issue 29, on the demo app; the other apps are the "not in the repository" check):

* AgentSpec >= 1.0x no speculation at every N;
* >= 1.10x the better peer at N = 32, >= 0.97x at N = 1;
* tagged >= untagged in acceptance and throughput at N = 32 (throughput: the pooled median
  of the per-repeat ratios; acceptance: the median over runs of tagged − untagged; the bar
  is met only where both are).

Prints one line per bar with the pooled median it is judged on (``met`` / ``MISS``);
the exit code is 0 either way (this reports, it does not gate)::

    python benchmarks/bench_bars.py docs/results/bench_2026-12-05*_demo_*.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from agentspec_mw_langgraph.bench import (
    BenchReport,
    BenchRow,
    paired_ratio,
    read_report,
    repeat_ratios,
)
from agentspec_mw_langgraph.bench_config import NO_PRELOAD, PEERS, BenchConfig
from agentspec_mw_langgraph.bench_report import better_peer

VS_NONE = 1.0
"""AgentSpec / no speculation at every N."""
VS_PEER_BUSY = 1.10
"""AgentSpec / the better peer at :data:`BUSY_N`."""
VS_PEER_ONE = 0.97
"""AgentSpec / the better peer at N = 1."""
BUSY_N = 32
TAGS = 1.0
"""Tagged / untagged AgentSpec at :data:`BUSY_N`, acceptance and throughput."""


@dataclass(frozen=True)
class Config:
    """What makes two reports' cells comparable."""

    app: str
    n: int
    max_tokens: int
    workflows: int
    temperature: float = 0.0
    """Sampled runs (> 0) pool apart: the bars are greedy's."""
    model: str | None = None
    """The engine's model (``None``: the default one)."""
    k: int = BenchConfig.model_fields["k"].default
    preload: bool = True
    """False: the methods' ``/no-preload`` rows (``--preload off`` or ``both``)."""
    max_num_seqs: int = BenchConfig.model_fields["max_num_seqs"].default
    """The engines' batch limit: another one is another operating point."""
    kv_cache_mib: int = BenchConfig.model_fields["kv_cache_mib"].default


@dataclass
class Pool:
    """Per-repeat ratios of one configuration, over every report that ran it."""

    vs_none: list[float] = field(default_factory=list)
    vs_peer: list[float] = field(default_factory=list)
    vs_untagged: list[float] = field(default_factory=list)
    acceptance: list[tuple[float, float]] = field(default_factory=list)
    """(tagged, untagged) per report."""
    runs: int = 0


def _per_repeat(a: BenchRow, b: BenchRow) -> list[float]:
    """Per-repeat ratios; an older row: its one ratio; none where ``b`` had no throughput."""
    per = repeat_ratios(a, b)
    if per:
        return per
    rel = paired_ratio(a, b)
    return [] if rel is None else [rel]


def _ratio(a: BenchRow, b: BenchRow) -> str:
    """:func:`paired_ratio` as ``"1.234x"``, ``"-x"`` where ``b`` had no throughput."""
    rel = paired_ratio(a, b)
    return "-x" if rel is None else f"{rel:.3f}x"


def load(path: Path) -> BenchReport:
    """A stored report (its apps need not be importable here)."""
    try:
        return read_report(path)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        msg = f"bench_bars: {path} is not an `agentspec bench --json` report: {exc}"
        raise SystemExit(msg) from None


def analyse(
    reports: list[tuple[str, BenchReport]],
) -> tuple[list[str], dict[Config, Pool]]:
    """Per-run lines and the pools (see the module docstring)."""
    lines: list[str] = []
    pools: dict[Config, Pool] = defaultdict(Pool)
    for name, report in reports:
        least, max_tokens = report.config.min_workflows, report.config.max_tokens
        cells: dict[tuple[str, int, bool], dict[str, BenchRow]] = defaultdict(dict)
        for r in report.rows:  # (app, N, without the preload) -> method -> row
            off = r.label.endswith(NO_PRELOAD)
            cells[(r.app, r.n, off)][r.label.removesuffix(NO_PRELOAD)] = r
        cfg = report.config
        for (app, n, off), by in sorted(cells.items(), key=lambda c: c[0]):
            on = not off
            ours, none = by.get("agentspec"), by.get("none")
            if ours is None or none is None:
                continue
            temp = cfg.temperature
            if any(r.identical_to_none is False for r in by.values()):
                lines.append(f"{name} {app} N={n}: outputs differ from none's: left out")
                continue
            key = Config(
                app, n, max_tokens, max(n, least), temp, cfg.model, cfg.k, on,
                cfg.max_num_seqs, cfg.kv_cache_mib,
            )  # fmt: skip
            pool = pools[key]
            pool.runs += 1
            sampled = f", temperature {temp:g}" if temp > 0 else ""
            setup = _setup(cfg.model, cfg.k, on, cfg.max_num_seqs, cfg.kv_cache_mib)
            parts = [
                f"{name} {app} N={n} ({max_tokens} tok, {max(n, least)} wf/run{sampled}{setup}):"
            ]
            per = _per_repeat(ours, none)
            pool.vs_none += per
            parts.append(f"{_ratio(ours, none)} none")
            peers = [by[p] for p in PEERS if p in by]
            best = better_peer(ours, peers)
            if best is not None:
                _, peer = best
                pool.vs_peer += _per_repeat(ours, peer)
                parts.append(f"{_ratio(ours, peer)} {peer.label}")
            elif peers:
                parts.append("no peer with throughput")
            untagged = by.get("agentspec-untagged")
            if untagged is not None:
                pool.vs_untagged += _per_repeat(ours, untagged)
                parts.append(f"{_ratio(ours, untagged)} untagged")
                if ours.acceptance is not None and untagged.acceptance is not None:
                    pool.acceptance.append((ours.acceptance, untagged.acceptance))
                    parts.append(f"accepted {ours.acceptance:.1%} vs {untagged.acceptance:.1%}")
            lines.append(" ".join(parts))
    return lines, pools


def _default(name: str) -> int:
    default = BenchConfig.model_fields[name].default
    assert isinstance(default, int)
    return default


def _setup(
    model: str | None,
    k: int,
    preload: bool,
    max_num_seqs: int = BenchConfig.model_fields["max_num_seqs"].default,
    kv_cache_mib: int = BenchConfig.model_fields["kv_cache_mib"].default,
) -> str:
    """What a line adds where the run's set-up is not the default one."""
    fields = BenchConfig.model_fields
    return (
        (f", model {model}" if model is not None else "")
        + (f", k {k}" if k != fields["k"].default else "")
        + (
            f", max_num_seqs {max_num_seqs}"
            if max_num_seqs != fields["max_num_seqs"].default
            else ""
        )
        + (
            f", KV cache {kv_cache_mib} MiB"
            if kv_cache_mib != fields["kv_cache_mib"].default
            else ""
        )
        + ("" if preload else ", no preload")
    )


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return (
        f"median {statistics.median(values):.3f} "
        f"({min(values):.3f}-{max(values):.3f}, {len(values)} repeats)"
    )


def _tags(p: Pool) -> str:
    """The tags bar, both halves: throughput (the pooled median of the per-repeat ratios)
    and acceptance (the median over runs of tagged − untagged, in points). It is met only
    where both are: runs with tagged acceptance lower in most of them miss whatever their
    throughput."""
    tput = "met" if statistics.median(p.vs_untagged) >= TAGS else "MISS"
    ahead = sum(t > u for t, u in p.acceptance)
    if p.acceptance:
        diff = statistics.median(t - u for t, u in p.acceptance)
        acc = "met" if diff >= 0.0 else "MISS"
        said = f", tagged - untagged median {100 * diff:+.1f} points"
    else:  # no acceptance to compare: the bar cannot be judged on it
        acc, said = "-", ""
    both = "MISS" if "MISS" in (tput, acc) else "-" if acc == "-" else "met"
    return (
        f"{_summary(p.vs_untagged)} (>= {TAGS}: {tput}); acceptance higher tagged in "
        f"{ahead} of {len(p.acceptance)} run(s){said} (>= 0: {acc}); both: {both}"
    )


def bar_lines(pools: dict[Config, Pool]) -> list[str]:
    """One line per bar and configuration, judged on the pooled median."""
    out = []

    def verdict(values: list[float], bar: float) -> str:
        if not values:  # no repeat with a throughput to divide by
            return "-"
        return "met" if statistics.median(values) >= bar else "MISS"

    def order(c: Config) -> tuple[object, ...]:
        return (
            c.app,
            str(c.model),
            c.k,
            not c.preload,
            c.temperature,
            c.max_tokens,
            c.workflows,
            c.n,
        )

    for cfg in sorted(pools, key=order):
        p = pools[cfg]
        sampled = f", temperature {cfg.temperature:g}" if cfg.temperature > 0 else ""
        setup = _setup(cfg.model, cfg.k, cfg.preload, cfg.max_num_seqs, cfg.kv_cache_mib)
        where = (
            f"{cfg.app} N={cfg.n}, {cfg.max_tokens} tok, {cfg.workflows} wf/run{sampled}{setup}, "
            f"{p.runs} run(s)"
        )
        out.append(
            f"{where}: vs none {_summary(p.vs_none)} (>= {VS_NONE}: {verdict(p.vs_none, VS_NONE)})"
        )
        bar = VS_PEER_BUSY if cfg.n == BUSY_N else VS_PEER_ONE if cfg.n == 1 else None
        if p.vs_peer and bar is not None:
            out.append(
                f"{where}: vs the better peer {_summary(p.vs_peer)} (>= {bar}: "
                f"{verdict(p.vs_peer, bar)})"
            )
        if cfg.n == BUSY_N and p.vs_untagged:
            out.append(f"{where}: tagged vs untagged {_tags(p)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="agentspec bench --json files")
    args = ap.parse_args(argv)
    reports = []
    seen: set[Path] = set()
    for path in args.reports:
        if not path.exists():
            ap.error(f"{path}: no such file")
        if path.resolve() in seen:  # a report given twice would count twice
            print(f"bench_bars: {path} given again: counted once", file=sys.stderr)
            continue
        seen.add(path.resolve())
        reports.append((path.name.removesuffix(".json"), load(path)))
    lines, pools = analyse(reports)
    print("\n".join(lines))
    print()
    print("\n".join(bar_lines(pools)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
