"""A proposer that always drafts ``k`` copies of token 0 (``fit_step_time.py --drafts``).

Greedy decoding of real text never emits token 0 after these prompts, so every draft is
rejected and a step emits one token per request: with drafts or without, a run takes the
same steps, and the steps' time differences are what the drafts cost the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentspec_mw.proposer import Draft, StepContext, TokenIds
from agentspec_mw.tags import StructureTags


class RejectedDrafts:
    """Drafts ``k`` tokens of id 0 for every request, every step."""

    name = "rejected-drafts"

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        """Nothing to remember."""

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        """Nothing to remember."""

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        """``k`` zeros per request."""
        draft = Draft(token_ids=(0,) * k, probs=(0.5,) * k)
        return [draft] * len(req_ids)

    def stop(self, req_id: str) -> None:
        """Nothing to release."""
