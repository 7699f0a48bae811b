"""One engine, one backend: the process-wide registry behind ``ChatAgentSpecVLLM``.

* :func:`backend_for` gives every model object on the same engine object the same backend
  (one engine loop per engine: two would step it at once). The backend is kept on the
  engine (attribute ``_agentspec_backend``), so it lives as long as the engine, and
  ``agentspec_mw_vllm.engine.shutdown(engine)`` closes it.
* :func:`shared_engine` gives model objects that build their embedded engine
  (``engine=None``) with equal settings one engine per process: a planner and a writer
  on two ``ChatAgentSpecVLLM`` objects share one engine's steps and one proposer history.
  Settings that differ from an engine already built here build a second engine, with a
  warning naming the difference (two engines hold twice the memory and split the
  proposer's history).
* :func:`release_shared_engines` shuts the shared engines down (tests, or to free memory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from agentspec_mw_langgraph.backend import BACKEND_ATTR, EngineBackend, VLLMBackend

__all__ = ["backend_for", "release_shared_engines", "shared_engine", "shared_engines"]

logger = logging.getLogger("agentspec_mw_langgraph.shared")

_ATTR = BACKEND_ATTR
_lock = threading.RLock()
_engines: list[tuple[dict[str, Any], Any]] = []
_unattached: dict[int, tuple[Any, EngineBackend]] = {}  # engines that refuse attributes


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

    Raises:
        TypeError: ``engine`` is not an engine this package can drive.
    """
    if isinstance(engine, EngineBackend):
        return engine
    with _lock:
        backend = getattr(engine, _ATTR, None)
        if backend is not None and not getattr(getattr(backend, "loop", None), "closed", False):
            return backend  # type: ignore[no-any-return]
        entry = _unattached.get(id(engine))
        if entry is not None and entry[0] is engine:
            return entry[1]
        backend = _make_backend(engine)
        try:
            setattr(engine, _ATTR, backend)
        except (AttributeError, TypeError):
            _unattached[id(engine)] = (engine, backend)
        return backend


def _difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(set(a) | set(b))
    return ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k))


def shared_engine(settings: dict[str, Any], build: Callable[[], Any]) -> Any:
    """The engine built here with ``settings``, or ``build()``'s (remembered), with a
    warning when engines with other settings exist already."""
    with _lock:  # one build at a time: a second caller with the same settings waits for it
        for known, engine in _engines:
            if known == settings:
                return engine
        if _engines:
            logger.warning(
                "ChatAgentSpecVLLM builds embedded engine #%d in this process: its settings "
                "differ from the existing engine's (%s). Each engine holds its own memory "
                "and proposer history; give the model objects the same settings (k, "
                "max_model_len, engine_options, model, speculative) or one engine= to share "
                "one engine.",
                len(_engines) + 1,
                _difference(settings, _engines[0][0]),
            )
        engine = build()
        _engines.append((dict(settings), engine))
        return engine


def shared_engines() -> list[Any]:
    """The embedded engines built through :func:`shared_engine` so far (still registered)."""
    with _lock:
        return [engine for _, engine in _engines]


def release_shared_engines() -> None:
    """Shut down and forget the shared embedded engines (model objects that hold one keep
    a dead engine: make new model objects afterwards)."""
    with _lock:
        engines = [engine for _, engine in _engines]
        _engines.clear()
    for engine in engines:
        try:
            from agentspec_mw_vllm.engine import shutdown
        except ImportError:  # a fake engine in tests without vLLM
            close = getattr(getattr(engine, _ATTR, None), "close", None)
            if close is not None:
                close()
            continue
        shutdown(engine)
