"""Typed, actionable errors raised by AgentSpec-MW."""

from __future__ import annotations

from pydantic import ValidationError


class AgentSpecError(Exception):
    """Base class of every error this package raises on purpose."""


class TraceFormatError(AgentSpecError, ValueError):
    """A trace record is malformed; the message names the file and the line."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: malformed trace record: {reason}")


class TagError(AgentSpecError, ValueError):
    """Structure tags (or their wire encoding) are malformed."""


class ProposerLoadError(AgentSpecError, ValueError):
    """A proposer name or dotted path could not be resolved to a proposer class."""


class ModelNotFoundError(AgentSpecError, ValueError):
    """A model name is neither a model folder nor a model id that can be loaded here."""


class MissingDependencyError(AgentSpecError, ImportError):
    """An optional dependency is not installed; the message says how to install it."""

    def __init__(self, package: str, feature: str, install: str) -> None:
        super().__init__(
            f"{feature} needs the package {package!r}, which is not installed. "
            f"Install it with: {install}"
        )


def validation_message(exc: ValidationError) -> str:
    """A pydantic ``ValidationError`` as one line: ``field: message`` per problem, joined
    by ``; ``, without pydantic's ``Value error,`` prefix, input dump and documentation
    link (what every ``agentspec`` command prints for a bad option, and what a malformed
    tag's ``TagError`` says: a client fixes every problem in one round trip)."""
    parts = []
    for e in exc.errors():
        where = ".".join(str(part) for part in e["loc"])
        msg = " ".join(str(e["msg"]).removeprefix("Value error, ").split())
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)
