"""``none``: the no-speculation baseline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentspec_mw.proposer import EMPTY_DRAFT, Draft, StepContext, TokenIds

if TYPE_CHECKING:
    from agentspec_mw.tags import StructureTags


class NoProposer:
    """Never drafts: every step yields exactly one token."""

    name = "none"

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        """Nothing to remember."""

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        """Nothing to remember."""

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        """An empty draft per request."""
        return [EMPTY_DRAFT] * len(req_ids)

    def stop(self, req_id: str) -> None:
        """Nothing to release."""
