"""DraftSession: the adapter's lifecycle, caps, tags, fault isolation and metrics (fakes)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from agentspec_mw.costfit import MeasuredStepTime
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.tags import MAX_WIRE_CHARS, StructureTags, tags_to_wire
from agentspec_mw_vllm.context import BatchContext
from agentspec_mw_vllm.metrics import DrafterMetrics
from agentspec_mw_vllm.session import _GATHER_ROWS, DraftSession, _gather
from tests.vllm.fakes import (
    BadDraftProposer,
    BatchExtendProbe,
    ExplodingProposer,
    GreedyLongProposer,
    ProbeProposer,
)

TAGS = StructureTags(agent_id="coder", query_id="q1", segment="tool_call")


class Batch:
    """A fake runner batch: token rows as vLLM keeps them (a live 2-D buffer)."""

    def __init__(self, width: int = 64) -> None:
        self.ids: list[str] = []
        self.prompt_len: list[int] = []
        self.extra: list[dict[str, object] | None] = []
        self.buf = np.zeros((8, width), dtype=np.int32)
        self.n = np.zeros(8, dtype=np.int32)

    def add(self, rid: str, prompt: list[int], extra: dict[str, object] | None = None) -> None:
        row = len(self.ids)
        self.ids.append(rid)
        self.prompt_len.append(len(prompt))
        self.extra.append(extra)
        self.buf[row, : len(prompt)] = prompt
        self.n[row] = len(prompt)

    def remove(self, rid: str) -> None:
        row = self.ids.index(rid)
        for seq in (self.ids, self.prompt_len, self.extra):
            seq.pop(row)
        self.buf[row:-1] = self.buf[row + 1 :].copy()
        self.n[row:-1] = self.n[row + 1 :].copy()

    def sample(self, tokens: dict[str, list[int]]) -> list[list[int]]:
        out = []
        for row, rid in enumerate(self.ids):
            new = tokens.get(rid, [])
            self.buf[row, self.n[row] : self.n[row] + len(new)] = new
            self.n[row] += len(new)
            out.append(list(new))
        return out

    def ctx(
        self,
        spec: dict[str, list[int]] | None = None,
        max_len: int = 64,
        scheduled: dict[str, int] | None = None,
        max_tokens: list[int | None] | None = None,
        finished: frozenset[str] = frozenset(),
        decoding: list[Any] | None = None,
    ) -> BatchContext:
        return BatchContext(
            req_ids=list(self.ids),
            num_prompt_tokens=list(self.prompt_len),
            extra_args=list(self.extra),
            scheduled_spec_decode_tokens=spec or {},
            num_scheduled_tokens=scheduled or {},
            max_num_batched_tokens=512,
            max_model_len=max_len,
            max_tokens=max_tokens or (),
            finished_req_ids=finished,
            decoding=decoding or (),
        )


def step(
    session: DraftSession, batch: Batch, tokens: dict[str, list[int]], **kw: object
) -> list[list[int]]:
    sampled = batch.sample(tokens)
    return session.step(batch.ctx(**kw), sampled, batch.n, batch.buf)  # type: ignore[arg-type]


@pytest.mark.parametrize("probe_cls", [ProbeProposer, BatchExtendProbe])
def test_lifecycle_feeds_each_token_once_and_stops_leavers(probe_cls: type[ProbeProposer]) -> None:
    """The same with one ``extend`` per request and with a step's tokens in one
    ``extend_many`` (where the proposer has it, the session uses it)."""
    probe = probe_cls(draft_len=3)
    session = DraftSession(probe, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("a", [1, 2, 3], tags_to_wire(TAGS))
    batch.add("b", [7, 8])
    assert step(session, batch, {"a": [4], "b": [9]}) == [[4, 4, 4], [9, 9, 9]]
    assert probe.tokens == {"a": [1, 2, 3, 4], "b": [7, 8, 9]}
    assert probe.tags == {"a": TAGS, "b": None}
    step(session, batch, {"a": [5, 6], "b": [10]})
    assert probe.tokens["a"] == [1, 2, 3, 4, 5, 6]
    batch.remove("a")
    step(session, batch, {"b": [11]})
    assert session.live_requests == {"b"}
    assert "a" not in probe.tokens and probe.tokens["b"] == [7, 8, 9, 10, 11]
    if isinstance(probe, BatchExtendProbe):
        assert probe.single_extends == 0
        assert probe.batches == [
            [("a", [4]), ("b", [9])],
            [("a", [5, 6]), ("b", [10])],
            [("b", [11])],
        ]


def test_a_failing_extend_many_costs_only_the_request_whose_extend_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """All or nothing: when ``extend_many`` raises, the session feeds each request alone,
    so only the request whose own ``extend`` raises gets no more drafts."""
    metrics = DrafterMetrics(prometheus=False)
    probe = BatchExtendProbe(draft_len=2)
    session = DraftSession(probe, k=4, metrics=metrics)
    batch = Batch()
    batch.add("a", [1, 2], tags_to_wire(TAGS))
    batch.add("x", [3, 4], tags_to_wire(StructureTags(agent_id="bad", query_id="q")))
    batch.add("b", [5, 6])
    with caplog.at_level(logging.ERROR, logger="agentspec_mw_vllm.session"):
        assert step(session, batch, {"a": [7], "x": [8], "b": [9]}) == [[7, 7], [], [9, 9]]
        assert step(session, batch, {"a": [10], "x": [11], "b": [12]}) == [[10, 10], [], [12, 12]]
    assert probe.tokens["a"] == [1, 2, 7, 10] and probe.tokens["b"] == [5, 6, 9, 12]
    assert probe.batches == [[("a", [10]), ("b", [12])]]  # x is left alone after it broke
    assert probe.single_extends == 3  # a, x, b alone after the first extend_many raised
    assert metrics.snapshot().faults == {"extend_many:ValueError": 1, "extend:ValueError": 1}


def test_partial_prefill_rows_get_no_draft_and_are_not_started() -> None:
    probe = ProbeProposer()
    session = DraftSession(probe, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("a", [1, 2, 3])
    assert step(session, batch, {}) == [[]]
    assert session.live_requests == frozenset()


def test_readmitted_request_replays_its_whole_history() -> None:
    probe = ProbeProposer()
    session = DraftSession(probe, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("a", [1, 2])
    step(session, batch, {"a": [3]})
    saved = (batch.buf[0].copy(), int(batch.n[0]))
    batch.remove("a")  # preempted
    step(session, batch, {})
    assert session.live_requests == frozenset()
    batch.add("a", [1, 2])
    batch.buf[0], batch.n[0] = saved
    step(session, batch, {"a": [4]})
    assert probe.tokens["a"] == [1, 2, 3, 4]


@pytest.mark.parametrize("told", [True, False])
def test_a_reused_request_id_starts_afresh(told: bool) -> None:
    """A host that picks its own request ids may reuse a finished one's. Told by vLLM
    (``finished_req_ids``) or not (the finish fell in a step without a draft call: the
    row holds fewer tokens than were fed), the session starts the new request with its
    own prompt and tags, never the old one's (another tenant's, here)."""
    probe = ProbeProposer(draft_len=2)
    session = DraftSession(probe, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("r", list(range(1, 11)), tags_to_wire(StructureTags(scope="tenant-a")))
    step(session, batch, {"r": [11]})
    batch.remove("r")
    batch.add("r", [50, 51, 52], tags_to_wire(StructureTags(scope="tenant-b")))
    out = step(session, batch, {"r": [53]}, finished=frozenset({"r"}) if told else frozenset())
    assert probe.tags["r"] == StructureTags(scope="tenant-b")
    assert probe.tokens["r"] == [50, 51, 52, 53]
    assert out == [[53, 53]]


def test_a_reused_id_with_a_longer_prompt_starts_afresh_untold() -> None:
    """Untold of the finish, and the new request holds more tokens than the old one fed:
    its other prompt length says it is new (it must not continue the old request's text,
    tags and tenant scope)."""
    probe = ProbeProposer(draft_len=2)
    session = DraftSession(probe, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("job", [1, 2, 3], tags_to_wire(StructureTags(scope="tenant-a")))
    step(session, batch, {"job": [4]})
    batch.remove("job")
    batch.add("job", [50, 51, 52, 53, 54], tags_to_wire(StructureTags(scope="tenant-b")))
    step(session, batch, {"job": [55]})
    assert probe.tags["job"] == StructureTags(scope="tenant-b")
    assert probe.tokens["job"] == [50, 51, 52, 53, 54, 55]


def test_every_row_is_capped_at_k_and_before_max_model_len() -> None:
    session = DraftSession(GreedyLongProposer(), k=5, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    batch.add("a", list(range(1, 11)))
    batch.add("b", list(range(1, 58)))
    drafts = step(session, batch, {"a": [1], "b": [1]}, max_len=64)
    assert [len(d) for d in drafts] == [5, 64 - 58 - 1]
    batch2 = Batch()
    batch2.add("c", list(range(1, 63)))
    assert step(session, batch2, {"c": [1]}, max_len=64) == [[]]


def test_every_row_is_capped_at_its_output_tokens_left_less_one() -> None:
    """A step emits at most draft + 1 tokens: past ``max_tokens`` a draft is waste."""
    session = DraftSession(GreedyLongProposer(), k=5, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    for rid in "abcd":
        batch.add(rid, [1, 2, 3])
    # after this step each row holds 3 prompt + 1 output token
    limits: list[int | None] = [4, 3, 2, None]
    drafts = step(session, batch, dict.fromkeys("abcd", [1]), max_tokens=limits)
    assert [len(d) for d in drafts] == [2, 1, 0, 5]
    assert session.metrics.snapshot().budget_offered == 8
    # two tokens accepted for "a": one output token left, so no draft
    drafts = step(session, batch, {"a": [1, 1], "b": [1], "d": [1]}, max_tokens=limits)
    assert [len(d) for d in drafts] == [0, 0, 0, 5]


@pytest.mark.parametrize("rows", [1, 47, 48, 60])
def test_gathered_tokens_equal_each_rows_slice(rows: int) -> None:
    """Under and from ``_GATHER_ROWS`` rows (slices, one fancy index): the same tokens."""
    rng = np.random.default_rng(rows)
    buf = rng.integers(0, 50_000, size=(64, 32)).astype(np.int32)
    picked = rng.permutation(64)[:rows].tolist()
    lo = rng.integers(0, 20, size=rows).tolist()
    hi = [a + int(n) for a, n in zip(lo, rng.integers(0, 9, size=rows), strict=True)]
    want = [int(t) for r, a, b in zip(picked, lo, hi, strict=True) for t in buf[r, a:b]]
    got = _gather(buf, picked, lo, hi, [b - a for a, b in zip(lo, hi, strict=True)])
    assert got.dtype == np.int32 and got.tolist() == want
    assert (rows >= _GATHER_ROWS) == (rows in (48, 60))


class _CountedReads(list):  # type: ignore[type-arg]
    """A context's ``max_tokens``, counting the rows read from it."""

    reads = 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        type(self).reads += 1
        return super().__getitem__(i)


def test_a_requests_max_tokens_is_read_once_when_it_is_first_seen() -> None:
    """A request's sampling params do not change, so its limit is read when the session
    first sees it (vLLM's plugin then looks up no request state for the other rows)."""
    session = DraftSession(GreedyLongProposer(), k=5, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    for rid in "ab":
        batch.add(rid, [1, 2, 3])
    _CountedReads.reads = 0
    drafts = step(session, batch, dict.fromkeys("ab", [1]), max_tokens=_CountedReads([4, None]))
    assert [len(d) for d in drafts] == [2, 5] and _CountedReads.reads == 2
    # later values are not read: "a" keeps its limit (3 + 4 tokens; 5 held, 1 left to draft)
    drafts = step(session, batch, dict.fromkeys("ab", [1]), max_tokens=_CountedReads([0, 0]))
    assert [len(d) for d in drafts] == [1, 5] and _CountedReads.reads == 2


@pytest.mark.parametrize("bad", [10**6, 100, -1, 3.5, True, "7", np.int64(100), None])
def test_a_bad_draft_row_is_dropped_and_counted(
    bad: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Ids outside ``[0, vocab_size)`` or not integers never reach vLLM: that row gets
    no drafts (a ``propose:bad_draft`` fault, logged once); the other rows keep theirs."""
    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(BadDraftProposer(bad=bad), k=4, metrics=metrics, vocab_size=100)
    batch = Batch()
    batch.add("v", [5, 6], tags_to_wire(TAGS))
    batch.add("x", [7, 8], tags_to_wire(StructureTags(agent_id="bad", query_id="q")))
    for i in range(3):
        assert step(session, batch, {"v": [9 + i], "x": [20 + i]}) == [[9 + i] * 3, []]
    assert metrics.snapshot().faults == {"propose:bad_draft": 3}
    assert caplog.text.count("bad draft") == 1
    # numpy ids in range are fine, and ids at the top of the vocabulary pass
    ok = DraftSession(BadDraftProposer(bad=np.int64(99)), k=4, metrics=metrics, vocab_size=100)
    assert step(ok, batch, {"v": [1], "x": [2]}) == [[1] * 3, [99, 2, 2, 2]]
    with pytest.raises(ValueError, match="vocab_size=0"):
        DraftSession(ProbeProposer(), k=4, vocab_size=0)


class _MixedDrafts(ProbeProposer):
    """Per request id: ``ok`` a plain draft, ``np`` numpy ids in range, ``junk`` a draft
    whose ids cannot be sliced, ``obj`` not a Draft at all."""

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        kinds: dict[str, object] = {
            "ok": Draft((3, 4, 5)),
            "np": Draft(tuple(np.array([6, 7], dtype=np.int32))),  # type: ignore[arg-type]
            "junk": Draft(7),  # type: ignore[arg-type]
            "obj": "not a draft",
        }
        return [kinds[rid] for rid in req_ids]  # type: ignore[misc]


def test_unreadable_draft_rows_are_dropped_and_the_rest_checked_as_a_whole() -> None:
    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(_MixedDrafts(), k=4, metrics=metrics, vocab_size=100)
    batch = Batch()
    for rid in ("ok", "junk", "np", "obj"):
        batch.add(rid, [1, 2])
    out = step(session, batch, {"ok": [1], "junk": [1], "np": [1], "obj": [1]})
    assert out == [[3, 4, 5], [], [6, 7], []]
    assert all(type(t) is int for row in out for t in row)  # numpy ids handed on as ints
    assert metrics.snapshot().faults == {"propose:bad_draft": 2}
    batch.remove("junk")
    batch.remove("obj")
    assert step(session, batch, {"ok": [1], "np": [1]}) == [[3, 4, 5], [6, 7]]


class _RegimeProbe(ProbeProposer):
    """Records the ``decoding`` each request started with."""

    def __init__(self) -> None:
        super().__init__(draft_len=1)
        self.decoding: dict[str, str] = {}

    def start(
        self, req_id: str, prompt_ids: Any, tags: Any = None, *, decoding: str = "greedy"
    ) -> None:
        self.decoding[req_id] = decoding
        super().start(req_id, prompt_ids, tags)


def test_decoding_reaches_a_proposer_that_takes_it_and_only_that() -> None:
    regime = _RegimeProbe()
    session = DraftSession(regime, k=4, metrics=DrafterMetrics(prometheus=False))
    batch = Batch()
    for rid in "abcd":
        batch.add(rid, [1, 2])
    tokens = dict.fromkeys("abcd", [3])
    step(session, batch, tokens, decoding=["sampled", "greedy", "constrained", None])
    assert regime.decoding == {"a": "sampled", "b": "greedy", "c": "constrained", "d": "greedy"}
    plain = ProbeProposer(draft_len=1)  # start(req_id, prompt_ids, tags): never passed it
    session = DraftSession(plain, k=4, metrics=DrafterMetrics(prometheus=False))
    assert step(session, batch, tokens, decoding=["sampled"] * 4) == [[3]] * 4
    assert set(plain.tokens) == set("abcd") and session.metrics.snapshot().faults == {}


class _DuckDrafts(ProbeProposer):
    """``duck``: an object with ``token_ids`` and no ``probs`` (no estimates to count)."""

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        duck = SimpleNamespace(token_ids=(8, 9))
        return [duck if rid == "duck" else Draft((3, 4)) for rid in req_ids]  # type: ignore[misc]


def test_a_draft_without_estimates_costs_no_row() -> None:
    """Session 67's review: a draft object without ``probs`` cost every row of its step
    (an ``adapter:AttributeError``); its ids are a draft like any other."""
    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(_DuckDrafts(), k=4, metrics=metrics, vocab_size=100)
    batch = Batch()
    for rid in ("ok", "duck"):
        batch.add(rid, [1, 2])
    for _ in range(2):
        assert step(session, batch, {"ok": [1], "duck": [1]}) == [[3, 4], [8, 9]]
    assert metrics.snapshot().faults == {}


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({**tags_to_wire(TAGS), "agentspec_v": 99}, "version"),
        ({**tags_to_wire(TAGS), "agentspec_blocks": "x" * MAX_WIRE_CHARS}, "oversized"),
        ({**tags_to_wire(TAGS), "agentspec_blocks": "[[1, 2]]"}, "invalid"),
        ({"agentspec_v": 1, "agentspec_agent": "a"}, "invalid"),
        ({**tags_to_wire(TAGS), "agentspec_colour": "red"}, "invalid"),
    ],
)
def test_bad_wire_tags_make_only_that_request_tag_free(
    extra: dict[str, object], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = DrafterMetrics(prometheus=False)
    probe = ProbeProposer()
    session = DraftSession(probe, k=4, metrics=metrics)
    batch = Batch()
    batch.add("bad", [1, 2], extra)
    batch.add("good", [3, 4], {**tags_to_wire(TAGS), "other_key": 1})
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_vllm.session"):
        drafts = step(session, batch, {"bad": [5], "good": [6]})
    assert probe.tags == {"bad": None, "good": TAGS}
    assert drafts == [[5, 5, 5], [6, 6, 6]]
    assert metrics.snapshot().tag_rejections == {reason: 1}
    assert "bad runs tag-free" in caplog.text


@pytest.mark.parametrize("verb", ["start", "extend", "propose", "stop"])
def test_a_throwing_proposer_costs_only_drafts(verb: str, caplog: pytest.LogCaptureFixture) -> None:
    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(ExplodingProposer(fail_in=verb), k=4, metrics=metrics)
    batch = Batch()
    batch.add("a", [1, 2])
    with caplog.at_level(logging.ERROR, logger="agentspec_mw_vllm.session"):
        for t in range(3, 8):
            drafts = step(session, batch, {"a": [t]})
            if verb in ("start", "extend", "propose"):
                assert drafts == [[]]
            else:
                assert drafts == [[t, t, t]]
        batch.remove("a")
        step(session, batch, {})
    faults = metrics.snapshot().faults
    if verb == "stop":
        assert faults == {"stop:RuntimeError": 1}
    elif verb == "start":
        assert faults == {"start:KeyError": 1}
    elif verb == "extend":
        assert faults == {"extend:ValueError": 1}  # the request is then left alone
    else:
        assert faults == {"propose:RuntimeError": 5}
    assert caplog.text.count("raised in") == 1  # logged once per kind
    assert session.live_requests == frozenset()


def test_missing_batch_context_is_a_counted_fault() -> None:
    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(ProbeProposer(), k=4, metrics=metrics)
    out = session.step(None, [[1], [2]], np.array([3, 3]), np.zeros((2, 8), dtype=np.int32))
    assert out == [[], []]
    assert metrics.snapshot().faults == {"adapter:RuntimeError": 1}


def _verify_once(proposer: ProbeProposer) -> tuple[DraftSession, Batch, DrafterMetrics]:
    """Two requests (``a`` tagged ``coder``) draft 3 tokens each; the scheduler keeps 3 of
    a's and 2 of b's, a accepts 2 (+1 bonus), b none."""
    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(proposer, k=4, metrics=metrics)
    batch = Batch()
    batch.add("a", [1, 2], tags_to_wire(TAGS))
    batch.add("b", [3, 4])
    step(session, batch, {"a": [5], "b": [6]})
    step(session, batch, {"a": [5, 5, 9], "b": [7]}, spec={"a": [5, 5, 5], "b": [6, 6]})
    return session, batch, metrics


def test_metrics_count_verified_and_accepted_per_agent_and_block() -> None:
    _, _, metrics = _verify_once(ProbeProposer(draft_len=3))
    snap = metrics.snapshot()
    assert snap.drafted == {"coder/tool_call": 3, "untagged/none": 2}
    assert snap.accepted == {"coder/tool_call": 2, "untagged/none": 0}
    assert snap.budget_offered == 16 and snap.budget_used == 12
    assert snap.draft_steps == 2 and snap.proposer_seconds > 0


class EstimatingProposer(ProbeProposer):
    """Echo drafts that carry per-token estimates (0.8, 0.5, 0.5, ...)."""

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        return [
            Draft((self.tokens[rid][-1],) * self.draft_len, (0.8,) + (0.5,) * (self.draft_len - 1))
            for rid in req_ids
        ]


def test_live_calibration_counts_the_expected_survival_of_the_verified_positions() -> None:
    # a: all 3 drafts verified (survivals 0.8, 0.4, 0.2), 2 accepted; b: cut to 2 (0.8, 0.4), none
    session, batch, metrics = _verify_once(EstimatingProposer(draft_len=3))
    snap = metrics.snapshot()
    assert snap.estimated == {"coder/tool_call": 3, "untagged/none": 2}
    assert snap.expected == pytest.approx({"coder/tool_call": 1.4, "untagged/none": 1.2})
    assert snap.estimated_accepted == {"coder/tool_call": 2, "untagged/none": 0}
    bins = {i: row for i, row in enumerate(snap.reliability) if row[0]}
    assert bins.keys() == {2, 4, 8}
    assert bins[8][0] == 2 and bins[8][1] == pytest.approx(1.6) and bins[8][2] == 1
    assert bins[4][0] == 2 and bins[4][2] == 1 and bins[2] == (1, pytest.approx(0.2), 0)
    # a request drafted nothing in the last step: nothing verified, nothing expected
    step(session, batch, {"a": [3], "b": [8]})
    assert metrics.snapshot().estimated == snap.estimated


def test_drafts_without_estimates_count_as_verified_only() -> None:
    _, _, metrics = _verify_once(ProbeProposer(draft_len=3))
    snap = metrics.snapshot()
    assert snap.drafted == {"coder/tool_call": 3, "untagged/none": 2}
    assert snap.estimated == {} and snap.expected == {} and snap.reliability == ()


class _BrokenMetrics(DrafterMetrics):
    def record_verified_many(self, rows: Sequence[object]) -> None:  # type: ignore[override]
        raise RuntimeError("metrics down")


def test_failing_metrics_cost_no_drafts() -> None:
    metrics = _BrokenMetrics(prometheus=False)
    session = DraftSession(ProbeProposer(draft_len=3), k=4, metrics=metrics)
    batch = Batch()
    batch.add("a", [1, 2])
    step(session, batch, {"a": [5]})
    drafts = step(session, batch, {"a": [5, 5, 9]}, spec={"a": [5, 5, 5]})
    assert drafts == [[9, 9, 9]]
    assert metrics.snapshot().faults == {"metrics:RuntimeError": 1}


def test_a_drafts_block_labels_its_verification() -> None:
    class Blocked(ProbeProposer):
        def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
            return [Draft((self.tokens[r][-1],) * 2, (), "json") for r in req_ids]

        def block_of(self, req_id: str) -> str | None:
            return "never read"

    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(Blocked(), k=4, metrics=metrics)
    batch = Batch()
    batch.add("a", [1, 2], tags_to_wire(TAGS))
    step(session, batch, {"a": [5]})
    step(session, batch, {"a": [5, 5, 9]}, spec={"a": [5, 5]})
    assert metrics.snapshot().drafted == {"coder/json": 2}


def test_survivals_must_match_the_verified_positions() -> None:
    with pytest.raises(ValueError, match="2 survivals for 3 drafted"):
        DrafterMetrics(prometheus=False).record_verified("x", "none", 3, 1, None, [0.9, 0.5])


def test_agent_labels_are_bounded() -> None:
    metrics = DrafterMetrics(prometheus=False)
    labels = {metrics.agent_label(f"agent{i}") for i in range(200)}
    assert "other" in labels and len(labels) == 65
    assert metrics.agent_label(None) == "untagged"


class RecordingTimer(MeasuredStepTime):
    """A real step-time fit that also keeps what it was told (or raises, if asked)."""

    def __init__(self, explode: bool = False) -> None:
        super().__init__()
        self.calls: list[tuple[float, float, float]] = []
        self.drafts: list[tuple[float, float]] = []
        self.emitted: list[float] = []
        self.explode = explode

    def observe(
        self,
        num_batched: float,
        num_kv: float,
        seconds: float,
        spec_kv: float = 0.0,
        draft_kv: float = 0.0,
        emitted: float = 0.0,
    ) -> bool:
        if self.explode:
            raise ArithmeticError("boom-timer")
        self.calls.append((num_batched, num_kv, seconds))
        self.drafts.append((spec_kv, draft_kv))
        self.emitted.append(emitted)
        return super().observe(num_batched, num_kv, seconds, spec_kv, draft_kv, emitted)


def _clock(times: list[float]):  # type: ignore[no-untyped-def]
    ticks = iter(times)
    return lambda: next(ticks)


def test_engine_steps_are_timed_between_draft_calls() -> None:
    metrics = DrafterMetrics(prometheus=False)
    timer = RecordingTimer()
    # each draft call reads the clock at its start and at its end
    clock = _clock([10.0, 10.001, 10.051, 10.052, 10.200, 10.201, 20.0, 20.001])
    session = DraftSession(
        ProbeProposer(draft_len=2), k=4, metrics=metrics, step_timer=timer, clock=clock
    )
    batch = Batch()
    batch.add("a", [1, 2, 3])
    batch.add("b", [4, 5])
    step(session, batch, {"a": [6], "b": [7]}, scheduled={"a": 3, "b": 2})
    assert timer.calls == []  # nothing before the first call to time against
    step(session, batch, {"a": [6, 6], "b": [7]}, scheduled={"a": 3, "b": 3})
    # 6 tokens scheduled, 6 + 4 resident, 50 ms from the end of the last call
    assert timer.calls == [(6, 10, pytest.approx(0.050))]
    assert timer.emitted == [3]  # the tokens the step sampled: a's two, b's one
    assert metrics.snapshot().step_model["steps"] == 1.0
    batch.add("c", [8])
    step(session, batch, {"a": [6], "b": [7], "c": [9]}, scheduled={"a": 3, "b": 3, "c": 1})
    assert timer.calls[-1] == (7, 14, pytest.approx(0.148))
    # a batch with no request of the last call: the engine may have idled, not timed
    batch.remove("a")
    batch.remove("b")
    batch.remove("c")
    batch.add("d", [1, 2])
    step(session, batch, {"d": [3]}, scheduled={"d": 2})
    assert len(timer.calls) == 2


def test_the_timed_step_reports_its_drafts_by_their_requests_context() -> None:
    timer = RecordingTimer()
    clock = _clock([10.0, 10.001, 10.051, 10.052, 10.200, 10.201])
    session = DraftSession(
        ProbeProposer(draft_len=2),
        k=4,
        metrics=DrafterMetrics(prometheus=False),
        step_timer=timer,
        clock=clock,
    )
    batch = Batch()
    batch.add("a", [1, 2, 3])
    batch.add("b", [4, 5])
    step(session, batch, {"a": [6], "b": [7]}, scheduled={"a": 3, "b": 2})
    # a carried 2 drafts (one accepted: a holds 6 tokens), b none
    step(session, batch, {"a": [6, 6], "b": [7]}, spec={"a": [6, 6]}, scheduled={"a": 3, "b": 1})
    assert timer.drafts == [(6, 12)]
    # both drafted: 2 + 1 drafts, a now at 7 tokens and b at 5
    spec = {"a": [6, 6], "b": [7]}
    step(session, batch, {"a": [6], "b": [7]}, spec=spec, scheduled={"a": 3, "b": 2})
    assert timer.drafts[-1] == (7 + 5, 2 * 7 + 1 * 5)


def test_a_step_clock_times_the_steps_and_the_clock_the_proposer() -> None:
    metrics = DrafterMetrics(prometheus=False)
    timer = RecordingTimer()
    session = DraftSession(
        ProbeProposer(draft_len=2),
        k=4,
        metrics=metrics,
        step_timer=timer,
        clock=_clock([10.0, 10.001, 10.500, 10.501]),  # wall: 499 ms between the calls
        step_clock=_clock([1.0, 1.001, 1.080, 1.081]),  # the engine thread's CPU: 79 ms
    )
    batch = Batch()
    batch.add("a", [1, 2, 3])
    step(session, batch, {"a": [6]}, scheduled={"a": 3})
    step(session, batch, {"a": [6, 6]}, scheduled={"a": 3})
    assert timer.calls == [(3, 6, pytest.approx(0.079))]


def test_a_throwing_step_timer_costs_nothing_but_its_fit() -> None:
    metrics = DrafterMetrics(prometheus=False)
    session = DraftSession(
        ProbeProposer(draft_len=2), k=4, metrics=metrics, step_timer=RecordingTimer(explode=True)
    )
    batch = Batch()
    batch.add("a", [1, 2, 3])
    step(session, batch, {"a": [6]}, scheduled={"a": 3})
    out = step(session, batch, {"a": [6]}, scheduled={"a": 1})
    assert [len(d) for d in out] == [2]
    assert metrics.snapshot().faults == {"step_timer:ArithmeticError": 1}


@pytest.mark.parametrize("omp", ["1", "2"])
def test_the_cpu_build_times_steps_on_the_engine_threads_cpu_clock(
    monkeypatch: pytest.MonkeyPatch, omp: str
) -> None:
    """With one OpenMP thread or more (the default is one per core), a CUDA build on wall
    time: CPU time would miss the GPU's work."""
    import time

    import agentspec_mw_vllm.adapter as adapter
    import agentspec_mw_vllm.engine as engine

    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(engine, "is_cpu_build", lambda: True)
    assert adapter._step_clock() is time.thread_time
    monkeypatch.setattr(engine, "is_cpu_build", lambda: False)
    assert adapter._step_clock() is None
