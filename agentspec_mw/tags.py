"""Structure tags: what a request tells the proposer about the agent producing it.

A request carries ``S = {agent_id, query_id, blocks}`` (the AgentSpec paper's structure
tag) plus what this project adds: an isolation ``scope`` (tenant key: a request never
drafts from another scope's text), the predicted ``segment`` of the output, and its
membership in the redundancy graph (``group_id`` shared by fan-out siblings, repeats of a
node across loop steps and retries of one task).

On the wire (vLLM ``SamplingParams.extra_args`` or the OpenAI API's ``vllm_xargs``) values
must be flat ``str``/``int``/``float``; :func:`tags_to_wire` / :func:`tags_from_wire`
convert, with a version key and size limits. Malformed input raises :class:`TagError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentspec_mw.errors import TagError

__all__ = [
    "SEGMENTS",
    "Segment",
    "StructureTags",
    "WIRE_PREFIX",
    "WIRE_VERSION",
    "tags_from_wire",
    "tags_to_wire",
]

Segment = Literal["plan", "tool_call", "observation", "answer", "other"]
SEGMENTS: tuple[str, ...] = ("plan", "tool_call", "observation", "answer", "other")
GroupKind = Literal["fanout", "repeat", "retry"]

WIRE_VERSION = 1
WIRE_PREFIX = "agentspec_"
MAX_ID_CHARS = 256
MAX_BLOCKS = 32
MAX_DELIM_CHARS = 64
MAX_WIRE_CHARS = 8192


class StructureTags(BaseModel):
    """Per-request structure tags (immutable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: str = Field(default="default", max_length=MAX_ID_CHARS)
    """Isolation scope (tenant key). History never crosses scopes."""
    agent_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    """The agent (node + graph namespace) producing this output."""
    query_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    """The user query / graph run this call serves."""
    segment: Segment | None = None
    """Predicted kind of output: plan, tool_call, answer (observation for tool results)."""
    blocks: tuple[tuple[str, str], ...] | None = Field(default=None, max_length=MAX_BLOCKS)
    """Block delimiters ``(start, end)``; ``None`` means the proposer's defaults."""
    group_id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    """Redundancy group: siblings of one fan-out, repeats of a node, retries of a task."""
    group_kind: GroupKind | None = None
    """How the members of ``group_id`` relate."""

    @field_validator("blocks")
    @classmethod
    def _check_blocks(
        cls, v: tuple[tuple[str, str], ...] | None
    ) -> tuple[tuple[str, str], ...] | None:
        if v is None:
            return v
        for start, end in v:
            if not start or not end:
                raise ValueError(f"block delimiters must be non-empty, got {(start, end)!r}")
            if len(start) > MAX_DELIM_CHARS or len(end) > MAX_DELIM_CHARS:
                raise ValueError(f"block delimiter longer than {MAX_DELIM_CHARS} chars")
        return v


def tags_to_wire(tags: StructureTags) -> dict[str, str | int | float]:
    """Encode tags as a flat ``{str: str|int|float}`` dict (keys prefixed ``agentspec_``)."""
    out: dict[str, str | int | float] = {
        f"{WIRE_PREFIX}v": WIRE_VERSION,
        f"{WIRE_PREFIX}scope": tags.scope,
        f"{WIRE_PREFIX}agent": tags.agent_id,
        f"{WIRE_PREFIX}query": tags.query_id,
    }
    if tags.segment is not None:
        out[f"{WIRE_PREFIX}segment"] = tags.segment
    if tags.blocks is not None:
        out[f"{WIRE_PREFIX}blocks"] = json.dumps([list(b) for b in tags.blocks])
    if tags.group_id is not None:
        out[f"{WIRE_PREFIX}group"] = tags.group_id
    if tags.group_kind is not None:
        out[f"{WIRE_PREFIX}group_kind"] = tags.group_kind
    return out


def has_wire_tags(extra: Mapping[str, Any] | None) -> bool:
    """True when ``extra`` holds any ``agentspec_`` key."""
    return bool(extra) and any(str(key).startswith(WIRE_PREFIX) for key in extra)  # type: ignore[union-attr]


def tags_from_wire(extra: Mapping[str, Any] | None) -> StructureTags | None:
    """Decode tags from a flat dict; ``None`` when it holds no ``agentspec_`` keys.

    Raises:
        TagError: unknown version, oversized, non-flat or invalid values.
    """
    if not has_wire_tags(extra):
        return None
    assert extra is not None
    ours = {k[len(WIRE_PREFIX) :]: v for k, v in extra.items() if str(k).startswith(WIRE_PREFIX)}
    size = sum(len(str(k)) + len(str(v)) for k, v in ours.items())
    if size > MAX_WIRE_CHARS:
        raise TagError(f"agentspec tags are {size} chars on the wire, over {MAX_WIRE_CHARS}")
    for key, value in ours.items():
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise TagError(f"agentspec_{key}={value!r}: wire values must be str, int or float")
    version = ours.pop("v", None)
    if version != WIRE_VERSION:
        raise TagError(
            f"agentspec_v={version!r}: unsupported tag version (this build reads {WIRE_VERSION})"
        )
    known = {"scope", "agent", "query", "segment", "blocks", "group", "group_kind"}
    unknown = set(ours) - known
    if unknown:
        raise TagError(f"unknown agentspec tag keys: {sorted('agentspec_' + u for u in unknown)}")
    blocks: Any = None
    if "blocks" in ours:
        try:
            blocks = json.loads(str(ours["blocks"]))
        except json.JSONDecodeError as exc:
            raise TagError(f"agentspec_blocks is not JSON: {exc}") from None
        if not isinstance(blocks, list) or not all(
            isinstance(b, list) and len(b) == 2 and all(isinstance(s, str) for s in b)
            for b in blocks
        ):
            raise TagError("agentspec_blocks must be a JSON list of [start, end] string pairs")
        blocks = tuple((b[0], b[1]) for b in blocks)
    try:
        return StructureTags(
            scope=str(ours.get("scope", "default")),
            agent_id=str(ours.get("agent", "")),
            query_id=str(ours.get("query", "")),
            segment=ours.get("segment"),  # type: ignore[arg-type]
            blocks=blocks,
            group_id=None if ours.get("group") is None else str(ours["group"]),
            group_kind=ours.get("group_kind"),  # type: ignore[arg-type]
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise TagError(f"invalid agentspec tags: {loc}: {first['msg']}") from None
