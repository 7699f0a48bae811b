"""How ``agentspec bench`` shows a report: the table (:func:`format_report`), the plain
verdicts (:func:`verdict_lines`) and the plot (:func:`plot_report`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentspec_mw_langgraph.bench_config import NO_PRELOAD, PEERS
from agentspec_mw_langgraph.bench_report import (
    ONE_REPEAT_NOISE,
    BenchReport,
    BenchRow,
    better_peer,
    noise_lead,
    noise_ratios,
    paired_ratio,
    speed_adjusted_ratio,
)

__all__ = ["ONE_REPEAT_NOISE", "format_report", "plot_report", "verdict_lines"]


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _same(identical: bool | None) -> str:
    """The table's ``same`` column: ``yes``, ``NO``, or ``-`` (sampled: not compared)."""
    return "-" if identical is None else "yes" if identical else "NO"


def _has_throughput(row: BenchRow) -> bool:
    """Whether ``row``'s method produced tokens in some repeat."""
    return any(t > 0 for t in row.tokens_per_s_repeats) or row.tokens_per_s > 0


def _even(per: Sequence[float]) -> str:
    """Why two methods with per-repeat ratios ``per`` are even."""
    if len(per) >= 2:
        return f"even: per repeat {min(per):.2f}-{max(per):.2f}x"
    return f"even: within one repeat's noise, {ONE_REPEAT_NOISE:.0%}"


def _standing(ours: BenchRow, peer: BenchRow) -> str:
    """A word for ``ours`` against ``peer`` by the noise rule (:data:`ONE_REPEAT_NOISE`):
    ahead / behind where every repeat's ratio is more than the noise from 1, else even
    (with two or more repeats their range is given); "<peer> had no throughput" where
    there is no ratio."""
    per = noise_ratios(ours, peer)
    if not per:
        return f"{peer.label} had no throughput"
    lead = noise_lead(per)
    if lead == 0:
        return _even(per)
    word = "ahead" if lead > 0 else "behind"
    return f"{word} by over {ONE_REPEAT_NOISE:.0%} in every repeat" if len(per) >= 2 else word


def _fastest(rows: Sequence[BenchRow]) -> str:
    """Which of ``rows`` (methods that produced tokens) is fastest, by the noise rule: the
    one ahead of every other (:func:`_standing`), with its gap over the runner-up (the one
    it beats by least, :func:`paired_ratio`); where none is, the leaders (the methods no
    other is ahead of) are even."""
    if not rows:
        return "no method produced tokens"
    per = {(a.label, b.label): noise_ratios(a, b) for a in rows for b in rows if a is not b}
    lead = {k: noise_lead(v) for k, v in per.items() if v}

    def beats(a: BenchRow, b: BenchRow) -> bool:
        return lead.get((a.label, b.label)) == 1

    by_speed = sorted(rows, key=lambda r: -r.tokens_per_s)
    leaders = [a for a in by_speed if not any(beats(b, a) for b in rows if b is not a)]
    if len(leaders) == 1:  # ahead of every other, unless a comparison was missing
        leaders += [b for b in by_speed if b is not leaders[0] and not beats(leaders[0], b)]
    if len(leaders) > 1:
        repeats = max(len(v) for v in per.values())
        why = (
            f"no method ahead of the others by over {ONE_REPEAT_NOISE:.0%} in every repeat"
            if repeats >= 2
            else f"within one repeat's noise, {ONE_REPEAT_NOISE:.0%}"
        )
        cells = ", ".join(f"{r.label} {r.tokens_per_s:.0f} tok/s" for r in leaders)
        return f"no method clearly fastest: {cells} (even: {why})"
    best = leaders[0]
    text = f"fastest is {best.label} ({best.tokens_per_s:.0f} tok/s, {_x(best.ratio_to_none)} none"
    rated = [
        (rel, r.label) for r in rows if r is not best and (rel := paired_ratio(best, r)) is not None
    ]
    if rated:
        rel, runner = min(rated)
        text += f", {rel - 1.0:.0%} over {runner}"
    return text + ")"


def verdict_lines(rows: Sequence[BenchRow]) -> list[str]:
    """Plain sentences per (shape, N), all by one noise rule (a method is ahead of another
    only where every repeat's throughput ratio is over 1 + :data:`ONE_REPEAT_NOISE`, else
    even; :func:`paired_ratio`): which method is fastest (and by how much over the
    runner-up), or which lead even; the methods that produced no tokens; AgentSpec against
    the better of n-gram and SuffixDecoding (the one it beats by least, :func:`better_peer`);
    and tagged against untagged AgentSpec. Methods run without vLLM's CPU preload
    (``<method>/no-preload``) are judged among themselves, on a line of their own."""
    groups: dict[tuple[str, int, bool], dict[str, BenchRow]] = {}
    for r in rows:  # (shape, N, without the preload) -> method -> row
        off = r.label.endswith(NO_PRELOAD)
        groups.setdefault((r.app, r.n, off), {})[r.label.removesuffix(NO_PRELOAD)] = r
    return [
        _verdict(f"{app} N={n}" + (" without the preload" if off else ""), group)
        for (app, n, off), group in sorted(groups.items(), key=lambda g: g[0])
    ]


def _verdict(head: str, group: dict[str, BenchRow]) -> str:
    """:func:`verdict_lines`' sentence for one (shape, N) and preload variant: ``group``
    maps each method (without its ``/no-preload``) to its row."""
    live = {k: r for k, r in group.items() if _has_throughput(r)}
    text = f"{head}: {_fastest(list(live.values()))}"
    dead = [k for k in group if k not in live]
    if dead and live:
        text += f"; no throughput: {', '.join(dead)}"
    peers = [live[p] for p in PEERS if p in live]
    if "agentspec" in live and any(p in group for p in PEERS):
        ours = live["agentspec"]
        text += f"; agentspec {_x(ours.ratio_to_none)} none"
        best = better_peer(ours, peers)
        if best is not None:
            rel, peer = best
            text += f" is {rel:.2f}x {peer.label} ({_standing(ours, peer)}; the better peer)"
        else:
            text += ", no peer with throughput to compare with"
    if "agentspec" in live and "agentspec-untagged" in live:
        t, u = live["agentspec"], live["agentspec-untagged"]
        text += (
            f"; tags: {_f(t.acceptance, '.1%')} vs {_f(u.acceptance, '.1%')} accepted, "
            f"{_x(paired_ratio(t, u))} untagged's tok/s"
        )
        adjusted = speed_adjusted_ratio(t, u)
        if adjusted is not None:
            text += f" ({adjusted:.3f}x with each engine's step speed divided out)"
    return text


def _deciles(rows: Sequence[Sequence[float]]) -> str:
    """``"0.5-0.6 54% of 120"``-style cells for the tenths of predicted survival with
    positions: realised share accepted, and how many positions."""
    width = 1 / len(rows)
    return ", ".join(
        f"{i * width:.1f}-{(i + 1) * width:.1f} {a / n:.0%} of {n:.0f}"
        for i, (n, _, a) in enumerate(rows)
        if n
    )


def format_report(report: BenchReport) -> str:
    """The table (one line per shape, N and method), per-agent acceptance at the
    largest N, and the verdicts."""
    head = (
        f"{'app':<9} {'N':>3} {'method':<24} {'tok/s':>7} {'x none':>6} {'TPOT50':>7} "
        f"{'TPOT99':>7} {'TTFT50':>7} {'lat50':>6} {'batch':>5} {'accept':>6} {'reject':>6} "
        f"{'prop ms':>7} {'fit err':>7} {'preempt':>7} {'same':>4} {'load':>4}"
    )
    lines = [
        f"agentspec bench, {report.date}, {report.cpus} CPUs, load {report.load_before[0]:.2f} "
        f"before / {report.load_after[0]:.2f} after; medians of {report.config.repeats} "
        f"repeat(s), ratios to none in the same run; TPOT, TTFT in ms, latency (lat50) in s; "
        f"batch: requests decoding at once, time-averaged",
        head,
        "-" * len(head),
    ]
    for r in report.rows:
        lines.append(
            f"{r.app:<9} {r.n:>3} {r.label:<24} {r.tokens_per_s:>7.1f} "
            f"{_x(r.ratio_to_none):>6} {_f(r.tpot_p50_ms, '.1f'):>7} "
            f"{_f(r.tpot_p99_ms, '.1f'):>7} {_f(r.ttft_p50_ms, '.0f'):>7} {r.latency_p50_s:>6.1f} "
            f"{_f(r.batch, '.1f'):>5} {_f(r.acceptance, '.1%'):>6} {_f(r.rejection, '.1%'):>6} "
            f"{_f(r.proposer_ms_per_step, '.3f'):>7} {_f(r.fit_error_median, '.1%'):>7} "
            f"{r.preemptions:>7} {_same(r.identical_to_none):>4} {r.load_avg:>4.1f}"
        )
    top = max(report.config.ns)
    for app in report.config.apps:
        group = [r for r in report.rows if r.app == app and r.n == top and r.drafted]
        agents = sorted({a for r in group for a in r.per_agent_acceptance})
        if not group or not agents:
            continue
        lines.append(f"\nacceptance per agent (accepted / drafted tokens), {app} N={top}:")
        lines.append(f"{'agent':<14}" + "".join(f" {r.label:>22}" for r in group))
        for a in agents:
            vals = []
            for r in group:
                d, acc = r.per_agent_tokens.get(a, [0, 0])
                vals.append(f"{_f(r.per_agent_acceptance.get(a), '.1%')} ({acc}/{d})")
            lines.append(f"{a:<14}" + "".join(f" {v:>22}" for v in vals))
        for r in group:
            if r.per_block:
                cells = [
                    f"{k} {v[1]}/{v[0]}"
                    for k, v in sorted(r.per_block.items(), key=lambda kv: -kv[1][0])
                ]
                lines.append(f"{r.label} per agent/block (accepted/drafted): " + ", ".join(cells))
    calibrated = [r for r in report.rows if r.n == top and r.expected_acceptance is not None]
    if calibrated:
        lines.append(
            f"\nlive calibration at N={top} (the proposer's predicted survival of each verified "
            "draft token against vLLM's verdict): "
            + "; ".join(
                f"{r.label} {r.app}: expected {_f(r.expected_acceptance, '.1%')} accepted, "
                f"got {_f(r.estimated_acceptance, '.1%')}"
                + (f" (by predicted survival: {_deciles(r.reliability)})" if r.reliability else "")
                for r in calibrated
            )
        )
    fits = [r for r in report.rows if r.fit_steps]
    if fits:
        lines.append(
            "\nstep-time fit (measured cost model), prediction error per step: "
            + "; ".join(
                f"{r.label} {r.app} N={r.n}: median |err| {r.fit_error_median:.1%}, "
                f"mean {r.fit_error_mean:+.1%}"
                + (
                    f", predicted / measured time {r.fit_time_ratio:.3f}"
                    if r.fit_time_ratio is not None
                    else ""
                )
                + f" ({r.fit_steps} steps)"
                for r in fits
                if r.fit_error_median is not None and r.fit_error_mean is not None
            )
        )
        models = [
            f"{r.label} {r.app} N={r.n}: {1e3 * m['fixed']:.1f} ms + "
            f"{1e3 * m['token']:.3f} ms/token + {1e6 * m['kv_token']:.2f} us/KV token + "
            f"{1e6 * m.get('spec_kv_token', 0.0):.2f} us/KV token of a drafting request + "
            f"{1e6 * m.get('draft_kv_token', 0.0):.3f} us/(draft x KV token) + "
            f"{1e3 * m.get('emitted_token', 0.0):.3f} ms/emitted token "
            f"({m.get('steps', 0):.0f} steps)"
            for r in fits
            if {"fixed", "token", "kv_token"} <= (m := r.step_model).keys()
        ]
        if models:
            lines.append("the fit after the last repeat: " + "; ".join(models))
    lines.append("")
    lines += verdict_lines(report.rows)
    if report.config.temperature > 0:
        lines.append(
            f"outputs sampled at temperature {report.config.temperature:g}: lossless in "
            "distribution, not compared with none's token for token"
        )
    else:
        verdict = "yes" if not report.mismatches else "NO: " + "; ".join(report.mismatches)
        lines.append(f"outputs identical to none in every run: {verdict}")
    return "\n".join(lines)


def plot_report(report: BenchReport, path: str | Path) -> Path:
    """A PNG: per shape, throughput and speedup over none vs N, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    apps = list(report.config.apps)
    t = report.config.temperature
    sampled = f" (sampled, temperature {t:g})" if t > 0 else ""
    fig, axes = plt.subplots(len(apps), 2, figsize=(11, 3.6 * len(apps)), squeeze=False)
    for i, app in enumerate(apps):
        ax1, ax2 = axes[i]
        for j, label in enumerate(report.config.labels()):
            rows = sorted(
                (r for r in report.rows if r.app == app and r.label == label), key=lambda r: r.n
            )
            ns = [r.n for r in rows]
            style = "--" if label.endswith(NO_PRELOAD) else "-"
            ax1.plot(
                ns, [r.tokens_per_s for r in rows], style, marker="o", label=label, color=f"C{j}"
            )
            ax2.plot(
                ns,
                [float("nan") if r.ratio_to_none is None else r.ratio_to_none for r in rows],
                style,
                marker="o",
                label=label,
                color=f"C{j}",
            )
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(report.config.ns), [str(n) for n in sorted(report.config.ns)])
            ax.minorticks_off()
            ax.set_xlabel("concurrent workflows N")
        ax1.set_ylabel("output tokens/s")
        ax1.set_title(f"{app}: throughput{sampled}")
        ax2.set_ylabel("speedup over none\n(median of per-repeat ratios)")
        ax2.axhline(1.0, color="grey", lw=0.8)
        ax2.set_title(f"{app}: speedup{sampled}")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
