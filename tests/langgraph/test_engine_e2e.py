"""End to end on the real embedded engine (default model, CPU): a small multi-agent graph
gives identical outputs with and without ``with_agentspec``, and the tags reach the
engine's proposer and its per-agent metrics."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.types import Send

from agentspec_mw_langgraph import ChatAgentSpecVLLM, TaggingConfig, get_handler, with_agentspec

from . import probe_proposer
from .graphs import fan_out_graph

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PROBE = "tests.langgraph.probe_proposer:ProbeProposer"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def probe_llm() -> Iterator[Any]:
    pytest.importorskip("vllm")
    from agentspec_mw_vllm.engine import build_llm, shutdown

    llm = build_llm(None, speculative=PROBE, k=2, max_model_len=768, seed=0, enforce_eager=True)
    yield llm
    shutdown(llm)


@pytest.fixture(scope="module")
def reference(probe_llm: Any) -> dict[str, Any]:
    """The graph's outputs on the probe engine, unwrapped (greedy: the reference)."""
    graph = build_graph(ChatAgentSpecVLLM(engine=probe_llm, max_tokens=MAX_TOKENS))
    return dict(graph.invoke({"topic": "tea", "ideas": [], "final": ""}))


class State(TypedDict):
    topic: str
    ideas: Annotated[list[str], operator.add]
    final: str


def build_graph(model: BaseChatModel) -> Any:
    def planner(state: State) -> dict[str, Any]:
        msg = model.invoke([HumanMessage(f"Give a one-line plan to write about {state['topic']}.")])
        return {"ideas": [f"plan: {msg.content}"]}

    def fan_out(state: State) -> list[Send]:
        return [
            Send("worker", {"topic": f"{state['topic']} ({angle})", "ideas": [], "final": ""})
            for angle in ("history", "science")
        ]

    def worker(state: State) -> dict[str, Any]:
        msg = model.invoke(
            [
                SystemMessage("You are a concise writer."),
                HumanMessage(f"One fact: {state['topic']}"),
            ]
        )
        return {"ideas": [f"{state['topic']}: {msg.content}"]}

    def writer(state: State) -> dict[str, Any]:
        notes = "\n".join(sorted(state["ideas"]))
        msg = model.invoke([HumanMessage(f"Summarize in one sentence:\n{notes}")])
        return {"final": str(msg.content)}

    return fan_out_graph(State, planner, fan_out, worker, writer)


def test_identical_outputs_and_tags_reach_the_engine(
    probe_llm: Any, reference: dict[str, Any]
) -> None:
    from agentspec_mw_vllm.metrics import get_metrics

    model = ChatAgentSpecVLLM(engine=probe_llm, max_tokens=MAX_TOKENS)
    graph = build_graph(model)
    inp = {"topic": "tea", "ideas": [], "final": ""}

    probe_proposer.RECEIVED.clear()
    plain = graph.invoke(inp)
    assert plain == reference
    assert probe_proposer.RECEIVED and set(probe_proposer.RECEIVED) == {None}

    probe_proposer.RECEIVED.clear()
    get_metrics().reset()
    app = with_agentspec(graph, config=TaggingConfig(adapter_raise_errors=True))
    tagged = app.invoke(inp)
    assert tagged == plain  # greedy outputs do not depend on the tags
    assert tagged["final"]

    received = probe_proposer.RECEIVED
    assert all(t is not None for t in received)
    assert sorted((t.agent_id, t.segment, t.group_id is not None) for t in received) == [  # type: ignore[union-attr]
        ("planner", "plan", False),
        ("worker", "answer", True),  # fan-out siblings: one group (group_kind stays client-side)
        ("worker", "answer", True),
        ("writer", "answer", False),
    ]
    assert len({t.group_id for t in received if t.agent_id == "worker"}) == 1  # type: ignore[union-attr]
    assert len({t.query_id for t in received}) == 1  # type: ignore[union-attr]
    handler = get_handler(app)
    assert handler is not None and handler.stats.tags_derived == 4

    snap = get_metrics().snapshot()
    agents = {key.split("/")[0] for key in snap.drafted}
    assert agents == {"planner", "worker", "writer"}, snap.drafted
    assert all(n > 0 for n in snap.drafted.values())


def test_async_engine_built_inside_a_loop_streams_and_matches(reference: dict[str, Any]) -> None:
    """An ``AsyncLLM`` built in async code (its output handler binds to the running loop)
    serves ``ainvoke`` and ``astream`` on that loop and sync nodes in worker threads, and
    refuses clearly once that loop is gone (it used to hang forever)."""
    import asyncio

    from agentspec_mw_langgraph.async_backend import AsyncEngineLoopError
    from agentspec_mw_vllm.engine import build_async_llm, shutdown

    inp = {"topic": "tea", "ideas": [], "final": ""}
    engines: list[Any] = []

    async def run() -> tuple[ChatAgentSpecVLLM, dict[str, Any], dict[str, Any], list[str]]:
        engine = build_async_llm(None, speculative=PROBE, k=2, max_model_len=768)
        engines.append(engine)
        model = ChatAgentSpecVLLM(engine=engine, max_tokens=MAX_TOKENS)
        app = with_agentspec(build_graph(model), config=TaggingConfig(adapter_raise_errors=True))
        out = await asyncio.wait_for(app.ainvoke(inp), 300)
        pieces = [str(c.content) async for c in model.astream("Name three teas.")]
        in_thread = await asyncio.wait_for(asyncio.to_thread(app.invoke, inp), 300)
        return model, out, in_thread, pieces

    try:
        model, out, in_thread, pieces = asyncio.run(run())
        assert out == in_thread == reference  # same greedy outputs as the in-process engine
        assert len([p for p in pieces if p]) > 1  # streamed as the engine produced it
        with pytest.raises(AsyncEngineLoopError, match="no longer running"):
            model.invoke("hi")
    finally:
        for engine in engines:
            shutdown(engine)


def test_token_count_without_an_engine_is_the_engines(probe_llm: Any) -> None:
    """The default model's tokenizer loaded alone counts the prompt the engine gets, and
    the engine's output names the model, not its cache folder."""
    from agentspec_mw.default_model import DEFAULT_MODEL_NAME

    messages = [SystemMessage("You are terse."), HumanMessage("Name three teas.")]
    alone = ChatAgentSpecVLLM().get_num_tokens_from_messages(messages)
    reply = ChatAgentSpecVLLM(engine=probe_llm, max_tokens=MAX_TOKENS).invoke(messages)
    assert reply.usage_metadata is not None
    assert alone == reply.usage_metadata["input_tokens"]
    assert reply.response_metadata["model_name"] == DEFAULT_MODEL_NAME


def test_agentspec_proposer_is_lossless(reference: dict[str, Any]) -> None:
    """The wrapped graph on the AgentSpec drafter gives the reference (greedy) outputs.

    Runs last: shutting an in-process engine down tears down vLLM's process-wide state.
    """
    from agentspec_mw.errors import ProposerLoadError
    from agentspec_mw.registry import resolve_proposer_class
    from agentspec_mw_vllm.engine import build_llm, shutdown

    try:
        resolve_proposer_class("agentspec")
    except ProposerLoadError:
        pytest.skip("the AgentSpec proposer is not in this build")
    llm = build_llm(None, speculative="agentspec", k=4, max_model_len=768, enforce_eager=True)
    try:
        graph = build_graph(ChatAgentSpecVLLM(engine=llm, max_tokens=MAX_TOKENS))
        app = with_agentspec(graph, config=TaggingConfig(adapter_raise_errors=True))
        assert app.invoke({"topic": "tea", "ideas": [], "final": ""}) == reference
    finally:
        shutdown(llm)
