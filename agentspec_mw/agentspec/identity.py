"""Who a request is: its isolation scope, agent and query group, and their index keys.

A request's identity comes from its tags; what the tags leave out (all of it without
tags) is derived from the prompt: the agent from a hash of its first few tokens, the
query group from a hash of a longer prefix. Each identity maps to a *key base* of the
history index (:class:`KeyBases`); index key = key base × ``NB`` + block id
(:mod:`.kernels`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from agentspec_mw.tags import StructureTags

__all__ = ["KeyBases", "identity"]


def _hash_ids(ids: np.ndarray) -> str:
    data = np.ascontiguousarray(ids, dtype=np.int32).tobytes()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def identity(
    prompt: np.ndarray, tags: StructureTags | None, agent_tokens: int, query_tokens: int
) -> tuple[str, str, str]:
    """``(scope, agent, group)`` of a request: from its tags; what they leave out (all of
    it without tags) derived from the prompt — the agent from its first ``agent_tokens``
    tokens, the query group from its first ``query_tokens`` — in scope ``default``
    without tags. Scope-only tags get the tag-free identity inside their scope."""
    if tags is None:
        scope = "default"
        agent_id = query_id = group_id = None
    else:
        scope = str(tags.scope)
        agent_id, query_id, group_id = tags.agent_id, tags.query_id, tags.group_id
    agent = str(agent_id) if agent_id else "anon:" + _hash_ids(prompt[:agent_tokens])
    if group_id:
        group = f"g:{group_id}"
    elif query_id:
        group = f"q:{query_id}"
    else:
        group = "anon:" + _hash_ids(prompt[:query_tokens])
    return scope, agent, group


class KeyBases:
    """Key bases of identities, least recently used forgotten past ``max_keys``.

    A forgotten identity's tokens become unreachable (a returning identity gets a new
    base) and are evicted from the index in turn.
    """

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._keys: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self._next = 0

    def __len__(self) -> int:
        return len(self._keys)

    def base(self, key: tuple[str, ...]) -> int:
        """The key base of ``key`` (a new one if it has none), marked most recent."""
        kid = self._keys.get(key)
        if kid is not None:
            self._keys.move_to_end(key)
            return kid
        kid = self._keys[key] = self._next
        self._next += 1
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return kid
