"""The shared-engine registry (``agentspec_mw_langgraph.shared``) under concurrency: a
build blocks only the callers of its own settings (one build per settings), a failed
build wedges nothing, and the backends of engines that refuse attributes are forgotten
once closed. Fake engines and builders only (no vLLM); threads meet on events."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import agentspec_mw_langgraph.shared as shared
from agentspec_mw_langgraph.backend import VLLMBackend
from agentspec_mw_langgraph.shared import (
    backend_for,
    release_shared_engines,
    shared_engine,
    shared_engines,
)

from .fake_engine import FakeStepEngine

WAIT_S = 2.0  # only ever reached when the behaviour under test is broken


class _Engine:
    """A fake engine (the registry only needs an object that takes attributes)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"_Engine({self.name!r})"


class _SlottedLLM:
    """A ``vllm.LLM`` stand-in that refuses new attributes (no ``_agentspec_backend``)."""

    __slots__ = ("llm_engine",)

    def __init__(self) -> None:
        self.llm_engine = FakeStepEngine()

    def get_tokenizer(self) -> Any:
        return None


class _Builds:
    """Builders that record their calls; ``slow`` ones block until released."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def fast(self, name: str) -> Callable[[], Any]:
        def build() -> Any:
            with self._lock:
                self.calls.append(name)
            return _Engine(name)

        return build

    def slow(
        self, name: str, started: threading.Event, go: threading.Event, fail: bool = False
    ) -> Callable[[], Any]:
        def build() -> Any:
            with self._lock:
                self.calls.append(name)
            started.set()
            assert go.wait(WAIT_S), "the test never released the build"
            if fail:
                raise RuntimeError(f"build {name} failed")
            return _Engine(name)

        return build


class _Call(threading.Thread):
    """``fn()`` in a daemon thread; ``result`` or ``error`` once joined."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def outcome(self) -> Any:
        self.join(WAIT_S)
        assert not self.is_alive(), "the call is still blocked"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture()
def waiting(monkeypatch: pytest.MonkeyPatch) -> queue.SimpleQueue[str]:
    """Each caller that starts waiting for a build in flight puts its thread's name here."""
    seen: queue.SimpleQueue[str] = queue.SimpleQueue()

    class _ObservedBuild(shared._Build):
        def wait(self) -> None:
            seen.put(threading.current_thread().name)
            super().wait()

    monkeypatch.setattr(shared, "_Build", _ObservedBuild)
    return seen


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    release_shared_engines()
    yield
    release_shared_engines()


A, B, C = {"model": "a"}, {"model": "b"}, {"model": "c"}


# --- one build per settings, and only its callers wait ------------------------------


def test_a_slow_build_does_not_block_callers_of_other_settings() -> None:
    builds, started, go = _Builds(), threading.Event(), threading.Event()
    engine_c = shared_engine(C, builds.fast("c"))
    slow = _Call(lambda: shared_engine(A, builds.slow("a", started, go)))
    others = _Call(
        lambda: (
            shared_engine(B, builds.fast("b")),  # another model: built meanwhile
            shared_engine(C, builds.fast("c again")),  # built already: handed out
            shared_engines(),
        )
    )
    try:
        slow.start()
        assert started.wait(WAIT_S)
        others.start()
        others.join(WAIT_S)  # returns at once unless blocked behind the build of A
        assert not others.is_alive(), "a build of other settings blocked these callers"
        engine_b, again, registered = others.outcome()
    finally:
        go.set()
    engine_a = slow.outcome()
    assert again is engine_c and registered == [engine_c, engine_b]
    assert [e.name for e in (engine_a, engine_b, engine_c)] == ["a", "b", "c"]
    assert sorted(builds.calls) == ["a", "b", "c"]
    assert shared_engines() == [engine_c, engine_b, engine_a]


def test_callers_of_one_settings_wait_for_its_one_build(
    waiting: queue.SimpleQueue[str],
) -> None:
    builds, started, go = _Builds(), threading.Event(), threading.Event()
    first = _Call(lambda: shared_engine(A, builds.slow("a", started, go)))
    later = [_Call(lambda: shared_engine(dict(A), builds.fast("dup"))) for _ in range(3)]
    try:
        first.start()
        assert started.wait(WAIT_S)
        for call in later:
            call.start()
        names = {waiting.get(timeout=WAIT_S) for _ in later}  # all three wait for it
        assert names == {call.name for call in later}
    finally:
        go.set()
    engine = first.outcome()
    assert all(call.outcome() is engine for call in later)
    assert builds.calls == ["a"] and shared_engines() == [engine]


def test_a_failed_build_wedges_nothing_its_waiters_build_again(
    waiting: queue.SimpleQueue[str],
) -> None:
    builds, started, go = _Builds(), threading.Event(), threading.Event()
    first = _Call(lambda: shared_engine(A, builds.slow("a", started, go, fail=True)))
    second = _Call(lambda: shared_engine(A, builds.fast("a retried")))
    try:
        first.start()
        assert started.wait(WAIT_S)
        second.start()
        assert waiting.get(timeout=WAIT_S) == second.name
    finally:
        go.set()
    with pytest.raises(RuntimeError, match="build a failed"):
        first.outcome()  # the error goes to the caller whose build raised
    engine = second.outcome()  # a waiter is woken and builds with its own builder
    assert engine.name == "a retried" and shared_engines() == [engine]
    assert shared_engine(A, builds.fast("unused")) is engine
    assert builds.calls == ["a", "a retried"]


def test_a_failed_build_with_no_waiter_lets_the_next_caller_build() -> None:
    def broken() -> Any:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        shared_engine(A, broken)
    assert shared_engines() == []
    assert shared_engine(A, lambda: _Engine("a")).name == "a"


def test_a_dead_shared_engine_is_replaced_by_one_build() -> None:
    builds = _Builds()
    old = shared_engine(A, builds.fast("a1"))
    old._agentspec_shut_down = True  # what agentspec_mw_vllm.engine.shutdown marks
    calls = [_Call(lambda: shared_engine(A, builds.fast("a2"))) for _ in range(4)]
    for call in calls:
        call.start()
    new = calls[0].outcome()
    assert new.name == "a2" and all(call.outcome() is new for call in calls)
    assert builds.calls == ["a1", "a2"] and shared_engines() == [new]


def test_a_dead_engines_slow_shutdown_does_not_block_other_callers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller that drops a dead engine shuts it down after releasing the registry's
    lock: callers of other settings go on meanwhile (they waited for the shutdown)."""
    builds, started, go = _Builds(), threading.Event(), threading.Event()
    dead = shared_engine(A, builds.fast("a"))
    shut: list[Any] = []

    def slow_shutdown(engine: Any) -> None:
        started.set()
        assert go.wait(WAIT_S), "the test never released the shutdown"
        shut.append(engine)

    monkeypatch.setattr(shared, "_shutdown", slow_shutdown)
    monkeypatch.setattr(shared, "_why_unusable", lambda e: "it died" if e is dead else None)
    dropping = _Call(lambda: shared_engine(A, builds.fast("a2")))
    other = _Call(lambda: shared_engine(B, builds.fast("b")))
    try:
        dropping.start()
        assert started.wait(WAIT_S)
        other.start()
        assert other.outcome().name == "b"  # while the dead engine's shutdown runs
        assert shut == []
    finally:
        go.set()
    assert dropping.outcome().name == "a2" and shut == [dead]


def test_a_build_asking_for_its_own_settings_raises_instead_of_hanging() -> None:
    def build() -> Any:
        return shared_engine(A, lambda: _Engine("inner"))

    with pytest.raises(RuntimeError, match="its own build"):
        shared_engine(A, build)
    assert shared_engines() == []


def test_release_waits_for_builds_in_flight_and_shuts_their_engines_down(
    waiting: queue.SimpleQueue[str],
) -> None:
    builds, started, go = _Builds(), threading.Event(), threading.Event()
    slow = _Call(lambda: shared_engine(A, builds.slow("a", started, go)))
    release = _Call(release_shared_engines)
    try:
        slow.start()
        assert started.wait(WAIT_S)
        release.start()
        assert waiting.get(timeout=WAIT_S) == release.name
    finally:
        go.set()
    engine = slow.outcome()
    release.outcome()
    assert getattr(engine, "_agentspec_shut_down", False) is True
    assert shared_engines() == []


# --- backends of engines that refuse attributes ---------------------------------------


def _unattached_entry(engine: Any) -> Any:
    entry = shared._unattached.get(id(engine))
    return entry[1] if entry is not None and entry[0] is engine else None


def test_a_closed_backend_of_an_attribute_refusing_engine_is_forgotten() -> None:
    engines = [_SlottedLLM() for _ in range(20)]
    backends = [backend_for(engine) for engine in engines]
    assert all(isinstance(b, VLLMBackend) for b in backends)
    assert backend_for(engines[0]) is backends[0]  # made once while open
    assert all(_unattached_entry(e) is b for e, b in zip(engines, backends, strict=True))
    for backend in backends:
        backend.close()
    fresh = backend_for(engines[0])  # like an engine carrying it: a fresh one after close
    assert fresh is not backends[0] and not fresh.loop.closed  # type: ignore[attr-defined]
    assert [_unattached_entry(e) for e in engines] == [fresh] + [None] * 19
    fresh.close()


def test_releasing_an_attribute_refusing_shared_engine_closes_and_forgets_its_backend() -> None:
    engine = shared_engine(A, _SlottedLLM)
    backend = backend_for(engine)
    assert _unattached_entry(engine) is backend
    release_shared_engines()
    assert backend.loop.closed  # type: ignore[attr-defined]
    assert _unattached_entry(engine) is None
