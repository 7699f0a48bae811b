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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentspec_mw.errors import AgentSpecError
from agentspec_mw_langgraph.bench_apps import bench_topics
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
    "engine_env",
    "engine_slowness",
    "format_report",
    "paired_ratio",
    "plot_report",
    "quick_config",
    "read_report",
    "repeat_ratios",
    "run_bench",
    "speed_adjusted_ratio",
    "summarize",
    "verdict_lines",
    "write_fit_steps",
]


class BenchError(AgentSpecError, RuntimeError):
    """An engine process failed to start or to run a workflow."""


class BenchMismatchError(BenchError):
    """A method's outputs differ from no speculation's (speculation must be lossless)."""


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
    if label.endswith(NO_PRELOAD):
        env[PRELOAD_ENV] = "0"
        return env
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


def _log_path(out: Path, label: str) -> Path:
    """Where method ``label``'s engine process logs."""
    return out.parent / f"{out.name}.{label.replace('/', '_')}.log"


def _check_writable(paths: list[Path]) -> None:
    """Create each path's folder and check the path can be written (opened for append; a
    file this creates is removed again), so a bad ``--out`` / ``--json`` fails before any
    engine starts rather than after the whole sweep.

    Raises:
        ValueError: a path (named) that cannot be written.
    """
    for path in paths:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            hint = (
                f": is a part of {str(path.parent)!r} a file?"
                if isinstance(exc, FileExistsError | NotADirectoryError)
                else ""
            )
            raise ValueError(
                f"cannot write {str(path)!r}: its folder cannot be made "
                f"({exc.strerror or exc}{hint})"
            ) from None
        try:
            existed = path.exists()
            with path.open("a"):
                pass
            if not existed:
                path.unlink()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ValueError(f"cannot write {str(path)!r}: {reason}") from None


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
        txt = out.with_suffix(".txt")
        txt.write_text(text + "\n\n" + report.sample_output + "\n")
        return txt

    if json_path is not None:
        attempt("the JSON report", write_json)
    attempt("the table", write_table)
    attempt("the plot", lambda: plot_report(report, out.with_suffix(".png")))
    attempt("the timed steps", lambda: write_fit_steps(results, out.with_suffix(".steps.jsonl")))
    return written, failed


def run_bench(
    config: BenchConfig,
    *,
    out: str | Path = "out/bench",
    json_path: str | Path | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> BenchReport:
    """Run the sweep, print the table, write (with ``json_path``) the report as JSON,
    ``<out>.txt``, ``<out>.png`` and ``<out>.steps.jsonl`` (:func:`write_fit_steps`);
    return the report. Every path is checked writable before any engine starts.

    Raises:
        ValueError: a path that cannot be written, or a repeated method, app or N (before
            any engine starts).
        BenchError: an engine process failed, or writing the report failed at the end.
        BenchMismatchError: some output differed from no speculation's (after writing
            the report; also where writing it failed, which its message then says).
    """
    from tqdm import tqdm

    out = Path(out)
    labels = config.labels()
    _check_distinct(config)
    targets = [out.with_suffix(s) for s in (".txt", ".png", ".steps.jsonl")]
    targets += [_log_path(out, label) for label in labels]
    _check_writable(targets + ([] if json_path is None else [Path(json_path)]))
    load_before = list(os.getloadavg())
    engines: dict[str, _Engine] = {}
    results: dict[tuple[str, str, int, int], RunResult] = {}
    loads: dict[tuple[str, str, int, int], float] = {}
    try:
        echo(f"starting {len(labels)} engines ({', '.join(labels)}); logs in {out}.<method>.log")
        for label in labels:
            method = label.removesuffix(NO_PRELOAD)
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
            engines[label] = _Engine(spec, engine_env(label), _log_path(out, label))
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
