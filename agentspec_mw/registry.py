"""Resolve proposer names (``none``, ``ngram``, ``suffix``, ``agentspec``) or dotted paths.

A dotted path ``package.module.Class`` (or ``package.module:Class``) names any class that
implements :class:`~agentspec_mw.proposer.Proposer`. Classes are built as
``cls(env=ProposerEnv, **options)`` when their constructor takes ``env``, else
``cls(**options)``.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from pydantic import ValidationError

from agentspec_mw.errors import ProposerLoadError, validation_message
from agentspec_mw.proposer import Proposer, ProposerEnv

__all__ = ["BUILTIN_PROPOSERS", "make_proposer", "proposer_target", "resolve_proposer_class"]

BUILTIN_PROPOSERS: dict[str, str] = {
    "none": "agentspec_mw.peers.none:NoProposer",
    "ngram": "agentspec_mw.peers.ngram:NgramProposer",
    "suffix": "agentspec_mw.peers.suffix:SuffixProposer",
    "agentspec": "agentspec_mw.agentspec.proposer:AgentSpecProposer",
}


def proposer_target(spec: str) -> tuple[str, str]:
    """The ``(module, class name)`` a builtin name or a dotted path names, without importing
    anything (a cheap check of a name before an engine is built).

    Raises:
        ProposerLoadError: ``spec`` is neither.
    """
    target = BUILTIN_PROPOSERS.get(spec, spec)
    if ":" in target:
        module_name, _, attr = target.partition(":")
    elif "." in target:
        module_name, _, attr = target.rpartition(".")
    else:
        module_name, attr = "", ""
    # Absolute paths only: importlib takes '.x' as relative (TypeError) and '' as a ValueError.
    if not attr or not module_name or "" in module_name.split("."):
        raise ProposerLoadError(
            f"proposer {spec!r} is neither a builtin ({', '.join(BUILTIN_PROPOSERS)}) "
            "nor a dotted path like 'package.module.Class'"
        )
    return module_name, attr


def resolve_proposer_class(spec: str) -> type:
    """Return the class a builtin name or a dotted path names."""
    module_name, attr = proposer_target(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProposerLoadError(f"proposer {spec!r}: cannot import {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ProposerLoadError(f"proposer {spec!r}: {module_name!r} has no class {attr!r}")
    return cls


def make_proposer(spec: str, env: ProposerEnv | None = None, **options: Any) -> Proposer:
    """Build a proposer from a name or dotted path, checking it implements the interface."""
    cls = resolve_proposer_class(spec)
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    try:
        obj = cls(env=env or ProposerEnv(), **options) if "env" in params else cls(**options)
    except (TypeError, ValueError) as exc:
        reason = str(exc)
        if isinstance(exc, ValidationError):  # an options model's: one line, no input dump
            reason = validation_message(exc)
        raise ProposerLoadError(f"proposer {spec!r}: bad options {options!r}: {reason}") from exc
    except MemoryError as exc:  # e.g. an index sized past this machine's memory
        raise ProposerLoadError(
            f"proposer {spec!r}: options {options!r} need more memory than this machine has: "
            f"{exc or 'MemoryError'}"
        ) from exc
    if not isinstance(obj, Proposer):
        raise ProposerLoadError(
            f"proposer {spec!r}: {cls.__qualname__} lacks the Proposer verbs "
            "(name, start, extend, propose, stop)"
        )
    return obj
