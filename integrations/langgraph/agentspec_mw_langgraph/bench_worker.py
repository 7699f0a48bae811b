"""One ``agentspec bench`` engine process: one warmed engine, one method, runs on request.

Started by :mod:`~agentspec_mw_langgraph.bench` as ``python -m
agentspec_mw_langgraph.bench_worker '<WorkerSpec JSON>'`` (so ``LD_PRELOAD`` and the
thread limits are set before the process starts, and every method's engine lives in
its own process: vLLM's in-process engines share process-wide state). The worker builds
the embedded ``vllm.LLM`` with the method's drafter, drives it with the LangGraph
adapter's engine loop (continuous batching: a request joins the running batch at the
next step), warms it up with one query per workflow shape, prints a ``ready`` line, then
answers each ``run`` command read from stdin (one JSON object per line) with one result
line. Protocol lines on stdout start with :data:`MARK`; anything else there is vLLM's.

What it measures per run, in this process (the engine runs here):

* per request: time of submission, of the first output token and of the last
  (TTFT = first − submitted, which includes waiting for a batch slot; TPOT = (last −
  first) / (tokens − 1)), tokens, drafted and accepted drafts (vLLM's
  per-request spec-decode metrics), the agent tag, a hash of the token ids;
* per workflow: wall time from start to end, and its final state (:func:`final_view`);
* vLLM's own counters before and after: spec decode (drafted, accepted) and preempted
  requests (a full KV cache: each is recomputed from its prompt later);
* the drafter's time per draft call, for every method alike: the ``propose`` method of
  vLLM's ``NgramProposer`` / ``SuffixDecodingProposer`` and of our ``AgentSpecDrafter``
  is wrapped with a timer (this process only);
* with the measured cost model: each step's prediction by the fit before it saw the
  step, against the step's measured time (relative error), the step's features and
  time (``fit_steps``), and AgentSpec's per-agent/per-block drafted and accepted counters.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

_T = TypeVar("_T")

__all__ = ["MARK", "RunResult", "WorkerSpec", "chat_model", "main"]

#: Prefix of the protocol lines on the worker's stdout.
MARK = "@@agentspec-bench@@ "


class WorkerSpec(BaseModel):
    """What one engine process runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str
    """The method's name in the results (e.g. ``agentspec-untagged``)."""
    speculative: str | None
    """``build_llm(speculative=...)``: ``None``, ``ngram``, ``suffix``, ``agentspec``."""
    tagged: bool = True
    """Wrap the graphs with ``with_agentspec`` (structure tags on every request)."""
    model: str | None = None
    k: int = Field(default=8, ge=1)
    max_tokens: int = Field(default=48, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    max_model_len: int = Field(default=2048, ge=64)
    max_num_seqs: int = Field(default=64, ge=1)
    kv_cache_mib: int = Field(default=1024, ge=64)
    apps: tuple[str, ...] = ("demo",)
    engine_options: dict[str, Any] = Field(default_factory=dict)


class RunResult(BaseModel):
    """One run: workflows of one shape on one engine, N of them in flight at a time."""

    label: str
    app: str
    n: int
    """Workflows in flight at a time (N; the run completes ``len(workflow_latency_s)``)."""
    wall_s: float
    output_tokens: int
    requests: int
    workflow_latency_s: list[float]
    tpot_s: list[float]
    decoding_s: float = 0.0
    """Σ over requests of the time from the first output token to the last: divided by
    ``wall_s``, how many requests decoded at once on average (:attr:`BenchRow.batch`)."""
    ttft_s: list[float] = []
    """Per request: submission to its first output token (the wait for a batch slot and
    for its prompt's prefill included)."""
    drafted: int
    accepted: int
    preemptions: int = 0
    """Requests vLLM preempted in the run (the KV cache was full: each is recomputed from
    its prompt later; ``vllm:num_preemptions``)."""
    proposer_s: float
    proposer_calls: int
    per_agent: dict[str, list[int]]
    """``agent -> [requests, output tokens, drafted, accepted]`` (per-request metrics)."""
    per_block: dict[str, list[int]] = {}
    """``"agent/block" -> [drafted, accepted]`` from AgentSpec's own counters."""
    fit_errors: list[float] = []
    """Relative errors ``(predicted - measured) / measured`` of the step-time fit."""
    fit_seconds: list[float] = []
    """The measured seconds of the steps in ``fit_errors``, in the same order."""
    fit_steps: list[list[float]] = []
    """Every step the fit used: ``[num_batched, num_kv, spec_kv, draft_kv, emitted,
    seconds]`` (``MeasuredStepTime.observe``'s arguments; ``<out>.steps.jsonl``)."""
    rejected_steps: list[list[float]] = []
    """Steps of valid time and features the fit left out as outliers (pauses), as
    ``fit_steps``: in ``fit_errors`` and the engine's slowness, not in the fit."""
    step_model: dict[str, float] = {}
    faults: dict[str, int] = {}
    estimated: int = 0
    """Draft tokens verified whose draft carried the proposer's estimates (AgentSpec's)."""
    expected: float = 0.0
    """Of those, the accepted tokens the proposer expected (Σ predicted survival)."""
    estimated_accepted: int = 0
    """Of those, the tokens accepted."""
    reliability: list[list[float]] = []
    """Per tenth of predicted survival: ``[positions, Σ predicted, accepted]``."""
    views: list[Any]
    """Each workflow's final state (:func:`~.bench_apps.final_view`), in topic order."""
    token_hashes: list[str]
    """A hash of each request's token ids, sorted (requests are not tied to workflows)."""
    topics: list[str] = []
    """The run's topics, one per workflow, in the order of :attr:`views` (a mismatch names
    its workflow by them)."""


@dataclass
class _Timing:
    start: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0


class _Stats:
    """Counters the instrumented code adds to (all threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.proposer_s = 0.0
        self.proposer_calls = 0
        self.fit_errors: list[float] = []
        self.fit_seconds: list[float] = []
        self.fit_steps: list[list[float]] = []
        self.rejected_steps: list[list[float]] = []

    def add_propose(self, seconds: float) -> None:
        with self.lock:
            self.proposer_s += seconds
            self.proposer_calls += 1


STATS = _Stats()


def _timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            STATS.add_propose(time.perf_counter() - t0)

    return wrapper


def _instrument() -> None:
    """Time every drafter's ``propose`` and the step-time fit's predictions (this process)."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    from agentspec_mw.costfit import MeasuredStepTime
    from agentspec_mw_vllm.adapter import AgentSpecDrafter

    for cls in (NgramProposer, SuffixDecodingProposer, AgentSpecDrafter):
        cls.propose = _timed(cls.propose)  # type: ignore[method-assign]
    MeasuredStepTime.observe = _scored(MeasuredStepTime.observe)  # type: ignore[method-assign]


def _scored(observe: Callable[..., bool]) -> Callable[..., bool]:
    """``MeasuredStepTime.observe`` recording each step in :data:`STATS`: the fit's
    prediction error before it learns the step, for every step of valid time (also one
    it leaves out as an outlier), and the step in ``fit_steps`` or ``rejected_steps``."""

    def observe_and_score(
        self: Any,  # a MeasuredStepTime
        nb: float,
        kv: float,
        s: float,
        spec_kv: float = 0.0,
        draft_kv: float = 0.0,
        emitted: float = 0.0,
    ) -> bool:
        predicted = None
        if self.observed >= self.min_steps:
            predicted = self.predict(nb, kv, spec_kv, draft_kv, emitted)
        used = observe(self, nb, kv, s, spec_kv, draft_kv, emitted)
        row = [nb, kv, spec_kv, draft_kv, emitted, s]
        # every step of valid time is scored, also one the fit left out as an outlier: the
        # worst-predicted steps are the ones a throughput estimate must not lose
        if used or (s > 0 and all(math.isfinite(x) and x >= 0 for x in row)):
            with STATS.lock:
                (STATS.fit_steps if used else STATS.rejected_steps).append(row)
                if predicted is not None and math.isfinite(predicted):
                    STATS.fit_errors.append((predicted - s) / s)
                    STATS.fit_seconds.append(s)
        return used

    return observe_and_score


def _timed_backend(llm: Any) -> Any:
    """A ``VLLMBackend`` that records each request's timing, counts and token hash."""
    from agentspec_mw.tags import WIRE_PREFIX
    from agentspec_mw_langgraph.backend import VLLMBackend

    class TimedBackend(VLLMBackend):
        def __init__(self, engine: Any) -> None:
            super().__init__(engine)
            self.lock = threading.Lock()
            self.clear()

        def clear(self) -> None:
            self.timings: list[_Timing] = []
            self.per_agent: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
            self.hashes: list[str] = []

        def _submit(self, request: Any, sink: Any) -> str:
            timing = _Timing(time.perf_counter())
            with self.lock:
                self.timings.append(timing)

            def timed_sink(out: Any) -> None:
                now = time.perf_counter()
                if not isinstance(out, BaseException):
                    if timing.first is None and out.outputs[0].token_ids:
                        timing.first = now
                    if out.finished:
                        timing.end = now
                        timing.tokens = len(out.outputs[0].token_ids)
                sink(out)

            return super()._submit(request, timed_sink)

        def _observe(self, request: Any, completion: Any) -> None:
            metrics = getattr(completion, "spec_decode_metrics", None)
            drafted = int(getattr(metrics, "num_draft_tokens", 0) or 0)
            hist = list(getattr(metrics, "histogram", []) or [])
            accepted = sum(j * int(n) for j, n in enumerate(hist))
            agent = str((request.extra_args or {}).get(f"{WIRE_PREFIX}agent", "untagged"))
            digest = hashlib.sha1(
                json.dumps(list(completion.token_ids)).encode(), usedforsecurity=False
            ).hexdigest()[:16]
            with self.lock:
                row = self.per_agent[agent]
                row[0] += 1
                row[1] += len(completion.token_ids)
                row[2] += drafted
                row[3] += accepted
                self.hashes.append(digest)

    return TimedBackend(llm)


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _bins_delta(
    after: Sequence[tuple[int, float, int]], before: Sequence[tuple[int, float, int]]
) -> list[list[float]]:
    """``after − before`` of the live calibration rows (``before`` may be empty)."""
    if not after:
        return []
    zero = [(0, 0.0, 0)] * len(after)
    return [
        [float(a[i] - b[i]) for i in range(3)] for a, b in zip(after, before or zero, strict=True)
    ]


def chat_model(spec: WorkerSpec, backend: Any) -> Any:
    """The chat model every graph of the process is built on (``backend``: the engine)."""
    from agentspec_mw_langgraph.engine_chat import ChatAgentSpecVLLM

    return ChatAgentSpecVLLM(
        engine=backend, max_tokens=spec.max_tokens, temperature=spec.temperature
    )


class Worker:
    """The engine, the graphs and the instrumentation of one process."""

    def __init__(self, spec: WorkerSpec) -> None:
        from agentspec_mw_langgraph.bench_apps import resolve_app
        from agentspec_mw_langgraph.config import TaggingConfig
        from agentspec_mw_langgraph.wrap import with_agentspec
        from agentspec_mw_vllm.engine import apply_env_defaults, build_llm

        self.spec = spec
        t0 = time.perf_counter()
        apply_env_defaults(in_process=True)  # before vLLM is imported
        _instrument()
        options: dict[str, Any] = {
            "max_num_seqs": spec.max_num_seqs,
            "kv_cache_memory_bytes": spec.kv_cache_mib << 20,
            "disable_log_stats": False,
            "enforce_eager": True,
            **spec.engine_options,
        }
        self.llm = build_llm(
            spec.model,
            speculative=spec.speculative,
            k=spec.k,
            max_model_len=spec.max_model_len,
            **options,
        )
        self.backend = _timed_backend(self.llm)
        chat = chat_model(spec, self.backend)
        self.graphs: dict[str, Any] = {}
        self.shapes = {name: resolve_app(name) for name in spec.apps}  # imports by path
        for name, shape in self.shapes.items():
            graph = shape.build(chat)
            if spec.tagged:
                graph = with_agentspec(graph, config=TaggingConfig())
            self.graphs[name] = graph
            shape.run(graph, "warm-up: the weather")  # JIT, templates; not timed
        self.start_s = time.perf_counter() - t0

    def run(self, app: str, topics: list[str], concurrency: int | None = None) -> RunResult:
        """Run the workflows of ``topics``, ``concurrency`` (all of them) at a time."""
        from agentspec_mw_langgraph.bench_apps import final_view
        from agentspec_mw_vllm.engine import engine_counters
        from agentspec_mw_vllm.metrics import get_metrics

        graph, shape = self.graphs[app], self.shapes[app]
        self.backend.clear()
        STATS.reset()
        d0, a0, p0 = engine_counters(self.llm)
        m0 = get_metrics().snapshot()

        def one(topic: str) -> tuple[Any, float]:
            t = time.perf_counter()
            state = shape.run(graph, topic)
            return final_view(state), time.perf_counter() - t

        t0 = time.perf_counter()
        width = max(min(concurrency or len(topics), len(topics)), 1)
        done = run_workflows(one, topics, width)
        wall = time.perf_counter() - t0
        d1, a1, p1 = engine_counters(self.llm)
        m1 = get_metrics().snapshot()
        drafted, accepted = _delta(m1.drafted, m0.drafted), _delta(m1.accepted, m0.accepted)
        per_agent = {k: list(v) for k, v in self.backend.per_agent.items()}
        return RunResult(
            label=self.spec.label,
            app=app,
            n=width,
            wall_s=wall,
            output_tokens=sum(v[1] for v in per_agent.values()),
            requests=sum(v[0] for v in per_agent.values()),
            workflow_latency_s=[lat for _, lat in done],
            tpot_s=self._tpots(),
            decoding_s=sum(
                t.end - t.first
                for t in self.backend.timings
                if t.first is not None and t.end is not None
            ),
            ttft_s=self._ttfts(),
            drafted=d1 - d0,
            accepted=a1 - a0,
            preemptions=p1 - p0,
            proposer_s=STATS.proposer_s,
            proposer_calls=STATS.proposer_calls,
            per_agent=per_agent,
            per_block={k: [drafted.get(k, 0), accepted.get(k, 0)] for k in drafted},
            fit_errors=list(STATS.fit_errors),
            fit_seconds=list(STATS.fit_seconds),
            fit_steps=list(STATS.fit_steps),
            rejected_steps=list(STATS.rejected_steps),
            step_model=dict(m1.step_model),
            faults=_delta(m1.faults, m0.faults),
            estimated=sum(m1.estimated.values()) - sum(m0.estimated.values()),
            expected=sum(m1.expected.values()) - sum(m0.expected.values()),
            estimated_accepted=(
                sum(m1.estimated_accepted.values()) - sum(m0.estimated_accepted.values())
            ),
            reliability=_bins_delta(m1.reliability, m0.reliability),
            views=[view for view, _ in done],
            token_hashes=sorted(self.backend.hashes),
            topics=list(topics),
        )

    def _ttfts(self) -> list[float]:
        """Time to the first output token, per request that produced one."""
        return [t.first - t.start for t in self.backend.timings if t.first is not None]

    def _tpots(self) -> list[float]:
        """Time per output token after the first, per request with >= 2 tokens."""
        return [
            (t.end - t.first) / (t.tokens - 1)
            for t in self.backend.timings
            if t.first is not None and t.end is not None and t.tokens >= 2
        ]

    def close(self) -> None:
        from agentspec_mw_vllm.engine import shutdown

        shutdown(self.llm)


def run_workflows(one: Callable[[str], _T], topics: Sequence[str], width: int) -> list[_T]:
    """``one(topic)`` for every topic, ``width`` in flight at a time (a finished one's thread
    takes the next topic), results in topic order."""
    with ThreadPoolExecutor(max_workers=max(width, 1)) as pool:
        return list(pool.map(one, topics))


def _emit(kind: str, payload: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps({"kind": kind, **payload}) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Serve ``run`` commands from stdin until ``stop`` or end of input."""
    args = sys.argv[1:] if argv is None else argv
    spec = WorkerSpec.model_validate_json(args[0])
    try:
        worker = Worker(spec)
    except Exception as exc:  # the parent shows it and stops the bench
        _emit("error", {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _emit("ready", {"start_s": worker.start_s})
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("cmd") == "stop":
                break
            try:
                width = cmd.get("concurrency")
                result = worker.run(
                    str(cmd["app"]), list(cmd["topics"]), None if width is None else int(width)
                )
            except Exception as exc:
                _emit("error", {"error": f"{type(exc).__name__}: {exc}"})
                continue
            _emit("result", result.model_dump())
    finally:
        worker.close()
    return 0


def exit_now(rc: int) -> None:
    """End the engine process once :func:`main` has returned: its results are out and its
    engine is shut down, so Python's teardown of vLLM and torch (~2.7 s on 2 cores, after
    ``shutdown``'s ~1.9 s) would only delay the bench; flush what is buffered, then
    ``os._exit``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to deliver
            pass
    os._exit(rc)


if __name__ == "__main__":
    exit_now(main())
