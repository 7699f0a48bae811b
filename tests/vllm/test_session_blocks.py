"""The session's block lookups after ``propose``, and its one ``extend_many`` a step, change
no draft and no metric.

The references are the session without them: every verified row asks the real AgentSpec
proposer for its block at verification (``block_of`` applies the queued calls first), or
every request's tokens go in an ``extend`` of their own. A synthetic engine with churn
(requests leave and new ones start in the same steps, with verified drafts) runs the
sessions side by side."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.tags import StructureTags, tags_to_wire
from agentspec_mw_vllm.context import BatchContext
from agentspec_mw_vllm.metrics import DrafterMetrics
from agentspec_mw_vllm.session import DraftSession

TOKEN_BYTES = [bytes([i]) for i in range(256)]  # token id = byte
WIDTH = 1024


class _NoKeptBlocks(DraftSession):
    """The session as it was: no blocks read after ``propose``."""

    def _keep_blocks(self, ask_ids: list[str], ask_rows: list[int], out: list[list[int]]) -> None:
        return None


class _OneByOne:
    """AgentSpec without ``extend_many``: the session feeds each request alone."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.start, self.extend, self.stop = inner.start, inner.extend, inner.stop
        self.propose, self.block_of = inner.propose, inner.block_of


def _calls() -> list[tuple[str, list[int], list[int], StructureTags]]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(36):
        city = ["Paris", "Rome", "Oslo"][int(rng.integers(0, 3))]
        n = int(rng.integers(1, 4))
        text = "Thought: I need the weather.\n" + "".join(
            f'<tool_call>{{"name": "weather", "arguments": {{"city": "{city}"}}}}</tool_call>\n'
            for _ in range(n)
        )
        prompt = f"You are agent {i % 3}. Task {i}: weather in {city}.\n"
        tags = StructureTags(agent_id=f"agent{i % 3}", query_id=f"q{i // 6}", segment="plan")
        out.append((f"r{i}", list(prompt.encode()), list(text.encode()), tags))
    return out


@dataclass
class _Row:
    rid: str
    plen: int
    out: list[int]
    wire: dict[str, str | int | float]
    pos: int = 1
    draft: list[int] = field(default_factory=list)


def _run(
    session_cls: type[DraftSession], batched: bool = True
) -> tuple[list[list[list[int]]], DrafterMetrics, int]:
    env = ProposerEnv(token_bytes=TOKEN_BYTES, cost_model=get_cost_model("llama8b-h100"), max_k=8)
    metrics = DrafterMetrics(prometheus=False)
    proposer = make_proposer("agentspec", env)
    session = session_cls(
        proposer if batched else _OneByOne(proposer),  # type: ignore[arg-type]
        8,
        metrics=metrics,
        vocab_size=len(TOKEN_BYTES),
    )
    waiting = deque(_calls())
    buf = np.zeros((4, WIDTH), dtype=np.int32)
    num = np.zeros(4, dtype=np.int32)
    rows: list[_Row] = []
    history: list[list[list[int]]] = []
    churn = 0  # steps where a request left, another started and a draft was verified
    while rows or waiting:
        kept = [i for i, r in enumerate(rows) if r.pos < len(r.out)]
        left = len(kept) < len(rows)
        for new_i, old_i in enumerate(kept):  # rows condensed in order
            buf[new_i], num[new_i] = buf[old_i], num[old_i]
        rows = [rows[i] for i in kept]
        sampled: list[list[int]] = []
        spec: dict[str, list[int]] = {}
        for i, r in enumerate(rows):  # verify each draft against the recorded output
            acc = 0
            while acc < len(r.draft) and r.pos + acc < len(r.out):
                if r.draft[acc] != r.out[r.pos + acc]:
                    break
                acc += 1
            new = r.out[r.pos : r.pos + acc + 1]
            if r.draft:
                spec[r.rid] = r.draft
            buf[i, num[i] : num[i] + len(new)] = new
            num[i] += len(new)
            r.pos += len(new)
            sampled.append(new)
        started = False
        while len(rows) < 4 and waiting:
            rid, prompt, out, tags = waiting.popleft()
            i = len(rows)
            buf[i, : len(prompt)] = prompt
            buf[i, len(prompt)] = out[0]
            num[i] = len(prompt) + 1
            rows.append(_Row(rid, len(prompt), out, tags_to_wire(tags)))
            sampled.append([out[0]])
            started = True
        churn += left and started and bool(spec)
        ctx = BatchContext(
            req_ids=[r.rid for r in rows],
            num_prompt_tokens=[r.plen for r in rows],
            extra_args=[r.wire for r in rows],
            scheduled_spec_decode_tokens=spec,
            max_num_batched_tokens=512,
            max_model_len=WIDTH,
        )
        drafts = session.step(ctx, sampled, num, buf)
        for r, d in zip(rows, drafts, strict=True):
            r.draft = d
        history.append(drafts)
    return history, metrics, churn


def test_blocks_read_after_propose_change_no_draft_and_no_metric() -> None:
    ours, m_ours, churn = _run(DraftSession)
    ref, m_ref, _ = _run(_NoKeptBlocks)
    assert ours == ref
    snap, snap_ref = m_ours.snapshot(), m_ref.snapshot()
    assert snap.drafted == snap_ref.drafted and snap.accepted == snap_ref.accepted
    assert snap.faults == {} and snap.total_accepted > 100
    # the proposer's own blocks were counted (not only the tags' segment), and steps with
    # leavers, new requests and verified drafts at once were exercised
    assert any(key.endswith("/tool_call") for key in snap.drafted), snap.drafted
    assert churn >= 3


def test_one_extend_many_a_step_changes_no_draft_and_no_metric() -> None:
    ours, m_ours, churn = _run(DraftSession)
    ref, m_ref, _ = _run(DraftSession, batched=False)
    assert ours == ref
    snap, snap_ref = m_ours.snapshot(), m_ref.snapshot()
    for field_ in ("drafted", "accepted", "estimated", "expected", "reliability", "faults"):
        assert getattr(snap, field_) == getattr(snap_ref, field_), field_
    assert churn >= 3 and m_ours.snapshot().total_accepted > 100
