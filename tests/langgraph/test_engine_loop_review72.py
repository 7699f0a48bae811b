"""Review 72: an interrupt while the engine loop starts its thread leaves a loop that
still serves the next call."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from agentspec_mw_langgraph.batching import EngineLoop

from .fake_engine import FakeStepEngine


def test_an_interrupt_before_the_loop_thread_starts_leaves_a_working_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = EngineLoop(FakeStepEngine(lambda ids: "ok"))
    real_start = threading.Thread.start
    calls = {"n": 0}

    def start(self: threading.Thread) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt  # Ctrl-C just before the thread starts
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(KeyboardInterrupt):
        loop.submit({"prompt_token_ids": [1, 2]}, None, lambda out: None)
    got: queue.SimpleQueue[Any] = queue.SimpleQueue()
    loop.submit({"prompt_token_ids": [1, 2]}, None, got.put)
    out = got.get(timeout=10)  # before: no thread ever served the inbox (queue.Empty)
    while not (isinstance(out, BaseException) or out.finished):
        out = got.get(timeout=10)
    assert not isinstance(out, BaseException) and out.outputs[0].text == "ok"
    assert loop.close(timeout=10)
