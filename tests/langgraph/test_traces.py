"""Trace recording: JSONL in the TraceRecord schema, readable by ``agentspec replay``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from agentspec_mw.traces.loader import iter_records
from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec

from .fake_chat import ScriptedChatModel
from .test_react import build, react_script


def test_records_every_call(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    config = TaggingConfig(adapter_raise_errors=True, trace_path=path, trace_workload="demo")
    model = ScriptedChatModel(script=react_script, model="Qwen/Qwen2.5-7B-Instruct")
    app = with_agentspec(build(model), config=config)
    app.invoke({"messages": [HumanMessage("q1")]})
    app.invoke({"messages": [HumanMessage("q2")]})
    handler = get_handler(app)
    assert handler is not None
    handler.close()
    assert handler.stats.traces_recorded == 6

    records = list(iter_records(path))
    assert len(records) == 6
    runs = sorted({r.run_id for r in records})
    assert len(runs) == 2 and all(r.startswith("run:") for r in runs)
    first = [r for r in records if r.run_id == records[0].run_id]
    assert [r.call_index for r in first] == [0, 1, 2]
    assert {(r.workload, r.source, r.agent) for r in records} == {
        ("demo", "agentspec-mw-langgraph", "agent")
    }
    assert [r.segment_hint for r in first] == ["tool_call", "answer", "tool_call"]
    assert [r.meta["actual_segment"] for r in first] == ["tool_call", "tool_call", "answer"]
    assert [r.meta["step"] for r in first] == [1, 3, 5]
    # the loop's turns: one agent, one query, no group of their own (as on the tags)
    assert [r.parent_group for r in first] == [None, None, None]
    # outputs use the traces' tool-call serialization; prompts are OpenAI message lists
    assert first[0].output == '{"name": "lookup", "arguments": {"city": "c0"}}'
    assert first[2].output.startswith("done: q")
    prompt = first[2].prompt
    assert isinstance(prompt, list)
    assert [m.role for m in prompt] == ["user", "assistant", "tool", "assistant", "tool"]
    assert prompt[1].model_dump()["tool_calls"][0]["function"]["name"] == "lookup"
    assert json.loads(path.read_text().splitlines()[0])["meta"]["model"] == (
        "Qwen/Qwen2.5-7B-Instruct"
    )


@pytest.mark.slow
def test_replay_reads_recorded_traces(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    from agentspec_mw.cli import main

    path = tmp_path / "calls.jsonl"
    config = TaggingConfig(adapter_raise_errors=True, trace_path=path)
    app = with_agentspec(build(ScriptedChatModel(script=react_script)), config=config)
    for i in range(3):
        app.invoke({"messages": [HumanMessage(f"question {i}")]})
    handler = get_handler(app)
    assert handler is not None
    handler.close()
    out = tmp_path / "replay.json"
    argv = ["replay", "--traces", str(path), "--tokenizer", str(tiny_tokenizer_dir)]
    argv += ["--proposers", "none", "--batch", "1", "--k", "4", "--json", str(out)]
    argv += ["--no-progress", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["results"], report
