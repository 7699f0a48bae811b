"""Engine faults the LangGraph adapter must survive: a failed or shut-down shared engine
is not handed out again; closing an ``AsyncLLM`` backend ends the requests in flight and
closes its loop; a dead ``AsyncLLM`` is reported as such; never two engine loops on one
engine after a ``close()`` that timed out."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.async_backend import (
    AsyncEngineDeadError,
    AsyncEngineLoopError,
    AsyncVLLMBackend,
)
from agentspec_mw_langgraph.backend import BACKEND_ATTR, GenerationRequest, VLLMBackend
from agentspec_mw_langgraph.batching import EngineLoopError
from agentspec_mw_langgraph.shared import backend_for, shared_engines

from .fake_engine import FakeLLM, FakeStepEngine

# --- the shared-engine registry -----------------------------------------------------


def test_a_failed_shared_engine_is_replaced(
    builds: list[FakeLLM], caplog: pytest.LogCaptureFixture
) -> None:
    first = ChatAgentSpecVLLM()
    assert first.invoke("a").content == "engine1"
    builds[0].llm_engine.fail_step = RuntimeError("EngineDeadError: engine core died")
    with pytest.raises(RuntimeError, match="engine core died"):
        first.invoke("b")
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_langgraph.shared"):
        fresh = ChatAgentSpecVLLM()  # equal settings: the registry must not hand out engine1
        assert fresh.invoke("c").content == "engine2"
    assert len(builds) == 2 and shared_engines() == [builds[1]]
    assert any("engine failed" in r.getMessage() for r in caplog.records)
    assert getattr(builds[0], "_agentspec_shut_down", False) is True  # shut down when dropped


def test_a_shut_down_shared_engine_is_replaced(builds: list[FakeLLM]) -> None:
    from agentspec_mw_vllm.engine import shutdown

    first = ChatAgentSpecVLLM()
    assert first.invoke("a").content == "engine1"
    shutdown(first.engine)  # the documented way to shut an engine down
    assert shared_engines() == []  # unregistered from the shared registry
    assert ChatAgentSpecVLLM().invoke("c").content == "engine2"
    assert ChatAgentSpecVLLM().invoke("d").content == "engine2"  # the new one is shared
    assert len(builds) == 2


# --- AsyncLLM backends ------------------------------------------------------------------


def _output(text: str, finished: bool) -> SimpleNamespace:
    comp = SimpleNamespace(
        text=text,
        token_ids=[1] * len(text),
        finish_reason="stop" if finished else None,
        spec_decode_metrics=None,
    )
    return SimpleNamespace(outputs=[comp], finished=finished)


class _SlowAsyncLLM:
    """An ``AsyncLLM`` built outside a loop whose requests never finish on their own."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.output_handler: asyncio.Task[None] | None = None
        self.cancelled = 0

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        if self.output_handler is None:
            self.output_handler = asyncio.ensure_future(asyncio.sleep(3600))
        text = ""
        try:
            while True:
                await asyncio.sleep(0.02)
                text += "x"
                yield _output(text, False)
        except asyncio.CancelledError:
            self.cancelled += 1  # vLLM aborts the request here
            raise


def test_closing_an_async_backend_ends_the_requests_in_flight(tiny_tokenizer: Any) -> None:
    engine = _SlowAsyncLLM(tiny_tokenizer)
    model = ChatAgentSpecVLLM(engine=engine)
    outcome: list[BaseException | object] = []

    def call() -> None:
        try:
            outcome.append(model.invoke("hi"))
        except BaseException as exc:  # noqa: BLE001 - what the caller saw
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 5
    while engine.output_handler is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the request is in flight
    backend = model.backend
    assert isinstance(backend, AsyncVLLMBackend)
    loop, thread = backend._private, backend._thread
    assert loop is not None and thread is not None
    backend.close()
    caller.join(5)
    assert not caller.is_alive(), "the caller still waits after close()"
    (error,) = outcome
    assert isinstance(error, AsyncEngineLoopError) and "closed" in str(error)
    assert loop.is_closed() and not thread.is_alive() and engine.cancelled == 1
    with pytest.raises(AsyncEngineLoopError, match="was closed"):
        model.invoke("again")
    backend.close()  # idempotent


class _DyingAsyncLLM:
    """Built outside a loop; after ``die()`` its output handler ends, as vLLM's does when
    the engine core fails (with ``error``: the handler task raises it)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.output_handler: asyncio.Task[None] | None = None
        self.dead = False
        self.error: BaseException | None = None

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        if self.dead:
            raise RuntimeError("EngineDeadError")
        if self.output_handler is None:

            async def handler() -> None:
                while not self.dead:
                    await asyncio.sleep(0.01)
                if self.error is not None:
                    raise self.error

            self.output_handler = asyncio.ensure_future(handler())
        yield _output("ok", True)


@pytest.mark.parametrize("error", [None, ValueError("engine core: CUDA error")])
def test_a_dead_async_engine_is_reported_as_dead(
    tiny_tokenizer: Any, error: BaseException | None
) -> None:
    engine = _DyingAsyncLLM(tiny_tokenizer)
    model = ChatAgentSpecVLLM(engine=engine)
    assert model.invoke("hi").content == "ok"
    engine.error, engine.dead = error, True
    handler = engine.output_handler
    assert handler is not None
    deadline = time.monotonic() + 5
    while not handler.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(AsyncEngineDeadError, match="engine died") as info:
        model.invoke("hi")
    assert "event loop" not in str(info.value) and "Build a new engine" in str(info.value)
    assert info.value.__cause__ is error
    model.backend.close()  # type: ignore[attr-defined]


# --- never two engine loops on one engine -------------------------------------------


class _RecordingEngine(FakeStepEngine):
    """Records whether two threads ever stepped it at once."""

    def __init__(self) -> None:
        super().__init__(lambda ids: "x" * 40, step_s=0.02)  # 0.8 s per request
        self.active = 0
        self.overlap = False
        self._guard = threading.Lock()

    def step(self) -> list[Any]:
        with self._guard:
            self.active += 1
            self.overlap |= self.active > 1
        try:
            return super().step()
        finally:
            with self._guard:
                self.active -= 1


def test_a_close_that_times_out_keeps_the_engine_to_its_loop(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vllm")  # sampling_params builds vLLM's SamplingParams
    engine = _RecordingEngine()
    llm = FakeLLM(tiny_tokenizer, engine)
    old = backend_for(llm)
    assert isinstance(old, VLLMBackend)
    request = GenerationRequest(prompt_token_ids=[1, 2, 3], max_tokens=64)
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(old.generate([request])))
    first.start()
    deadline = time.monotonic() + 5
    while not engine.running and time.monotonic() < deadline:
        time.sleep(0.005)
    old.close(timeout=0.05)  # gives up: the loop still finishes its request
    assert old.loop.closed and old.loop.running
    assert getattr(llm, BACKEND_ATTR) is old  # still registered: it steps the engine
    monkeypatch.setattr(VLLMBackend, "previous_loop_wait_s", 0.05)
    with pytest.raises(EngineLoopError, match="still steps the engine"):
        backend_for(llm)
    monkeypatch.setattr(VLLMBackend, "previous_loop_wait_s", 10.0)
    new = backend_for(llm)  # waits for the old loop to stop
    assert new is not old and not old.loop.running
    assert new.generate([request])[0].text == "x" * 40
    first.join(5)
    assert results and results[0][0].text == "x" * 40
    assert not engine.overlap, "two engine loops stepped the engine at once"
    new.close()  # type: ignore[attr-defined]
    assert not hasattr(llm, BACKEND_ATTR)
