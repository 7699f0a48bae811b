"""``backend_for`` makes a backend outside the registry's lock.

A new ``VLLMBackend`` on an engine whose closed backend's loop still finishes its requests
waits up to ``previous_loop_wait_s`` for that loop: meanwhile other threads that want the
backend of another engine, or the registry's other functions, go on, and callers for the
same engine wait for that one making (never two backends, so never two engine loops).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from typing import Any, cast

import pytest

from agentspec_mw_langgraph.backend import GenerationRequest, VLLMBackend
from agentspec_mw_langgraph.shared import backend_for, shared_engines

from .fake_engine import FakeLLM, FakeStepEngine


def test_a_slow_backend_making_blocks_no_other_engine(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(VLLMBackend, "previous_loop_wait_s", 1.5)
    other = FakeLLM(tiny_tokenizer, FakeStepEngine())
    ready = backend_for(other)  # built already
    busy_engine = FakeStepEngine(lambda ids: "y" * 20000, step_s=0.002)
    busy = FakeLLM(tiny_tokenizer, busy_engine)
    first = backend_for(busy)
    assert isinstance(first, VLLMBackend)
    stream = cast(
        "Generator[tuple[str, Any]]",
        first.stream(GenerationRequest(prompt_token_ids=[1, 2], max_tokens=20000)),
    )
    next(stream)  # a request in flight for ~40 s
    first.close(timeout=0)
    assert first.loop.closed and first.loop.running  # closed, still finishing

    made: list[Any] = []
    makers = [
        threading.Thread(target=lambda: made.append(_attempt(busy)), daemon=True) for _ in range(3)
    ]
    for t in makers:
        t.start()
    time.sleep(0.2)  # the makers wait for the busy engine's old loop
    started = time.monotonic()
    assert backend_for(other) is ready  # another engine: at once
    shared_engines()  # the registry's other functions too
    # blocked, they would return once the making's 1.5 s wait ends, ~1.3 s from here
    assert time.monotonic() - started < 1.0
    for t in makers:
        t.join(10)
    # the one making waited 1.5 s and raised; each waiter then tried once itself
    assert len(made) == 3 and all(isinstance(m, Exception) for m in made)
    stream.close()  # abort: the old loop stops
    assert first.loop.wait_stopped(5)
    backends: list[Any] = []
    makers = [
        threading.Thread(target=lambda: backends.append(backend_for(busy)), daemon=True)
        for _ in range(4)
    ]
    for t in makers:
        t.start()
    for t in makers:
        t.join(5)
    assert len(backends) == 4 and all(b is backends[0] for b in backends)  # one making
    assert backends[0] is not first
    backends[0].close()
    assert isinstance(ready, VLLMBackend)
    ready.close()


def _attempt(engine: Any) -> Any:
    try:
        return backend_for(engine)
    except Exception as exc:  # noqa: BLE001 - what the caller saw
        return exc
