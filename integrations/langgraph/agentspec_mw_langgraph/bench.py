"""``agentspec bench``: N concurrent multi-agent LangGraph workflows on the embedded engine,
per speculation method, with throughput, latency, acceptance and an identical-output check.

Each method gets one engine in its own process (:mod:`.bench_worker`), started once and
warmed up; the engine is vLLM's in-process ``LLM`` driven by the adapter's engine loop,
which batches continuously (a request joins the running batch at the next step). The
parent runs the sweep: for each workflow shape, each N and each repeat, the same
``max(N, min_workflows)`` topics go to every method in turn, N of them in flight at a
time (the order rotates with the repeat, so no method always runs first on a machine
whose load drifts), each repeat with topics no earlier run of the shape used (a sweep
that needs more than :func:`~agentspec_mw_langgraph.bench_apps.topic_count` per shape is
refused: a repeated topic is a query the proposers' caches have seen). Methods:

* ``none`` — no speculation (the baseline of every ratio);
* ``ngram``, ``suffix`` — vLLM's n-gram kernel and SuffixDecoding (arctic-inference);
* ``agentspec`` — our proposer, the graphs wrapped with ``with_agentspec`` (tags);
* ``agentspec-untagged`` — our proposer, graphs not wrapped (no tags reach the engine).

Per (method, shape, N), over the repeats: workflow throughput (output tokens / wall time;
the median, and the median of the per-repeat ratios to ``none``; two methods are
compared by the median of their per-repeat ratio, :func:`paired_ratio`), TPOT p50/p99 (per
request: time from its first to its last token / (tokens − 1)), TTFT p50 (per request:
submission to first token, the wait for a batch slot included), workflow latency p50,
acceptance and rejection from vLLM's spec-decode counters (they count draft tokens
accepted past a request's ``max_tokens``, which the output drops; AgentSpec's adapter
drafts none there, vLLM's n-gram and SuffixDecoding do), the drafter's milliseconds
per draft call, the step-time fit's prediction error (AgentSpec with the measured cost
model), per-agent acceptance (per-request metrics, by the agent tag) and AgentSpec's
per-agent/per-block counters. Every output (final states and every request's token
ids) must equal ``none``'s; a mismatch fails the run (:class:`BenchMismatchError`, after
the report is written).

With ``preload="both"`` every method also runs without vLLM's CPU preload
(:mod:`agentspec_mw_vllm.preload`) as ``<method>/no-preload``, interleaved the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentspec_mw.costfit import fit_observed_steps, observed_step_features
from agentspec_mw.errors import AgentSpecError
from agentspec_mw_langgraph.bench_apps import APPS, bench_topics, resolve_app, topic_count
from agentspec_mw_langgraph.bench_worker import MARK, RunResult, WorkerSpec

__all__ = [
    "METHODS",
    "MIN_SLOWNESS_STEPS",
    "ONE_REPEAT_NOISE",
    "BenchConfig",
    "BenchError",
    "BenchMismatchError",
    "BenchReport",
    "BenchRow",
    "engine_env",
    "engine_slowness",
    "format_report",
    "paired_ratio",
    "plot_report",
    "quick_config",
    "run_bench",
    "speed_adjusted_ratio",
    "summarize",
    "write_fit_steps",
]

#: method -> (``build_llm(speculative=...)``, graphs tagged).
METHODS: dict[str, tuple[str | None, bool]] = {
    "none": (None, True),
    "ngram": ("ngram", True),
    "suffix": ("suffix", True),
    "agentspec": ("agentspec", True),
    "agentspec-untagged": ("agentspec", False),
}
_PEERS = ("ngram", "suffix")
_NO_PRELOAD = "/no-preload"


class BenchError(AgentSpecError, RuntimeError):
    """An engine process failed to start or to run a workflow."""


class BenchMismatchError(BenchError):
    """A method's outputs differ from no speculation's (speculation must be lossless)."""


class BenchConfig(BaseModel):
    """What ``agentspec bench`` runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ns: tuple[int, ...] = (1, 4, 16, 32, 64)
    """Concurrent workflows per run."""
    min_workflows: int = Field(default=8, ge=1)
    """Workflows per run at least: a run at N < ``min_workflows`` keeps N in flight until
    ``min_workflows`` have finished (one workflow of the demo is ~200 tokens, ~3 s at N = 1:
    too little work to time a few per cent apart)."""
    methods: tuple[str, ...] = tuple(METHODS)
    """Methods to compare (``none`` is always run: it is every ratio's baseline)."""
    apps: tuple[str, ...] = ("demo", "tool_loop", "reflect")
    """Workflow shapes: names in :data:`~agentspec_mw_langgraph.bench_apps.APPS`, or import
    paths ``package.module:build`` / ``path/to/file.py:build``
    (:func:`~agentspec_mw_langgraph.bench_apps.resolve_app`)."""
    repeats: int = Field(default=3, ge=1)
    """Runs per (shape, N, method); medians over them."""
    k: int = Field(default=8, ge=1)
    """Draft tokens per request per step."""
    max_tokens: int = Field(default=48, ge=1)
    """Tokens per LLM call at most."""
    max_num_seqs: int = Field(default=64, ge=1)
    """The engine's concurrent requests at most."""
    kv_cache_mib: int = Field(default=1024, ge=64)
    """KV cache per engine (MiB)."""
    model: str | None = None
    """Model (``None``: the default model)."""
    preload: Literal["on", "off", "both"] = "on"
    """vLLM's CPU preload (tcmalloc, Intel OpenMP) in the engine processes."""

    @field_validator("ns")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or min(v) < 1:
            raise ValueError(f"ns={list(v)} must be a non-empty list of N >= 1")
        return v

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in v if m not in METHODS]
        if unknown:
            raise ValueError(f"methods {unknown} unknown; choose from {list(METHODS)}")
        return ("none", *[m for m in v if m != "none"])

    @field_validator("apps")
    @classmethod
    def _known_apps(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError(f"apps [] unknown; choose from {list(APPS)} or give module:attr")
        for name in v:  # imports an imported app's module here: its errors come first
            resolve_app(name)
        return v

    @model_validator(mode="after")
    def _distinct_topics(self) -> BenchConfig:
        # a topic run twice on one app is a query the proposers' caches have seen: their
        # acceptance would be inflated, n-gram's (no cross-request cache) not
        need = self.repeats * sum(self.workflows(n) for n in self.ns)
        if need > topic_count():
            raise ValueError(
                f"repeats x sum(max(N, min_workflows)) = {need} workflows per app, over the "
                f"bench's {topic_count()} distinct topics: fewer repeats, smaller N or "
                "fewer min_workflows"
            )
        return self

    def workflows(self, n: int) -> int:
        """Workflows one run at N completes (N at a time)."""
        return max(n, self.min_workflows)

    def labels(self) -> list[str]:
        """The engine processes' labels (method, and ``/no-preload`` variants)."""
        variants = {"on": [""], "off": [_NO_PRELOAD], "both": ["", _NO_PRELOAD]}[self.preload]
        return [m + v for v in variants for m in self.methods]


def quick_config(**overrides: Any) -> BenchConfig:
    """The CI-sized run: two workflows of the demo app, none and AgentSpec, 8 tokens a call
    (two engine processes: three took 108 s on 2 loaded cores)."""
    base: dict[str, Any] = {
        "ns": (2,),
        "min_workflows": 2,
        "methods": ("none", "agentspec"),
        "apps": ("demo",),
        "repeats": 1,
        "k": 4,
        "max_tokens": 8,
        "max_num_seqs": 8,
        "kv_cache_mib": 256,
    }
    base.update(overrides)
    return BenchConfig(**base)


class BenchRow(BaseModel):
    """One (method, shape, N): medians and pooled percentiles over the repeats."""

    label: str
    app: str
    n: int
    repeats: int
    tokens_per_s: float
    ratio_to_none: float
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
    identical_to_none: bool
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


class _Engine:
    """One engine process (see :mod:`.bench_worker`)."""

    def __init__(self, spec: WorkerSpec, env: dict[str, str], log: Path) -> None:
        self.spec = spec
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentspec_mw_langgraph.bench_worker", spec.model_dump_json()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env=env,
            text=True,
        )
        self.start_s = 0.0

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                msg: dict[str, Any] = json.loads(line[len(MARK) :])
                if msg["kind"] == "error":
                    raise BenchError(f"[{self.spec.label}] {msg['error']} (log: {self.log})")
                return msg
        tail = self.log.read_text()[-2000:] if self.log.exists() else ""
        raise BenchError(
            f"[{self.spec.label}] the engine process exited (code {self.proc.wait()}); "
            f"its log ({self.log}) ends:\n{tail}"
        )

    def wait_ready(self) -> float:
        self.start_s = float(self._read()["start_s"])
        return self.start_s

    def run(self, app: str, topics: list[str], concurrency: int) -> RunResult:
        assert self.proc.stdin is not None
        cmd = {"cmd": "run", "app": app, "topics": topics, "concurrency": concurrency}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        msg = self._read()
        msg.pop("kind")
        return RunResult(**msg)

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write('{"cmd": "stop"}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


def engine_env(label: str) -> dict[str, str]:
    """The environment of method ``label``'s engine process: the CPU engine defaults (thread
    counts), quiet vLLM logs, an in-process engine core, and vLLM's CPU preload unless the
    label is a ``/no-preload`` variant."""
    from agentspec_mw_vllm.engine import env_defaults
    from agentspec_mw_vllm.preload import PRELOAD_ENV, with_preload

    env = dict(os.environ)
    for key, value in env_defaults(env).items():
        env.setdefault(key, value)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if label.endswith(_NO_PRELOAD):
        env[PRELOAD_ENV] = "0"
        return env
    return with_preload(env)


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summarize(
    results: dict[tuple[str, str, int, int], RunResult],
    loads: dict[tuple[str, str, int, int], float],
    config: BenchConfig,
) -> tuple[list[BenchRow], list[str]]:
    """Rows per (label, app, N) from the runs ``(label, app, n, repeat) -> result``, and
    the mismatches against each label's ``none`` (same preload variant)."""
    rows: list[BenchRow] = []
    mismatches: list[str] = []
    for app in config.apps:
        for n in config.ns:
            slowness = engine_slowness(
                {
                    label: [results[(label, app, n, r)].fit_steps for r in range(config.repeats)]
                    for label in config.labels()
                }
            )
            for label in config.labels():
                base = "none" + (_NO_PRELOAD if label.endswith(_NO_PRELOAD) else "")
                runs = [results[(label, app, n, r)] for r in range(config.repeats)]
                bases = [results[(base, app, n, r)] for r in range(config.repeats)]
                tput = [x.output_tokens / x.wall_s for x in runs]
                ratios = [
                    (x.output_tokens / x.wall_s) / (b.output_tokens / b.wall_s)
                    for x, b in zip(runs, bases, strict=True)
                ]
                identical = True
                for r, (x, b) in enumerate(zip(runs, bases, strict=True)):
                    if x.views != b.views or x.token_hashes != b.token_hashes:
                        identical = False
                        mismatches.append(f"{label} {app} N={n} repeat {r}: outputs differ")
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
                        ratio_to_none=float(np.median(ratios)),
                        tpot_p50_ms=None if tpot50 is None else 1e3 * tpot50,
                        tpot_p99_ms=None if tpot99 is None else 1e3 * tpot99,
                        ttft_p50_ms=None if ttft50 is None else 1e3 * ttft50,
                        latency_p50_s=float(np.median(lats)),
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
                            if secs and len(secs) == len(errs)
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
    common model's speed. ``None`` unless both rows have it for every repeat. A
    diagnostic: the bars are on measured throughput."""
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
    ]
    return float(np.median(per))


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def repeat_ratios(a: BenchRow, b: BenchRow) -> list[float]:
    """``a``'s throughput over ``b``'s in each repeat (both ran back to back there; a repeat
    where ``b`` has no throughput is left out); empty where the rows' repeats do not pair up
    (older JSON)."""
    x, y = a.tokens_per_s_repeats, b.tokens_per_s_repeats
    if not x or len(x) != len(y):
        return []
    return [p / q for p, q in zip(x, y, strict=True) if q > 0]


def paired_ratio(a: BenchRow, b: BenchRow) -> float:
    """``a``'s throughput over ``b``'s: the median over repeats of the ratio within each
    repeat (both ran back to back there, under the same load), not a ratio of medians or of
    the two rows' ratios to none (each a median over repeats whose load differs: they can
    rank two methods against their own tok/s). Rows without per-repeat values (older
    JSON) fall back to the ratio of their ratios to none."""
    per = repeat_ratios(a, b)
    if per:
        return float(np.median(per))
    return a.ratio_to_none / b.ratio_to_none


ONE_REPEAT_NOISE = 0.05
"""How far apart two methods' throughputs in one repeat may be by chance: paired ratios of
one configuration's repeats on this 2-core VM spread 0.92-0.99x (N = 1) and 1.07-1.10x
(N = 32) within one run (docs/results.md §5 as of `9ca0fe5`, 2026-12-04), and two one-repeat
runs of the main job ranked the methods differently. With one repeat a gap under this is called
even."""


def _standing(ours: BenchRow, peer: BenchRow) -> str:
    """A word for ``ours`` against ``peer`` that respects the noise. With two or more
    repeats the per-repeat ratios decide: ahead / behind when every repeat agrees, else
    even (their range is given); with one repeat, a paired ratio within
    :data:`ONE_REPEAT_NOISE` of 1 is even."""
    per = repeat_ratios(ours, peer)
    if len(per) >= 2:
        if min(per) > 1.0:
            return "ahead in every repeat"
        if max(per) < 1.0:
            return "behind in every repeat"
        return f"even: per repeat {min(per):.2f}-{max(per):.2f}x"
    rel = paired_ratio(ours, peer)
    if abs(rel - 1.0) < ONE_REPEAT_NOISE:
        return f"even: within one repeat's noise, {ONE_REPEAT_NOISE:.0%}"
    return "ahead" if rel >= 1.0 else "behind"


def verdict_lines(rows: Sequence[BenchRow]) -> list[str]:
    """Plain sentences: per (shape, N), which method is fastest (and by how much over the
    runner-up), AgentSpec against the better of n-gram and SuffixDecoding (the one it
    beats by least, :func:`paired_ratio`; "even" where the repeats disagree or, with one
    repeat, the gap is under :data:`ONE_REPEAT_NOISE`), and tagged against untagged
    AgentSpec."""
    lines = []
    keys = sorted({(r.app, r.n) for r in rows}, key=lambda k: (k[0], k[1]))
    for app, n in keys:
        group = {r.label: r for r in rows if (r.app, r.n) == (app, n)}
        ranked = sorted(group.values(), key=lambda r: -r.tokens_per_s)
        best = ranked[0]
        text = (
            f"{app} N={n}: fastest is {best.label} "
            f"({best.tokens_per_s:.0f} tok/s, {best.ratio_to_none:.2f}x none"
        )
        if len(ranked) > 1 and ranked[1].tokens_per_s > 0:
            margin = best.tokens_per_s / ranked[1].tokens_per_s - 1.0
            text += f", {margin:.0%} over {ranked[1].label}"
        text += ")"
        peers = [group[p] for p in _PEERS if p in group]
        if "agentspec" in group and peers:
            ours = group["agentspec"]
            rel, peer = min((paired_ratio(ours, p), p.label) for p in peers)
            word = _standing(ours, group[peer])
            text += (
                f"; agentspec {ours.ratio_to_none:.2f}x none is {rel:.2f}x {peer} "
                f"({word}; the better peer)"
            )
        if "agentspec" in group and "agentspec-untagged" in group:
            t, u = group["agentspec"], group["agentspec-untagged"]
            text += (
                f"; tags: {_f(t.acceptance, '.1%')} vs {_f(u.acceptance, '.1%')} accepted, "
                f"{paired_ratio(t, u):.2f}x untagged's tok/s"
            )
            adjusted = speed_adjusted_ratio(t, u)
            if adjusted is not None:
                text += f" ({adjusted:.3f}x with each engine's step speed divided out)"
        lines.append(text)
    return lines


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
        f"{'TPOT99':>7} {'TTFT50':>7} {'lat50':>6} {'accept':>6} {'reject':>6} {'prop ms':>7} "
        f"{'fit err':>7} {'preempt':>7} {'same':>4} {'load':>4}"
    )
    lines = [
        f"agentspec bench, {report.date}, {report.cpus} CPUs, load {report.load_before[0]:.2f} "
        f"before / {report.load_after[0]:.2f} after; medians of {report.config.repeats} "
        f"repeat(s), ratios to none in the same run; TPOT, TTFT in ms, latency (lat50) in s",
        head,
        "-" * len(head),
    ]
    for r in report.rows:
        lines.append(
            f"{r.app:<9} {r.n:>3} {r.label:<24} {r.tokens_per_s:>7.1f} "
            f"{r.ratio_to_none:>5.2f}x {_f(r.tpot_p50_ms, '.1f'):>7} "
            f"{_f(r.tpot_p99_ms, '.1f'):>7} {_f(r.ttft_p50_ms, '.0f'):>7} {r.latency_p50_s:>6.1f} "
            f"{_f(r.acceptance, '.1%'):>6} {_f(r.rejection, '.1%'):>6} "
            f"{_f(r.proposer_ms_per_step, '.3f'):>7} {_f(r.fit_error_median, '.1%'):>7} "
            f"{r.preemptions:>7} {'yes' if r.identical_to_none else 'NO':>4} {r.load_avg:>4.1f}"
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
    fig, axes = plt.subplots(len(apps), 2, figsize=(11, 3.6 * len(apps)), squeeze=False)
    for i, app in enumerate(apps):
        ax1, ax2 = axes[i]
        for j, label in enumerate(report.config.labels()):
            rows = sorted(
                (r for r in report.rows if r.app == app and r.label == label), key=lambda r: r.n
            )
            ns = [r.n for r in rows]
            style = "--" if label.endswith(_NO_PRELOAD) else "-"
            ax1.plot(
                ns, [r.tokens_per_s for r in rows], style, marker="o", label=label, color=f"C{j}"
            )
            ax2.plot(
                ns, [r.ratio_to_none for r in rows], style, marker="o", label=label, color=f"C{j}"
            )
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(report.config.ns), [str(n) for n in sorted(report.config.ns)])
            ax.minorticks_off()
            ax.set_xlabel("concurrent workflows N")
        ax1.set_ylabel("output tokens/s")
        ax1.set_title(f"{app}: throughput")
        ax2.set_ylabel("speedup over none\n(median of per-repeat ratios)")
        ax2.axhline(1.0, color="grey", lw=0.8)
        ax2.set_title(f"{app}: speedup")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _sample_output(results: dict[tuple[str, str, int, int], RunResult], config: BenchConfig) -> str:
    """One agent's output, so a person sees what the agents did (none, first shape, top N)."""
    app, n = config.apps[0], max(config.ns)
    run = results[("none" if config.preload != "off" else "none" + _NO_PRELOAD, app, n, 0)]
    view = run.views[0] if run.views else {}
    if app == "demo" and isinstance(view, dict):
        return f"writer's answer (demo, N={n}, first query):\n{view.get('answer', '')}"
    if app == "reflect" and isinstance(view, dict):
        return f"final draft after review (reflect, N={n}, first query):\n{view.get('draft', '')}"
    messages = view.get("messages", []) if isinstance(view, dict) else []
    if messages and isinstance(messages[-1], dict):
        return f"the last message ({app}, N={n}, first query):\n{messages[-1].get('content', '')}"
    return f"the final state ({app}, N={n}, first query):\n{json.dumps(view)[:2000]}"


def write_fit_steps(
    results: dict[tuple[str, str, int, int], RunResult], path: str | Path
) -> Path | None:
    """Write the steps the measured cost model timed, one JSON line per run (``label``,
    ``app``, ``n``, ``repeat``, ``steps``: ``[num_batched, num_kv, spec_kv, draft_kv,
    emitted, seconds]`` each; ``benchmarks/fit_live_steps.py`` refits them); ``None``
    (nothing written) when no run timed any."""
    lines = [
        json.dumps({"label": k[0], "app": k[1], "n": k[2], "repeat": k[3], "steps": r.fit_steps})
        for k, r in sorted(results.items())
        if r.fit_steps
    ]
    if not lines:
        return None
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def run_bench(
    config: BenchConfig,
    *,
    out: str | Path = "out/bench",
    json_path: str | Path | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> BenchReport:
    """Run the sweep, print the table, write ``<out>.txt``, ``<out>.png``,
    ``<out>.steps.jsonl`` (:func:`write_fit_steps`) and (with ``json_path``) the report as
    JSON; return the report.

    Raises:
        BenchError: an engine process failed.
        BenchMismatchError: some output differed from no speculation's (after writing
            the report).
    """
    from tqdm import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load_before = list(os.getloadavg())
    labels = config.labels()
    engines: dict[str, _Engine] = {}
    results: dict[tuple[str, str, int, int], RunResult] = {}
    loads: dict[tuple[str, str, int, int], float] = {}
    try:
        echo(f"starting {len(labels)} engines ({', '.join(labels)}); logs in {out}.<method>.log")
        for label in labels:
            method = label.removesuffix(_NO_PRELOAD)
            speculative, tagged = METHODS[method]
            spec = WorkerSpec(
                label=label,
                speculative=speculative,
                tagged=tagged,
                model=config.model,
                k=config.k,
                max_tokens=config.max_tokens,
                max_num_seqs=config.max_num_seqs,
                kv_cache_mib=config.kv_cache_mib,
                apps=config.apps,
            )
            log = out.parent / f"{out.name}.{label.replace('/', '_')}.log"
            engines[label] = _Engine(spec, engine_env(label), log)
        starts = {label: e.wait_ready() for label, e in engines.items()}
        echo("engines ready: " + ", ".join(f"{k} {v:.0f} s" for k, v in starts.items()))
        total = len(config.apps) * len(config.ns) * config.repeats * len(labels)
        bar = tqdm(total=total, desc="bench", unit="run", disable=not progress, file=sys.stderr)
        offset = 0
        for app in config.apps:
            for n in config.ns:
                for r in range(config.repeats):
                    topics = bench_topics(offset, config.workflows(n))
                    offset += len(topics)
                    order = labels[r % len(labels) :] + labels[: r % len(labels)]
                    for label in order:
                        bar.set_postfix_str(f"{app} N={n} r{r} {label}")
                        loads[(label, app, n, r)] = os.getloadavg()[0]
                        results[(label, app, n, r)] = engines[label].run(app, topics, n)
                        bar.update(1)
        bar.close()
    finally:
        for engine in engines.values():
            engine.close()
    rows, mismatches = summarize(results, loads, config)
    report = BenchReport(
        config=config,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        cpus=os.cpu_count() or 0,
        load_before=load_before,
        load_after=list(os.getloadavg()),
        engine_start_s=starts,
        rows=rows,
        mismatches=mismatches,
        sample_output=_sample_output(results, config),
    )
    text = format_report(report)
    echo(text)
    echo("\n" + report.sample_output)
    out.with_suffix(".txt").write_text(text + "\n\n" + report.sample_output + "\n")
    png = plot_report(report, out.with_suffix(".png"))
    written = [str(png), str(out.with_suffix(".txt"))]
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(report.model_dump_json(indent=1))
        written.append(str(json_path))
    steps = write_fit_steps(results, out.with_suffix(".steps.jsonl"))
    if steps is not None:
        written.append(str(steps))
    echo("wrote " + ", ".join(written))
    if mismatches:
        raise BenchMismatchError(
            f"{len(mismatches)} run(s) differ from no speculation: {mismatches[:3]}"
        )
    return report
