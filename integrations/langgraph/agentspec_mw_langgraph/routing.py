"""Routing keys: keep the requests that draft from each other on one replica.

AgentSpec's drafting history lives in each engine's proposer. Behind a router that spreads
requests over several vLLM replicas, a query whose agents, fan-out siblings, retries and
repeats land on different replicas drafts from a fraction of its own history. Routers
already route by a key: ``vllm-router --policy consistent_hash`` hashes the
``x-session-id`` header (then ``x-user-id``, ``x-tenant-id``...). The adapter sends that
header on every request of a tagged call, derived from the call's tags at the granularity
of :attr:`TaggingConfig.routing_granularity
<agentspec_mw_langgraph.config.TaggingConfig.routing_granularity>`:

* ``"query"`` (default): isolation scope + query id. A query's agents, fan-out siblings,
  retries and repeats share a replica; different queries spread over the replicas.
* ``"fanout"``: the calls of a ``Send`` fan-out's siblings get scope + query + that
  fan-out (every call of a sibling: also the turns of a subgraph it runs), so different
  fan-outs of one query may go to different replicas; other calls
  (and retries, whose group is the retry) get the query key. More spread for queries with
  several wide fan-outs, less history shared between a fan-out and the rest of its query.
* ``"tenant"``: the scope alone. Most shared history (repeats across queries of a tenant),
  least balance: one busy tenant loads one replica.
* ``"off"``: no header (the router's own policy decides).

The key is a hash (``as-`` + 32 hex digits) of those fields, not the fields themselves:
header values must be ASCII and a router's logs need not see tenant or query names.
Plain clients set the same header with :func:`routing_headers`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from agentspec_mw.tags import StructureTags

__all__ = [
    "ROUTING_HEADER",
    "RoutingGranularity",
    "check_header_name",
    "routing_headers",
    "routing_key",
    "tags_routing_key",
]

RoutingGranularity = Literal["query", "fanout", "tenant", "off"]
ROUTING_HEADER = "x-session-id"
"""The header ``vllm-router``'s ``consistent_hash`` policy reads first."""
_TOKEN = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP header name (RFC 9110 token)
_SEP = "\x1f"  # unit separator: no field boundary ambiguity


def check_header_name(name: str) -> str:
    """``name`` if it is a valid HTTP header name.

    Raises:
        ValueError: ``name`` is empty or holds characters a header name cannot.
    """
    if not _TOKEN.match(name):
        raise ValueError(
            f"routing_header={name!r} is not an HTTP header name: use letters, digits and "
            "'-', e.g. 'x-session-id' (vllm-router) or 'x-dynamo-session-id' (Dynamo)"
        )
    return name


def routing_key(
    scope: str,
    query_id: str | None = None,
    group_id: str | None = None,
    *,
    granularity: RoutingGranularity = "query",
) -> str | None:
    """The routing key of a request (see the module docstring); ``None`` for ``"off"``.

    Args:
        scope: the isolation scope (tenant key) of the request's tags.
        query_id: the query it serves (``None``: the scope alone is the key).
        group_id: its fan-out group, used at ``"fanout"`` granularity only.
        granularity: ``"query"``, ``"fanout"``, ``"tenant"`` or ``"off"``.

    Raises:
        ValueError: ``granularity`` is none of those.
    """
    if granularity == "off":
        return None
    if granularity == "tenant" or query_id is None:
        parts = [scope]
    elif granularity == "query":
        parts = [scope, query_id]
    elif granularity == "fanout":
        parts = [scope, query_id] if group_id is None else [scope, query_id, group_id]
    else:
        raise ValueError(
            f"routing granularity {granularity!r} is not one of 'query', 'fanout', 'tenant', 'off'"
        )
    digest = hashlib.sha256(_SEP.join(parts).encode()).hexdigest()[:32]
    return f"as-{digest}"


def tags_routing_key(
    tags: StructureTags, granularity: RoutingGranularity, *, fanout: str | None = None
) -> str | None:
    """:func:`routing_key` of a call's tags. Only ``fanout`` groups count as groups, and
    as the fan-out, not the call's position in a sibling: ``fanout`` names it (the handler
    passes its step template up to the level the siblings were pushed at, so a sibling's
    calls at inner steps, e.g. the turns of a subgraph it runs, stay with the fan-out);
    without it, the group id less the handler's ``...#<ordinal>`` suffix."""
    group = tags.group_id if tags.group_kind == "fanout" else None
    if group is not None and fanout is not None:
        group = fanout
    elif group is not None:
        head, _, ordinal = group.rpartition("#")
        group = head if head and ordinal.isdigit() else group
    return routing_key(tags.scope, tags.query_id, group, granularity=granularity)


def routing_headers(
    scope: str,
    query_id: str | None = None,
    group_id: str | None = None,
    *,
    granularity: RoutingGranularity = "query",
    header: str = ROUTING_HEADER,
) -> dict[str, str]:
    """The header a plain client sends so that a router keeps its query on one replica.

    ``client.chat.completions.create(..., extra_headers=routing_headers("tenant-a",
    "q-17"))``; ``{}`` for ``granularity="off"``. Arguments as in :func:`routing_key`.

    Raises:
        ValueError: ``header`` is not a header name, or ``granularity`` is unknown.
    """
    key = routing_key(scope, query_id, group_id, granularity=granularity)
    return {} if key is None else {check_header_name(header): key}
