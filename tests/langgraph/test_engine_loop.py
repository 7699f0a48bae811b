"""The engine loop on a fake ``LLMEngine``: continuous batching of concurrent callers,
streaming per step, errors, aborts; the chat model on it (stream, async, per-call
speculation stats); the shared-engine registry; an ``AsyncLLM`` built inside a loop."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.async_backend import AsyncEngineLoopError, AsyncVLLMBackend
from agentspec_mw_langgraph.backend import GenerationRequest, VLLMBackend
from agentspec_mw_langgraph.batching import EngineLoop, EngineLoopError
from agentspec_mw_langgraph.shared import backend_for, release_shared_engines

from .fake_engine import FakeBackend, FakeLLM, FakeStepEngine


def _prompt(n: int = 3) -> dict[str, Any]:
    return {"prompt_token_ids": list(range(1, n + 1))}


def _collect(loop: EngineLoop, prompt: dict[str, Any]) -> list[Any]:
    """Submit and wait: every output the sink got, in order."""
    got: queue.SimpleQueue[Any] = queue.SimpleQueue()
    loop.submit(prompt, None, got.put)
    items = []
    while True:
        item = got.get(timeout=10)
        items.append(item)
        if isinstance(item, BaseException) or item.finished:
            return items


def test_concurrent_callers_share_steps() -> None:
    engine = FakeStepEngine(lambda ids: "x" * 30, step_s=0.005)
    loop = EngineLoop(engine)
    barrier = threading.Barrier(6)
    results: dict[int, list[Any]] = {}

    def call(i: int) -> None:
        barrier.wait()
        results[i] = _collect(loop, _prompt(i + 1))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(results) == list(range(6))
    assert all(r[-1].outputs[0].text == "x" * 30 for r in results.values())
    assert loop.max_in_flight == 6 and max(engine.batch_sizes) == 6
    # six 30-token requests in far fewer than 6 * 30 steps: they ran side by side
    assert loop.steps < 2 * 30
    assert len(engine.thread_ids) == 1  # only the loop thread touched the engine
    loop.close()


def test_outputs_arrive_every_step_and_late_requests_join() -> None:
    engine = FakeStepEngine(lambda ids: "abcdefgh"[: len(ids) * 4])
    loop = EngineLoop(engine)
    items = _collect(loop, _prompt(2))
    assert [o.outputs[0].text for o in items] == ["a", "ab", "abc", "abcd", "abcde", "abcdef",
                                                   "abcdefg", "abcdefgh"]  # fmt: skip
    assert [o.finished for o in items] == [False] * 7 + [True]
    loop.close()
    with pytest.raises(EngineLoopError, match="closed"):
        loop.submit(_prompt(), None, lambda out: None)


def test_a_bad_request_fails_alone_and_a_failing_engine_fails_everyone() -> None:
    engine = FakeStepEngine()
    loop = EngineLoop(engine)
    (err,) = _collect(loop, {"prompt_token_ids": []})
    assert isinstance(err, ValueError) and "empty prompt" in str(err)
    assert _collect(loop, _prompt())[-1].outputs[0].text == "abcdef"  # the loop lives on

    engine.fail_step = RuntimeError("device lost")
    (err,) = _collect(loop, _prompt())
    assert isinstance(err, RuntimeError) and "device lost" in str(err)
    with pytest.raises(EngineLoopError, match="device lost"):
        loop.submit(_prompt(), None, lambda out: None)


def test_a_request_the_engine_dropped_fails_instead_of_hanging() -> None:
    engine = FakeStepEngine()
    loop = EngineLoop(engine)
    original = engine.add_request

    def add_then_lose(request_id: str, prompt: Any, params: Any) -> str:
        original(request_id, prompt, params)
        engine.running.clear()  # e.g. someone else's llm.generate took its outputs
        return request_id

    engine.add_request = add_then_lose  # type: ignore[method-assign]
    (err,) = _collect(loop, _prompt())
    assert isinstance(err, RuntimeError) and "without a final output" in str(err)
    assert loop.steps == 1  # failed at once, no spinning
    loop.close()


def test_a_consumer_that_stops_aborts_its_request(tiny_tokenizer: Any) -> None:
    engine = FakeStepEngine(lambda ids: "y" * 200, step_s=0.002)
    backend = VLLMBackend(FakeLLM(tiny_tokenizer, engine))
    stream = backend.stream(GenerationRequest(prompt_token_ids=[1, 2], max_tokens=200))
    kind, text = next(stream)
    assert kind == "delta" and text == "y"
    stream.close()  # e.g. the caller broke out of its loop
    backend.loop.close()
    assert len(engine.aborted) == 1 and not engine.running


def test_chat_model_streams_per_step_with_tags_and_spec_stats(tiny_tokenizer: Any) -> None:
    engine = FakeStepEngine(lambda ids: "hello world", spec=(12, [1, 2, 3]))
    model = ChatAgentSpecVLLM(engine=FakeLLM(tiny_tokenizer, engine))
    chunks = list(model.stream("hi"))
    assert [c.content for c in chunks if c.content] == list("hello world")  # one per step
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.content == "hello world"
    stats = {"num_draft_tokens": 12, "num_accepted_draft_tokens": 0 * 1 + 1 * 2 + 2 * 3}
    assert total.response_metadata["speculative_decoding"] == stats

    msg = model.invoke("hi")
    assert msg.content == "hello world" and msg.response_metadata["speculative_decoding"] == stats
    assert msg.usage_metadata is not None and msg.usage_metadata["output_tokens"] == 11

    async def run() -> tuple[str, list[str]]:
        a = await model.ainvoke("hi")
        pieces = [str(c.content) async for c in model.astream("hi")]
        return str(a.content), pieces

    content, pieces = asyncio.run(run())
    assert content == "hello world" and len([p for p in pieces if p]) == 11
    # every request went through the one engine loop thread
    assert len(engine.thread_ids) == 1
    extra = [p.extra_args for p in engine.params.values()]
    assert extra == [None] * 4  # no graph, no tags


def test_async_callers_on_many_event_loops_at_once(tiny_tokenizer: Any) -> None:
    engine = FakeStepEngine(lambda ids: "z" * 20, step_s=0.003)
    model = ChatAgentSpecVLLM(engine=FakeLLM(tiny_tokenizer, engine))
    out: dict[int, str] = {}

    def run(i: int) -> None:
        async def go() -> str:
            msgs = await asyncio.gather(*(model.ainvoke(f"q{i}{j}") for j in range(2)))
            return "".join(str(m.content) for m in msgs)

        out[i] = asyncio.run(go())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert out == {i: "z" * 40 for i in range(3)}
    backend = model.backend
    assert isinstance(backend, VLLMBackend) and backend.loop.max_in_flight >= 2


def test_model_objects_on_one_engine_share_its_backend(tiny_tokenizer: Any) -> None:
    llm = FakeLLM(tiny_tokenizer, FakeStepEngine())
    a, b = ChatAgentSpecVLLM(engine=llm), ChatAgentSpecVLLM(engine=llm, max_tokens=5)
    assert a.backend is b.backend is backend_for(llm)
    with pytest.raises(TypeError, match="vllm.LLM"):
        backend_for(12345)
    with pytest.raises(ValueError, match="already has a backend"):
        VLLMBackend(llm)  # a second loop would step the engine at the same time
    assert a.invoke("hi").content == "abcdef"
    loop = a.backend.loop  # type: ignore[attr-defined]

    from agentspec_mw_vllm.engine import shutdown

    shutdown(llm)  # closes the loop the engine carries
    assert loop.closed and not hasattr(llm, "_agentspec_backend")
    assert backend_for(llm) is not a.backend  # a fresh backend after the old one closed


def test_embedded_engines_are_shared_per_settings(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import agentspec_mw_vllm.engine as engine_mod

    built: list[dict[str, Any]] = []

    def fake_build_llm(model: Any, **kwargs: Any) -> FakeBackend:
        built.append(kwargs)
        name = f"engine {len(built)}"
        return FakeBackend(tiny_tokenizer, lambda prompt: name)

    monkeypatch.setattr(engine_mod, "build_llm", fake_build_llm)
    release_shared_engines()
    try:
        planner, writer = ChatAgentSpecVLLM(max_tokens=8), ChatAgentSpecVLLM(max_tokens=64)
        with caplog.at_level(logging.WARNING, logger="agentspec_mw_langgraph.shared"):
            assert planner.invoke("a").content == writer.invoke("b").content == "engine 1"
            assert len(built) == 1 and not caplog.records
            other = ChatAgentSpecVLLM(k=4)
            assert other.invoke("c").content == "engine 2"
        (record,) = caplog.records
        assert "k: 4 vs 8" in record.getMessage() and "#2" in record.getMessage()
        private = ChatAgentSpecVLLM(share_engine=False)
        assert private.invoke("d").content == "engine 3"
        assert ChatAgentSpecVLLM().invoke("e").content == "engine 1"
    finally:
        release_shared_engines()


class _FakeAsyncLLM:
    """Like vLLM's ``AsyncLLM``: built inside a running loop, its output handler is bound
    to that loop, and a request awaited on another loop never completes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.output_handler: asyncio.Task[None] | None = None
        try:
            asyncio.get_running_loop()
            self._start_handler()
        except RuntimeError:
            pass

    def _start_handler(self) -> None:
        if self.output_handler is None:
            self.output_handler = asyncio.ensure_future(asyncio.sleep(3600))

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        from types import SimpleNamespace

        self._start_handler()
        assert self.output_handler is not None
        if self.output_handler.get_loop() is not asyncio.get_running_loop():
            await asyncio.Event().wait()  # vLLM's hang: outputs go to the handler's loop
        text = ""
        for ch in "ok!":
            text += ch
            comp = SimpleNamespace(
                text=text, token_ids=[1] * len(text), finish_reason=None, spec_decode_metrics=None
            )
            yield SimpleNamespace(outputs=[comp], finished=False)
            await asyncio.sleep(0)


def test_async_engine_built_inside_a_running_loop(tiny_tokenizer: Any) -> None:
    async def main() -> tuple[str, str, list[str], AsyncVLLMBackend]:
        engine = _FakeAsyncLLM(tiny_tokenizer)  # e.g. build_async_llm(...) in async code
        model = ChatAgentSpecVLLM(engine=engine)
        first = await asyncio.wait_for(model.ainvoke("hi"), 5)
        pieces = [str(c.content) async for c in model.astream("hi")]
        # a sync call from a worker thread (a sync LangGraph node) is marshalled here
        sync = await asyncio.wait_for(asyncio.to_thread(model.invoke, "hi"), 5)
        with pytest.raises(AsyncEngineLoopError, match="ainvoke"):
            model.invoke("hi")  # blocking on the loop's own thread
        backend = model.backend
        assert isinstance(backend, AsyncVLLMBackend)
        return str(first.content), str(sync.content), pieces, backend

    first, sync, pieces, backend = asyncio.run(main())
    assert first == sync == "ok!" and "".join(pieces) == "ok!" and len(pieces) >= 3
    model = ChatAgentSpecVLLM(engine=backend)
    with pytest.raises(AsyncEngineLoopError, match="no longer running"):
        model.invoke("hi")  # the loop that owned the engine has returned


def test_async_engine_built_outside_a_loop_works_everywhere(tiny_tokenizer: Any) -> None:
    model = ChatAgentSpecVLLM(engine=_FakeAsyncLLM(tiny_tokenizer))
    assert model.invoke("hi").content == "ok!"

    async def main() -> str:
        return str((await model.ainvoke("hi")).content)

    assert asyncio.run(main()) == asyncio.run(main()) == "ok!"
    backend = model.backend
    assert isinstance(backend, AsyncVLLMBackend)
    backend.close()


def test_first_async_call_builds_the_engine_off_the_event_loop(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentspec_mw_vllm.engine as engine_mod

    built_on: list[int] = []

    def fake_build_llm(model: Any, **kwargs: Any) -> FakeBackend:
        built_on.append(threading.get_ident())
        return FakeBackend(tiny_tokenizer, lambda prompt: "built")

    monkeypatch.setattr(engine_mod, "build_llm", fake_build_llm)
    release_shared_engines()
    try:

        async def main() -> tuple[str, int]:
            msg = await ChatAgentSpecVLLM(k=3).ainvoke("hi")
            return str(msg.content), threading.get_ident()

        content, loop_thread = asyncio.run(main())
        assert content == "built" and built_on and built_on[0] != loop_thread
    finally:
        release_shared_engines()
