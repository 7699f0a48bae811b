"""One engine, one backend: the process-wide registry behind ``ChatAgentSpecVLLM``.

* :func:`backend_for` gives every model object on the same engine object the same backend
  (one engine loop per engine: two would step it at once). The backend is kept on the
  engine (attribute ``_agentspec_backend``), so it lives as long as the engine, and
  ``agentspec_mw_vllm.engine.shutdown(engine)`` closes it. It is made outside the
  registry's lock: callers for the same engine wait for that one making, the others go on.
* :func:`shared_engine` gives model objects that build their embedded engine
  (``engine=None``) with equal settings one engine per process: a planner and a writer
  on two ``ChatAgentSpecVLLM`` objects share one engine's steps and one proposer history.
  Settings that differ from an engine already built here build a second engine, with a
  warning naming the difference (two engines hold twice the memory and split the
  proposer's history). Builds are per settings: while one runs, callers with equal
  settings wait for it (one build per settings), callers with other settings do not.
* :func:`release_shared_engines` shuts the shared engines down (tests, or to free memory).

Settings are compared by their key (the chat model's: the effective build arguments,
``agentspec_mw_vllm.engine.engine_kwargs``), as a deep copy taken when
:func:`shared_engine` is called, so a nested option mutated later does not change what a
registered engine was built with.
A forked child starts with an empty registry (the parent's engines cannot serve it: their
engine loops are threads of the parent), and a fresh lock.

A registered engine is handed out only while it can serve: one that was shut down
(``agentspec_mw_vllm.engine.shutdown`` marks it with the attribute
``_agentspec_shut_down``) or whose backend reports it dead (its engine loop failed, its
``AsyncLLM`` died or its backend was closed) is dropped from the registry -- shut down
first, if it was not -- and :func:`shared_engine` builds a new one. ``shutdown`` drops
a registered engine at once: the registry puts a hook in the engine's list
``_agentspec_on_shutdown``, which ``shutdown`` calls once the engine is shut down, so
the registry holds no dead engine (its weights, its KV cache) until its next call. An
engine that refuses attributes carries neither the mark nor the hook (see below).

An engine that refuses attributes cannot carry its backend: the registry keeps the
backend (and the engine) until the backend is closed and no longer drives the engine
(its engine loop stopped), then forgets both at its next call; :func:`backend_for` makes
a new backend for such an engine after that. Shutting such an engine down here
(:func:`release_shared_engines`, or dropping a dead shared engine) closes its backend
too (``agentspec_mw_vllm.engine.shutdown`` alone cannot find it).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from agentspec_mw_langgraph.backend import BACKEND_ATTR, EngineBackend, VLLMBackend

__all__ = ["backend_for", "release_shared_engines", "shared_engine", "shared_engines"]

logger = logging.getLogger("agentspec_mw_langgraph.shared")

_ATTR = BACKEND_ATTR
#: Set (``True``) on an engine by ``agentspec_mw_vllm.engine.shutdown`` (the vLLM
#: integration does not import this package, so the name is shared, not imported).
_SHUT_DOWN_ATTR = "_agentspec_shut_down"
#: The engine's list of callables that ``agentspec_mw_vllm.engine.shutdown`` calls, each
#: with the engine, once it is shut down (the name is shared likewise).
_ON_SHUTDOWN_ATTR = "_agentspec_on_shutdown"
_lock = threading.RLock()  # guards the state below; held through no build or making
#: ``(key, settings, engine)`` of the engines built (keys are not hashable: a list).
_engines: list[tuple[Any, dict[str, Any], Any]] = []
#: The backends of engines that refuse attributes, by ``id(engine)`` (the engine is kept
#: so that the id is not reused while the entry lives); see the module doc.
_unattached: dict[int, tuple[Any, EngineBackend]] = {}


class _Build:
    """An engine being built for ``key`` (or a backend being made for the engine ``key``):
    callers with an equal key wait for it."""

    def __init__(self, key: Any, settings: dict[str, Any]) -> None:
        self.key = key
        self.settings = settings
        self.thread = threading.get_ident()
        self._done = threading.Event()

    def finish(self) -> None:
        self._done.set()

    def wait(self) -> None:
        self._done.wait()

    def wait_unless_mine(self, message: str) -> None:
        """Wait for it; raise ``RuntimeError(message)`` instead when the calling thread is
        the one doing it (it would wait for itself)."""
        if self.thread == threading.get_ident():
            raise RuntimeError(message)
        self.wait()


_building: list[_Build] = []  # the builds in flight
#: The backends being made by :func:`backend_for`, keyed by their engine (``_Build.key``).
_making: list[_Build] = []


def _make_backend(engine: Any) -> EngineBackend:
    """An ``AsyncLLM`` (async-generator ``generate``) or a ``vllm.LLM``."""
    import inspect

    if inspect.isasyncgenfunction(getattr(type(engine), "generate", None)):
        from agentspec_mw_langgraph.async_backend import AsyncVLLMBackend

        return AsyncVLLMBackend(engine)
    if not hasattr(engine, "llm_engine"):
        raise TypeError(
            f"engine={type(engine).__name__} is neither a vllm.LLM, a vLLM AsyncLLM nor an "
            "EngineBackend; pass one of those, or engine=None for the embedded default"
        )
    return VLLMBackend(engine)


def backend_for(engine: Any) -> EngineBackend:
    """The backend of ``engine`` (an :class:`EngineBackend` is its own), made once.

    The backend is made outside the registry's lock (a new ``VLLMBackend`` may wait up
    to its ``previous_loop_wait_s`` for a closed backend's engine loop to stop): callers
    for the same engine wait for that one making (one backend per engine), callers for
    other engines, and the registry's other functions, go on meanwhile. A making that
    raises registers nothing and raises in its own caller; the callers that waited for it
    then go on as if it had never started.

    Raises:
        TypeError: ``engine`` is not an engine this package can drive.
        RuntimeError: called while making the backend of the same engine (it would wait
            for itself).
    """
    if isinstance(engine, EngineBackend):
        return engine
    while True:
        with _lock:
            _prune_unattached()
            backend = getattr(engine, _ATTR, None)
            loop = getattr(backend, "loop", None)
            if backend is not None and not getattr(loop, "closed", False):
                return backend  # type: ignore[no-any-return]
            entry = _unattached.get(id(engine))
            if entry is not None and entry[0] is engine:
                return entry[1]
            pending = next((m for m in _making if m.key is engine), None)
            if pending is None:
                mine = _Build(engine, {})
                _making.append(mine)
                break
        pending.wait_unless_mine(  # then look again: its backend, or (it failed) none
            "backend_for was called while making the backend of the same engine (it "
            "would wait for itself)"
        )
    try:
        backend = _make_backend(engine)
        with _lock:
            try:
                setattr(engine, _ATTR, backend)
            except (AttributeError, TypeError):
                _unattached[id(engine)] = (engine, backend)
    finally:
        with _lock:
            _making.remove(mine)
        mine.finish()
    return backend


def _stopped(backend: Any) -> bool:
    """Whether ``backend`` was closed and no longer drives its engine (its engine loop,
    if it has one, has stopped: never two loops on one engine)."""
    loop = getattr(backend, "loop", None)
    if loop is not None:
        return getattr(loop, "closed", False) is True and not getattr(loop, "running", False)
    return getattr(backend, "closed", False) is True


def _prune_unattached() -> None:
    """Forget the backends of attribute-refusing engines that are closed (or that their
    engine carries after all) (call with ``_lock`` held)."""
    for key, (engine, backend) in list(_unattached.items()):
        if _stopped(backend) or getattr(engine, _ATTR, None) is backend:
            del _unattached[key]


def _difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(set(a) | set(b))
    return ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k))


def _registered_backend(engine: Any) -> Any:
    """The backend :func:`backend_for` made for ``engine`` (``None``: none yet)."""
    if isinstance(engine, EngineBackend):
        return engine
    backend = getattr(engine, _ATTR, None)
    if backend is None:
        entry = _unattached.get(id(engine))
        if entry is not None and entry[0] is engine:
            backend = entry[1]
    return backend


def _why_unusable(engine: Any) -> str | None:
    """Why a registered engine can serve no more requests, or ``None`` while it can."""
    if getattr(engine, _SHUT_DOWN_ATTR, False) is True:
        return "it was shut down"
    backend = _registered_backend(engine)
    if backend is None:
        return None
    loop = getattr(backend, "loop", None)
    failure = getattr(loop, "failure", None)
    if failure is not None:
        return f"its engine failed ({failure!r})"
    death = getattr(backend, "engine_death", None)  # an AsyncLLM's backend
    if callable(death):
        if getattr(backend, "closed", False) is True:
            return "its backend was closed"
        found = death()
        if found is not None:
            return f"its engine died ({found[0]})"
    return None


def _shutdown(engine: Any) -> None:
    """``agentspec_mw_vllm.engine.shutdown(engine)``, or close its backend without vLLM;
    the backend of an engine that refuses attributes (which ``shutdown`` cannot find) is
    closed first, and forgotten."""
    with _lock:
        entry = _unattached.get(id(engine))
    try:
        if entry is not None and entry[0] is engine:
            close = getattr(entry[1], "close", None)
            if close is not None:
                close()
    finally:
        try:
            from agentspec_mw_vllm.engine import shutdown
        except ImportError:  # a fake engine in tests without vLLM
            close_carried = getattr(_registered_backend(engine), "close", None)
            if close_carried is not None:
                close_carried()
        else:
            shutdown(engine)
        with _lock:
            _prune_unattached()


def _drop_unusable() -> list[Any]:
    """Forget the registered engines that can no longer serve (call with ``_lock``
    held); they are returned for :func:`_shut_down_dropped`, to call after the lock is
    released (a dead engine's shutdown may take seconds). One marked shut down is still
    registered only if its ``shutdown`` raised part-way (a shutdown that finished calls
    the registry's hook, which unregisters it): shutting it down again (idempotent)
    finishes the job instead of leaving its core running."""
    dropped = []
    for entry in list(_engines):
        why = _why_unusable(entry[2])
        if why is None:
            continue
        _engines.remove(entry)
        logger.warning(
            "dropped a shared embedded engine of ChatAgentSpecVLLM: %s; model objects "
            "created from now on get a new engine (make new model objects to leave it)",
            why,
        )
        dropped.append(entry[2])
    _prune_unattached()
    return dropped


def _shut_down_dropped(engines: list[Any]) -> None:
    """Shut down what :func:`_drop_unusable` dropped (call without ``_lock``)."""
    for engine in engines:
        try:
            _shutdown(engine)
        except Exception:  # noqa: BLE001 - a dead engine may fail to shut down
            logger.warning("shutting the dropped engine down failed", exc_info=True)


def _forget_shut_down(engine: Any) -> None:
    """The hook :func:`shared_engine` leaves on its engines: unregister ``engine`` (it was
    shut down). It takes only the registry's lock, briefly, and is called without it
    (``shutdown`` runs outside the lock; a thread holding it re-enters the ``RLock``)."""
    with _lock:
        _engines[:] = [entry for entry in _engines if entry[2] is not engine]


def _hook_shutdown(engine: Any) -> None:
    """Have ``shutdown(engine)`` call :func:`_forget_shut_down` (call with ``_lock``
    held); an engine that refuses attributes gets none (see the module doc)."""
    hooks = getattr(engine, _ON_SHUTDOWN_ATTR, None)
    if hooks is None:
        hooks = []
        try:
            setattr(engine, _ON_SHUTDOWN_ATTR, hooks)
        except (AttributeError, TypeError):
            return
    if isinstance(hooks, list) and _forget_shut_down not in hooks:
        hooks.append(_forget_shut_down)


def shared_engine(settings: dict[str, Any], build: Callable[[], Any], *, key: Any = None) -> Any:
    """The engine built here with settings equal to ``settings``, or ``build()``'s
    (remembered), with a warning when engines with other settings exist (or are being
    built) already. Registered engines that can no longer serve (shut down, failed, died)
    are dropped first (see the module doc).

    Settings are equal when their ``key`` is (``None``: ``settings`` is the key), e.g. the
    engine's effective build arguments; ``settings`` are what the warning names. Both are
    deep-copied.

    Builds are per settings, outside the registry's lock: a caller whose settings equal
    those of a build in flight waits for it and gets its engine (one build per
    settings); callers with other settings, or whose engine exists, go on meanwhile. A
    build that raises registers nothing and raises in its own caller; the callers that
    waited for it then go on as if it had never started (one of them builds with its
    ``build``, the others wait for that build), and so does any later caller.

    Raises:
        RuntimeError: called from the build of an engine with equal settings (it would
            wait for itself).
    """
    settings = copy.deepcopy(settings)
    key = settings if key is None else copy.deepcopy(key)
    while True:
        with _lock:
            dropped = _drop_unusable()
            found = next((engine for known, _, engine in _engines if known == key), None)
            pending = None
            if found is None:
                pending = next((b for b in _building if b.key == key), None)
            if found is None and pending is None:
                existing = [shown for _, shown, _ in _engines] + [b.settings for b in _building]
                if existing:
                    logger.warning(
                        "ChatAgentSpecVLLM builds embedded engine #%d in this process: its "
                        "settings differ from the existing engine's (%s). Each engine holds "
                        "its own memory and proposer history; give the model objects the "
                        "same settings (k, max_model_len, engine_options, model, "
                        "speculative) or one engine= to share one engine.",
                        len(existing) + 1,
                        _difference(settings, existing[0]),
                    )
                mine = _Build(key, settings)
                _building.append(mine)
        _shut_down_dropped(dropped)
        if found is not None:
            return found
        if pending is None:
            break
        pending.wait_unless_mine(  # then look again: its engine, or (it failed) none
            "shared_engine was called from its own build for the same settings "
            "(the build would wait for itself)"
        )
    try:
        engine = build()
    except BaseException:
        with _lock:
            _building.remove(mine)
        mine.finish()
        raise
    with _lock:
        _building.remove(mine)
        _engines.append((key, settings, engine))
        _hook_shutdown(engine)
    mine.finish()
    return engine


def _forget_after_fork() -> None:
    """In a forked child: forget the parent's engines, builds and backends (they cannot
    serve the child), and replace the lock (a parent's thread may have held it)."""
    global _lock
    _lock = threading.RLock()
    _engines.clear()
    _building.clear()
    _making.clear()
    _unattached.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_after_fork)


def shared_engines() -> list[Any]:
    """The embedded engines built through :func:`shared_engine` so far that are still
    registered (the ones that can no longer serve are dropped first)."""
    with _lock:
        dropped = _drop_unusable()
        engines = [engine for _, _, engine in _engines]
    _shut_down_dropped(dropped)
    return engines


def release_shared_engines() -> None:
    """Shut down and forget the shared embedded engines (model objects that hold one keep
    a dead engine: make new model objects afterwards). Builds in flight when it is called
    are waited for first, and their engines shut down too."""
    me = threading.get_ident()
    with _lock:
        builds = [b for b in _building if b.thread != me]
    for pending in builds:
        pending.wait()
    with _lock:
        engines = [engine for _, _, engine in _engines]
        _engines.clear()
    for engine in engines:
        _shutdown(engine)
