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
the report is written). Sampled benches (``temperature`` > 0) draw other outputs each run:
they are not compared.

With ``preload="both"`` every method also runs without vLLM's CPU preload
(:mod:`agentspec_mw_vllm.preload`) as ``<method>/no-preload``, interleaved the same way.
An engine process that gives no result within ``run_timeout_s`` (or is not ready within
it) is killed and the bench fails naming the run (:class:`BenchTimeoutError`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentspec_mw.cli import check_writable
from agentspec_mw.errors import AgentSpecError
from agentspec_mw_langgraph.bench_apps import bench_topics, topic_count
from agentspec_mw_langgraph.bench_config import (
    METHODS,
    NO_PRELOAD,
    BenchConfig,
    quick_config,
)
from agentspec_mw_langgraph.bench_format import (
    ONE_REPEAT_NOISE,
    format_report,
    plot_report,
    verdict_lines,
)
from agentspec_mw_langgraph.bench_report import (
    MIN_SLOWNESS_STEPS,
    BenchReport,
    BenchRow,
    engine_slowness,
    paired_ratio,
    read_report,
    repeat_ratios,
    speed_adjusted_ratio,
    summarize,
)
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
    "BenchTimeoutError",
    "OUT_SUFFIXES",
    "engine_env",
    "engine_slowness",
    "format_report",
    "out_file",
    "paired_ratio",
    "plot_report",
    "quick_config",
    "read_report",
    "repeat_ratios",
    "run_bench",
    "speed_adjusted_ratio",
    "summarize",
    "verdict_lines",
    "worker_spec",
    "write_fit_steps",
]


class BenchError(AgentSpecError, RuntimeError):
    """An engine process failed to start or to run a workflow."""


class BenchMismatchError(BenchError):
    """A method's outputs differ from no speculation's (speculation must be lossless)."""


class BenchTimeoutError(BenchError):
    """An engine process gave no result (or was not ready) within
    :attr:`BenchConfig.run_timeout_s`: it was killed."""


_EOF = object()
"""What :class:`_Engine`'s reader thread queues when the process's stdout ends."""


class _Engine:
    """One engine process (see :mod:`.bench_worker`). A thread reads its stdout into a
    queue, so a wait for its next protocol line can time out (:meth:`_read`)."""

    worker_module = "agentspec_mw_langgraph.bench_worker"
    """The module run as the engine process (``python -m``; tests put a stand-in here)."""

    def __init__(self, spec: WorkerSpec, env: dict[str, str], log: Path) -> None:
        self.spec = spec
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.worker_module, spec.model_dump_json()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env=env,
            text=True,
        )
        self._lines: queue.SimpleQueue[object] = queue.SimpleQueue()
        threading.Thread(target=self._pump, name=f"bench-{spec.label}-stdout", daemon=True).start()
        self.start_s = 0.0

    def _pump(self) -> None:
        """Queue the process's stdout lines, then :data:`_EOF` (the reader thread)."""
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self._lines.put(line)
        finally:
            self._lines.put(_EOF)

    def _tail(self) -> str:
        return self.log.read_text()[-2000:] if self.log.exists() else ""

    def _read(self, what: str, timeout_s: float | None) -> dict[str, Any]:
        """The next protocol message (``what`` names the wait in errors).

        Raises:
            BenchError: the worker answered with an error, or the process exited.
            BenchTimeoutError: no message within ``timeout_s`` seconds; the process is
                killed first.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                line = self._lines.get(timeout=wait)
            except queue.Empty:
                self.kill()
                raise BenchTimeoutError(
                    f"{what} after {timeout_s:g} s (run_timeout_s, --run-timeout): the "
                    f"engine process was killed; its log ({self.log}) ends:\n{self._tail()}"
                ) from None
            if line is _EOF:
                break
            assert isinstance(line, str)
            if line.startswith(MARK):
                msg: dict[str, Any] = json.loads(line[len(MARK) :])
                if msg["kind"] == "error":
                    raise BenchError(f"[{self.spec.label}] {msg['error']} (log: {self.log})")
                return msg
        raise BenchError(
            f"[{self.spec.label}] the engine process exited (code {self.proc.wait()}); "
            f"its log ({self.log}) ends:\n{self._tail()}"
        )

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Wait for the process's ``ready`` line; its start time (s).

        Raises:
            BenchError: the engine failed to start.
            BenchTimeoutError: not ready within ``timeout_s`` seconds (killed).
        """
        self.start_s = float(self._read(f"{self.spec.label}: not ready", timeout_s)["start_s"])
        return self.start_s

    def run(
        self,
        app: str,
        topics: list[str],
        concurrency: int,
        *,
        repeat: int = 0,
        timeout_s: float | None = None,
    ) -> RunResult:
        """Run the workflows of ``topics`` on app ``app``, ``concurrency`` at a time.

        Raises:
            BenchError: the run failed, or the process exited.
            BenchTimeoutError: no result within ``timeout_s`` seconds (the process is
                killed; the message names the method, app, N and ``repeat``).
        """
        assert self.proc.stdin is not None
        cmd = {"cmd": "run", "app": app, "topics": topics, "concurrency": concurrency}
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the process is gone (it died after its last result)
            raise BenchError(
                f"[{self.spec.label}] the engine process exited (code {self.proc.wait()}) "
                f"before {app} N={concurrency} repeat {repeat}; its log ({self.log}) ends:\n"
                f"{self._tail()}"
            ) from None
        what = f"{self.spec.label} {app} N={concurrency} repeat {repeat}: no result"
        msg = self._read(what, timeout_s)
        msg.pop("kind")
        return RunResult(**msg)

    def kill(self) -> None:
        """End the process at once (a stuck engine)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def request_stop(self) -> None:
        """Send the ``stop`` command and return at once: each engine takes seconds to shut
        down (~2 s here; the process then skips Python's teardown,
        :func:`~agentspec_mw_langgraph.bench_worker.exit_now`), so :func:`run_bench` asks
        them all before waiting for any."""
        stdin = self.proc.stdin
        if self.proc.poll() is None and stdin is not None and not stdin.closed:
            try:
                stdin.write('{"cmd": "stop"}\n')
                stdin.close()
            except OSError:
                self.kill()

    def close(self) -> None:
        """Stop the process (:meth:`request_stop`, unless sent already; killed if it does
        not end in 60 s)."""
        self.request_stop()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):  # a killed process's pipe
                self.proc.stdin.close()
        self._log_file.close()


def engine_env(label: str) -> dict[str, str]:
    """The environment of method ``label``'s engine process: the CPU engine defaults (thread
    counts), quiet vLLM logs, an in-process engine core, and vLLM's CPU preload unless the
    label is a ``/no-preload`` variant."""
    from agentspec_mw_vllm.engine import env_defaults
    from agentspec_mw_vllm.preload import with_preload, without_preload

    env = dict(os.environ)
    for key, value in env_defaults(env).items():
        env.setdefault(key, value)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if label.endswith(NO_PRELOAD):  # also out of an LD_PRELOAD the shell exported
        return without_preload(env)
    return with_preload(env)


def _sample_output(results: dict[tuple[str, str, int, int], RunResult], config: BenchConfig) -> str:
    """One agent's output, so a person sees what the agents did (none, first shape, top N)."""
    app, n = config.apps[0], max(config.ns)
    run = results[("none" if config.preload != "off" else "none" + NO_PRELOAD, app, n, 0)]
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
    emitted, seconds]`` each, the steps its fit used; ``rejected``: those it left out as
    outliers, where any; ``benchmarks/fit_live_steps.py`` refits them); ``None``
    when no run timed any: nothing is written, and a file an earlier bench left at
    ``path`` is removed (it would pass for this run's steps)."""
    path = Path(path)
    lines = [
        json.dumps(
            {"label": k[0], "app": k[1], "n": k[2], "repeat": k[3], "steps": r.fit_steps}
            | ({"rejected": r.rejected_steps} if r.rejected_steps else {})
        )
        for k, r in sorted(results.items())
        if r.fit_steps
    ]
    if not lines:
        path.unlink(missing_ok=True)
        return None
    path.write_text("\n".join(lines) + "\n")
    return path


OUT_SUFFIXES = (".steps.jsonl", ".json", ".txt", ".png")
"""Extensions of the bench's files (the ``--json`` report's included): an ``out`` that
ends with one names its stem with it (:func:`out_file`)."""


def out_file(out: str | Path, suffix: str) -> Path:
    """The file ``<out><suffix>`` of output stem ``out``: ``out`` keeps its dots
    (``run.v2`` -> ``run.v2.txt``); only an extension the bench writes
    (:data:`OUT_SUFFIXES`, any case), given with the stem, is replaced (``b.txt`` ->
    ``b.png``)."""
    out = Path(out)
    name = out.name
    for known in OUT_SUFFIXES:
        if name.lower().endswith(known) and len(name) > len(known):
            name = name[: -len(known)]
            break
    return out.with_name(name + suffix)


def _log_path(out: Path, label: str) -> Path:
    """Where method ``label``'s engine process logs (``<out>.<label>.log``)."""
    return out_file(out, f".{label.replace('/', '_')}.log")


def _check_json_apart(json_path: Path, targets: list[Path], out: Path) -> None:
    """Refuse a ``--json`` path that is one of the bench's other files (``targets``: OUT's
    table, plot, timed steps and engine logs): one would overwrite the other.

    Raises:
        ValueError: ``json_path`` names one of ``targets``.
    """
    same = [t for t in targets if t.resolve() == json_path.resolve()]
    if same:
        raise ValueError(
            f"--json {str(json_path)!r} names a file the bench writes itself with --out "
            f"{str(out)!r} ({str(same[0])!r}; OUT.txt, OUT.png, OUT.steps.jsonl and the "
            "engines' logs are its own): give the report another name, e.g. "
            f"{str(out_file(out, '.json'))!r}"
        )


def _check_distinct(config: BenchConfig) -> None:
    """Each method, app and N once (:class:`BenchConfig` refuses repeats; a config built
    without validation may still hold them): runs are keyed by (method, app, N, repeat),
    and a second engine of one method would never be closed.

    Raises:
        ValueError: a repeated method, app or N.
    """
    for field, values in (("methods", config.labels()), ("apps", config.apps), ("ns", config.ns)):
        if len(set(values)) != len(values):
            raise ValueError(f"{field}={list(values)} has duplicates: give each once")


def _write_outputs(
    report: BenchReport,
    results: dict[tuple[str, str, int, int], RunResult],
    out: Path,
    json_path: str | Path | None,
    echo: Callable[[str], None],
) -> tuple[list[str], list[str]]:
    """Print the table and write the report's files (the JSON, the data, first), each
    apart: one that fails leaves the others written. Returns the paths written and the
    failures (a full disk, or a bug: run_bench reports them with any mismatch)."""
    written: list[str] = []
    failed: list[str] = []

    def attempt(what: str, write: Callable[[], Path | None]) -> None:
        try:
            path = write()
        except Exception as exc:
            failed.append(f"{what}: {type(exc).__name__}: {exc}")
        else:
            if path is not None:
                written.append(str(path))

    def write_json() -> Path:
        assert json_path is not None
        Path(json_path).write_text(report.model_dump_json(indent=1))
        return Path(json_path)

    def write_table() -> Path:
        text = format_report(report)
        echo(text)
        echo("\n" + report.sample_output)
        txt = out_file(out, ".txt")
        txt.write_text(text + "\n\n" + report.sample_output + "\n")
        return txt

    if json_path is not None:
        attempt("the JSON report", write_json)
    attempt("the table", write_table)
    attempt("the plot", lambda: plot_report(report, out_file(out, ".png")))
    attempt("the timed steps", lambda: write_fit_steps(results, out_file(out, ".steps.jsonl")))
    return written, failed


def worker_spec(config: BenchConfig, label: str) -> WorkerSpec:
    """What the engine process of ``label`` (a method, or its no-preload variant) runs."""
    speculative, tagged = METHODS[label.removesuffix(NO_PRELOAD)]
    return WorkerSpec(
        label=label,
        speculative=speculative,
        tagged=tagged,
        model=config.model,
        k=config.k,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        max_num_seqs=config.max_num_seqs,
        kv_cache_mib=config.kv_cache_mib,
        apps=config.apps,
    )


def run_bench(
    config: BenchConfig,
    *,
    out: str | Path = "out/bench",
    json_path: str | Path | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> BenchReport:
    """Run the sweep, print the table, write (with ``json_path``) the report as JSON,
    ``<out>.txt``, ``<out>.png`` and ``<out>.steps.jsonl`` (:func:`write_fit_steps`; the
    stem keeps its dots, :func:`out_file`); return the report. Every path is checked
    writable before any engine starts. An engine that is not ready, or gives no run's
    result, within :attr:`BenchConfig.run_timeout_s` is killed and the bench fails; a
    failed engine writes nothing (the sweep is incomplete).

    Raises:
        ValueError: a path that cannot be written, a ``json_path`` that is one of the
            other files, or a repeated method, app or N (before any engine starts).
        BenchError: an engine process failed, or writing the report failed at the end.
        BenchTimeoutError: an engine process was not ready, or gave no result of a run
            (the method, app, N and repeat named), in time; it was killed.
        BenchMismatchError: some output differed from no speculation's (after writing
            the report; also where writing it failed, which its message then says).
    """
    from tqdm import tqdm

    out = Path(out)
    labels = config.labels()
    _check_distinct(config)
    every = len(config.apps) * config.workflows_per_app()
    if len(config.apps) > 1 and every > topic_count():
        echo(
            f"note: {every} workflows over {len(config.apps)} apps reuse the bench's "
            f"{topic_count()} topics across apps on the same engines: SuffixDecoding's and "
            "AgentSpec's histories have seen a later app's topics (n-gram keeps none); "
            "bench one app at a time for the bars"
        )
    targets = [out_file(out, s) for s in (".txt", ".png", ".steps.jsonl")]
    targets += [_log_path(out, label) for label in labels]
    if json_path is not None:
        _check_json_apart(Path(json_path), targets, out)
    check_writable(targets + ([] if json_path is None else [Path(json_path)]))
    load_before = list(os.getloadavg())
    engines: dict[str, _Engine] = {}
    results: dict[tuple[str, str, int, int], RunResult] = {}
    loads: dict[tuple[str, str, int, int], float] = {}
    try:
        logs = out_file(out, ".<method>.log")
        echo(f"starting {len(labels)} engines ({', '.join(labels)}); logs in {logs}")
        for label in labels:
            spec = worker_spec(config, label)
            engines[label] = _Engine(spec, engine_env(label), _log_path(out, label))
        starts = {label: e.wait_ready(config.run_timeout_s) for label, e in engines.items()}
        echo("engines ready: " + ", ".join(f"{k} {v:.0f} s" for k, v in starts.items()))
        total = len(config.apps) * len(config.ns) * config.repeats * len(labels)
        bar = tqdm(total=total, desc="bench", unit="run", disable=not progress, file=sys.stderr)
        with bar:  # closed on a failure too: the error is printed on a line of its own
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
                            results[(label, app, n, r)] = engines[label].run(
                                app, topics, n, repeat=r, timeout_s=config.run_timeout_s
                            )
                            bar.update(1)
    finally:
        for engine in engines.values():  # all shut down at once
            engine.request_stop()
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
    written, failed = _write_outputs(report, results, out, json_path, echo)
    differ = f"{len(mismatches)} run(s) differ from no speculation: {mismatches[:3]}"
    if written:
        echo("wrote " + ", ".join(written))
    if failed:
        problem = "writing the report failed: " + "; ".join(failed)
        if mismatches:  # the verdict that matters first, the failure with it
            raise BenchMismatchError(f"{differ}; {problem}")
        raise BenchError(problem)
    if mismatches:
        raise BenchMismatchError(differ)
    return report
