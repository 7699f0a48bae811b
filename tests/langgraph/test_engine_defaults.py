"""The chat model's default engine, for real (default model, CPU): the wrapped graph gives
the same greedy outputs as an engine without speculation, constrained outputs (forced tool
calls, JSON schemas) too; calls stream per engine step;
a 6-way fan-out runs in shared engine steps; each call reports its speculation."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage
from langgraph.types import Send

from agentspec_mw_langgraph import ChatAgentSpecVLLM, TaggingConfig, with_agentspec
from agentspec_mw_langgraph.backend import VLLMBackend
from agentspec_mw_langgraph.shared import release_shared_engines

from .graphs import fan_out_graph
from .schemas import Person, add, weather

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MAX_TOKENS = 12
ANGLES = ("history", "science", "trade", "health", "ritual", "taste")


@pytest.fixture(scope="module")
def default_chat() -> Iterator[ChatAgentSpecVLLM]:
    """A chat model on the embedded engine with every engine setting left at its default."""
    pytest.importorskip("vllm")
    chat = ChatAgentSpecVLLM(max_tokens=MAX_TOKENS)
    assert isinstance(chat.backend, VLLMBackend)  # builds the engine now
    yield chat
    release_shared_engines()


@pytest.fixture(scope="module")
def plain_llm(default_chat: ChatAgentSpecVLLM) -> Iterator[Any]:
    """The same engine defaults, without speculation."""
    from agentspec_mw_vllm.engine import build_llm, shutdown

    llm = build_llm(None, speculative=None)
    yield llm
    shutdown(llm)


class State(TypedDict):
    topic: str
    notes: Annotated[list[str], operator.add]
    final: str


def build_graph(model: BaseChatModel) -> Any:
    def planner(state: State) -> dict[str, Any]:
        msg = model.invoke([HumanMessage(f"Plan, in one line, a note on {state['topic']}.")])
        return {"notes": [f"plan: {msg.content}"]}

    def fan_out(state: State) -> list[Send]:
        return [Send("worker", {"topic": f"{state['topic']} ({a})"}) for a in ANGLES]

    def worker(state: State) -> dict[str, Any]:
        msg = model.invoke([HumanMessage(f"One short fact about {state['topic']}.")])
        return {"notes": [f"{state['topic']}: {msg.content}"]}

    def writer(state: State) -> dict[str, Any]:
        notes = "\n".join(sorted(state["notes"]))
        msg = model.invoke([HumanMessage(f"Summarize in one sentence:\n{notes}")])
        return {"final": str(msg.content)}

    return fan_out_graph(State, planner, fan_out, worker, writer)


def test_default_wrapped_graph_equals_no_speculation(
    default_chat: ChatAgentSpecVLLM, plain_llm: Any
) -> None:
    import torch

    backend = default_chat.backend
    assert isinstance(backend, VLLMBackend)
    engine = backend.llm.llm_engine
    assert engine.model_config.dtype == torch.float32  # the CPU default: lossless
    assert engine.vllm_config.speculative_config.method == "custom_class"

    inp = {"topic": "tea", "notes": [], "final": ""}
    reference = build_graph(ChatAgentSpecVLLM(engine=plain_llm, max_tokens=MAX_TOKENS)).invoke(inp)
    app = with_agentspec(build_graph(default_chat), config=TaggingConfig(adapter_raise_errors=True))
    backend.loop.max_in_flight = 0
    assert app.invoke(inp) == reference
    assert reference["final"] and len(reference["notes"]) == 1 + len(ANGLES)
    assert backend.loop.max_in_flight == len(ANGLES)  # the fan-out shared engine steps

    msg = default_chat.invoke("Name a green tea.")
    stats = msg.response_metadata["speculative_decoding"]
    assert 0 <= stats["num_accepted_draft_tokens"] <= stats["num_draft_tokens"]


def test_fanout_streams_per_step_in_shared_steps(default_chat: ChatAgentSpecVLLM) -> None:
    backend = default_chat.backend
    assert isinstance(backend, VLLMBackend)
    prompts = [f"Write a short line about {a}." for a in ANGLES]
    expected = [str(default_chat.invoke(p).content) for p in prompts]

    # (text, engine steps so far, time) of every chunk, per stream
    seen: dict[int, list[tuple[str, int, float]]] = {}
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        barrier.wait()
        seen[i] = [
            (str(c.content), backend.loop.steps, time.perf_counter())
            for c in default_chat.stream(prompts[i])
        ]

    backend.loop.max_in_flight = 0
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert backend.loop.max_in_flight == len(prompts)  # all six in the same steps
    for i, chunks in seen.items():
        assert "".join(text for text, _, _ in chunks) == expected[i]  # as if not streamed
        texted = [c for c in chunks if c[0]]
        # more than one chunk of text (not 3: the outputs are in AgentSpec's history from
        # the calls above, and a step that accepts all k = 8 drafts emits 9 tokens, so a
        # 10-token answer can come in two steps; CI saw it once, 2026-12-04)
        assert len(texted) >= 2
        first, last = texted[0], chunks[-1]
        # the first text arrived steps (and time) before the generation ended
        assert first[1] < last[1] and first[2] < last[2]


#: Greedy calls at batch 1 whose outputs differ with and without speculation when the
#: engine runs in bfloat16 on this CPU (2 of 8 prompts tried, 2026-12-02; float32: 0 of 8):
#: this test fails if the default dtype goes back to bfloat16.
TIE_PRONE = ("Write three sentences about ritual of tea.", "List five steps to brew oolong tea.")


def test_default_engine_equals_no_speculation_at_batch_one(
    default_chat: ChatAgentSpecVLLM, plain_llm: Any
) -> None:
    longer = ChatAgentSpecVLLM(max_tokens=64)  # same engine settings: the same engine
    assert longer.backend is default_chat.backend
    plain = ChatAgentSpecVLLM(engine=plain_llm, max_tokens=64)
    for prompt in TIE_PRONE:
        assert longer.invoke(prompt).content == plain.invoke(prompt).content


def _structured_calls(model: ChatAgentSpecVLLM) -> tuple[list[Any], int, int]:
    """Constrained calls (forced tool calls, JSON schema, a call or the answer), each prompt
    twice so the second can draft from the first: the raw messages, tokens drafted and
    accepted."""
    fc = model.with_structured_output(Person, include_raw=True)
    js = model.with_structured_output(Person, method="json_schema", include_raw=True)
    forced = model.bind_tools([add, weather], tool_choice="any")
    call_or_answer = model.bind_tools([add], response_format=Person)  # create_agent's
    raws: list[Any] = []
    for _ in range(2):
        for runnable in (fc, js):
            out = runnable.invoke("Invent a baker called Ann, aged 31.")
            assert isinstance(out, dict) and isinstance(out["parsed"], Person)
            raws.append(out["raw"])
        raws.append(forced.invoke("What is 2 plus 3?"))
        assert raws[-1].tool_calls[0]["name"] in ("add", "weather")
        raws.append(call_or_answer.invoke("Use the add tool to add 2 and 3."))
        assert raws[-1].tool_calls[0]["args"] == {"a": 2, "b": 3}  # a call, not forced
    drafted = accepted = 0
    for msg in raws:
        stats = msg.response_metadata.get("speculative_decoding") or {}
        drafted += stats.get("num_draft_tokens", 0)
        accepted += stats.get("num_accepted_draft_tokens", 0)
    return [(m.content, m.tool_calls) for m in raws], drafted, accepted


def test_constrained_outputs_equal_no_speculation(
    default_chat: ChatAgentSpecVLLM, plain_llm: Any
) -> None:
    """Forced tool calls and JSON-schema outputs (vLLM's structured outputs: drafts the
    grammar rejects are cut before verification) are identical with and without AgentSpec,
    and AgentSpec drafted under the grammar."""
    spec = ChatAgentSpecVLLM(engine=default_chat.engine, max_tokens=64)
    plain = ChatAgentSpecVLLM(engine=plain_llm, max_tokens=64)
    got, drafted, accepted = _structured_calls(spec)
    expected, _, _ = _structured_calls(plain)
    assert got == expected
    assert drafted > 0 and accepted > 0
