"""An interrupted call aborts its engine request, wherever the interrupt lands.

``KeyboardInterrupt`` (Ctrl-C in a notebook) can reach the caller at any bytecode,
including after the engine loop (or the ``AsyncLLM``'s loop) took the request but before
the caller held its id or future; an asyncio cancellation lands at an ``await``. Either
way the request must be aborted (no KV cache and batch slot held until ``max_tokens``, no
request running forever on an engine that never finishes it), no entry may outlive it,
and the engine must serve the next call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agentspec_mw_langgraph.async_backend import AsyncVLLMBackend
from agentspec_mw_langgraph.backend import GenerationRequest, VLLMBackend

from .fake_engine import FakeLLM, FakeStepEngine

WAIT_S = 5.0


def _request(max_tokens: int = 200) -> GenerationRequest:
    return GenerationRequest(prompt_token_ids=[1, 2], max_tokens=max_tokens)


def _until(done: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()


def _interrupt_once(target: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``target.name`` runs, then raises ``KeyboardInterrupt`` (once): Ctrl-C landing
    right after the request was handed over, before its caller got the answer."""
    original = getattr(target, name)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(target, name, original)
        original(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(target, name, interrupted)


# --- VLLMBackend (vllm.LLM behind one engine loop) ---------------------------------------


def _backend(tiny_tokenizer: Any) -> tuple[FakeStepEngine, VLLMBackend]:
    engine = FakeStepEngine(lambda ids: "y" * 200, step_s=0.002)
    return engine, VLLMBackend(FakeLLM(tiny_tokenizer, engine))


def _assert_all_aborted_and_next_call_works(engine: FakeStepEngine, backend: VLLMBackend) -> None:
    assert _until(lambda: bool(engine.params))  # the loop took the request
    assert _until(lambda: not engine.running), "the interrupted request still runs"
    assert set(engine.params) == set(engine.aborted)  # aborted, not run to max_tokens
    assert _until(lambda: not backend._sinks)
    engine.answer = lambda ids: "ok"
    (result,) = backend.generate([_request()])  # the engine serves the next call
    assert result.text == "ok"
    backend.close()


@pytest.mark.parametrize("where", ["loop.submit", "_submit"])
def test_generate_interrupted_after_the_handover_aborts(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    engine, backend = _backend(tiny_tokenizer)
    target = backend.loop if where == "loop.submit" else backend
    _interrupt_once(target, where.rsplit(".", 1)[-1], monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        backend.generate([_request()])
    _assert_all_aborted_and_next_call_works(engine, backend)


def test_stream_interrupted_after_the_handover_aborts(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, backend = _backend(tiny_tokenizer)
    _interrupt_once(backend, "_submit", monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        next(iter(backend.stream(_request())))
    _assert_all_aborted_and_next_call_works(engine, backend)


def test_a_stream_dropped_before_its_first_item_leaves_nothing_running(
    tiny_tokenizer: Any,
) -> None:
    engine, backend = _backend(tiny_tokenizer)
    stream = cast("Generator[tuple[str, Any]]", backend.stream(_request()))
    stream.close()  # e.g. Ctrl-C between stream() and the first next()
    del stream
    time.sleep(0.1)  # a request handed over would have been added now
    assert _until(lambda: not engine.running), "the dropped stream's request still runs"
    assert set(engine.params) == set(engine.aborted)  # none started, or started and aborted
    engine.answer = lambda ids: "ok"
    assert backend.generate([_request()])[0].text == "ok"
    backend.close()


def test_async_stream_interrupted_after_the_handover_aborts(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, backend = _backend(tiny_tokenizer)
    _interrupt_once(backend, "_submit", monkeypatch)

    async def call() -> None:
        async for _ in backend.astream(_request()):
            pass

    loop = asyncio.new_event_loop()  # kept open, as a notebook's: its sink still works
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(call())
        _assert_all_aborted_and_next_call_works(engine, backend)
    finally:
        loop.close()


def test_a_cancelled_task_aborts_its_request(tiny_tokenizer: Any) -> None:
    engine, backend = _backend(tiny_tokenizer)

    async def main() -> None:
        task = asyncio.ensure_future(backend.agenerate(_request()))
        while not engine.running:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    _assert_all_aborted_and_next_call_works(engine, backend)


# --- AsyncVLLMBackend (an AsyncLLM built outside any loop) -------------------------------


class _EndlessAsyncLLM:
    """An ``AsyncLLM`` whose requests never finish on their own; counts them."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.output_handler: asyncio.Task[None] | None = None
        self.started = 0
        self.aborted = 0
        self.lock = threading.Lock()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        if self.output_handler is None:
            self.output_handler = asyncio.ensure_future(asyncio.sleep(3600))
        with self.lock:
            self.started += 1
        text = ""
        try:
            while params.max_tokens != 1 or not text:
                await asyncio.sleep(0.01)
                text += "x"
                done = params.max_tokens == 1
                comp = SimpleNamespace(
                    text=text,
                    token_ids=[1] * len(text),
                    finish_reason="length" if done else None,
                    spec_decode_metrics=None,
                )
                yield SimpleNamespace(outputs=[comp], finished=done)
        except (asyncio.CancelledError, GeneratorExit):
            with self.lock:
                self.aborted += 1  # vLLM aborts the request here
            raise

    def in_flight(self) -> int:
        with self.lock:
            return self.started - self.aborted


def _check_async(engine: _EndlessAsyncLLM, backend: AsyncVLLMBackend) -> None:
    time.sleep(0.1)  # a request handed over but not started yet would start now
    assert _until(lambda: engine.in_flight() == 0), "the interrupted request still runs"
    assert _until(lambda: not backend._pumps)
    (result,) = backend.generate([_request(max_tokens=1)])  # the next call is served
    assert result.text == "x"
    backend.close()


def test_async_llm_generate_interrupted_after_the_handover_aborts(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _EndlessAsyncLLM(tiny_tokenizer)
    backend = AsyncVLLMBackend(engine)
    # Ctrl-C inside run_coroutine_threadsafe, after it scheduled the request
    _interrupt_once(asyncio, "run_coroutine_threadsafe", monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        backend.generate([_request()])
    _check_async(engine, backend)


def test_async_llm_astream_interrupted_after_the_handover_aborts(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _EndlessAsyncLLM(tiny_tokenizer)
    backend = AsyncVLLMBackend(engine)

    async def call() -> None:
        _interrupt_once(asyncio, "run_coroutine_threadsafe", monkeypatch)
        async for _ in backend.astream(_request()):
            pass

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(call())
    _check_async(engine, backend)


def test_async_llm_stream_dropped_before_its_first_item_leaves_nothing_running(
    tiny_tokenizer: Any,
) -> None:
    engine = _EndlessAsyncLLM(tiny_tokenizer)
    backend = AsyncVLLMBackend(engine)
    stream = cast("Generator[tuple[str, Any]]", backend.stream(_request()))
    stream.close()  # e.g. Ctrl-C between stream() and the first next()
    del stream
    _check_async(engine, backend)


def test_async_llm_cancelled_task_aborts_its_request(tiny_tokenizer: Any) -> None:
    engine = _EndlessAsyncLLM(tiny_tokenizer)
    backend = AsyncVLLMBackend(engine)

    async def main() -> None:
        task = asyncio.ensure_future(backend.agenerate(_request()))
        while engine.in_flight() == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    _check_async(engine, backend)
