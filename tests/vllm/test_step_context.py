"""What DraftSession tells a proposer about the step (the StepContext it builds)."""

from __future__ import annotations

from collections.abc import Sequence

from agentspec_mw.proposer import EMPTY_DRAFT, Draft, StepContext
from agentspec_mw_vllm.metrics import DrafterMetrics
from agentspec_mw_vllm.session import DraftSession
from tests.vllm.fakes import ProbeProposer
from tests.vllm.test_session import Batch, step


class ContextProbe(ProbeProposer):
    """Records every StepContext it is given."""

    def __init__(self) -> None:
        super().__init__(draft_len=0)
        self.contexts: list[StepContext] = []

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        self.contexts.append(step)
        return [EMPTY_DRAFT] * len(req_ids)


def test_step_context_carries_the_budget_and_the_decode_tokens() -> None:
    probe = ContextProbe()
    session = DraftSession(probe, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("a", [1, 2, 3])
    batch.add("b", [7, 8])
    step(session, batch, {"a": [4], "b": [9]})
    ctx = probe.contexts[-1]
    assert ctx.max_num_batched_tokens == 512 and ctx.num_decode_tokens == 2
    assert ctx.batch_size == 2 and ctx.num_kv_tokens == 7
    assert ctx.num_prefill_tokens is None  # no count from the scheduler in this batch


def test_batch_size_counts_decoding_rows_not_asked_for_a_draft() -> None:
    """A request at its length limit gets no draft but still decodes in the step: it
    counts in ``batch_size`` and ``num_kv_tokens`` as in the replay (one meaning)."""
    probe = ContextProbe()
    session = DraftSession(probe, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("a", [1, 2, 3])
    batch.add("b", [7, 8])
    step(session, batch, {"a": [4], "b": [9]}, max_len=5)  # a: 4 tokens, no room to draft
    ctx = probe.contexts[-1]
    assert ctx.batch_size == 2 and ctx.num_decode_tokens == 2 and ctx.num_kv_tokens == 7
