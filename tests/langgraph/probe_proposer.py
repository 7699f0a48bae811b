"""A probe proposer for the real-engine test: records the tags each request arrives with.

It runs inside the engine (in this process: the embedded ``LLM`` has multiprocessing
off) and drafts the request's last token twice, so every agent gets verified drafts and
the engine's per-agent metrics have an entry for it. Drafts never change greedy output.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from agentspec_mw.proposer import Draft, StepContext, TokenIds
from agentspec_mw.tags import StructureTags

_lock = threading.Lock()
RECEIVED: list[StructureTags | None] = []
"""The tags of every request started, in order."""


class ProbeProposer:
    """Records tags at ``start``; drafts the last token repeated (at most 2 tokens)."""

    name = "probe"

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        with _lock:
            RECEIVED.append(tags)
        self._last[req_id] = int(prompt_ids[-1])

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        if len(token_ids):
            self._last[req_id] = int(token_ids[-1])

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        return [Draft((self._last.get(r, 0),) * min(k, 2)) for r in req_ids]

    def stop(self, req_id: str) -> None:
        self._last.pop(req_id, None)
