"""The scheduler's waiting prompts, counted for the drafter (agentspec_mw_vllm.queue)."""

from __future__ import annotations

import inspect
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from agentspec_mw_vllm import plugin
from agentspec_mw_vllm.queue import WAITING_ATTR, QueueReader, read_waiting_tokens


class _Request(SimpleNamespace):
    """A vLLM request: hashed by identity, as vLLM's are."""

    __hash__ = object.__hash__


def _req(
    rid: str, num_tokens: int, computed: int = 0, cached: int = 0, status: str = "waiting"
) -> _Request:
    """``cached`` of its tokens are in the prefix cache; one block hash per 16 tokens."""
    return _Request(
        request_id=rid,
        num_tokens=num_tokens,
        num_computed_tokens=computed,
        block_hashes=[cached] * (num_tokens // 16),
        status=status,
    )


class _Coordinator:
    """The prefix cache: ``block_hashes`` stands for the cached tokens; counts lookups."""

    def __init__(self) -> None:
        self.lookups: list[int] = []

    def find_longest_cache_hit(self, block_hashes: list[int], max_len: int) -> tuple[Any, int, int]:
        self.lookups.append(max_len)
        return (), min(block_hashes[0] if block_hashes else 0, max_len), 0


def _scheduler(
    waiting: list[Any], running_prefills: list[Any] = (), caching: bool = True
) -> SimpleNamespace:  # type: ignore[assignment]
    coord = _Coordinator()
    kv = SimpleNamespace(coordinator=coord, prefix_cache_lookup_enabled=lambda r: caching)
    return SimpleNamespace(
        waiting=list(waiting),
        kv_holding_waiting=[],
        _inflight_prefills=set(running_prefills),
        kv_cache_manager=kv,
        vllm_config=SimpleNamespace(speculative_config=SimpleNamespace(method="custom_class")),
    )


def test_waiting_prompts_less_their_cache_hits_and_the_rest_of_partial_prefills() -> None:
    fresh = _req("a", 300, cached=128)  # 128 of its tokens are in the prefix cache
    preempted = _req("b", 90)  # prompt + output, recomputed whole
    partial = _req("c", 1000, computed=512)  # running, its chunk done
    done = _req("d", 40, computed=40)  # its last chunk was this step
    sched = _scheduler([fresh, preempted], [partial, done])
    total, hits = read_waiting_tokens(sched, {})
    assert total == (300 - 128) + 90 + (1000 - 512)
    assert hits == {fresh: 128, preempted: 0}


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    sched = _scheduler([_req("a", 256, cached=256)])
    assert read_waiting_tokens(sched, {})[0] == 1  # vLLM looks up at most num_tokens - 1


def test_a_request_keeps_the_hit_it_was_first_seen_with() -> None:
    sched = _scheduler([_req("a", 300, cached=128)])
    reader = QueueReader()
    assert reader.read(sched) == 172
    sched.waiting[0].block_hashes[0] = 256  # more of it cached later: not looked up again
    assert reader.read(sched) == 172
    assert sched.kv_cache_manager.coordinator.lookups == [299]


def test_a_new_request_under_a_reused_id_is_looked_up_afresh() -> None:
    """The memo is per request object: a new request that reuses a waiting one's id
    (ids are the caller's with ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1``) gets its own
    hit, not the old one's."""
    sched = _scheduler([_req("job", 8016, cached=8000)])
    reader = QueueReader()
    assert reader.read(sched) == 16
    sched.waiting = [_req("job", 8016)]  # aborted, and a new "job" with nothing cached
    assert reader.read(sched) == 8016


def test_the_count_stops_at_the_token_budget_and_caps_its_lookups() -> None:
    """A burst of long new prompts costs at most LOOKUP_BLOCKS_PER_STEP blocks of lookups
    a step (the rest count whole, looked up later), and the scan stops once the queue
    fills the scheduler's budget."""
    from agentspec_mw_vllm.queue import LOOKUP_BLOCKS_PER_STEP

    n_blocks = 500
    burst = [_req(f"r{i}", 16 * n_blocks + 16, cached=16 * n_blocks) for i in range(1000)]
    sched = _scheduler(burst)
    total, _ = read_waiting_tokens(sched, {})
    lookups = sched.kv_cache_manager.coordinator.lookups
    assert 0 < len(lookups) * (n_blocks + 1) <= LOOKUP_BLOCKS_PER_STEP
    assert total == 16 * len(lookups) + (16 * n_blocks + 16) * (1000 - len(lookups))
    sched = _scheduler(burst)
    total, hits = read_waiting_tokens(sched, {}, limit=4096)
    assert 4096 <= total < 4096 + 16 * n_blocks + 16 and len(hits) <= 2


def test_a_streaming_session_waiting_for_input_is_not_counted() -> None:
    idle = _req("s", 200, computed=199, status="streaming")
    sched = _scheduler([_req("a", 50)])
    sched.kv_holding_waiting = [idle]
    assert read_waiting_tokens(sched, {}, skip_status="streaming")[0] == 50


def test_a_priority_queue_is_read_from_its_heap_without_popping() -> None:
    class Heap:
        def __init__(self, items: list[Any]) -> None:
            self._heap = items

        def __iter__(self) -> Any:
            raise AssertionError("the count must not pop a copy of the heap every step")

    sched = _scheduler([])
    sched.waiting = Heap([_req("a", 50), _req("b", 70)])
    assert read_waiting_tokens(sched, {})[0] == 120


def test_a_request_loading_its_kv_elsewhere_counts_once() -> None:
    """A request whose KV loads asynchronously waits *and* is an in-flight prefill."""
    loading = _req("a", 500, computed=200)
    sched = _scheduler([loading], [loading])
    assert read_waiting_tokens(sched, {})[0] == 300


def test_no_lookup_where_the_cache_is_off() -> None:
    sched = _scheduler([_req("a", 300, cached=128)], caching=False)
    assert read_waiting_tokens(sched, {})[0] == 300
    assert sched.kv_cache_manager.coordinator.lookups == []


def test_a_failing_count_is_logged_once_and_then_not_tried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sched = _scheduler([_req("a", 300)])
    del sched.kv_cache_manager.coordinator  # the lookup raises
    reader = QueueReader()
    with caplog.at_level(logging.ERROR, logger="agentspec_mw_vllm.queue"):
        assert reader.read(sched) is None
        assert reader.read(sched) is None
    assert len(caplog.records) == 1


def test_the_scheduler_wrap_counts_only_for_a_custom_class_drafter() -> None:
    def schedule(self: Any) -> Any:
        return SimpleNamespace()

    wrapped = plugin._wrap_schedule(schedule)
    ours = _scheduler([_req("a", 50)])
    assert getattr(wrapped(ours), WAITING_ATTR) == 50
    for method in ("ngram", None):
        other = _scheduler([_req("a", 50)])
        other.vllm_config.speculative_config = (
            None if method is None else SimpleNamespace(method=method)
        )
        assert not hasattr(wrapped(other), WAITING_ATTR)


def test_a_failed_count_leaves_the_output_without_the_attribute() -> None:
    wrapped = plugin._wrap_schedule(lambda self: SimpleNamespace())
    sched = _scheduler([_req("a", 50)])
    del sched.waiting  # the count raises
    assert not hasattr(wrapped(sched), WAITING_ATTR)


def runner_and_output() -> tuple[SimpleNamespace, SimpleNamespace]:
    """A one-row runner and an empty scheduler output, as ``build_batch_context`` reads them."""
    batch = SimpleNamespace(num_reqs=1, req_ids=["r1"], num_prompt_tokens=[5])
    runner = SimpleNamespace(
        input_batch=batch,
        requests={},
        scheduler_config=SimpleNamespace(max_num_batched_tokens=256),
        max_model_len=1024,
    )
    so = SimpleNamespace(
        scheduled_spec_decode_tokens={}, num_scheduled_tokens={}, finished_req_ids=set()
    )
    return runner, so


def test_the_batch_context_passes_the_count_on() -> None:
    runner, so = runner_and_output()
    assert plugin.build_batch_context(runner, so).num_waiting_prompt_tokens is None
    setattr(so, WAITING_ATTR, 77)
    assert plugin.build_batch_context(runner, so).num_waiting_prompt_tokens == 77


def test_installed_vllm_has_what_the_count_reads() -> None:
    """The scheduler's and the KV cache manager's attributes the count reads, on the
    installed vLLM (0.33.0's source, read from its wheel on 2026-12-06, has the same; on a
    release without them the count fails once, is logged, and drafts are priced as
    before)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

    init = inspect.getsource(Scheduler.__init__)
    for attr in ("self.waiting =", "self.kv_holding_waiting =", "self._inflight_prefills:"):
        assert attr in init, attr
    assert "slots" not in inspect.getsource(SchedulerOutput)[:200]  # takes an attribute
    assert callable(KVCacheManager.prefix_cache_lookup_enabled)
    assert "self.coordinator" in inspect.getsource(KVCacheManager.__init__)
    lookup = "".join(inspect.getsource(KVCacheManager.get_computed_blocks).split())
    assert "self.coordinator.find_longest_cache_hit(request.block_hashes," in lookup
    for prop in ("num_tokens",):
        assert isinstance(inspect.getattr_static(Request, prop), property)
    req_init = inspect.getsource(Request.__init__)
    for attr in ("self.request_id", "self.num_computed_tokens", "self.block_hashes"):
        assert attr in req_init, attr
