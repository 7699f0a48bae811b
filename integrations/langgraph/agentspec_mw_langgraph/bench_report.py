"""What ``agentspec bench`` measured: one :class:`BenchRow` per (method, shape, N) summarised
from the runs (:func:`summarize`), the :class:`BenchReport`, and the comparisons between two
rows — per-repeat ratios (:func:`paired_ratio`), the better peer by them
(:func:`better_peer`) and the engines' speed divided out (:func:`engine_slowness`,
:func:`speed_adjusted_ratio`)."""

from __future__ import annotations

import gzip
import json
import lzma
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError, model_validator

from agentspec_mw.costfit import fit_observed_steps, observed_step_features
from agentspec_mw_langgraph.bench_config import NO_PRELOAD, RESOLVE_APPS, BenchConfig
from agentspec_mw_langgraph.bench_worker import RunResult

__all__ = [
    "MIN_SLOWNESS_STEPS",
    "ONE_REPEAT_NOISE",
    "BenchReport",
    "BenchRow",
    "better_peer",
    "engine_slowness",
    "noise_lead",
    "noise_ratios",
    "paired_ratio",
    "read_report",
    "repeat_ratios",
    "speed_adjusted_ratio",
    "summarize",
]


class BenchRow(BaseModel):
    """One (method, shape, N): medians and pooled percentiles over the repeats."""

    label: str
    app: str
    n: int
    repeats: int
    tokens_per_s: float
    ratio_to_none: float | None
    """Median over repeats of this method's tok/s over ``none``'s in the same repeat;
    ``None`` when ``none`` produced no tokens in any repeat (nothing to divide by)."""
    tokens_per_s_repeats: list[float] = []
    """Output tokens/s of each repeat, in repeat order (a repeat runs every method back to
    back, so two methods' values of one repeat saw the same load; :func:`paired_ratio`)."""
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    ttft_p50_ms: float | None = None
    """Per request, submission to first token (a wait for a batch slot included). Drafts
    make every step longer (TPOT up) and requests finish in fewer steps (the waiting start
    sooner: TTFT down); docs/vllm.md has a measured example."""
    latency_p50_s: float
    batch: float | None = None
    """The batch the row really ran at: requests decoding at once, averaged over the run's
    wall time (Σ per request first→last token / wall; Little's law), median over repeats.
    N counts workflows, not requests: a fan-out runs several requests per workflow, a
    workflow between two LLM calls none. What to compare with a replay's batch size.
    ``None`` in reports from before it was measured."""
    drafted: int
    accepted: int
    acceptance: float | None
    rejection: float | None
    preemptions: int = 0
    """Requests vLLM preempted, summed over the repeats (a full KV cache: each one's prompt
    is computed again later, time no method's drafts save)."""
    proposer_ms_per_step: float | None
    fit_error_median: float | None
    """Median |predicted − measured| / measured of the step-time fit (measured model)."""
    fit_error_mean: float | None
    """Mean signed relative error (> 0: the fit predicts slower steps than measured)."""
    fit_steps: int
    fit_time_ratio: float | None = None
    """Σ predicted / Σ measured time of those steps (what a throughput estimate sees: a
    mean error made by a few long steps cancels here)."""
    step_slowness_repeats: list[float] = []
    """Per repeat, how slowly this method's engine process ran: Σ measured / Σ predicted
    time of its timed steps, all predicted by one fit to the timed steps of every engine
    of this shape and N (:func:`engine_slowness`; the AgentSpec engines time their
    steps, vLLM's own drafters do not: empty for them). :func:`speed_adjusted_ratio`
    divides it out of a paired ratio."""
    step_model: dict[str, float] = {}
    """The measured model's fit after the last repeat (``fixed``/``token``/``kv_token`` in
    seconds per step, per batched token, per KV token; ``steps`` it rests on); empty
    without it."""
    per_agent_acceptance: dict[str, float | None]
    per_agent_tokens: dict[str, list[int]] = {}
    """``agent -> [drafted, accepted]`` summed over the repeats (per-request metrics)."""
    per_block: dict[str, list[int]]
    """AgentSpec's ``"agent/block" -> [drafted, accepted]``."""
    expected_acceptance: float | None = None
    """Live calibration: of the verified draft tokens that carried the proposer's estimate
    (AgentSpec's), the share it expected accepted (Σ predicted survival / tokens) ..."""
    estimated_acceptance: float | None = None
    """... and the share accepted, on the same tokens."""
    reliability: list[list[float]] = []
    """Per tenth of predicted survival, summed over the repeats: ``[positions, Σ predicted,
    accepted]`` (:attr:`agentspec_mw_vllm.metrics.MetricsSnapshot.reliability`)."""
    identical_to_none: bool | None
    """Every run's outputs token for token ``none``'s (``None``: sampled calls, not
    compared: :attr:`~.bench_config.BenchConfig.temperature`)."""
    load_avg: float
    """Mean 1-minute load average at the start of this row's runs."""


class BenchReport(BaseModel):
    """Everything ``agentspec bench`` measured."""

    config: BenchConfig
    date: str
    cpus: int
    load_before: list[float]
    load_after: list[float]
    engine_start_s: dict[str, float]
    rows: list[BenchRow]
    mismatches: list[str]
    sample_output: str = ""

    @model_validator(mode="before")
    @classmethod
    def _from_before_min_workflows(cls, data: Any) -> Any:
        # a stored report whose config has no min_workflows ran N workflows per run
        cfg = data.get("config") if isinstance(data, dict) else None
        if isinstance(cfg, dict) and "min_workflows" not in cfg:
            data = {**data, "config": {**cfg, "min_workflows": 1}}
        return data


def read_report(path: str | Path) -> BenchReport:
    """A stored ``agentspec bench --json`` report (plain, or ``.xz`` / ``.gz`` compressed),
    read without importing its apps: a report of an app this process cannot import (an
    outside app given as ``module:build``) reads as well as the built-in ones'.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not such a report (the first problem named).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such report")
    data = p.read_bytes()
    try:
        if p.suffix == ".xz":
            data = lzma.decompress(data)
        elif p.suffix == ".gz":
            data = gzip.decompress(data)
    except (lzma.LZMAError, gzip.BadGzipFile, EOFError) as exc:
        raise ValueError(f"{p}: not a readable {p.suffix} file ({exc})") from None
    try:
        return BenchReport.model_validate_json(data, context={RESOLVE_APPS: False})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the file"
        raise ValueError(
            f"{p}: not an `agentspec bench --json` report ({where}: {first['msg']}; "
            f"{exc.error_count()} problem(s))"
        ) from None


_MISSING = object()
"""A workflow one of two runs did not end (:func:`_difference`)."""


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _throughput(run: RunResult) -> float:
    """Output tokens/s of one run (0 for a run of no wall time: nothing measured)."""
    return run.output_tokens / run.wall_s if run.wall_s > 0 else 0.0


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where JSON-like ``a`` first differs from ``b`` (which must differ): a path such as
    ``messages[3].content``, with the first differing character of two strings, or how
    two lists' lengths or two dicts' keys differ."""
    where = path or "the top level"
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            if key not in b:
                return f"{where}: key {key!r} not in none's"
            if a[key] != b[key]:
                return _first_difference(a[key], b[key], f"{path}.{key}" if path else str(key))
        extra = next(k for k in b if k not in a)
        return f"{where}: none's key {extra!r} missing"
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
        return f"{where}: {len(a)} item(s), none's {len(b)}"
    if isinstance(a, str) and isinstance(b, str):
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        return f"{where}, character {min(len(a), len(b)) if at is None else at}"
    shown = [json.dumps(v, default=str)[:40] for v in (a, b)]
    return f"{where}: {shown[0]} vs none's {shown[1]}"


def _difference(run: RunResult, base: RunResult) -> str:
    """Which workflow of ``run`` first differs from ``base``'s (none's) and where: its index,
    its topic and the first differing place in its final state (:func:`_first_difference`);
    where every final state agrees, how many requests' token ids differ (they are not tied
    to a workflow)."""
    topics = run.topics or base.topics
    count = len(base.views)
    for i, (x, y) in enumerate(zip_longest(run.views, base.views, fillvalue=_MISSING)):
        if x == y:
            continue
        who = f"workflow {i} of {count}" + (f" (topic {topics[i]!r})" if i < len(topics) else "")
        if x is _MISSING or y is _MISSING:
            gone = "no final state" if x is _MISSING else "a final state none's run lacks"
            return f"{who}: {gone} (the run ended {len(run.views)} workflow(s), none's {count})"
        return f"{who}: final state differs at {_first_difference(x, y)}"
    odd = Counter(run.token_hashes)
    odd.subtract(base.token_hashes)
    changed = max(sum(v for v in odd.values() if v > 0), sum(-v for v in odd.values() if v < 0))
    return (
        "every workflow's final state is none's; the token ids of "
        f"{changed} request(s) differ (not tied to a workflow)"
    )


def summarize(
    results: dict[tuple[str, str, int, int], RunResult],
    loads: dict[tuple[str, str, int, int], float],
    config: BenchConfig,
) -> tuple[list[BenchRow], list[str]]:
    """Rows per (label, app, N) from the runs ``(label, app, n, repeat) -> result``, and
    the mismatches against each label's ``none`` (same preload variant; each names the
    run, and its first differing workflow and where, :func:`_difference`). A repeat where
    ``none`` produced no tokens has no ratio to it (:attr:`BenchRow.ratio_to_none` is
    ``None`` when no repeat has one)."""
    rows: list[BenchRow] = []
    mismatches: list[str] = []
    for app in config.apps:
        for n in config.ns:
            slowness = engine_slowness(
                {
                    label: [
                        (x := results[(label, app, n, r)]).fit_steps + x.rejected_steps
                        for r in range(config.repeats)
                    ]
                    for label in config.labels()
                }
            )
            for label in config.labels():
                base = "none" + (NO_PRELOAD if label.endswith(NO_PRELOAD) else "")
                runs = [results[(label, app, n, r)] for r in range(config.repeats)]
                bases = [results[(base, app, n, r)] for r in range(config.repeats)]
                tput = [_throughput(x) for x in runs]
                ratios = [
                    t / q for t, q in zip(tput, map(_throughput, bases), strict=True) if q > 0
                ]
                identical: bool | None = None  # sampled: the same distribution, other tokens
                if config.temperature == 0:
                    identical = True
                    for r, (x, b) in enumerate(zip(runs, bases, strict=True)):
                        if x.views != b.views or x.token_hashes != b.token_hashes:
                            identical = False
                            mismatches.append(
                                f"{label} {app} N={n} repeat {r}: outputs differ: "
                                f"{_difference(x, b)}"
                            )
                tpots = [t for x in runs for t in x.tpot_s]
                ttft50 = _pct([t for x in runs for t in x.ttft_s], 50)
                lats = [t for x in runs for t in x.workflow_latency_s]
                drafted = sum(x.drafted for x in runs)
                accepted = sum(x.accepted for x in runs)
                calls = sum(x.proposer_calls for x in runs)
                errs = [e for x in runs for e in x.fit_errors]
                secs = [t for x in runs for t in x.fit_seconds]
                agents: dict[str, list[int]] = {}
                blocks: dict[str, list[int]] = {}
                for x in runs:
                    for agent, v in x.per_agent.items():
                        acc = agents.setdefault(agent, [0, 0])
                        acc[0] += v[2]
                        acc[1] += v[3]
                    for block, v in x.per_block.items():
                        acc = blocks.setdefault(block, [0, 0])
                        acc[0] += v[0]
                        acc[1] += v[1]
                tpot50, tpot99 = _pct(tpots, 50), _pct(tpots, 99)
                estimated = sum(x.estimated for x in runs)
                bins = [x.reliability for x in runs if x.reliability]
                rows.append(
                    BenchRow(
                        label=label,
                        app=app,
                        n=n,
                        repeats=len(runs),
                        tokens_per_s=float(np.median(tput)),
                        tokens_per_s_repeats=tput,
                        ratio_to_none=float(np.median(ratios)) if ratios else None,
                        tpot_p50_ms=None if tpot50 is None else 1e3 * tpot50,
                        tpot_p99_ms=None if tpot99 is None else 1e3 * tpot99,
                        ttft_p50_ms=None if ttft50 is None else 1e3 * ttft50,
                        latency_p50_s=float(np.median(lats)),
                        batch=(
                            float(np.median([x.decoding_s / x.wall_s for x in runs]))
                            if all(x.decoding_s > 0 and x.wall_s > 0 for x in runs)
                            else None
                        ),
                        drafted=drafted,
                        accepted=accepted,
                        acceptance=accepted / drafted if drafted else None,
                        rejection=1 - accepted / drafted if drafted else None,
                        preemptions=sum(x.preemptions for x in runs),
                        proposer_ms_per_step=(
                            1e3 * sum(x.proposer_s for x in runs) / calls if calls else None
                        ),
                        fit_error_median=float(np.median(np.abs(errs))) if errs else None,
                        fit_error_mean=float(np.mean(errs)) if errs else None,
                        fit_steps=len(errs),
                        fit_time_ratio=(
                            sum(t * (1 + e) for t, e in zip(secs, errs, strict=True)) / sum(secs)
                            if secs and len(secs) == len(errs) and sum(secs) > 0
                            else None
                        ),
                        step_slowness_repeats=slowness.get(label, []),
                        step_model=dict(runs[-1].step_model),
                        per_agent_acceptance={
                            a: (v[1] / v[0] if v[0] else None) for a, v in sorted(agents.items())
                        },
                        per_agent_tokens=dict(sorted(agents.items())),
                        per_block=dict(sorted(blocks.items())),
                        expected_acceptance=(
                            sum(x.expected for x in runs) / estimated if estimated else None
                        ),
                        estimated_acceptance=(
                            sum(x.estimated_accepted for x in runs) / estimated
                            if estimated
                            else None
                        ),
                        reliability=[
                            [sum(column) for column in zip(*cells, strict=True)]
                            for cells in zip(*bins, strict=True)
                        ],
                        identical_to_none=identical,
                        load_avg=float(
                            np.mean([loads[(label, app, n, r)] for r in range(len(runs))])
                        ),
                    )
                )
    return rows, mismatches


MIN_SLOWNESS_STEPS = 20
"""Timed steps each repeat of an engine needs before :func:`engine_slowness` rates it."""


def engine_slowness(
    steps: Mapping[str, Sequence[Sequence[Sequence[float]]]],
) -> dict[str, list[float]]:
    """How slowly each engine process ran, per repeat, on one yardstick.

    ``steps`` maps a method to its timed steps per repeat (``RunResult.fit_steps``: rows
    ``[num_batched, num_kv, spec_kv, draft_kv, emitted, seconds]``). One step-time model is
    fitted to every step of every method that timed at least :data:`MIN_SLOWNESS_STEPS` in
    each repeat (:func:`agentspec_mw.costfit.fit_observed_steps`), and a method's repeat
    gets ``Σ measured / Σ predicted`` over its steps: above 1, its process ran slower than
    the common model says that work takes. On this 2-core VM two engines that did the
    same work differ by up to ±13 % in one repeat (2026-12-05, docs/experiments/
    tags_live_2026-12-05.md); their throughput ratio follows. Steps of non-positive or
    non-finite time are dropped; methods left without enough steps (or with fewer than two
    rated methods: nothing to compare) are left out.
    """

    def usable(rep: Sequence[Sequence[float]]) -> np.ndarray:
        a = np.asarray(rep, dtype=np.float64).reshape(-1, 6)
        return a[np.all(np.isfinite(a), axis=1) & (a[:, 5] > 0)]

    timed = {label: [usable(rep) for rep in reps] for label, reps in steps.items() if reps}
    rated = {k: v for k, v in timed.items() if all(len(a) >= MIN_SLOWNESS_STEPS for a in v)}
    if len(rated) < 2:
        return {}
    coef = fit_observed_steps(np.vstack([a for reps in rated.values() for a in reps]))
    out = {}
    for label, reps in rated.items():
        predicted = [float((observed_step_features(a) @ coef).sum()) for a in reps]
        if min(predicted) > 0:  # a fit of all zeros rates nothing
            out[label] = [float(a[:, 5].sum()) / p for a, p in zip(reps, predicted, strict=True)]
    return out if len(out) >= 2 else {}


def speed_adjusted_ratio(a: BenchRow, b: BenchRow) -> float | None:
    """:func:`paired_ratio` with each engine's :attr:`BenchRow.step_slowness_repeats`
    divided out: the median over repeats of ``(tok/s_a · slowness_a) / (tok/s_b ·
    slowness_b)`` — what ``a``'s drafts did against ``b``'s had both processes run at the
    common model's speed (a repeat where ``b`` has no throughput is left out). ``None``
    unless both rows have it for every repeat, or where no repeat is left. A diagnostic:
    the bars are on measured throughput."""
    n = len(a.tokens_per_s_repeats)
    if not n or not (
        len(b.tokens_per_s_repeats)
        == len(a.step_slowness_repeats)
        == len(b.step_slowness_repeats)
        == n
    ):
        return None
    per = [
        (ta * sa) / (tb * sb)
        for ta, sa, tb, sb in zip(
            a.tokens_per_s_repeats,
            a.step_slowness_repeats,
            b.tokens_per_s_repeats,
            b.step_slowness_repeats,
            strict=True,
        )
        if tb * sb > 0
    ]
    return float(np.median(per)) if per else None


def repeat_ratios(a: BenchRow, b: BenchRow) -> list[float]:
    """``a``'s throughput over ``b``'s in each repeat (both ran back to back there; a repeat
    where ``b`` has no throughput is left out); empty where the rows' repeats do not pair up
    (older JSON)."""
    x, y = a.tokens_per_s_repeats, b.tokens_per_s_repeats
    if not x or len(x) != len(y):
        return []
    return [p / q for p, q in zip(x, y, strict=True) if q > 0]


def paired_ratio(a: BenchRow, b: BenchRow) -> float | None:
    """``a``'s throughput over ``b``'s: the median over repeats of the ratio within each
    repeat (both ran back to back there, under the same load), not a ratio of medians or of
    the two rows' ratios to none (each a median over repeats whose load differs: they can
    rank two methods against their own tok/s). Rows without per-repeat values (older
    JSON) fall back to the ratio of their ratios to none. ``None`` where there is nothing
    to divide by: ``b`` had no throughput in any repeat (or, for older rows, no ratio)."""
    x, y = a.tokens_per_s_repeats, b.tokens_per_s_repeats
    if x and len(x) == len(y):
        per = repeat_ratios(a, b)
        return float(np.median(per)) if per else None
    if a.ratio_to_none is None or not b.ratio_to_none:  # None or 0
        return None
    return a.ratio_to_none / b.ratio_to_none


ONE_REPEAT_NOISE = 0.05
"""How far apart two methods' throughputs in one repeat may be by chance: paired ratios of
one configuration's repeats on this 2-core VM spread 0.92-0.99x (N = 1) and 1.07-1.10x
(N = 32) within one run (docs/results.md §5 as of `9ca0fe5`, 2026-12-04), and two one-repeat
runs of the main job ranked the methods differently. A method is ahead of (behind) another
only where its throughput ratio to the other's is above 1 + this (below 1 - this) in every
repeat; otherwise the two are called even."""


def noise_ratios(a: BenchRow, b: BenchRow) -> list[float]:
    """``a``'s throughput over ``b``'s in each repeat (:func:`repeat_ratios`); older rows
    without per-repeat values give their one :func:`paired_ratio`; empty where ``b`` had
    no throughput to divide by."""
    per = repeat_ratios(a, b)
    if per:
        return per
    rel = paired_ratio(a, b)
    return [] if rel is None else [rel]


def noise_lead(per: Sequence[float]) -> int:
    """The noise rule on per-repeat ratios ``a / b`` (not empty): 1 where ``a`` is ahead
    (every ratio above 1 + :data:`ONE_REPEAT_NOISE`), -1 where it is behind (every one
    below 1 - it), 0 where the two are even."""
    if min(per) > 1.0 + ONE_REPEAT_NOISE:
        return 1
    if max(per) < 1.0 - ONE_REPEAT_NOISE:
        return -1
    return 0


def better_peer(ours: BenchRow, peers: Iterable[BenchRow]) -> tuple[float, BenchRow] | None:
    """The better of ``peers`` against ``ours``, with ``ours``' :func:`paired_ratio` to it
    (the median of the per-repeat ratios, not the peers' median tok/s: each a median over
    repeats whose load differs): the peer ``ours`` stands worst against by the noise rule
    (:func:`noise_lead`: behind before even before ahead), and among those the one it
    beats by least; a tie goes to the first label in sort order. A peer ``ours`` is
    behind in every repeat is named even where another's noisier repeats have a lower
    median. ``None`` where no peer has a ratio (none had throughput). The one rule of the
    verdict (:func:`.bench_format.verdict_lines`) and ``benchmarks/bench_bars.py``."""
    rated = [
        (noise_lead(noise_ratios(ours, p)), rel, p)
        for p in peers
        if (rel := paired_ratio(ours, p)) is not None
    ]
    if not rated:
        return None
    _, rel, peer = min(rated, key=lambda x: (x[0], x[1], x[2].label))
    return rel, peer
