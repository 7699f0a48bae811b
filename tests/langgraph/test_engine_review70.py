"""Session 70's review of the embedded-engine path: streamed invalid tool calls stay
invalid, the response cache tells models apart, ``shutdown`` / ``close`` end every caller
(the home loop's included) before the engine core goes, a failed ``generate`` batch stops
its other requests, Llama-style ``parameters`` are read, and the demo calculator reports an
overflow. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.messages import AIMessage, BaseMessage

from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.async_backend import AsyncEngineLoopError, AsyncVLLMBackend
from agentspec_mw_langgraph.backend import GenerationRequest, VLLMBackend
from agentspec_mw_langgraph.batching import EngineLoopError
from agentspec_mw_langgraph.toolformat import parse_tool_calls

from .fake_engine import FakeBackend, FakeLLM, FakeStepEngine, FakeStreamingBackend
from .test_engine_faults import _SlowAsyncLLM


def _wait(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


# --- 1. streamed invalid tool calls --------------------------------------------------

_VALID = '<tool_call>\n{"name": "word_count", "arguments": {"text": "a b"}}\n</tool_call>'


def _calls(message: BaseMessage) -> tuple[list[Any], list[Any]]:
    """A message's tool calls and invalid calls (without ``error``: LangChain leaves it
    ``None`` on calls it parses from joined chunks)."""
    assert isinstance(message, AIMessage)
    invalid = [{k: v for k, v in c.items() if k != "error"} for c in message.invalid_tool_calls]
    return list(message.tool_calls), invalid


@pytest.mark.parametrize("backend_cls", [FakeBackend, FakeStreamingBackend])
@pytest.mark.parametrize(
    "text",
    [
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": "2+2"}\n</tool_call>',
        '<tool_call>\n{"name": "x",\n</tool_call>',  # a truncated JSON object
        "<tool_call>\n</tool_call>",  # an empty block
        _VALID + '\n<tool_call>\n{"name": "calculator", "arguments": [1]}\n</tool_call>',
    ],
)
def test_streamed_invalid_tool_calls_join_to_the_invoke_message(
    tiny_tokenizer: Any, backend_cls: type[FakeBackend], text: str
) -> None:
    model = ChatAgentSpecVLLM(engine=backend_cls(tiny_tokenizer, lambda prompt: text))
    invoked = model.invoke("hi")
    joined: Any = None
    for chunk in model.stream("hi"):
        joined = chunk if joined is None else joined + chunk
    calls, invalid = _calls(invoked)
    assert invalid and all(c["name"] != "" for c in calls)
    assert _calls(joined) == (calls, invalid)
    streaming = ChatAgentSpecVLLM(
        engine=backend_cls(tiny_tokenizer, lambda prompt: text), streaming=True
    )
    assert _calls(streaming.invoke("hi")) == (calls, invalid)


def test_a_graph_streamed_in_messages_mode_keeps_invalid_calls_invalid(
    tiny_tokenizer: Any,
) -> None:
    from langgraph.graph import END, START, MessagesState, StateGraph

    text = '<tool_call>\n{"name": "calculator", "arguments": "2+2"}\n</tool_call>'
    model = ChatAgentSpecVLLM(engine=FakeBackend(tiny_tokenizer, lambda prompt: text))
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    app = graph.compile()
    invoked = app.invoke({"messages": [("user", "hi")]})["messages"][-1]
    last: Any = None
    for mode, value in app.stream(
        {"messages": [("user", "hi")]}, stream_mode=["messages", "values"]
    ):
        if mode == "values":
            last = value["messages"][-1]
    assert _calls(last) == _calls(invoked)
    assert last.tool_calls == [] and last.invalid_tool_calls[0]["name"] == "calculator"


# --- 2. the response cache -----------------------------------------------------------


class _OtherModelBackend(FakeBackend):
    model_name = "other-model"


class _SpeculatingBackend(FakeBackend):
    """A backend whose engine reports vLLM's speculative config."""

    def __init__(self, tokenizer: Any, script: Callable[[str], str]) -> None:
        super().__init__(tokenizer, script)
        spec = SimpleNamespace(method="ngram", num_speculative_tokens=4)
        self.engine = SimpleNamespace(
            vllm_config=SimpleNamespace(speculative_config=spec, additional_config={})
        )


@pytest.mark.parametrize(
    ("backend_cls", "settings"),
    [
        (FakeBackend, {"top_p": 0.5}),
        (FakeBackend, {"seed": 7}),
        (FakeBackend, {"stop": ["from"]}),
        (_OtherModelBackend, {}),
        (_SpeculatingBackend, {}),
    ],
)
def test_the_response_cache_keeps_models_apart(
    tiny_tokenizer: Any, backend_cls: type[FakeBackend], settings: dict[str, Any]
) -> None:
    cache = InMemoryCache()
    first = ChatAgentSpecVLLM(engine=FakeBackend(tiny_tokenizer, lambda p: "A"), cache=cache)
    assert first.invoke("hi").content == "A"
    other_backend = backend_cls(tiny_tokenizer, lambda p: "B")
    other = ChatAgentSpecVLLM(engine=other_backend, cache=cache, **settings)
    assert other.invoke("hi").content == "B"
    assert len(other_backend.requests) == 1  # its own engine answered
    assert other.invoke("hi").content == "B" and len(other_backend.requests) == 1  # cached
    same = ChatAgentSpecVLLM(engine=FakeBackend(tiny_tokenizer, lambda p: "C"), cache=cache)
    assert same.invoke("hi").content == "A"  # equal settings and model: shared


# --- 3. closing an AsyncLLM backend ends the home loop's callers ----------------------


class _InLoopAsyncLLM:
    """An ``AsyncLLM`` built inside a running loop: its requests are fed by its output
    handler task, which ``shutdown()`` cancels (vLLM does not fail the requests then)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.queues: dict[str, asyncio.Queue[str]] = {}
        self.output_handler = asyncio.get_running_loop().create_task(self._handler())

    async def _handler(self) -> None:
        while True:
            await asyncio.sleep(0.02)
            for q in self.queues.values():
                q.put_nowait("x")

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        q: asyncio.Queue[str] = asyncio.Queue()
        self.queues[request_id] = q
        text = ""
        try:
            while True:
                text += await q.get()
                comp = SimpleNamespace(
                    text=text,
                    token_ids=[1] * len(text),
                    finish_reason=None,
                    spec_decode_metrics=None,
                )
                yield SimpleNamespace(outputs=[comp], finished=False)
        finally:
            self.queues.pop(request_id, None)

    def shutdown(self) -> None:
        self.output_handler.cancel()


def test_shutdown_ends_a_caller_on_the_engines_own_loop(tiny_tokenizer: Any) -> None:
    pytest.importorskip("vllm")  # sampling_params builds vLLM's SamplingParams
    from agentspec_mw_vllm.engine import shutdown

    async def main() -> BaseException | str:
        engine = _InLoopAsyncLLM(tiny_tokenizer)
        model = ChatAgentSpecVLLM(engine=engine)
        task = asyncio.create_task(model.ainvoke("hi"))
        while not engine.queues:  # the request is in flight
            await asyncio.sleep(0.01)
        assert isinstance(model.backend, AsyncVLLMBackend)
        shutdown(engine)
        try:
            await asyncio.wait_for(task, 3)
        except TimeoutError:
            return "still waiting 3 s after shutdown"
        except BaseException as exc:  # noqa: BLE001 - what the caller saw
            await asyncio.sleep(0.05)
            assert not engine.queues  # the request was cancelled: vLLM aborts it
            return exc
        return "returned"

    outcome = asyncio.run(main())
    assert isinstance(outcome, AsyncEngineLoopError) and "closed" in str(outcome)


# --- 4. shutdown(llm) ends the requests and the loop before the engine core ----------


class _Core:
    def __init__(self, backend: list[VLLMBackend]) -> None:
        self.backend = backend
        self.loop_running_at_shutdown: list[bool] = []

    def shutdown(self) -> None:
        self.loop_running_at_shutdown.append(self.backend[0].loop.running)


def test_shutdown_ends_requests_in_flight_and_stops_the_loop_before_the_core(
    tiny_tokenizer: Any,
) -> None:
    pytest.importorskip("vllm")
    from agentspec_mw_vllm.engine import shutdown

    engine = FakeStepEngine(lambda ids: "x" * 400, step_s=0.02)  # an 8 s generation
    holder: list[VLLMBackend] = []
    core = _Core(holder)
    engine.engine_core = core  # type: ignore[attr-defined]
    llm = FakeLLM(tiny_tokenizer, engine)
    model = ChatAgentSpecVLLM(engine=llm, max_tokens=400)
    backend = model.backend
    assert isinstance(backend, VLLMBackend)
    holder.append(backend)
    outcome: list[BaseException | object] = []

    def consume() -> None:
        try:
            outcome.append(list(model.stream("hi")))
        except BaseException as exc:  # noqa: BLE001 - what the caller saw
            outcome.append(exc)

    caller = threading.Thread(target=consume, daemon=True)
    caller.start()
    assert _wait(lambda: backend.loop.steps >= 3)
    started = time.monotonic()
    shutdown(llm)
    assert time.monotonic() - started < 3, "shutdown waited for the request to finish"
    assert core.loop_running_at_shutdown == [False]  # the core went after the loop stopped
    caller.join(3)
    (error,) = outcome
    assert isinstance(error, EngineLoopError) and "engine shut down" in str(error)
    assert engine.running == {} and len(engine.aborted) == 1
    with pytest.raises(EngineLoopError):
        backend.generate([GenerationRequest(prompt_token_ids=[1], max_tokens=4)])


# --- 5. a failed generate batch stops its other requests -----------------------------


def test_a_failed_generate_aborts_the_other_requests(tiny_tokenizer: Any) -> None:
    pytest.importorskip("vllm")
    engine = FakeStepEngine(lambda ids: "x" * 200, step_s=0.01)
    backend = VLLMBackend(FakeLLM(tiny_tokenizer, engine))
    ok = GenerationRequest(prompt_token_ids=[1], max_tokens=200)
    bad = GenerationRequest(prompt_token_ids=[], max_tokens=200)  # the fake rejects it
    with pytest.raises(ValueError, match="empty prompt"):
        backend.generate([bad, ok, ok])
    assert _wait(lambda: not engine.running and len(engine.aborted) == 2)
    assert backend._sinks == {}
    backend.close()


class _OutsideLoopAsyncLLM(_SlowAsyncLLM):
    """An ``AsyncLLM`` built outside a loop: an empty prompt fails, others never end."""

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        if not prompt["prompt_token_ids"]:
            raise ValueError("empty prompt")
        async for out in super().generate(prompt, params, request_id):
            yield out


class _CountingAsyncLLM(_OutsideLoopAsyncLLM):
    """Counts the requests that reached the engine and those still running."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.started = 0
        self.running = 0

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        if prompt["prompt_token_ids"]:
            self.started += 1
            self.running += 1
        try:
            async for out in super().generate(prompt, params, request_id):
                yield out
        finally:
            if prompt["prompt_token_ids"]:
                self.running -= 1


def test_a_failed_async_generate_cancels_the_other_requests(tiny_tokenizer: Any) -> None:
    """The two others are stopped: aborted in the engine, or (cancelled before their task
    ran, since review 72) never sent to it; none keeps running."""
    pytest.importorskip("vllm")
    engine = _CountingAsyncLLM(tiny_tokenizer)
    backend = AsyncVLLMBackend(engine)
    ok = GenerationRequest(prompt_token_ids=[1], max_tokens=200)
    bad = GenerationRequest(prompt_token_ids=[], max_tokens=200)
    with pytest.raises(ValueError, match="empty prompt"):
        backend.generate([bad, ok, ok])
    time.sleep(0.2)  # a request still starting would show up as running here
    assert _wait(lambda: engine.running == 0)
    assert engine.cancelled == engine.started <= 2
    backend.close()


# --- 6. tool calls without "arguments" -----------------------------------------------


@pytest.mark.parametrize(
    ("body", "valid", "name", "args"),
    [
        ('{"name": "f", "arguments": {"x": 1}}', True, "f", {"x": 1}),  # Hermes: unchanged
        ('{"name": "f", "arguments": "{\\"x\\": 1}"}', True, "f", {"x": 1}),
        ('{"name": "f"}', True, "f", {}),
        ('{"name": "f", "parameters": {"x": 1}}', True, "f", {"x": 1}),  # Llama 3
        ('{"name": "f", "args": {"x": 1}}', False, "f", None),  # not silently {}
        ('{"name": "calculator", "arguments": "2+2"}', False, "calculator", None),
        ('{"arguments": {"x": 1}}', False, None, None),
        ("not json", False, None, None),
    ],
)
def test_tool_call_arguments_and_invalid_call_names(
    body: str, valid: bool, name: str | None, args: dict[str, Any] | None
) -> None:
    _, calls, invalid = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>")
    if valid:
        assert [(c["name"], c["args"]) for c in calls] == [(name, args)] and invalid == []
    else:
        assert calls == [] and [(c["name"], c["args"]) for c in invalid] == [(name, body)]


# --- 7. the demo calculator ----------------------------------------------------------


def test_the_demo_calculator_reports_an_overflow() -> None:
    from agentspec_mw_langgraph.demo_graph import _run_tool, calculator, demo_tools

    assert calculator.invoke({"expression": "999999 ** 60"}).startswith("error:")
    tools = {t.name: t for t in demo_tools()}
    call = {"name": "calculator", "args": {"expression": "999999 ** 60"}, "id": "c1"}
    assert _run_tool(tools, call).startswith("error:")  # type: ignore[arg-type]
    assert calculator.invoke({"expression": "2+2"}) == "4"
