"""AgentSpec given only what vLLM's model runner can give it: no waiting queue, no KV pool.

In the replay the budget sees the prompt tokens waiting and the free KV
(``StepContext.num_prefill_tokens`` / ``kv_capacity_tokens`` / ``num_free_kv_tokens``); the
vLLM adapter passes ``None`` for them (docs/agentspec.md, "What a draft displaces"). This
proposer hides them, so a replay shows what the replay's knowledge is worth::

    PYTHONPATH=benchmarks agentspec replay --traces T --tokenizer TOK \\
        --proposers _blind_queue.AgentSpecBlind --batch 32 --k 16 --cost-model llama8b-h100-roofline
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agentspec_mw.agentspec.proposer import AgentSpecProposer
from agentspec_mw.proposer import Draft, StepContext


class AgentSpecBlind(AgentSpecProposer):
    """:class:`AgentSpecProposer` blind to the waiting queue and the KV pool, as in vLLM."""

    name = "agentspec_blind"

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        """Drafts for ``req_ids`` from a step context without the queue and the KV pool."""
        blind = replace(
            step, num_prefill_tokens=None, kv_capacity_tokens=None, num_free_kv_tokens=None
        )
        return super().propose(req_ids, k, blind)
