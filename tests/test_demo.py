"""``agentspec demo``: the workflow on a scripted model (tools really run, tags per agent),
the table, and a tiny end-to-end run of the command on the real engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from agentspec_mw_langgraph import TaggingConfig, with_agentspec
from agentspec_mw_langgraph.demo import AgentCounts, DemoRun, format_table, outputs_identical
from agentspec_mw_langgraph.demo_graph import ASPECTS, build_workflow, calculator, initial_state

from .langgraph.fake_chat import ScriptedChatModel
from .langgraph.fake_openai import FakeOpenAI


def _script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    if tools and not isinstance(messages[-1], ToolMessage):
        return AIMessage(
            "",
            tool_calls=[
                {"name": "calculator", "args": {"expression": "6.5 * 1000"}, "id": "c1"},
                {"name": "lookup_note", "args": {"topic": "Tea"}, "id": "c2"},
            ],
        )
    return AIMessage(f"reply to: {str(messages[-1].content)[:30]}")


def test_workflow_runs_tools_and_tags_every_agent() -> None:
    model = ScriptedChatModel(script=_script)
    app = with_agentspec(build_workflow(model), config=TaggingConfig(adapter_raise_errors=True))
    out = app.invoke(initial_state("tea"))
    assert out["facts"].splitlines()[:2] == ["6500", NOTES_TEA]
    assert [n.split(":")[0] for n in out["notes"]] == list(ASPECTS)
    assert out["answer"].startswith("reply to:")
    agents = [tags.agent_id for tags, _ in model.seen if tags is not None]
    assert len(agents) == len(model.seen)  # every call was tagged
    assert sorted(set(agents)) == ["critic", "planner", "tools_agent", "worker", "writer"]
    assert agents.count("worker") == len(ASPECTS) and agents.count("tools_agent") == 2


NOTES_TEA = "Tea is brewed from Camellia sinensis leaves; about 6.5 million tonnes a year."


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("6.5 * 1000", "6500"), ("(2 + 3) ** 2 % 7", "4"), ("1/0", "error: float division by zero")],
)
def test_calculator_is_a_real_tool(expression: str, expected: str) -> None:
    assert calculator.invoke({"expression": expression}) == expected


def test_calculator_refuses_code() -> None:
    assert calculator.invoke({"expression": "__import__('os')"}).startswith("error:")
    assert calculator.invoke({"expression": "9 ** 999"}).startswith("error:")


def _run(label: str, wall: float, tokens: int, drafted: int, accepted: int) -> DemoRun:
    counts = AgentCounts(requests=1, output_tokens=tokens, drafted=drafted, accepted=accepted)
    return DemoRun(label, wall, 1.0, counts, {"worker": counts}, [{"answer": "x"}])


def test_counts_and_table() -> None:
    c = AgentCounts(requests=2, output_tokens=100, drafted=50, accepted=40)
    assert c.steps == 60 and c.accepted_per_step == pytest.approx(40 / 60)
    assert c.rejection == pytest.approx(0.2)
    assert AgentCounts().rejection is None and AgentCounts().accepted_per_step == 0.0
    runs = [_run("none", 10.0, 100, 0, 0), _run("agentspec", 5.0, 100, 50, 40)]
    table = format_table(runs)
    lines = {line.split("  ")[0].strip(): line.split() for line in table.splitlines()[2:]}
    assert lines["tokens/s"][-2:] == ["10.0", "20.0"]
    assert lines["speedup vs first"][-2:] == ["1.00x", "2.00x"]
    assert lines["rejection rate"][-2:] == ["-", "20.0%"]
    assert lines["acceptance: worker"][-2:] == ["-", "80.0%"]
    assert outputs_identical(runs)
    runs[1].outputs = [{"answer": "y"}]
    assert not outputs_identical(runs)


class _FakeServer(FakeOpenAI):
    """FakeOpenAI plus ``/v1/models`` and a ``/metrics`` whose counters grow per request."""

    def __init__(self) -> None:
        super().__init__()
        chat = self.transport
        self.transport = httpx.MockTransport(self._route)
        self._chat = chat

    def _route(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "served"}]})
        if request.url.path == "/metrics":
            n = len(self.bodies)
            return httpx.Response(
                200,
                text="# HELP x\n"
                f'vllm:generation_tokens_total{{model_name="served"}} {10.0 * n}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="served"}} {4.0 * n}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="served"}} {3.0 * n}\n'
                f'agentspec_drafted_tokens_total{{agent="worker",block="answer"}} {2.0 * n}\n'
                f'agentspec_accepted_tokens_total{{agent="worker",block="answer"}} {1.0 * n}\n',
            )
        return self._chat.handle_request(request)


def test_server_mode_tags_requests_and_reads_metrics() -> None:
    from agentspec_mw_langgraph.demo import run_server

    server = _FakeServer()
    run = run_server(
        "http://vllm.test:8000/v1",
        topics=["tea"],
        max_tokens=8,
        progress=lambda _: None,
        transport=server.transport,
    )
    bodies = server.bodies
    agents = {b["vllm_xargs"]["agentspec_agent"] for b in bodies}
    assert agents == {"planner", "worker", "tools_agent", "critic", "writer"}
    assert {b["model"] for b in bodies} == {"served"}
    n = len(bodies)
    assert (run.total.output_tokens, run.total.drafted, run.total.accepted) == (
        10 * n,
        4 * n,
        3 * n,
    )
    assert run.per_agent["worker"].acceptance == pytest.approx(0.5)
    assert run.outputs[0]["answer"].startswith("answer:")
    # the fake calls the calculator with bad arguments: the error goes back as the result
    assert run.outputs[0]["facts"].startswith("error: ValidationError")


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_command_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real command, tiny: three engines, one query, 6 tokens per call."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")  # restored after the test
    from agentspec_mw.cli import main

    out = tmp_path / "demo"
    rc = main(["demo", "--max-tokens", "6", "--topics", "tea", "--k", "4", "--out", str(out)])
    text = capsys.readouterr().out
    assert "outputs identical across runs: yes" in text
    assert rc == 0
    header = next(
        line for line in text.splitlines() if line.split() == ["none", "suffix", "agentspec"]
    )
    assert header
    assert "acceptance: worker" in text and "rejection rate" in text
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "agentspec" in out.with_suffix(".txt").read_text()


def test_run_demo_gives_proposer_options_only_to_proposer_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cost_model`` reaches the AgentSpec run's engine, not none's or SuffixDecoding's
    (whose engines refuse it: ``check_drafter_options``); other options reach every run."""
    from agentspec_mw_langgraph import demo

    seen: dict[str, dict[str, Any]] = {}

    def fake_run_engine(label: str, spec: str | None, **kwargs: Any) -> DemoRun:
        seen[label] = kwargs
        return _run(label, 1.0, 10, 0, 0)

    monkeypatch.setattr(demo, "run_engine", fake_run_engine)
    drafters = (("none", None), ("suffix", "suffix"), ("agentspec", "agentspec"))
    demo.run_demo(drafters=drafters, out=tmp_path / "d", cost_model="measured", dtype="float32")
    assert seen["agentspec"]["cost_model"] == "measured"
    assert "cost_model" not in seen["none"] and "cost_model" not in seen["suffix"]
    assert all(kw["dtype"] == "float32" for kw in seen.values())
