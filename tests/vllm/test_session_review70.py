"""Review 70: a request vLLM leaves out of a step (token budget, preemption) keeps its
proposer state; the step fit's KV counts a chunked prompt's cache, not its whole prompt;
a failing metrics backend never raises into vLLM's engine loop."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agentspec_mw_vllm.context import BatchContext
from agentspec_mw_vllm.metrics import DrafterMetrics
from agentspec_mw_vllm.session import DraftSession
from tests.vllm.fakes import PROBE_LOG, ProbeProposer
from tests.vllm.test_session import Batch, RecordingTimer, _clock


def _step(
    session: DraftSession, batch: Batch, tokens: dict[str, list[int]], live: set[str], **kw: object
) -> list[list[int]]:
    sampled = batch.sample(tokens)
    ctx = dataclasses.replace(batch.ctx(**kw), live_req_ids=live)  # type: ignore[arg-type]
    return session.step(ctx, sampled, batch.n, batch.buf)


def test_a_request_left_out_of_a_step_keeps_its_state_and_its_draft_is_counted() -> None:
    """``b`` is not scheduled at t1 (vLLM takes it out of the batch, keeps it in
    ``runner.requests``): no stop and no second start (it was restarted, its history fed
    again), and the draft vLLM verifies when it comes back is counted (it was lost)."""
    PROBE_LOG.clear()
    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(ProbeProposer(draft_len=3), k=4, metrics=metrics)
    b = Batch()
    b.add("a", [1, 2, 3])
    b.add("b", [4, 5, 6])
    live = {"a", "b"}
    _step(session, b, {"a": [7], "b": [8]}, live)
    saved = (b.buf[1].copy(), int(b.n[1]))
    b.remove("b")
    _step(session, b, {"a": [7, 7, 7, 9]}, live, spec={"a": [7, 7, 7]})
    assert "b" in session.live_requests
    b.add("b", [4, 5, 6])
    b.buf[1], b.n[1] = saved
    _step(
        session,
        b,
        {"a": [9, 9, 9, 1], "b": [8, 8, 8, 2]},
        live,
        spec={"a": [9, 9, 9], "b": [8, 8, 8]},
    )
    verbs = [e[0] for e in PROBE_LOG if e[0] in ("start", "stop") and e[1][0] == "b"]
    assert verbs == ["start"]
    snap = metrics.snapshot()
    assert (sum(snap.drafted.values()), sum(snap.accepted.values())) == (9, 9)
    # without the runner's requests (another host) an absent request has left, as before
    _step(session, b, {"a": [1]}, {"a", "b"})
    b.remove("b")
    session.step(b.ctx(), b.sample({"a": [1]}), b.n, b.buf)
    assert "b" not in session.live_requests


def test_the_step_fit_counts_a_chunked_prompts_cache_not_its_whole_prompt() -> None:
    """A 8,000-token prompt in its second 512-token chunk holds 1,024 KV tokens after the
    step, not 8,000 (vLLM's token count holds the whole prompt from the start)."""
    timer = RecordingTimer()
    session = DraftSession(
        ProbeProposer(draft_len=2),
        k=4,
        metrics=DrafterMetrics(prometheus=False),
        step_timer=timer,
        clock=_clock([1.0, 1.001, 1.051, 1.052]),
    )
    buf = np.zeros((2, 9000), dtype=np.int32)
    n = np.array([101, 8000], dtype=np.int32)

    def ctx(computed: list[int]) -> BatchContext:
        return BatchContext(
            req_ids=["dec", "long"],
            num_prompt_tokens=[100, 8000],
            extra_args=[None, None],
            num_scheduled_tokens={"dec": 1, "long": 512},
            max_num_batched_tokens=2048,
            max_model_len=9000,
            num_computed_tokens=computed,
        )

    session.step(ctx([100, 0]), [[5], []], n, buf)
    n[0] += 1
    session.step(ctx([101, 512]), [[5], []], n, buf)
    (_, kv, _), *_ = timer.calls
    assert kv == 102 + 1024


class _DownMetrics(DrafterMetrics):
    def record_fault(self, kind: str) -> None:
        raise OSError(28, "No space left on device")

    def record_step(self, *args: object) -> None:
        raise OSError(28, "No space left on device")


def test_a_failing_metrics_backend_never_raises_into_the_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Boom(ProbeProposer):
        def propose(self, ids, k, st):  # type: ignore[no-untyped-def]
            raise RuntimeError("proposer bug")

    session = DraftSession(Boom(), k=4, metrics=_DownMetrics(prometheus=False))
    b = Batch()
    b.add("a", [1, 2, 3])
    for t in range(3):
        assert session.step(b.ctx(), b.sample({"a": [4 + t]}), b.n, b.buf) == [[]]
    assert "counting a proposer fault failed" in caplog.text


def test_a_row_at_its_length_limit_is_not_in_the_next_steps_context() -> None:
    """``done`` emits its one allowed token in this step and leaves: the budget of the
    next step sees only ``live`` (it counted 2 rows and 3,012 KV tokens)."""
    from tests.vllm.test_session import step

    PROBE_LOG.clear()
    session = DraftSession(
        ProbeProposer(draft_len=2), k=4, metrics=DrafterMetrics(prometheus=False)
    )
    b = Batch(width=4096)
    b.add("live", [1] * 10)
    b.add("done", [2] * 3000)
    step(session, b, {"live": [5], "done": [6]}, max_len=8192, max_tokens=[100, 1])
    ctx = [e for e in PROBE_LOG if e[0] == "propose"][-1][1][2]
    assert (ctx.batch_size, ctx.num_kv_tokens, ctx.num_decode_tokens) == (1, 11, 1)


def test_drafts_vllm_substituted_are_not_counted_as_the_proposers() -> None:
    """vLLM skips a draft call (a row near the context limit) and schedules zeros for
    every request: the next call does not count them as the proposer's verified draft,
    with its old draft's survivals (it counted 4 drafted, 0 accepted); a draft that is
    the proposer's is counted."""
    from agentspec_mw.proposer import Draft
    from agentspec_mw.tags import StructureTags, tags_to_wire
    from tests.vllm.test_session import step

    class Est(ProbeProposer):
        def propose(self, ids, k, st):  # type: ignore[no-untyped-def]
            return [Draft((self.tokens[r][-1],) * 4, (0.9,) * 4) for r in ids]

    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(Est(), k=4, metrics=metrics)
    b = Batch()
    b.add("a", [1, 2, 3], tags_to_wire(StructureTags(agent_id="coder", query_id="q")))
    assert step(session, b, {"a": [5]}) == [[5, 5, 5, 5]]
    b.sample({"a": [5, 5, 5, 5, 7]})  # verified in a step whose draft call vLLM skipped
    step(session, b, {"a": [8]}, spec={"a": [0, 0, 0, 0]})
    snap = metrics.snapshot()
    assert sum(snap.drafted.values()) == 0 and snap.expected == {}
    step(session, b, {"a": [8, 8, 1]}, spec={"a": [8, 8, 8, 8]})  # its own draft
    snap = metrics.snapshot()
    assert (sum(snap.drafted.values()), sum(snap.accepted.values())) == (4, 2)


def test_the_affinity_router_keeps_a_key_on_its_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``consistent_hash`` vllm-router's circuit breaker is off (it moved a key's
    calls to another replica for good after two errors, splitting its query's history);
    other policies keep vllm-router's default."""
    from agentspec_mw_vllm import cluster

    monkeypatch.setattr(cluster, "_router_binary", lambda: "vllm-router")
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert "--disable-circuit-breaker" in cluster.router_command(urls)
    assert "--disable-circuit-breaker" not in cluster.router_command(urls, policy="round_robin")
