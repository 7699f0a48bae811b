"""The scheduler-faithful replay on hand-made cases: token budget, chunked prefill, draft
trimming, prefix caching, KV capacity (waits and preemption), serving metrics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from agentspec_mw.costmodel import PRESETS, ServingLimits, StepTimeModel, kv_capacity_tokens
from agentspec_mw.peers.none import NoProposer
from agentspec_mw.proposer import EMPTY_DRAFT, Draft, StepContext
from agentspec_mw.replay.kvcache import PrefixKVCache, block_hashes
from agentspec_mw.replay.run import (
    ReplayConfig,
    ResultRow,
    issued_together,
    more_in_flight,
    run_replay,
    serving_limits,
)
from agentspec_mw.replay.sim import ReplayCall, WorkloadRun, replay_workload
from agentspec_mw.traces.tokenized import CallMeta
from tests.test_replay import Oracle

#: One second per batched token, nothing else: simulated time = tokens scheduled.
PER_TOKEN = StepTimeModel(name="per-token", c_fix=0.0, c_tok=1.0, c_kv=0.0, c_oh=0.0)


def _limits(budget: int = 8192, kv: int | None = None, block: int = 16) -> ServingLimits:
    return ServingLimits(max_num_batched_tokens=budget, kv_capacity_tokens=kv, block_size=block)


def _call(name: str, run: str, prompt: Sequence[int], output: Sequence[int]) -> ReplayCall:
    return ReplayCall(
        req_id=name,
        run_id=run,
        prompt=np.asarray(prompt, dtype=np.int32),
        output=np.asarray(output, dtype=np.int32),
    )


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _replay(calls: list[ReplayCall], proposer: object = None, **kw: object) -> WorkloadRun:
    kw.setdefault("batch", 1)
    kw.setdefault("k", 8)
    kw.setdefault("cost_model", PER_TOKEN)
    return replay_workload(calls, proposer or NoProposer(), **kw)  # type: ignore[arg-type]


def test_prefill_is_chunked_under_the_budget_and_costs_its_tokens() -> None:
    call = _call("a", "r", _seq(1000, 100), _seq(1, 5))
    r = _replay([call], limits=_limits(budget=32))
    # chunks 32, 32, 32, 4 (the last samples token 0), then 4 one-token decode steps
    assert r.engine_steps == 4 + 4
    assert r.prefill_tokens == 100 and r.steps == 5 and r.mat == 1.0
    assert r.sim_time_s == pytest.approx(100 + 4)
    assert r.ttft_s == [pytest.approx(100.0)]  # arrival at 0, first token after 100 tokens
    assert r.tpot_s == [pytest.approx(1.0)]
    # without a budget limit the prompt is one step
    assert _replay([call], limits=_limits(budget=4096)).engine_steps == 1 + 4


def test_running_requests_go_first_and_drafts_are_trimmed_to_the_budget() -> None:
    # a decoding call with a perfect proposer and a second run's long prompt waiting:
    # budget 6 -> the decode takes 1 + 5 drafts... trimmed to fit, the prefill gets the rest
    a = _call("a", "r0", _seq(500, 4), _seq(1, 40))
    b = _call("b", "r1", _seq(900, 64), _seq(50, 3))
    seen: list[tuple[int, int | None]] = []

    class Spy(Oracle):
        def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
            seen.append((step.num_decode_tokens, step.num_prefill_tokens))
            assert step.max_num_batched_tokens == 6
            return super().propose(req_ids, k, step)

    oracle = Spy({"a": a.output, "b": b.output})
    r = _replay([a, b], oracle, batch=2, k=8, limits=_limits(budget=6))
    # step 1: a's prompt (4) + 2 of b's; then a decodes with 5 drafts (budget 6: 1 + 5),
    # and b's prefill gets nothing until a is done
    assert seen[0] == (1, 62)
    assert r.drafted == r.accepted  # a perfect proposer, whatever the trimming left
    assert r.drafted <= 5 * r.steps
    assert r.sim_time_s == pytest.approx(4 + 64 + r.drafted + r.steps - 2)


def test_drafts_beyond_the_budget_are_trimmed_from_the_tail() -> None:
    call = _call("a", "r", _seq(500, 3), _seq(1, 31))
    full = _replay([call], Oracle({"a": call.output}), k=8, limits=_limits(budget=8192))
    trimmed = _replay([call], Oracle({"a": call.output}), k=8, limits=_limits(budget=4))
    # prefill step (token 0), then 30 tokens: 9 per step untrimmed, 4 per step at budget 4
    assert full.steps == 1 + -(-30 // 9)
    assert trimmed.steps == 1 + -(-30 // 4)
    assert trimmed.rejection_rate == 0.0 and trimmed.drafted_per_step < full.drafted_per_step


def test_two_decoding_requests_share_the_budget_in_admission_order() -> None:
    a = _call("a", "r0", [7], _seq(1, 20))
    b = _call("b", "r1", [8], _seq(100, 20))
    r = _replay([a, b], Oracle({"a": a.output, "b": b.output}), batch=2, k=4, limits=_limits(7))
    # each decode step: a takes 1 + 4, b 1 + 1 (budget 7): a advances 5, b 2 per step;
    # a is done after 4 steps (19 tokens), b has 11 left at 5 per step
    assert r.engine_steps == 1 + 4 + -(-(19 - 8) // 5)
    assert r.rejection_rate == 0.0


def test_the_same_runs_next_call_hits_the_prefix_cache_by_whole_blocks() -> None:
    p1, o1 = _seq(1000, 40), _seq(1, 25)
    first = _call("c0", "r", p1, o1)
    second = _call("c1", "r", p1 + o1 + _seq(2000, 10), _seq(60, 4))
    r = _replay([first, second], limits=_limits(block=16))
    # the first call computed 40 + 25 - 1 = 64 tokens (its last token is never fed back):
    # four full blocks, all a prefix of the second prompt
    assert r.cached_tokens == 64 and r.prompt_tokens == 40 + 75
    assert r.prefill_tokens == 40 + 75 - 64
    assert r.prefix_hit_rate == pytest.approx(64 / 115)
    # with blocks of 128 nothing is whole
    assert _replay([first, second], limits=_limits(block=128)).cached_tokens == 0


def test_other_runs_share_identical_prefixes_once_computed() -> None:
    system = _seq(3000, 48)
    a = _call("a", "r0", system + [1, 2], [9, 9])
    b = _call("b", "r1", system + [3, 4], [9, 9])
    one = _replay([a, b], batch=1, limits=_limits(block=16))
    assert one.cached_tokens == 48  # b arrives after a computed the system prompt
    both = _replay([a, b], batch=2, limits=_limits(block=16))
    assert both.cached_tokens == 0  # admitted in the same step: both compute it, as in vLLM


def test_a_call_waits_when_its_kv_does_not_fit() -> None:
    a = _call("a", "r0", _seq(100, 40), _seq(1, 8))
    b = _call("b", "r1", _seq(200, 40), _seq(1, 8))
    free = _replay([a, b], batch=2, k=0, limits=_limits(kv=None))
    capped = _replay([a, b], batch=2, k=0, limits=_limits(kv=64))  # 4 blocks; each needs 3
    assert free.kv_waits == 0 and max(free.step_batch) == 2
    assert capped.kv_waits > 0 and max(capped.step_batch) == 1
    assert capped.effective_batch == 1.0 and free.effective_batch > 1.5
    # b's first token comes after a has finished: its whole duration is queueing
    assert capped.ttft_s[1] > capped.ttft_s[0] + 8
    assert capped.steps == free.steps == 16  # the same work


def test_running_requests_are_preempted_when_their_kv_grows_past_capacity() -> None:
    a = _call("a", "r0", _seq(100, 20), _seq(1, 30))
    b = _call("b", "r1", _seq(200, 20), _seq(1, 30))
    r = _replay([a, b], batch=2, k=0, limits=_limits(kv=80))  # 5 blocks; each ends on 4
    assert r.preemptions >= 1
    assert r.prefill_tokens > 40  # the preempted call recomputed what it had
    assert r.steps == 60 and r.mat == 1.0  # every token emitted once


def test_a_waiting_call_is_admitted_only_when_its_whole_prompt_fits() -> None:
    """vLLM's admission gate (``scheduler_reserve_full_isl``, on by default): a prompt
    waits until blocks for all of it are free, not only for its first chunk — else it is
    admitted, grows into a decoding call's room and one of them is preempted."""
    a = _call("a", "r0", [1] * 8, _seq(100, 40))  # short prompt, long output
    b = _call("b", "r1", [2] * 48, [7] * 4)  # arrives with a: 12 blocks, 16-token chunks
    r = _replay([a, b], batch=2, k=0, limits=_limits(budget=16, kv=52, block=4))
    assert r.preemptions == 0 and r.kv_waits > 0
    assert r.prefill_tokens == r.prompt_tokens == 56  # nothing computed twice


def test_a_resumed_call_whose_chunk_ends_at_its_last_token_samples_without_a_draft(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a preemption a call recomputes its prompt and output in chunks; a chunk that
    ends one token short samples nothing, so vLLM has no draft for its next step (it
    schedules the last token alone). It used to be drafted and verified as a decode."""
    from agentspec_mw.replay import sim

    schedule, short, drafted_after_short = sim._schedule, set(), []

    def spy(running: list[Any], *rest: Any) -> dict[Any, int]:
        drafted_after_short.extend(r.draft for r in running if id(r) in short and r.decoding)
        short.clear()
        scheduled = schedule(running, *rest)
        for r, n in scheduled.items():
            if not r.decoding and r.emitted > 0 and r.computed + n == r.num_tokens - 1:
                short.add(id(r))
        return scheduled

    monkeypatch.setattr(sim, "_schedule", spy)
    calls = [_call(f"{j}", f"r{j}", [j + 1] * 8, _seq(100 + 50 * j, 30)) for j in range(3)]
    truth = {c.req_id: c.output for c in calls}
    r = _replay(calls, Oracle(truth), batch=3, k=3, limits=_limits(budget=7, kv=56, block=4))
    assert r.preemptions > 0 and drafted_after_short == [()]  # the case arose; no draft


def test_a_call_larger_than_the_kv_cache_is_an_error() -> None:
    with pytest.raises(ValueError, match="needs 68 tokens of KV cache"):
        _replay([_call("a", "r", _seq(1, 50), _seq(1, 10))], k=8, limits=_limits(kv=64))


def _workload(runs: int = 6, calls: int = 3) -> dict[str, list[ReplayCall]]:
    rng = np.random.default_rng(5)
    out: list[ReplayCall] = []
    for i in range(calls):
        for run in range(runs):
            prompt = np.concatenate([np.arange(64), rng.integers(100, 200, 30 + 20 * i)])
            out.append(_call(f"{run}.{i}", f"r{run}", prompt, rng.integers(0, 6, 40)))
    return {"w": out}


def test_none_is_exactly_one_and_a_perfect_proposer_wins() -> None:
    wl = _workload()
    cfg = ReplayConfig(
        traces=["x"],
        tokenizer="t",
        proposers=["none"],
        batch=[1, 4],
        k=[4],
        cost_model="cpu-smollm2",
    )
    rows = run_replay(cfg, wl, progress=False)
    assert {r.speedup for r in rows} == {1.0} and {r.mat for r in rows} == {1.0}
    truth = {c.req_id: c.output for c in wl["w"]}
    cost = PRESETS["cpu-smollm2"]
    base = replay_workload(wl["w"], NoProposer(), batch=4, k=4, cost_model=cost)
    best = replay_workload(wl["w"], Oracle(truth), batch=4, k=4, cost_model=cost)
    assert best.rejection_rate == 0.0 and best.mat > 4.0
    assert best.sim_time_s < base.sim_time_s / 2
    assert best.prefill_tokens == base.prefill_tokens  # same prompts, same cache


def test_the_same_inputs_give_the_same_numbers() -> None:
    wl = _workload()
    lim = _limits(budget=96, kv=256, block=16)

    def once() -> dict[str, object]:
        calls = wl["w"]
        r = _replay(calls, Oracle({c.req_id: c.output for c in calls}), batch=4, k=4, limits=lim)
        d = dict(vars(r))
        del d["propose_us"], d["proposer_time_s"]
        return d

    a = once()
    assert a["preemptions"] or a["kv_waits"]  # the case exercises the KV limit
    assert a == once()


def test_metrics_and_rows_report_the_effective_batch() -> None:
    wl = _workload(runs=4)
    cfg = ReplayConfig(traces=["x"], tokenizer="t", proposers=["none"], batch=[2, 8], k=[4])
    rows = {r.batch: r for r in run_replay(cfg, wl, progress=False) if r.workload == "w"}
    assert rows[2].batch_filled and rows[2].effective_batch >= 1.6
    assert not rows[8].batch_filled and rows[8].effective_batch <= 4.0  # 4 runs only
    assert rows[2].throughput_tok_s == pytest.approx(rows[2].output_tokens / rows[2].sim_time_s)
    assert rows[2].ttft_p50_s > 0 and rows[2].tpot_p99_s >= rows[2].tpot_p50_s > 0
    assert 0 < rows[2].prefix_hit_rate < 1  # the shared 64-token system prompt


def test_kv_cache_evicts_least_recently_freed_blocks_tail_first() -> None:
    kv = PrefixKVCache(block_size=4, capacity_blocks=4)
    ha = block_hashes(np.arange(8), 4)
    hb = block_hashes(np.arange(100, 108), 4)
    assert kv.admit("a", ha, 0, 8)
    kv.register("a", ha, 8)
    kv.release("a")  # a's two blocks cached, evictable
    assert kv.peek_hit(ha, 9) == 8 and kv.free_blocks == 4
    assert kv.admit("b", hb, 0, 12)  # 3 blocks: evicts one of a's, its tail (freed first)
    assert kv.peek_hit(ha, 9) == 4  # a's first block is still there
    assert not kv.admit("c", hb, 0, 8)  # 2 more do not fit (1 evictable left)
    assert kv.used_blocks == 3


def test_preset_hardware_is_derived_from_the_device() -> None:
    h100, h200 = PRESETS["llama8b-h100"].limits, PRESETS["llama8b-h200"].limits
    # ~430k tokens of 128 KiB on an 80 GB H100 (the figure), twice that on an H200
    assert h100.kv_capacity_tokens is not None and 420_000 < h100.kv_capacity_tokens < 460_000
    assert h200.kv_capacity_tokens is not None and h200.kv_capacity_tokens > 1.9 * 420_000
    assert h100.max_num_batched_tokens == 8192 and h100.block_size == 16
    # Qwen2.5-7B's KV is 56 KiB a token (4 KV heads x 28 layers): over twice Llama's tokens
    qwen = PRESETS["qwen2.5-7b-h200"].limits
    assert qwen.kv_capacity_tokens is not None
    assert 2.2 * h200.kv_capacity_tokens < qwen.kv_capacity_tokens < 2.4 * h200.kv_capacity_tokens
    cpu = PRESETS["cpu-smollm2"].limits
    assert (cpu.max_num_batched_tokens, cpu.block_size) == (4096, 128)
    with pytest.raises(ValueError, match="no room for KV"):
        kv_capacity_tokens(10e9, 16e9, 131072)


def test_empty_drafts_cost_nothing_extra() -> None:
    class Empty(NoProposer):
        def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
            return [EMPTY_DRAFT] * len(req_ids)

    wl = _workload()["w"]
    base = _replay(wl, batch=3, k=0, cost_model=PRESETS["llama8b-h100"])
    same = _replay(wl, Empty(), batch=3, k=4, cost_model=PRESETS["llama8b-h100"])
    assert same.sim_time_s == base.sim_time_s and same.steps == base.steps


def test_config_overrides_the_presets_limits() -> None:
    wl = _workload(runs=4)
    cfg = ReplayConfig(
        traces=["x"], tokenizer="t", proposers=["none"], batch=[4], k=[4], cost_model="cpu-smollm2"
    )
    assert serving_limits(cfg) == PRESETS["cpu-smollm2"].limits
    tight = cfg.model_copy(update={"max_num_batched_tokens": 16, "kv_capacity_tokens": 512})
    lim = serving_limits(tight)
    assert (lim.max_num_batched_tokens, lim.kv_capacity_tokens, lim.block_size) == (16, 512, 128)
    wide = {r.workload: r for r in run_replay(cfg, wl, progress=False)}["w"]
    narrow = {r.workload: r for r in run_replay(tight, wl, progress=False)}["w"]
    assert narrow.ttft_p50_s > wide.ttft_p50_s  # prompts prefill 16 tokens a step
    assert narrow.effective_batch < wide.effective_batch


def _sibling(name: str, run: str, prompt: Sequence[int], output: Sequence[int]) -> ReplayCall:
    return replace(_call(name, run, prompt, output), with_previous=True)


def test_calls_issued_together_arrive_together_and_the_run_waits_for_all() -> None:
    # run r: a lead call, two siblings issued with it, then a call after the group;
    # at batch 1 (one run in flight) the group is three requests in the engine at once
    lead = _call("a", "r", _seq(100, 16), _seq(1, 4))
    sib1 = _sibling("b", "r", _seq(200, 16), _seq(11, 8))
    sib2 = _sibling("c", "r", _seq(300, 16), _seq(21, 2))
    after = _call("d", "r", _seq(400, 16), _seq(31, 3))
    r = _replay([lead, sib1, sib2, after], limits=_limits())
    assert max(r.step_batch) == 3
    assert r.ttft_s[:3] == [pytest.approx(48.0)] * 3  # one step: the three prompts
    # d arrives when the longest sibling (8 tokens) is done, not when the lead is
    assert len(r.ttft_s) == 4 and r.ttft_s[3] == pytest.approx(16.0)
    steps_with_d = r.engine_steps - 8  # the group's 8 steps, then d's own
    assert steps_with_d == 1 + 2
    # one after another (the replay before 2026-12-05): never more than one request
    serial = [replace(c, with_previous=False) for c in (lead, sib1, sib2, after)]
    s = _replay(serial, limits=_limits())
    assert max(s.step_batch) == 1 and s.engine_steps == 4 + 8 + 2 + 3
    # the same tokens (time = tokens under this model) in fewer, wider steps
    assert r.engine_steps == 11 and r.output_tokens == s.output_tokens


def test_a_group_whose_first_call_has_no_output_is_led_by_its_next() -> None:
    empty = _call("a", "r", _seq(100, 16), [])
    sib = _sibling("b", "r", _seq(200, 16), _seq(1, 3))
    sib2 = _sibling("c", "r", _seq(300, 16), _seq(11, 3))
    r = _replay([empty, sib, sib2], limits=_limits())
    assert r.calls == 2 == len(r.ttft_s) and r.output_tokens == 6  # a replayed no-output call
    assert max(r.step_batch) == 2 and len(r.ttft_s) == 2


def _meta(run: str, group: str | None, step: int | None) -> CallMeta:
    return CallMeta("w", run, 0, "agent", "other", group, step)


SAME = (np.arange(4), np.arange(4))  # two calls' prompts: the same, and not
DIFFERENT = (np.arange(4), np.arange(5))


def test_what_the_trace_marks_as_issued_together() -> None:
    # a LangGraph fan-out: one group, one superstep
    assert issued_together(_meta("r", "g", 2), _meta("r", "g", 2), *DIFFERENT)
    assert not issued_together(_meta("r", "g", 2), _meta("r", "g", 3), *SAME)
    # the samples of one request: one group, no step, the same prompt
    assert issued_together(_meta("r", "g", None), _meta("r", "g", None), *SAME)
    # attempts at one question (Reflexion): one group, no step, prompts that grow
    assert not issued_together(_meta("r", "g", None), _meta("r", "g", None), *DIFFERENT)
    # no group, another group, another run: never
    assert not issued_together(_meta("r", None, 2), _meta("r", None, 2), *SAME)
    assert not issued_together(_meta("r", "g", 2), _meta("r", "h", 2), *SAME)
    assert not issued_together(_meta("r", "g", 2), _meta("s", "g", 2), *SAME)


def test_workloads_whose_runs_fan_out_are_named_with_their_effective_batch() -> None:
    def row(workload: str, batch: int, in_flight: int, eff: float) -> ResultRow:
        return ResultRow.model_construct(
            workload=workload, batch=batch, max_in_flight=in_flight, effective_batch=eff
        )

    rows = [
        row("tot", 1, 10, 6.2),
        row("tot", 8, 80, 49.4),
        row("react", 8, 8, 7.9),
        row("ALL", 8, 88, 50.0),
    ]
    (line,) = more_in_flight(rows)
    assert line.startswith("note: tot: its runs send calls together")
    assert "batch 1 ran at 6, batch 8 ran at 49" in line
    assert more_in_flight([row("react", 8, 8, 7.9)]) == []
