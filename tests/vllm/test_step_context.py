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


def test_the_draft_length_vllm_asks_for_caps_the_step() -> None:
    """vLLM's dynamic speculative decoding lowers ``num_spec_tokens_to_schedule`` by batch
    size (and passes it to its own n-gram drafter): the proposer is asked for that many,
    and no draft is longer; 0 asks none; ``None`` leaves the drafter's ``k``."""
    import dataclasses

    from tests.vllm.fakes import ProbeProposer

    class KProbe(ProbeProposer):
        def __init__(self) -> None:
            super().__init__(draft_len=6)
            self.ks: list[int] = []

        def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
            self.ks.append(k)
            return super().propose(req_ids, k, step)

    probe = KProbe()
    session = DraftSession(probe, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("a", [1, 2, 3])
    for asked, want in ((2, 2), (None, 4), (9, 4), (0, None)):
        sampled = batch.sample({"a": [5]})
        ctx = dataclasses.replace(batch.ctx(), num_spec_tokens=asked)
        out = session.step(ctx, sampled, batch.n, batch.buf)  # type: ignore[arg-type]
        if want is None:
            assert out == [[]] and len(probe.ks) == 3  # not asked
        else:
            assert probe.ks[-1] == want and len(out[0]) == want
