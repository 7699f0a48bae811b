"""Configuration of the LangGraph adapter (one validated object): :class:`TaggingConfig`.

It was called ``AgentSpecConfig`` before; that name clashed with the proposer's
``agentspec_mw.agentspec.config.AgentSpecConfig`` and still imports here, with a
``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentspec_mw.tags import Segment, check_blocks
from agentspec_mw.traces.schema import check_workload_name
from agentspec_mw_langgraph.routing import ROUTING_HEADER, RoutingGranularity, check_header_name

__all__ = ["TaggingConfig"]


class TaggingConfig(BaseModel):
    """How :func:`~agentspec_mw_langgraph.with_agentspec` (and
    :class:`~agentspec_mw_langgraph.middleware.AgentSpecMiddleware`) tag LLM calls."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    tags_scope: str = Field(default="default", min_length=1, max_length=256)
    """Isolation scope put on every tag (tenant key): history never crosses scopes."""
    tags_blocks: tuple[tuple[str, str], ...] | None = None
    """Block delimiters for every call; ``None`` derives them per call (see docs/langgraph.md)."""
    tags_segment_by_node: dict[str, Segment] = Field(default_factory=dict)
    """Node name -> segment: overrides the predicted segment for that node's calls."""
    tags_query_from_thread: bool = True
    """Use the run's ``thread_id`` as query id when it has one (else the root run id)."""
    adapter_raise_errors: bool = False
    """Re-raise adapter failures (tests); by default a failure means no tags + a warning."""
    graph_history: int = Field(default=64, ge=0)
    """How many finished queries' redundancy graphs the handler keeps for inspection."""
    graph_max_calls: int = Field(default=4096, ge=1)
    """Calls kept per query's redundancy graph; later ones are only counted (``dropped``)."""
    trace_path: Path | None = None
    """Append every LLM call to this JSONL file (the ``TraceRecord`` schema); ``None``: off."""
    trace_workload: str = Field(default="langgraph", min_length=1)
    """The ``workload`` field of recorded traces (not ``ALL``: the replay's pooled rows)."""
    routing_granularity: RoutingGranularity = "query"
    """Which calls share a replica behind a router (the ``routing_header`` value): ``query``
    (scope + query: a query's agents, fan-out siblings, retries and repeats draft from one
    proposer), ``fanout`` (each ``Send`` fan-out's calls apart from the rest of its query:
    more balance, less shared history), ``tenant`` (the scope: most shared history, least
    balance) or ``off`` (no header). See :mod:`~agentspec_mw_langgraph.routing`."""
    routing_header: str = ROUTING_HEADER
    """The request header that carries the routing key (``x-session-id``: vllm-router's
    ``consistent_hash``; ``x-dynamo-session-id``: NVIDIA Dynamo)."""

    @field_validator("routing_header")
    @classmethod
    def _check_header(cls, v: str) -> str:
        return check_header_name(v)

    @field_validator("trace_workload")
    @classmethod
    def _check_workload(cls, v: str) -> str:
        # as a TraceRecord checks it: else every record would fail at the end of its call
        return check_workload_name(v)

    @field_validator("tags_blocks")
    @classmethod
    def _check_blocks(
        cls, v: tuple[tuple[str, str], ...] | None
    ) -> tuple[tuple[str, str], ...] | None:
        if v is not None:
            check_blocks(v)  # what the wire and the proposer's block grammar accept
        return v


def deprecated_alias(stacklevel: int = 2) -> type[TaggingConfig]:
    """:class:`TaggingConfig`, with the ``DeprecationWarning`` of its old name."""
    warnings.warn(
        "agentspec_mw_langgraph.AgentSpecConfig is now TaggingConfig (the old name clashed "
        "with the proposer's agentspec_mw.agentspec.config.AgentSpecConfig); import "
        "TaggingConfig instead",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
    return TaggingConfig


def __getattr__(name: str) -> Any:
    """``AgentSpecConfig``: the deprecated name of :class:`TaggingConfig`."""
    if name == "AgentSpecConfig":
        return deprecated_alias()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
