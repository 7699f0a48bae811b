"""``agentspec bench``: the workflow shapes on a scripted model, apps named by import path,
the summary (medians, ratios, percentiles, mismatches), the report, the preload, and tiny
real runs."""

from __future__ import annotations

import json
import lzma
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from agentspec_mw_langgraph import TaggingConfig, with_agentspec
from agentspec_mw_langgraph.bench import (
    BenchConfig,
    BenchReport,
    BenchRow,
    engine_slowness,
    format_report,
    paired_ratio,
    plot_report,
    quick_config,
    read_report,
    speed_adjusted_ratio,
    summarize,
    verdict_lines,
    worker_spec,
    write_fit_steps,
)
from agentspec_mw_langgraph.bench_apps import (
    APPS,
    REFLECT_ROUNDS,
    BenchApp,
    BenchAppError,
    bench_topics,
    final_view,
    resolve_app,
    topic_count,
)
from agentspec_mw_langgraph.bench_worker import RunResult, chat_model, run_workflows
from agentspec_mw_vllm import preload
from agentspec_mw_vllm.engine import engine_counters

from .helpers import script
from .langgraph.fake_chat import ScriptedChatModel


def _script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    last = messages[-1]
    if tools and not isinstance(last, ToolMessage):
        return AIMessage(
            "",
            tool_calls=[{"name": "lookup_note", "args": {"topic": "tea"}, "id": "rand-1"}],
        )
    return AIMessage(f"reply to: {str(last.content)[:24]}")


def test_topics_are_distinct_and_the_same_for_every_caller() -> None:
    count = topic_count()
    topics = bench_topics(0, count)
    assert len(set(topics)) == count >= 351  # the default sweep's 3 x (1 + 4 + 16 + 32 + 64)
    assert topics[:2] == ["tea", "coffee"]
    # the first 150 are those every earlier run measured
    assert topics[50] == "modern tea" and topics[149] == "traditional satellites"
    assert bench_topics(3, 2) == topics[3:5]
    assert bench_topics(count, 1) == topics[:1]  # the sequence repeats after them


def test_a_sweep_that_would_repeat_a_topic_is_refused() -> None:
    config = BenchConfig(ns=(1, 4, 16, 32, 64), repeats=3)  # the default fits
    assert [config.workflows(n) for n in config.ns] == [8, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="distinct topics"):
        BenchConfig(ns=(64, 128), repeats=3)
    # small N runs min_workflows topics: those count too
    BenchConfig(ns=(1,), repeats=3, min_workflows=topic_count() // 3)
    with pytest.raises(ValueError, match="fewer min_workflows"):
        BenchConfig(ns=(1,), repeats=3, min_workflows=topic_count() // 3 + 1)


@pytest.mark.parametrize("width", [1, 2, 5])
def test_a_run_keeps_n_workflows_in_flight_until_all_have_run(width: int) -> None:
    topics = [f"t{i}" for i in range(5)]
    cond, state = threading.Condition(), {"now": 0, "most": 0, "done": 0}

    def one(topic: str) -> str:
        with cond:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            cond.notify_all()
            # hold until as many run as can (width, or all not yet finished): no timing luck
            cond.wait_for(
                lambda: state["now"] >= min(width, len(topics) - state["done"]), timeout=5
            )
            state["now"] -= 1
            state["done"] += 1
            cond.notify_all()
        return topic.upper()

    assert run_workflows(one, topics, width) == [t.upper() for t in topics]
    assert state["most"] == width


@pytest.mark.parametrize("app", sorted(APPS))
def test_every_shape_runs_tagged_with_real_tools(app: str) -> None:
    model = ScriptedChatModel(script=_script)
    shape = APPS[app]
    graph = with_agentspec(shape.build(model), config=TaggingConfig(adapter_raise_errors=True))
    view = final_view(shape.run(graph, "tea"))
    json.dumps(view)  # JSON-able, so two engines' runs compare
    assert "rand-1" not in json.dumps(view)  # tool-call ids are random: not compared
    assert all(tags is not None for tags, _ in model.seen)
    if app == "tool_loop":
        tool_results = [m["content"] for m in view["messages"] if m["type"] == "tool"]
        assert tool_results[-1].startswith("Tea is brewed")  # after the worked example
    if app == "reflect":  # the scripted reviewer never says OK: the loop stops at the cap
        assert view["rounds"] == REFLECT_ROUNDS
        assert len(view["reviews"]) == REFLECT_ROUNDS + 1


#: A user's app outside the package: a two-node graph over any chat model.
_EXT_APP = textwrap.dedent(
    """
    from typing import Any, TypedDict

    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph

    from agentspec_mw_langgraph.bench_apps import BenchApp


    class State(TypedDict):
        topic: str
        draft: str
        answer: str


    def build(model: Any) -> Any:
        def drafter(state: State) -> dict[str, Any]:
            return {"draft": str(model.invoke([HumanMessage(state["topic"])]).content)}

        def editor(state: State) -> dict[str, Any]:
            return {"answer": str(model.invoke([HumanMessage(state["draft"])]).content)}

        g = StateGraph(State)
        g.add_node("drafter", drafter)
        g.add_node("editor", editor)
        g.add_edge(START, "drafter")
        g.add_edge("drafter", "editor")
        g.add_edge("editor", END)
        return g.compile()


    def make_input(topic: str) -> dict[str, Any]:
        return {"topic": f"Write about {topic}.", "draft": "", "answer": ""}


    APP = BenchApp("mine", build, make_input, {"recursion_limit": 5})
    NOT_AN_APP = 3
    """
)
_MESSAGES_APP = textwrap.dedent(
    """
    from langgraph.graph import START, MessagesState, StateGraph


    def build(model):
        g = StateGraph(MessagesState)
        g.add_node("assistant", lambda s: {"messages": [model.invoke(s["messages"])]})
        g.add_edge(START, "assistant")
        return g.compile()


    GRAPH = build(None)  # a compiled graph: the bench needs build(model) instead
    """
)


@pytest.fixture
def ext_apps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on ``sys.path`` with two app modules (``ext_bench_app``, ``ext_msgs_app``)."""
    (tmp_path / "ext_bench_app.py").write_text(_EXT_APP)
    (tmp_path / "ext_msgs_app.py").write_text(_MESSAGES_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("ext_bench_app", "ext_msgs_app"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def _echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(f"re: {str(messages[-1].content)[:30]}")


def test_an_app_by_import_path_runs_tagged_with_its_make_input(ext_apps: Path) -> None:
    app = resolve_app("ext_bench_app:build")
    assert app.name == "ext_bench_app:build" and app.config == {}
    model = ScriptedChatModel(script=_echo)
    graph = with_agentspec(app.build(model), config=TaggingConfig(adapter_raise_errors=True))
    view = final_view(app.run(graph, "tea"))
    assert view == {
        "topic": "Write about tea.",
        "draft": "re: Write about tea.",
        "answer": "re: re: Write about tea.",
    }
    assert [tags.agent_id for tags, _ in model.seen] == ["drafter", "editor"]
    # a BenchApp attribute keeps its input and config, under the name given on the CLI
    exported = resolve_app("ext_bench_app:APP")
    assert exported.name == "ext_bench_app:APP" and exported.config == {"recursion_limit": 5}
    # the same module by file path (langgraph.json's form)
    by_file = resolve_app(f"{ext_apps / 'ext_bench_app.py'}:build")
    assert by_file.make_input("tea") == app.make_input("tea")
    assert BenchConfig(apps=("demo", "ext_bench_app:build")).apps[1] == "ext_bench_app:build"


def test_a_build_without_make_input_gets_messages(ext_apps: Path) -> None:
    app = resolve_app("ext_msgs_app:build")
    model = ScriptedChatModel(script=_echo)
    view = final_view(app.run(app.build(model), "tea"))
    assert [m["content"] for m in view["messages"]] == ["tea", "re: tea"]
    assert resolve_app("demo") is APPS["demo"] and isinstance(APPS["demo"], BenchApp)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("nope", r"app 'nope' unknown; choose from \['demo', 'tool_loop', 'reflect'\]"),
        ("no_such_mod_xyz:build", r"cannot import module 'no_such_mod_xyz'.*PYTHONPATH"),
        ("ext_bench_app:buidl", r"module 'ext_bench_app' \(.*ext_bench_app.py\) has no attr"),
        ("ext_bench_app:NOT_AN_APP", r"'NOT_AN_APP' in module 'ext_bench_app' is a int"),
        ("ext_msgs_app:GRAPH", r"is a compiled graph; expected a BenchApp or a function"),
        ("missing/app.py:build", r"no file '.*missing/app.py'"),
        (":build", r"unknown; choose from"),
    ],
)
def test_a_bad_app_path_says_what_is_wrong(ext_apps: Path, name: str, match: str) -> None:
    with pytest.raises(BenchAppError, match=match):
        resolve_app(name)
    with pytest.raises(ValueError, match=match):
        BenchConfig(apps=("demo", name))  # before any engine starts


def test_the_cli_fails_at_once_on_a_bad_app(capsys: pytest.CaptureFixture[str]) -> None:
    from agentspec_mw.cli import main

    assert main(["bench", "--apps", "no_such_mod_xyz:build", "--no-progress"]) == 2
    assert "cannot import module 'no_such_mod_xyz'" in capsys.readouterr().err


def test_the_recorder_takes_the_bench_app_names_before_its_engine(
    ext_apps: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import agentspec_mw_vllm.engine as engine

    record = script("record_bench_app")

    class Started(Exception):
        pass

    def build_llm(*args: Any, **kwargs: Any) -> Any:
        raise Started

    monkeypatch.setattr(engine, "apply_env_defaults", lambda *, in_process: None)
    monkeypatch.setattr(engine, "build_llm", build_llm)
    out = str(ext_apps / "t.jsonl")
    assert record.main(["--out", out, "--app", "no_such_mod_xyz:build"]) == 2
    assert "cannot import module 'no_such_mod_xyz'" in capsys.readouterr().err
    for app in ("ext_bench_app:build", f"{ext_apps / 'ext_bench_app.py'}:build", "demo"):
        with pytest.raises(Started):  # resolved; the engine would start next
            record.main(["--out", out, "--app", app])
    assert record.workload_name("map_reduce:build") == "bench_map_reduce_build"
    assert record.workload_name("demo") == "bench_demo"


def _result(label: str, n: int, wall: float, **kw: Any) -> RunResult:
    base: dict[str, Any] = {
        "label": label,
        "app": "demo",
        "n": n,
        "wall_s": wall,
        "output_tokens": 100,
        "requests": 2,
        "workflow_latency_s": [wall, wall / 2],
        "tpot_s": [0.01, 0.02, 0.03],
        "ttft_s": [0.2, 0.4],
        "drafted": 0,
        "accepted": 0,
        "proposer_s": 0.0,
        "proposer_calls": 0,
        "per_agent": {"writer": [2, 100, 0, 0]},
        "views": [{"answer": "a"}],
        "token_hashes": ["h1", "h2"],
    }
    base.update(kw)
    return RunResult(**base)


def _report(config: BenchConfig, rows: list[BenchRow], mismatches: list[str]) -> BenchReport:
    return BenchReport(
        config=config,
        date="2026-12-05",
        cpus=2,
        load_before=[1.0] * 3,
        load_after=[1.0] * 3,
        engine_start_s={},
        rows=rows,
        mismatches=mismatches,
    )


def _results(config: BenchConfig) -> dict[tuple[str, str, int, int], RunResult]:
    walls = {"none": [2.0, 2.0, 4.0], "suffix": [1.0, 2.0, 1.0]}
    out = {}
    for label, ws in walls.items():
        for r, w in enumerate(ws):
            extra: dict[str, Any] = {}
            if label == "suffix":
                extra = {
                    "drafted": 40,
                    "accepted": 10,
                    "proposer_s": 0.002,
                    "proposer_calls": 4,
                    "per_agent": {"writer": [2, 100, 40, 10]},
                }
                if r == 2:
                    extra["views"] = [{"answer": "b"}]
            out[(label, "demo", 4, r)] = _result(label, 4, w, **extra)
    return out


def test_summary_medians_ratios_and_mismatches() -> None:
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3)
    results = _results(config)
    loads = dict.fromkeys(results, 1.5)
    rows, mismatches = summarize(results, loads, config)
    none, suffix = rows
    assert (none.label, suffix.label) == ("none", "suffix")
    assert none.tokens_per_s == pytest.approx(50.0)  # median of 50, 50, 25
    assert suffix.tokens_per_s == pytest.approx(100.0)  # median of 100, 50, 100
    assert suffix.ratio_to_none == pytest.approx(2.0)  # median of per-repeat 2, 1, 4
    assert suffix.acceptance == pytest.approx(0.25) and suffix.rejection == pytest.approx(0.75)
    assert suffix.proposer_ms_per_step == pytest.approx(0.5)
    assert suffix.tpot_p50_ms == pytest.approx(20.0)
    assert suffix.ttft_p50_ms == pytest.approx(300.0)  # pooled over the repeats' requests
    assert suffix.per_agent_acceptance == {"writer": 0.25}
    assert not suffix.identical_to_none and none.identical_to_none
    assert mismatches == [
        "suffix demo N=4 repeat 2: outputs differ: workflow 0 of 1: final state differs at "
        "answer, character 0"
    ]
    report = _report(config, rows, mismatches)
    text = format_report(report)
    assert "outputs identical to none in every run: NO" in text
    assert "TTFT50" in text and "    300 " in text
    assert verdict_lines(rows) == [  # suffix / none per repeat: 2, 1, 4 -- one repeat even
        "demo N=4: no method clearly fastest: suffix 100 tok/s, none 50 tok/s (even: no method "
        "ahead of the others by over 5% in every repeat)"
    ]


def test_sampled_runs_are_not_compared_token_for_token() -> None:
    """At temperature > 0 each method's outputs are other samples of the same distribution:
    a differing output is no mismatch, the table's ``same`` column says ``-`` and the
    report says why, instead of "identical"."""
    config = BenchConfig(
        ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3, temperature=0.8
    )
    results = _results(config)  # suffix's repeat 2 differs from none's
    rows, mismatches = summarize(results, dict.fromkeys(results, 1.0), config)
    assert mismatches == []
    assert [row.identical_to_none for row in rows] == [None, None]
    text = format_report(_report(config, rows, mismatches))
    assert "outputs identical" not in text
    assert "sampled at temperature 0.8" in text
    suffix = next(line.split() for line in text.splitlines() if " suffix " in line)
    assert suffix[-2] == "-"
    with pytest.raises(pydantic.ValidationError):
        BenchConfig(temperature=-0.1)
    # every engine process's graphs are built on a chat model sampling at that temperature
    spec = worker_spec(config, "suffix")
    assert (spec.speculative, spec.temperature) == ("suffix", 0.8)
    chat = chat_model(spec, backend=object())
    assert (chat.temperature, chat.max_tokens) == (0.8, config.max_tokens)


def test_preemptions_are_summed_over_the_repeats_and_printed() -> None:
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3)
    results = _results(config)
    for r, preempted in enumerate((1, 0, 2)):
        key = ("suffix", "demo", 4, r)
        results[key] = results[key].model_copy(update={"preemptions": preempted})
    rows, _ = summarize(results, dict.fromkeys(results, 1.0), config)
    assert [row.preemptions for row in rows] == [0, 3]
    lines = format_report(_report(config, rows, [])).splitlines()
    assert lines[1].split()[-3:] == ["preempt", "same", "load"]
    suffix = next(line.split() for line in lines if line.startswith("demo") and " suffix " in line)
    assert suffix[-3] == "3"


def test_the_effective_batch_is_requests_decoding_at_once_over_the_wall() -> None:
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3)
    results = _results(config)
    for r, decoding in enumerate((6.0, 9.0, 3.0)):  # suffix walls 1, 2, 1 s: 6, 4.5, 3
        key = ("suffix", "demo", 4, r)
        results[key] = results[key].model_copy(update={"decoding_s": decoding})
    rows, _ = summarize(results, dict.fromkeys(results, 1.0), config)
    none, suffix = rows
    assert none.batch is None  # not measured (an older report's runs)
    assert suffix.batch == pytest.approx(4.5)  # the median of 6, 4.5, 3
    lines = format_report(_report(config, rows, [])).splitlines()
    head = lines[1].split()
    row = next(line.split() for line in lines if line.startswith("demo") and " suffix " in line)
    assert row[head.index("batch") - 1] == "4.5"  # "x none" is one column, two words


def test_the_worker_reads_vllms_counters_summed_over_engines() -> None:
    class Metric:
        def __init__(self, name: str, value: float) -> None:
            self.name, self.value = name, value

    class Engine:
        def get_metrics(self) -> list[Metric]:
            return [
                Metric("vllm:spec_decode_num_draft_tokens", 10),
                Metric("vllm:spec_decode_num_accepted_tokens", 4),
                Metric("vllm:num_preemptions", 2),
                Metric("vllm:num_preemptions", 1),  # a second engine's
                Metric("vllm:prompt_tokens", 99),
            ]

    assert engine_counters(Engine()) == (10, 4, 3)


def test_the_fit_after_the_last_repeat_is_kept_and_printed() -> None:
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3)
    results = _results(config)
    fit = {
        "fixed": 0.05,
        "token": 5e-4,
        "kv_token": 2e-6,
        "spec_kv_token": 4e-6,
        "draft_kv_token": 8e-7,
        "emitted_token": 3e-4,
        "steps": 300.0,
    }
    for r in range(3):
        old = results[("suffix", "demo", 4, r)]
        model = fit if r == 2 else {"fixed": 1.0, "token": 1.0, "kv_token": 1.0}
        results[("suffix", "demo", 4, r)] = old.model_copy(
            update={"fit_errors": [0.1, -0.1], "step_model": model}
        )
    rows, mismatches = summarize(results, dict.fromkeys(results, 1.0), config)
    none, suffix = rows
    assert suffix.step_model == fit and none.step_model == {}
    text = format_report(_report(config, rows, mismatches))
    assert (
        "the fit after the last repeat: suffix demo N=4: 50.0 ms + 0.500 ms/token + "
        "2.00 us/KV token + 4.00 us/KV token of a drafting request + 0.800 us/(draft x KV "
        "token) + 0.300 ms/emitted token (300 steps)" in text
    )


def test_live_calibration_is_pooled_over_the_repeats_and_printed() -> None:
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3)
    results = _results(config)
    bins = [[0.0, 0.0, 0.0] for _ in range(10)]
    bins[9], bins[2] = [8.0, 7.6, 7.0], [2.0, 0.5, 0.0]
    for r in range(2):  # the third repeat's drafts carried no estimate
        old = results[("suffix", "demo", 4, r)]
        update = {"estimated": 10, "expected": 8.1, "estimated_accepted": 7, "reliability": bins}
        results[("suffix", "demo", 4, r)] = old.model_copy(update=update)
    rows, mismatches = summarize(results, dict.fromkeys(results, 1.0), config)
    none, suffix = rows
    assert none.expected_acceptance is None and none.reliability == []
    assert suffix.expected_acceptance == pytest.approx(0.81)
    assert suffix.estimated_acceptance == pytest.approx(0.7)
    assert suffix.reliability[9] == [16.0, 15.2, 14.0] and suffix.reliability[2][0] == 4.0
    text = format_report(_report(config, rows, mismatches))
    assert "suffix demo: expected 81.0% accepted, got 70.0%" in text
    assert "(by predicted survival: 0.2-0.3 0% of 4, 0.9-1.0 88% of 16)" in text


def test_the_fit_reports_predicted_over_measured_time() -> None:
    """Three 50 ms steps and one 250 ms step, each predicted at the mean (100 ms): the
    mean relative error is +60 %, yet the predicted time sums to the measured time."""
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=1)
    results = _results(config)
    secs = [0.05, 0.05, 0.05, 0.25]
    old = results[("suffix", "demo", 4, 0)]
    results[("suffix", "demo", 4, 0)] = old.model_copy(
        update={"fit_errors": [(0.1 - t) / t for t in secs], "fit_seconds": secs}
    )
    _, suffix = summarize(results, dict.fromkeys(results, 1.0), config)[0]
    assert suffix.fit_error_mean == pytest.approx(0.6)
    assert suffix.fit_time_ratio == pytest.approx(1.0)
    report = _report(config, [suffix], [])
    assert "mean +60.0%, predicted / measured time 1.000 (4 steps)" in format_report(report)


def test_verdict_names_the_better_peer_and_the_tags() -> None:
    config = BenchConfig(
        ns=(4,), methods=("none", "ngram", "suffix", "agentspec", "agentspec-untagged"), repeats=1
    )
    walls = {"none": 4.0, "ngram": 3.0, "suffix": 2.0, "agentspec": 2.5, "agentspec-untagged": 3.5}
    results = {
        (k, "demo", 4, 0): _result(k, 4, w, drafted=10, accepted=5) for k, w in walls.items()
    }
    rows, mismatches = summarize(
        results, dict.fromkeys(results, 1.0), config.model_copy(update={"apps": ("demo",)})
    )
    assert not mismatches
    (line,) = verdict_lines(rows)
    assert line.startswith("demo N=4: fastest is suffix (50 tok/s, 2.00x none, 25% over agentspec)")
    assert "agentspec 1.60x none is 0.80x suffix (behind; the better peer)" in line
    assert "1.40x untagged's tok/s" in line


def _timed_steps(slowness: float, n: int = 30, seed: int = 0) -> list[list[float]]:
    """``n`` steps ``[batched, kv, spec_kv, draft_kv, emitted, seconds]`` whose time is
    ``slowness`` x (20 ms + 0.5 ms/token + 1 us/KV token)."""
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(n):
        batched = float(rng.integers(8, 80))
        kv = float(rng.integers(1_000, 9_000))
        seconds = slowness * (0.020 + 0.0005 * batched + 1e-6 * kv)
        steps.append([batched, kv, 0.0, 0.0, batched, seconds])
    return steps


def test_engine_slowness_rates_each_engine_on_one_fit() -> None:
    """Two engines timed the same kind of steps, one 10 % slower in repeat 1: each gets
    Σ measured / Σ predicted on the common fit; an engine that timed no steps is left out."""
    got = engine_slowness(
        {
            "agentspec": [_timed_steps(1.0, seed=1), _timed_steps(1.1, seed=2)],
            "agentspec-untagged": [_timed_steps(1.0, seed=3), _timed_steps(1.0, seed=4)],
            "none": [[], []],
        }
    )
    assert set(got) == {"agentspec", "agentspec-untagged"}
    t, u = got["agentspec"], got["agentspec-untagged"]
    assert t[1] / u[1] == pytest.approx(1.1, rel=5e-3)  # the common fit is not exact
    assert t[0] / u[0] == pytest.approx(1.0, rel=5e-3)
    # one engine alone has nothing to be compared with; too few steps are not rated
    assert engine_slowness({"agentspec": [_timed_steps(1.0)]}) == {}
    assert engine_slowness({"a": [_timed_steps(1.0, n=5)], "b": [_timed_steps(1.0)]}) == {}
    # a step of no or infinite time is dropped, not a crash at the end of a long bench
    bad = [*_timed_steps(1.0, seed=5), [10.0, 100.0, 0.0, 0.0, 10.0, 0.0]]
    bad.append([10.0, 100.0, 0.0, 0.0, 10.0, float("inf")])
    got = engine_slowness({"a": [bad], "b": [_timed_steps(1.0, seed=6)]})
    assert got["a"][0] == pytest.approx(1.0, rel=5e-3) and got["b"][0] == pytest.approx(
        1.0, rel=5e-3
    )


def test_speed_adjusted_ratio_divides_each_engines_slowness_out() -> None:
    config = BenchConfig(
        ns=(4,), methods=("none", "agentspec", "agentspec-untagged"), apps=("demo",), repeats=2
    )
    walls = {"none": (4.0, 4.0), "agentspec": (2.2, 2.0), "agentspec-untagged": (2.0, 2.0)}
    slow = {"agentspec": (1.1, 1.0), "agentspec-untagged": (1.0, 1.0)}
    results = {
        (k, "demo", 4, r): _result(
            k,
            4,
            w,
            drafted=10,
            accepted=5,
            fit_steps=_timed_steps(slow[k][r], seed=r) if k in slow else [],
        )
        for k, ws in walls.items()
        for r, w in enumerate(ws)
    }
    rows, _ = summarize(results, dict.fromkeys(results, 1.0), config)
    by = {r.label: r for r in rows}
    t, u = by["agentspec"], by["agentspec-untagged"]
    assert by["none"].step_slowness_repeats == []
    assert t.step_slowness_repeats[0] / u.step_slowness_repeats[0] == pytest.approx(1.1, rel=5e-3)
    # measured: tagged 0.909x then 1.0x untagged; its process ran 10 % slow in repeat 0
    assert paired_ratio(t, u) == pytest.approx((1 / 1.1 + 1.0) / 2)
    assert speed_adjusted_ratio(t, u) == pytest.approx(1.0, rel=5e-3)
    assert speed_adjusted_ratio(t, by["none"]) is None
    (line,) = verdict_lines(rows)
    assert "x with each engine's step speed divided out)" in line


def test_verdict_pairs_the_repeats() -> None:
    """AgentSpec is faster than SuffixDecoding in two of three repeats, yet its median
    ratio to none is lower (the medians come from different repeats): the verdict
    compares the two within each repeat."""
    config = BenchConfig(
        ns=(4,), methods=("none", "suffix", "agentspec"), apps=("demo",), repeats=3
    )
    walls = {"none": [2.0, 2.0, 2.0], "suffix": [1.0, 2.0, 1.2], "agentspec": [0.9, 1.6, 1.3]}
    results = {
        (k, "demo", 4, r): _result(k, 4, w[r], drafted=10, accepted=5)
        for k, w in walls.items()
        for r in range(3)
    }
    rows, _ = summarize(results, dict.fromkeys(results, 1.0), config)
    by = {r.label: r for r in rows}
    ours, suffix = by["agentspec"], by["suffix"]
    assert ours.ratio_to_none < suffix.ratio_to_none
    assert ours.tokens_per_s_repeats == pytest.approx([100 / 0.9, 100 / 1.6, 100 / 1.3])
    assert paired_ratio(ours, suffix) == pytest.approx(1.0 / 0.9)
    (line,) = verdict_lines(rows)
    assert f"is {1.0 / 0.9:.2f}x suffix (even: per repeat 0.92-1.25x; the better peer)" in line
    old = ours.model_copy(update={"tokens_per_s_repeats": []})
    assert paired_ratio(old, suffix) == pytest.approx(ours.ratio_to_none / suffix.ratio_to_none)


@pytest.mark.parametrize(
    ("suffix_walls", "ours_walls", "word"),
    [
        ([1.0], [0.97], "even: within one repeat's noise, 5%"),
        ([1.0], [0.9], "ahead"),
        ([1.0], [1.1], "behind"),
        ([1.0, 1.0, 1.0], [0.9, 0.92, 0.94], "ahead by over 5% in every repeat"),
        ([1.0, 1.0], [1.1, 1.2], "behind by over 5% in every repeat"),
        ([1.0, 1.0, 1.0], [0.9, 0.95, 0.98], "even: per repeat 1.02-1.11x"),  # one within 5 %
        ([1.0, 1.0], [1.01, 1.2], "even: per repeat 0.83-0.99x"),
    ],
)
def test_verdict_calls_a_gap_inside_the_noise_even(
    suffix_walls: list[float], ours_walls: list[float], word: str
) -> None:
    """Ahead or behind only where every repeat's gap is over ONE_REPEAT_NOISE, else even
    (one repeat or several)."""
    repeats = len(suffix_walls)
    config = BenchConfig(
        ns=(4,), methods=("none", "suffix", "agentspec"), apps=("demo",), repeats=repeats
    )
    walls = {"none": [2.0] * repeats, "suffix": suffix_walls, "agentspec": ours_walls}
    results = {
        (k, "demo", 4, r): _result(k, 4, w[r], drafted=10, accepted=5)
        for k, w in walls.items()
        for r in range(repeats)
    }
    rows, _ = summarize(results, dict.fromkeys(results, 1.0), config)
    (line,) = verdict_lines(rows)
    assert f"suffix ({word}; the better peer)" in line


def test_plot_is_written(tmp_path: Path) -> None:
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3)
    results = _results(config)
    rows, mismatches = summarize(results, dict.fromkeys(results, 1.0), config)
    report = _report(config, rows, mismatches)
    assert plot_report(report, tmp_path / "b.png").stat().st_size > 1000


def test_config_validation_and_quick() -> None:
    with pytest.raises(ValueError, match="unknown; choose from"):
        BenchConfig(methods=("none", "eagle"))
    with pytest.raises(ValueError, match="must be a non-empty list of N >= 1"):
        BenchConfig(ns=(0,))
    assert BenchConfig(methods=("suffix",)).methods == ("none", "suffix")  # baseline added
    quick = quick_config()
    assert quick.ns == (2,) and quick.repeats == 1 and quick.workflows(2) == 2
    assert BenchConfig(methods=("none", "suffix"), preload="both").labels() == [
        "none",
        "suffix",
        "none/no-preload",
        "suffix/no-preload",
    ]


def fake_cpu_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An x86 vLLM CPU host whose prefix ``tmp_path`` holds Intel OpenMP (``lib/``)."""
    from agentspec_mw_vllm import engine

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    monkeypatch.setattr(engine, "is_cpu_build", lambda: True)
    monkeypatch.setattr(preload.platform, "machine", lambda: "x86_64")
    return tmp_path


def test_preload_finds_the_libraries_and_can_be_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_cpu_prefix(tmp_path, monkeypatch)
    libs = preload.find_preload_libs(str(tmp_path))
    assert libs[-1] == str(tmp_path / "lib" / "libiomp5.so")
    value = preload.preload_env({"LD_PRELOAD": "/x/libfoo.so"}, prefix=str(tmp_path))
    assert value.split(":")[0] == "/x/libfoo.so" and value.endswith("libiomp5.so")
    again = preload.preload_env({"LD_PRELOAD": value}, prefix=str(tmp_path))
    assert again == value  # nothing twice
    assert preload.preload_env({"AGENTSPEC_PRELOAD": "0"}, prefix=str(tmp_path)) == ""
    from agentspec_mw_vllm import engine

    monkeypatch.setattr(engine, "is_cpu_build", lambda: False)
    assert preload.preload_env({}, prefix=str(tmp_path)) == ""  # CUDA hosts: untouched


def test_no_preload_engines_drop_an_exported_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell that exported the preload (``export LD_PRELOAD=$(python -m
    agentspec_mw_vllm.preload)``) does not reach ``--preload off``'s engines; other
    preloaded libraries stay."""
    from agentspec_mw_langgraph.bench import NO_PRELOAD, engine_env

    exported = "/usr/lib/x/libtcmalloc_minimal.so.4:/opt/libfoo.so /venv/lib/libiomp5.so"
    monkeypatch.setenv("LD_PRELOAD", exported)
    env = engine_env("none" + NO_PRELOAD)
    assert env["LD_PRELOAD"] == "/opt/libfoo.so" and env["AGENTSPEC_PRELOAD"] == "0"
    monkeypatch.setenv("LD_PRELOAD", "/venv/lib/libiomp5.so")
    assert "LD_PRELOAD" not in engine_env("agentspec" + NO_PRELOAD)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bench_quick_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real command, CI-sized: two engine processes, two workflows each of the demo app
    and of a user's app the engine processes import from the path given on the command
    line (one run of both: an engine process's start is most of a quick run's time)."""
    pytest.importorskip("vllm")
    from agentspec_mw.cli import main

    (tmp_path / "mine.py").write_text(_EXT_APP)
    mine = f"{tmp_path / 'mine.py'}:build"
    out, js = tmp_path / "bench", tmp_path / "bench.json"
    argv = ["bench", "--quick", "--apps", f"demo,{mine}", "--no-progress", "--out", str(out)]
    rc = main([*argv, "--json", str(js)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "outputs identical to none in every run: yes" in text
    report = BenchReport.model_validate_json(js.read_text())
    assert {(r.app, r.label) for r in report.rows} == {
        (app, label) for app in ("demo", mine) for label in ("none", "agentspec")
    }
    by_label = {r.label: r for r in report.rows if r.app == "demo"}
    assert by_label["none"].drafted == 0 and by_label["agentspec"].drafted > 0
    assert by_label["agentspec"].proposer_ms_per_step is not None
    assert by_label["none"].proposer_ms_per_step is None
    # AgentSpec's drafts carry its estimates: the live calibration counts them
    agentspec = by_label["agentspec"]
    assert agentspec.expected_acceptance is not None and 0 < agentspec.expected_acceptance <= 1
    assert sum(n for n, _, _ in agentspec.reliability) <= agentspec.drafted
    assert "live calibration at N=" in text
    assert all(r.tokens_per_s > 0 and r.identical_to_none for r in report.rows)
    assert "writer's answer" in report.sample_output
    assert out.with_suffix(".png").stat().st_size > 1000


def test_the_sample_output_of_a_users_app_is_its_final_state() -> None:
    """An app the bench does not know shows its first query's final state (the end-to-end
    run shows the demo's)."""
    from agentspec_mw_langgraph.bench import _sample_output

    config = BenchConfig.model_construct(ns=(2,), apps=("mine.py:build",))  # no file to check
    view = {"topic": "tea", "answer": "steep it"}
    results = {("none", "mine.py:build", 2, 0): _result("none", 2, 1.0, views=[view])}
    assert _sample_output(results, config) == (
        "the final state (mine.py:build, N=2, first query):\n" + json.dumps(view)
    )


def test_the_timed_steps_are_written_one_line_per_run(tmp_path: Path) -> None:
    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3)
    results = _results(config)
    stale = tmp_path / "none.steps.jsonl"  # an earlier bench's, at the same --out
    stale.write_text('{"label": "agentspec", "steps": [[1, 2, 3, 4, 5, 0.01]]}\n')
    assert write_fit_steps(results, stale) is None  # nothing timed: nothing written
    assert not stale.exists()  # and the old steps do not pass for this run's
    step = [40.0, 9000.0, 3000.0, 9000.0, 52.0, 0.09]
    key = ("suffix", "demo", 4, 1)
    results[key] = results[key].model_copy(update={"fit_steps": [step, step]})
    path = write_fit_steps(results, tmp_path / "b.steps.jsonl")
    assert path is not None
    (line,) = path.read_text().splitlines()
    assert json.loads(line) == {
        "label": "suffix",
        "app": "demo",
        "n": 4,
        "repeat": 1,
        "steps": [step, step],
    }


def test_the_command_line_reaches_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """``agentspec bench`` flags land in :class:`BenchConfig` (nothing starts here)."""
    import agentspec_mw_langgraph.bench as bench_mod
    from agentspec_mw.cli import main

    seen: list[BenchConfig] = []
    monkeypatch.setattr(bench_mod, "run_bench", lambda config, **_: seen.append(config))
    argv = ["bench", "--n", "1,16", "--apps", "demo", "--min-workflows", "4", "--repeats", "2"]
    assert main([*argv, "--no-progress"]) == 0
    (config,) = seen
    assert config.ns == (1, 16) and config.repeats == 2
    assert [config.workflows(n) for n in config.ns] == [4, 16]
    assert main(["bench", "--quick", "--no-progress"]) == 0
    assert seen[-1].workflows(2) == 2  # CI's size: two workflows, as before


def test_a_report_from_before_min_workflows_ran_n_per_run() -> None:
    report = BenchReport(
        config=BenchConfig(ns=(1,), apps=("demo",)),
        date="2026-12-05 13:00 UTC",
        cpus=2,
        load_before=[],
        load_after=[],
        engine_start_s={},
        rows=[],
        mismatches=[],
    )
    data = json.loads(report.model_dump_json())
    assert BenchReport.model_validate(data).config.workflows(1) == 8  # stored, kept
    del data["config"]["min_workflows"]
    assert BenchReport.model_validate(data).config.workflows(1) == 1


def test_a_stored_report_reads_without_importing_its_apps(tmp_path: Path) -> None:
    """An outside app's report (``module:build`` this process cannot import) reads with
    :func:`read_report`; a config given directly still imports its apps and fails."""
    report = BenchReport(
        config=BenchConfig(ns=(32,), apps=("demo",)),
        date="2026-12-05 13:00 UTC",
        cpus=2,
        load_before=[0.5],
        load_after=[2.0],
        engine_start_s={"none": 30.0},
        rows=[],
        mismatches=[],
    )
    data = json.loads(report.model_dump_json())
    data["config"]["apps"] = ["no_such_module_anywhere:build"]
    path = tmp_path / "outside.json"
    path.write_text(json.dumps(data))
    read = read_report(path)
    assert read.config.apps == ("no_such_module_anywhere:build",) and read.cpus == 2
    with pytest.raises(pydantic.ValidationError, match="no_such_module_anywhere"):
        BenchReport.model_validate(data)
    path.write_text('{"rows": []}')
    with pytest.raises(ValueError, match="not an `agentspec bench --json` report"):
        read_report(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not an `agentspec bench --json` report"):
        read_report(path)
    packed = tmp_path / "outside.json.xz"
    with lzma.open(packed, "wt") as f:
        f.write(json.dumps(data))
    assert read_report(packed).config.apps == ("no_such_module_anywhere:build",)
    packed.write_bytes(b"not xz")
    with pytest.raises(ValueError, match="not a readable .xz file"):
        read_report(packed)
    with pytest.raises(FileNotFoundError):
        read_report(tmp_path / "missing.json")


def test_the_docs_report_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/vllm.md's ``read_report`` example runs as written, from the repository root,
    on the stored report it names."""
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "vllm.md").read_text()
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL) if "read_report" in b
    ]
    monkeypatch.chdir(root)
    printed: list[Any] = []
    scope: dict[str, Any] = {"print": printed.append}
    exec(compile(block, "docs/vllm.md[read_report]", "exec"), scope)  # noqa: S102
    (ratio,) = printed
    assert 0.5 < ratio < 2.0


def test_show_prints_a_stored_report_and_plots_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agentspec bench --show REPORT`` runs nothing: the table, the verdicts and the plot
    of a stored report; exit 1 where its outputs differed (as the run's was), 2 on misuse."""
    from agentspec_mw.cli import main

    config = BenchConfig(ns=(4,), methods=("none", "suffix"), apps=("demo",), repeats=3)
    results = _results(config)
    rows, mismatches = summarize(results, dict.fromkeys(results, 1.0), config)
    clean = tmp_path / "clean.json"
    clean.write_text(_report(config, rows, []).model_dump_json())
    out = tmp_path / "shown"
    assert main(["bench", "--show", str(clean), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "demo N=4: no method clearly fastest: suffix 100 tok/s, none 50 tok/s" in text
    assert "outputs identical to none in every run: yes" in text
    assert (tmp_path / "shown.png").stat().st_size > 0
    bad = tmp_path / "bad.json"
    bad.write_text(_report(config, rows, mismatches).model_dump_json())
    assert main(["bench", "--show", str(bad), "--out", str(out)]) == 1
    assert main(["bench", "--show", str(clean), "--n", "4"]) == 2  # --show runs nothing
    assert main(["bench", "--show", str(tmp_path / "missing.json")]) == 2
    assert "no such report" in capsys.readouterr().err


def test_an_engine_process_exits_with_its_code_and_flushes_its_output() -> None:
    """:func:`exit_now` skips Python's teardown, not what the process printed."""
    import subprocess

    code = (
        "import sys; from agentspec_mw_langgraph.bench_worker import exit_now; "
        "sys.stdout.write('result line'); sys.stderr.write('log line'); exit_now(3)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "result line", "log line")
