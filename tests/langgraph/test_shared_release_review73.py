"""``shutdown(engine)`` unregisters a shared engine at once.

The registry of shared engines (``agentspec_mw_langgraph.shared``) used to keep a shut-down
engine -- its weights and KV cache -- until its next call swept it. It now leaves a hook on
each engine it registers (``_agentspec_on_shutdown``), which
``agentspec_mw_vllm.engine.shutdown`` calls once the engine is shut down. Fake engines only.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import agentspec_mw_langgraph.shared as shared
from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.shared import release_shared_engines, shared_engine
from agentspec_mw_vllm.engine import shutdown

from .fake_engine import FakeLLM

WAIT_S = 5.0  # only ever reached when the behaviour under test is broken
A, B = {"model": "a"}, {"model": "b"}


class _Engine:
    """A fake engine (the registry only needs an object that takes attributes)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1


class _Slotted:
    """An engine that refuses new attributes: it carries no hook."""

    __slots__ = ("shutdowns",)

    def __init__(self) -> None:
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1


def _registered() -> list[Any]:
    """The registry's engines, read without the sweep of its public functions."""
    with shared._lock:
        return [engine for _, _, engine in shared._engines]


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    release_shared_engines()
    yield
    release_shared_engines()


def test_shutdown_unregisters_the_engine_and_frees_it() -> None:
    engine = shared_engine(A, lambda: _Engine("a"))
    other = shared_engine(B, lambda: _Engine("b"))
    assert _registered() == [engine, other]
    ref = weakref.ref(engine)
    shutdown(engine)
    assert engine.shutdowns == 1
    assert _registered() == [other]  # no shared_engine call in between
    del engine
    gc.collect()
    assert ref() is None
    shutdown(other)
    shutdown(other)  # idempotent
    assert _registered() == []


def test_shutting_down_a_model_objects_engine_frees_it(builds: list[FakeLLM]) -> None:
    model = ChatAgentSpecVLLM()
    assert model.invoke("a").content == "engine1"
    ref = weakref.ref(builds[0])
    shutdown(model.engine)
    assert _registered() == []
    del model
    builds.clear()
    gc.collect()
    assert ref() is None  # weights and KV cache go with it
    assert ChatAgentSpecVLLM().invoke("b").content == "engine1"  # a new engine (n-th build)
    assert len(_registered()) == 1


def test_a_failing_hook_neither_fails_shutdown_nor_stops_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = shared_engine(A, lambda: _Engine("a"))
    seen: list[Any] = []

    def broken(_: Any) -> None:
        raise ValueError("hook failed")

    engine._agentspec_on_shutdown.insert(0, broken)
    engine._agentspec_on_shutdown.append(seen.append)
    shutdown(engine)
    assert seen == [engine] and _registered() == []
    assert engine.shutdowns == 1
    assert any("on-shutdown hook failed" in r.getMessage() for r in caplog.records)


def test_a_failed_shutdown_keeps_the_engine_for_release_to_retry() -> None:
    """A shutdown that raises (its engine loop still steps it) does not unregister it:
    ``release_shared_engines`` still shuts it down (unchanged behaviour)."""
    engine = shared_engine(A, lambda: _Engine("a"))
    stuck = SimpleNamespace(loop=SimpleNamespace(running=True), close=lambda: None)
    engine._agentspec_backend = stuck
    with pytest.raises(RuntimeError, match="still steps"):
        shutdown(engine)
    assert _registered() == [engine] and engine.shutdowns == 0
    stuck.loop.running = False
    release_shared_engines()
    assert engine.shutdowns == 1 and _registered() == []


def test_the_next_call_finishes_a_shutdown_that_raised() -> None:
    """``shutdown`` marks the engine before it can raise (its loop still steps it): the
    registry's next call drops the marked engine and shuts it down again, once the loop
    has stopped, instead of forgetting it with its core still running."""
    engine = shared_engine(A, lambda: _Engine("a"))
    stuck = SimpleNamespace(loop=SimpleNamespace(running=True), close=lambda: None)
    engine._agentspec_backend = stuck
    with pytest.raises(RuntimeError, match="still steps"):
        shutdown(engine)
    stuck.loop.running = False
    fresh = shared_engine(A, lambda: _Engine("a2"))
    assert fresh is not engine and engine.shutdowns == 1 and _registered() == [fresh]


def test_shutdown_under_the_registrys_lock_does_not_deadlock() -> None:
    """From a thread holding the lock (it is re-entrant), and from another thread while
    a third holds it (the hook waits for the lock, then drops the engine)."""
    first = shared_engine(A, lambda: _Engine("a"))
    with shared._lock:
        shutdown(first)
    assert _registered() == []

    second = shared_engine(A, lambda: _Engine("a2"))
    done = threading.Event()
    caller = threading.Thread(target=lambda: (shutdown(second), done.set()), daemon=True)
    with shared._lock:
        caller.start()
        assert not done.wait(0.2)  # the hook waits for the lock
    assert done.wait(WAIT_S), "shutdown deadlocked on the registry's lock"
    assert _registered() == []


def test_shutdown_from_a_build_drops_only_that_engine() -> None:
    """A build (run outside the lock) that shuts another shared engine down."""
    old = shared_engine(A, lambda: _Engine("a"))

    def build() -> Any:
        shutdown(old)
        return _Engine("b")

    new = shared_engine(B, build)
    assert _registered() == [new]
    # a dropped dead engine is shut down by the registry: its hook re-enters the registry
    new._agentspec_backend = SimpleNamespace(loop=SimpleNamespace(failure=RuntimeError("x")))
    replacement = shared_engine(B, lambda: _Engine("b2"))
    assert _registered() == [replacement] and new.shutdowns == 1


def test_an_engine_refusing_attributes_stays_until_released() -> None:
    """Unchanged: ``shutdown`` can neither mark it nor find a hook on it."""
    engine = shared_engine(A, _Slotted)
    shutdown(engine)
    assert engine.shutdowns == 1 and _registered() == [engine]
    release_shared_engines()
    assert _registered() == []
