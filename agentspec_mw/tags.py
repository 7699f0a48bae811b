"""Structure tags: what a request tells the proposer about the agent producing it.

A request carries ``S = {agent_id, query_id, blocks}`` (the AgentSpec paper's structure
tag) plus what this project adds: an isolation ``scope`` (tenant key: a request never
drafts from another scope's text), the predicted ``segment`` of the output, and its
membership in the redundancy graph (``group_id`` shared by fan-out siblings, repeats of a
node across loop steps and retries of one task).

**Scope-only tags.** ``agent_id`` and ``query_id`` are given together or not at all. With
neither (``None``), the tags name only an isolation scope (and optionally a segment,
blocks or a group): the proposer derives the agent and the query from the prompt as in
tag-free mode, inside that scope. On the wire, ``{"agentspec_v": 1, "agentspec_scope":
"t1"}`` alone is valid; this is what ``agentspec serve``'s scope binding injects into
requests that carry no tags.

On the wire (vLLM ``SamplingParams.extra_args`` or the OpenAI API's ``vllm_xargs``) values
must be flat ``str``/``int``/``float``; :func:`tags_to_wire` / :func:`tags_from_wire`
convert, with a version key and limits checked before anything is parsed (the whole tag
set at most :data:`MAX_WIRE_CHARS` characters, ``agentspec_blocks`` at most
:data:`MAX_BLOCKS_DEPTH` brackets deep). :func:`tags_from_wire` never raises anything but
:class:`TagError`, whatever the input. Block delimiters are checked exactly as the
proposer's block grammar checks them (1..:data:`MAX_DELIM_BYTES` UTF-8 bytes each, at
least one block when ``blocks`` is given), and every string must be encodable as UTF-8
(no lone surrogates), so tags that decode are tags every proposer can compile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentspec_mw.errors import TagError, validation_message

__all__ = [
    "MAX_BLOCKS",
    "MAX_DELIM_BYTES",
    "MAX_ID_CHARS",
    "MAX_WIRE_CHARS",
    "SEGMENTS",
    "Segment",
    "StructureTags",
    "WIRE_PREFIX",
    "WIRE_VERSION",
    "check_blocks",
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
"""Block kinds per tag set."""
MAX_DELIM_BYTES = 64
"""Longest block delimiter in UTF-8 bytes (the proposer's ``blocks.MAX_DELIM``)."""
MAX_WIRE_CHARS = 8192
"""Characters of all ``agentspec_`` keys and values of one request together."""
MAX_BLOCKS_DEPTH = 2
"""Bracket nesting of ``agentspec_blocks`` (a list of ``[start, end]`` lists)."""
_KNOWN = frozenset({"scope", "agent", "query", "segment", "blocks", "group", "group_kind"})


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} cannot be encoded as UTF-8 (a lone surrogate?): {text[:40]!r}"
        ) from None


def check_blocks(blocks: tuple[tuple[str, str], ...]) -> None:
    """Raise ``ValueError`` unless ``blocks`` is what the block grammar accepts: 1 to
    :data:`MAX_BLOCKS` pairs of delimiters of 1..:data:`MAX_DELIM_BYTES` UTF-8 bytes."""
    if not blocks:
        raise ValueError("blocks must hold at least one (start, end) pair; omit it for defaults")
    if len(blocks) > MAX_BLOCKS:
        raise ValueError(f"blocks holds {len(blocks)} pairs, over {MAX_BLOCKS}")
    for pair in blocks:
        for delim in pair:
            size = len(_utf8(delim, "a block delimiter"))
            if not 1 <= size <= MAX_DELIM_BYTES:
                raise ValueError(
                    f"block delimiters must be 1..{MAX_DELIM_BYTES} UTF-8 bytes, "
                    f"got {size} in {pair!r:.80}"
                )


class StructureTags(BaseModel):
    """Per-request structure tags (immutable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: str = Field(default="default", min_length=1, max_length=MAX_ID_CHARS)
    """Isolation scope (tenant key). History never crosses scopes. Not empty: ``""`` is a
    client's bug (an unset variable), refused as an empty agent or query is."""
    agent_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    """The agent (node + graph namespace) producing this output; ``None`` (with
    ``query_id=None``): derived from the prompt, as without tags (scope-only tags)."""
    query_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    """The user query / graph run this call serves; ``None`` exactly when ``agent_id`` is."""
    segment: Segment | None = None
    """Predicted kind of output: plan, tool_call, answer (observation for tool results)."""
    blocks: tuple[tuple[str, str], ...] | None = None
    """Block delimiters ``(start, end)``; ``None`` means the proposer's defaults."""
    group_id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    """Redundancy group: siblings of one fan-out, repeats of a node, retries of a task."""
    group_kind: GroupKind | None = None
    """How the members of ``group_id`` relate. Client-side only (routing keys, traces):
    :func:`tags_to_wire` leaves it out; one sent by an older client is still decoded."""

    @model_validator(mode="after")
    def _check(self) -> StructureTags:
        if (self.agent_id is None) != (self.query_id is None):
            raise ValueError(
                "agent_id and query_id go together: give both, or neither for scope-only tags "
                f"(got agent_id={self.agent_id!r:.60}, query_id={self.query_id!r:.60})"
            )
        for name in ("scope", "agent_id", "query_id", "group_id"):
            value = getattr(self, name)
            if value is not None:
                _utf8(value, name)
        if self.blocks is not None:
            check_blocks(self.blocks)
        # the size the server counts (JSON escapes grow the blocks: a '"' is 2 characters,
        # a non-ASCII one 6): tags it would refuse are refused here, where they are built
        wire = tags_to_wire(self)
        size = sum(len(k) - len(WIRE_PREFIX) + _wire_len(v) for k, v in wire.items())
        if size > MAX_WIRE_CHARS:
            raise ValueError(
                f"these tags are {size} characters on the wire, over {MAX_WIRE_CHARS} (the "
                "blocks' delimiters, JSON-escaped, take most): use fewer or shorter delimiters"
            )
        return self

    @property
    def scope_only(self) -> bool:
        """True when the tags name no agent and query (derive them from the prompt)."""
        return self.agent_id is None


def tags_to_wire(tags: StructureTags) -> dict[str, str | int | float]:
    """Encode tags as a flat ``{str: str|int|float}`` dict (keys prefixed ``agentspec_``;
    ``None`` fields are left out).

    ``group_kind`` is not sent: measured on held-out traces it would not change the
    proposer's survival estimate or choice of source (docs/experiments/headroom.md §4),
    and the server reads nothing else from it. ``segment`` is sent: the server labels its
    per-block acceptance metrics with it (:mod:`agentspec_mw_vllm.metrics`)."""
    out: dict[str, str | int | float] = {
        f"{WIRE_PREFIX}v": WIRE_VERSION,
        f"{WIRE_PREFIX}scope": tags.scope,
    }
    if tags.agent_id is not None:
        out[f"{WIRE_PREFIX}agent"] = tags.agent_id
    if tags.query_id is not None:
        out[f"{WIRE_PREFIX}query"] = tags.query_id
    if tags.segment is not None:
        out[f"{WIRE_PREFIX}segment"] = tags.segment
    if tags.blocks is not None:
        out[f"{WIRE_PREFIX}blocks"] = json.dumps([list(b) for b in tags.blocks])
    if tags.group_id is not None:
        out[f"{WIRE_PREFIX}group"] = tags.group_id
    return out  # group_kind stays client-side (routing, traces): no proposer reads it


def has_wire_tags(extra: Mapping[str, Any] | None) -> bool:
    """True when ``extra`` holds any ``agentspec_`` key."""
    return bool(extra) and any(str(key).startswith(WIRE_PREFIX) for key in extra)  # type: ignore[union-attr]


def _json_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of a JSON text, brackets inside strings not counted."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _decode_blocks(raw: str) -> tuple[tuple[str, str], ...]:
    depth = _json_depth(raw)
    if depth > MAX_BLOCKS_DEPTH:
        raise TagError(
            f"agentspec_blocks nests {depth} brackets deep, over {MAX_BLOCKS_DEPTH}: it must "
            'be a JSON list of [start, end] string pairs, e.g. [["<a>", "</a>"]]'
        )
    try:
        blocks = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, and e.g. over-long number literals
        raise TagError(f"agentspec_blocks is not JSON: {exc}") from None
    if not isinstance(blocks, list) or not all(
        isinstance(b, list) and len(b) == 2 and all(isinstance(s, str) for s in b) for b in blocks
    ):
        raise TagError("agentspec_blocks must be a JSON list of [start, end] string pairs")
    return tuple((b[0], b[1]) for b in blocks)


def _show(value: Any, limit: int = 60) -> str:
    """A short repr of a client-sent value (huge ints and failing reprs included)."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"<int of {value.bit_length()} bits>"
    try:
        return repr(value)[:limit]
    except Exception:
        return f"<{type(value).__name__}>"


def _wire_value(key: str, value: Any) -> str | int | float:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise TagError(f"agentspec_{key:.40}={_show(value)}: wire values must be str, int or float")
    return value


def _wire_len(value: str | int | float) -> int:
    """Characters of a wire value (an int's digits estimated when ``str`` would refuse)."""
    if isinstance(value, int) and value.bit_length() > 1000:
        return int(value.bit_length() * 0.30103) + 1
    return len(value) if isinstance(value, str) else len(str(value))


def _decode(extra: Mapping[str, Any]) -> StructureTags:
    ours = {
        str(k)[len(WIRE_PREFIX) :]: v for k, v in extra.items() if str(k).startswith(WIRE_PREFIX)
    }
    size = 0
    for key, value in ours.items():
        size += len(key) + _wire_len(_wire_value(key, value))
        if size > MAX_WIRE_CHARS:
            raise TagError(f"agentspec tags are {size}+ chars on the wire, over {MAX_WIRE_CHARS}")
    version = ours.pop("v", None)
    if version is None:
        raise TagError(
            f"agentspec_v is missing: tags need the version key, agentspec_v={WIRE_VERSION}"
        )
    if isinstance(version, str) and version.strip() == str(WIRE_VERSION):
        raise TagError(f"agentspec_v={_show(version)}: send the int {WIRE_VERSION}, not the string")
    if version != WIRE_VERSION:
        raise TagError(
            f"agentspec_v={_show(version)}: unsupported tag version (this build reads "
            f"{WIRE_VERSION})"
        )
    unknown = set(ours) - _KNOWN
    if unknown:
        names = sorted("agentspec_" + u[:40] for u in unknown)[:8]
        raise TagError(f"unknown agentspec tag keys: {names}")
    blocks = _decode_blocks(str(ours["blocks"])) if "blocks" in ours else None

    def text(key: str) -> str | None:
        value = ours.get(key)
        return None if value is None else str(value)

    try:
        return StructureTags(
            scope=str(ours.get("scope", "default")),
            agent_id=text("agent"),
            query_id=text("query"),
            segment=ours.get("segment"),  # type: ignore[arg-type]
            blocks=blocks,
            group_id=text("group"),
            group_kind=ours.get("group_kind"),  # type: ignore[arg-type]
        )
    except ValidationError as exc:
        raise TagError(f"invalid agentspec tags: {validation_message(exc)}") from None


@lru_cache(maxsize=1024)
def _decode_once(key: tuple[tuple[str, type, Any], ...]) -> StructureTags:
    """:func:`_decode` of the wire items ``(key, type, value)``, remembered for the last
    1,024 distinct tag sets (each at most :data:`MAX_WIRE_CHARS`; a refused one is not
    kept). The tags are immutable, so requests may share one."""
    return _decode({k: t(float(v)) if issubclass(t, float) else v for k, t, v in key})


def tags_from_wire(extra: Mapping[str, Any] | None) -> StructureTags | None:
    """Decode tags from a flat dict; ``None`` when it holds no ``agentspec_`` keys.

    Raises:
        TagError: unknown version, oversized, too deeply nested, non-flat or invalid
            values — and nothing else, for any input (an unexpected failure while
            decoding is reported as a :class:`TagError` too).
    """
    try:
        if not has_wire_tags(extra):
            return None
        assert extra is not None
        # a request's tags are mostly those of the agent's calls before it: decoded once.
        # The key holds each value's type (True == 1 == 1.0 would share an entry) and a
        # float's repr, numpy's float64 too (0.0 == -0.0, decoded "0.0" and "-0.0": two
        # scopes must not share)
        key = tuple(
            (str(k), v.__class__, float.__repr__(v) if isinstance(v, float) else v)
            for k, v in extra.items()
            if str(k).startswith(WIRE_PREFIX)
        )
        try:
            hash(key)
        except TypeError:  # an unhashable value, refused by the decoding
            return _decode(extra)
        return _decode_once(key)
    except TagError:
        raise
    except Exception as exc:  # defensive: hostile input must not escape as another type
        raise TagError(
            f"agentspec tags could not be decoded ({type(exc).__name__}: {exc!s:.120})"
        ) from None
