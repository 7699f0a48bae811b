"""The AgentSpec proposer: blocks, index, budget, calibration, isolation, caps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from agentspec_mw.agentspec import (
    DEFAULT_BLOCKS,
    AgentSpecProposer,
    BlockGrammar,
    BlockState,
    allocate,
    ngram_index,
    redundancy_score,
)
from agentspec_mw.agentspec.budget import StepShape, admission_bound, prefill_time, step_times
from agentspec_mw.agentspec.calibration import SOURCES
from agentspec_mw.agentspec.kernels import C_CAL, C_CCAP, C_CLEN, C_CSTART, C_OK
from agentspec_mw.agentspec.ngram_index import MAX_N, NgramIndex, _lookup_par, _lookup_rows
from agentspec_mw.agentspec.parallel import SERIAL, THREADED, ModeChooser
from agentspec_mw.agentspec.slots import SlotTable
from agentspec_mw.costfit import MeasuredStepTime
from agentspec_mw.costmodel import PRESETS, StepTimeFn
from agentspec_mw.proposer import ProposerEnv, StepContext
from agentspec_mw.tags import StructureTags
from agentspec_mw.tokens import token_bytes_table

COST = PRESETS["llama8b-h100"]


@pytest.fixture(scope="module")
def tb(tiny_tokenizer) -> list[bytes]:  # type: ignore[no-untyped-def]
    return token_bytes_table(tiny_tokenizer)


def _ids(tok, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return list(tok(text, add_special_tokens=False)["input_ids"])


# -- block tracker ------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,inside,after",
    [
        ("Here:\n```python\nprint(1)\n```\nDone", "code", "text"),
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nok', "json_call", "text"),
        ("<think>hmm, let me see</think>answer", "think", "text"),
        (" I should search.\nAction 1: Search[x]\nThought 2: bar", "action", "thought"),
    ],
)
def test_block_tracker_on_real_delimiters(
    tiny_tokenizer, tb, text: str, inside: str, after: str
) -> None:  # type: ignore[no-untyped-def]
    g = BlockGrammar(DEFAULT_BLOCKS, tb)
    ids = _ids(tiny_tokenizer, text)
    whole = BlockState(g)
    runs = whole.feed(ids)
    assert inside in [b for b, _ in runs]
    assert whole.current == after
    # token by token (delimiters split across calls) gives the same attribution
    one = BlockState(g)
    per_token = [one.feed([t])[0][0] for t in ids]
    assert per_token == [b for b, n in runs for _ in range(n)]


def test_block_tracker_split_delimiter_and_unterminated(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    g = BlockGrammar(DEFAULT_BLOCKS, tb)
    st = BlockState(g)
    # feed "<tool_call>" byte-piece by byte-piece, as tokens that split it
    pieces = ["<to", "ol_c", "all>", "x"]
    for p in pieces:
        st.feed(_ids(tiny_tokenizer, p))
    assert st.current == "tool_call"  # opened across four calls, never closed
    st.feed(_ids(tiny_tokenizer, "```"))
    assert st.stack == ["tool_call", "code"]  # nesting


def _reference_blocks(g: BlockGrammar, ids: Sequence[int]) -> list[str]:
    """A slow, obvious oracle: after each byte, apply the delimiters ending there."""
    delims = sorted(
        {d for s in g.specs for d in (s.start.encode(), s.end.encode())}, key=len, reverse=True
    )
    stack: list[str] = []
    seen = b""
    out = []
    for t in ids:
        out.append(stack[-1] if stack else "text")
        for byte in g.token_bytes[t]:
            seen += bytes([byte])
            for d in delims:
                if not seen.endswith(d):
                    continue
                if stack and d == next(s.end.encode() for s in g.specs if s.name == stack[-1]):
                    stack.pop()
                else:
                    opens = [s.name for s in g.specs if s.start.encode() == d]
                    if opens and len(stack) < 8:
                        stack.append(opens[0])
    return out


def test_block_tracker_matches_a_reference_on_the_sample(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import _corpus

    g = BlockGrammar(DEFAULT_BLOCKS, tb)
    rng = np.random.default_rng(0)
    for text in _corpus()[:40]:
        ids = _ids(tiny_tokenizer, text)
        st = BlockState(g)
        got: list[str] = []
        i = 0
        while i < len(ids):  # random chunking: attribution must not depend on it
            n = int(rng.integers(1, 6))
            got += [b for b, m in st.feed(ids[i : i + n]) for _ in range(m)]
            i += n
        assert got == _reference_blocks(g, ids)


# -- the index ----------------------------------------------------------------------
def test_index_majority_continuation_and_key_isolation() -> None:
    ix = NgramIndex(capacity=1 << 12)
    seq = np.array([5, 6, 7, 8, 1, 2, 5, 6, 7, 9, 3, 5, 6, 7, 8, 4], dtype=np.int32)
    ix.insert(np.zeros(len(seq), np.int64), np.full(len(seq), ix.new_seq(), np.int64), seq)
    ctx = np.zeros((2, MAX_N), np.int32)
    ctx[:, :2] = [6, 7]
    toks, probs, lens, match, support = ix.lookup(np.array([0, 1]), ctx, np.array([2, 2]), 4)
    assert toks[0, 0] == 8 and probs[0, 0] == pytest.approx(2 / 3)  # 8,9,8 follow "6 7"
    assert match[0] == 2 and support[0] == 3
    assert lens[1] == 0  # key 1 never sees key 0's tokens


def test_index_inserts_hash_every_level_as_the_reference_hash() -> None:
    """``stage_insert`` hashes all levels in one pass; each level's table entry must sit
    under :func:`ngram_index._hash` of the same n-gram and point at the newest token."""
    ix = NgramIndex(capacity=1 << 12)
    toks = np.arange(100, 120, dtype=np.int32)
    key = 7
    ix.insert(np.full(len(toks), key, np.int64), np.full(len(toks), ix.new_seq(), np.int64), toks)
    _rec, ht, *_ = ix.arrays
    for n in ngram_index.LEVELS:
        h = ngram_index._hash(np.int64(key), np.int64(n), toks, len(toks))
        rows = np.flatnonzero(ht[:, 0] == h)
        assert len(rows) == 1 and ht[rows[0], 1] == len(toks) - 1, n


@pytest.mark.parametrize("capacity", [64, 1 << 12])
def test_index_staged_inserts_equal_one_at_a_time(capacity: int) -> None:
    """Inserts whose table probes wait in a stage (flushed every ``STAGE_TOKENS`` tokens,
    or every ``capacity`` tokens when the arena is smaller, and at the end of a call)
    leave the index exactly as inserting one token per call, i.e. each insert done
    whole — also once the arena has wrapped many times."""
    rng = np.random.default_rng(11)
    n_tok = 3 * ngram_index.STAGE_TOKENS + 77
    toks = rng.integers(0, 5, n_tok).astype(np.int32)  # small vocabulary: shared n-grams
    keys = rng.integers(0, 3, n_tok).astype(np.int64)
    batched, single = NgramIndex(capacity=capacity), NgramIndex(capacity=capacity)
    seq_ids = [(batched.new_seq(), single.new_seq()) for _ in range(5)]
    pick = rng.integers(0, 5, n_tok)
    seqs_b = np.array([seq_ids[i][0] for i in pick], np.int64)
    seqs_s = np.array([seq_ids[i][1] for i in pick], np.int64)
    batched.insert(keys, seqs_b, toks)
    for i in range(n_tok):
        single.insert(keys[i : i + 1], seqs_s[i : i + 1], toks[i : i + 1])
    assert batched.written == single.written == n_tok
    for a, b in zip(batched.arrays, single.arrays, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("capacity", [64, 1 << 12])
def test_index_runs_equal_one_at_a_time(capacity: int) -> None:
    """``stage_run`` (the kernels' call per run of one key's tokens, the insert inlined)
    leaves the index exactly as inserting its tokens one call each."""
    rng = np.random.default_rng(12)
    runs, single = NgramIndex(capacity=capacity), NgramIndex(capacity=capacity)
    seq_ids = [(runs.new_seq(), single.new_seq()) for _ in range(4)]
    toks = rng.integers(0, 5, 2 * ngram_index.STAGE_TOKENS + 301).astype(np.int32)
    stage = ngram_index.new_stage()
    lo = 0
    while lo < len(toks):
        hi = min(len(toks), lo + int(rng.integers(1, 90)))
        key, which = int(rng.integers(0, 3)), int(rng.integers(0, 4))
        ngram_index.stage_run(key, seq_ids[which][0], toks, lo, hi, runs.arrays, stage)
        for i in range(lo, hi):
            single.insert(
                np.array([key], np.int64), np.array([seq_ids[which][1]], np.int64), toks[i : i + 1]
            )
        lo = hi
    ngram_index.flush_stage(runs.arrays, stage)
    assert runs.written == single.written == len(toks)
    for a, b in zip(runs.arrays, single.arrays, strict=True):
        np.testing.assert_array_equal(a, b)


def test_index_recycled_sequence_starts_clean() -> None:
    """A released sequence id comes back empty: new tokens neither link to nor hash with
    the tokens it held before."""
    ix = NgramIndex(capacity=1 << 10)
    s = ix.new_seq()
    ix.insert(np.zeros(5, np.int64), np.full(5, s, np.int64), np.arange(5, dtype=np.int32))
    ix.end_seqs(np.array([s]))
    assert ix.new_seq() == s
    ix.insert(np.zeros(1, np.int64), np.array([s]), np.array([9], np.int32))
    rec32 = ix.arrays[7]
    assert rec32[4, 1] == -1  # the old last token does not hold the new one as its next
    assert ix.arrays[4][s] == 1  # its ring holds the one new token: no n-gram yet


def test_index_capacity_evicts_oldest() -> None:
    ix = NgramIndex(capacity=64)
    s = ix.new_seq()
    old = np.array([1, 2, 3, 4] * 4, dtype=np.int32)
    ix.insert(np.zeros(16, np.int64), np.full(16, s, np.int64), old)
    filler = np.arange(100, 200, dtype=np.int32)
    ix.insert(np.zeros(100, np.int64), np.full(100, ix.new_seq(), np.int64), filler)
    ctx = np.zeros((1, MAX_N), np.int32)
    ctx[0, :2] = [2, 3]
    assert ix.lookup(np.array([0]), ctx, np.array([2]), 4)[2][0] == 0


def test_index_threaded_lookup_equals_serial() -> None:
    """Rows split over threads (``_lookup_par``) give exactly the serial drafts."""
    rng = np.random.default_rng(3)
    ix = NgramIndex(capacity=1 << 14)
    n_tok = 6000
    toks = rng.integers(0, 12, n_tok).astype(np.int32)  # small vocabulary: many matches
    keys = rng.integers(0, 5, n_tok).astype(np.int64)
    ix.insert(keys, np.full(n_tok, ix.new_seq(), np.int64), toks)
    n = 301
    ctx = rng.integers(0, 12, (n, MAX_N)).astype(np.int32)
    ctx_len = rng.integers(0, MAX_N + 1, n).astype(np.int64)
    qkeys = rng.integers(-1, 5, n).astype(np.int64)
    ks = np.full(n, 8, np.int64)

    def run(chunks: int) -> list[np.ndarray]:
        out = [np.zeros((n, 8), np.int32), np.zeros((n, 8))]
        out += [np.zeros(n, np.int64) for _ in range(3)]
        args = (qkeys, ctx, ctx_len, ks, ix.arrays, *out)
        if chunks:
            _lookup_par(chunks, *args)
        else:
            _lookup_rows(0, n, *args)
        return out

    serial = run(0)
    assert serial[2].sum() > 0  # some rows draft
    for chunks in (2, 3, 7):
        for a, b in zip(serial, run(chunks), strict=True):
            np.testing.assert_array_equal(a, b)


def _reference_lookup(
    events: list[tuple[int, int, int]], key: int, tail: list[int], k: int
) -> tuple[list[int], list[float], int, int]:
    """The index's lookup by brute force over the inserted ``(key, seq, token)`` events
    (none evicted): ``(tokens, probs, match, support)``."""
    prev: list[int] = []  # position of the previous token of the same sequence
    last: dict[int, int] = {}
    for p, (_, s, _) in enumerate(events):
        prev.append(last.get(s, -1))
        last[s] = p
    nxt = [-1] * len(events)
    for p, q in enumerate(prev):
        if q >= 0:
            nxt[q] = p

    def window(p: int, n: int) -> list[int] | None:
        out = []
        while len(out) < n and p >= 0:
            out.append(events[p][2])
            p = prev[p]
        return out[::-1] if len(out) == n else None

    for n in sorted(ngram_index.LEVELS.tolist(), reverse=True):
        if len(tail) < n:
            continue
        cands = []
        for p in range(len(events) - 1, -1, -1):
            if len(cands) == 16:
                break
            if events[p][0] == key and nxt[p] >= 0 and window(p, n) == tail[-n:]:
                cands.append(nxt[p])
        if not cands:
            continue
        toks: list[int] = []
        probs: list[float] = []
        support = len(cands)
        while len(toks) < k and cands:
            seen = [events[c][2] for c in cands]
            best = max(dict.fromkeys(seen), key=seen.count)  # the first seen wins ties
            pr = seen.count(best) / len(cands)
            toks.append(best)
            probs.append(pr)
            cands = [nxt[c] for c in cands if events[c][2] == best and nxt[c] >= 0]
        return toks, probs, n, support
    return [], [], 0, 0


def test_index_lookup_equals_brute_force() -> None:
    """The lockstep lookup (serial and threaded) drafts exactly what a brute-force search
    over the inserted tokens gives, each row at most its own ``ks[r]`` tokens. The index
    has not wrapped here: once it has, an insert can start a new chain past a stale
    bucket and lose older occurrences (the known limitation in docs/agentspec.md), so
    brute force is not its specification."""
    rng = np.random.default_rng(7)
    ix = NgramIndex(capacity=1 << 13)
    n_tok = 4000
    toks = rng.integers(0, 6, n_tok).astype(np.int32)  # small vocabulary: long chains
    keys = rng.integers(0, 3, n_tok).astype(np.int64)
    seqs = np.array([ix.new_seq() for _ in range(4)])[rng.integers(0, 4, n_tok)]
    ix.insert(keys, seqs, toks)
    assert ix.written <= ix.capacity
    events = list(zip(keys.tolist(), seqs.tolist(), toks.tolist(), strict=True))
    n = 200
    ctx = rng.integers(0, 6, (n, MAX_N)).astype(np.int32)
    ctx_len = rng.integers(0, MAX_N + 1, n).astype(np.int64)
    qkeys = rng.integers(-1, 3, n).astype(np.int64)
    ks = np.where(rng.random(n) < 0.75, 12, rng.integers(0, 12, n)).astype(np.int64)
    for mode in ("serial", "threaded"):
        out = [np.zeros((n, 12), np.int32), np.zeros((n, 12))]
        out += [np.zeros(n, np.int64) for _ in range(3)]
        args = (qkeys, ctx, ctx_len, ks, ix.arrays, *out)
        if mode == "serial":
            _lookup_rows(0, n, *args)
        else:
            _lookup_par(3, *args)
        tok, prob, lens, match, support = out
        assert lens.sum() > n  # the rows draft
        for r in range(n):
            want = ([], [], 0, 0)
            if qkeys[r] >= 0:
                tail = ctx[r, : ctx_len[r]].tolist()
                want = _reference_lookup(events, int(qkeys[r]), tail, int(ks[r]))
            got = (tok[r, : lens[r]].tolist(), prob[r, : lens[r]].tolist(), match[r], support[r])
            assert got[0] == want[0] and got[2:] == want[2:], (mode, r)
            np.testing.assert_allclose(got[1], want[1])


def test_mode_chooser_prefers_threads_until_they_are_measured_slow() -> None:
    """Threaded unless its measured cost per row exceeds margin x serial; the other mode
    is re-timed every ``explore_every`` calls; first timings are discarded."""
    ch = ModeChooser(explore_every=8, alpha=1.0, margin=1.25)
    first = []
    for seconds, rows in ((1.0, 1), (1.2e-3, 100), (1.0, 1), (1.0e-3, 100)):
        mode = ch.pick()
        first.append(mode)
        ch.observe(mode, seconds, rows)  # the 1.0 s (compile-like) first timings: ignored
    assert first == [THREADED, THREADED, SERIAL, SERIAL]
    assert ch.cost == pytest.approx([1.0e-5, 1.2e-5])
    picks = [ch.pick() for _ in range(16)]
    assert picks.count(THREADED) == 14  # within the margin: threads, exploring serial
    assert [i for i, m in enumerate(picks) if m == SERIAL] == [3, 11]
    ch.observe(THREADED, 5.0e-3, 100)  # the other cores got busy
    picks = [ch.pick() for _ in range(16)]
    assert picks.count(SERIAL) == 14
    ch.observe(THREADED, 0.5e-3, 100)  # free again: noticed at the next exploration
    assert ch.pick() == THREADED
    with pytest.raises(ValueError, match="margin"):
        ModeChooser(margin=0.5)


def test_index_lookup_results_do_not_depend_on_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """``NgramIndex.lookup`` gives the same drafts whichever mode the chooser picks."""
    monkeypatch.setattr(ngram_index, "get_num_threads", lambda: 2)  # tests run 1 thread
    rng = np.random.default_rng(5)
    ix = NgramIndex(capacity=1 << 13)
    toks = rng.integers(0, 10, 3000).astype(np.int32)
    keys = rng.integers(0, 3, 3000).astype(np.int64)
    ix.insert(keys, np.full(3000, ix.new_seq(), np.int64), toks)
    n = 200
    ctx = rng.integers(0, 10, (n, MAX_N)).astype(np.int32)
    ctx_len = np.full(n, MAX_N, np.int64)
    qkeys = rng.integers(0, 3, n).astype(np.int64)
    runs = [ix.lookup(qkeys, ctx, ctx_len, 8) for _ in range(6)]
    assert runs[0][2].sum() > 0
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    assert min(ix.lookup_modes._seen) >= 2  # both modes ran (and were timed)


def test_index_lookup_rejects_depths_over_k() -> None:
    """Per-row depths over ``k`` (or too few of them) would overrun the output rows."""
    ix = NgramIndex(capacity=1 << 10)
    ctx = np.zeros((2, MAX_N), np.int32)
    args = (np.zeros(2, np.int64), ctx, np.full(2, 4, np.int64), 4)
    for bad in (np.array([4, 5]), np.array([4]), np.array([-1, 2])):
        with pytest.raises(ValueError, match="depths"):
            ix.lookup(*args, ks=bad)
    assert ix.lookup(*args, ks=np.array([4, 0]))[2].tolist() == [0, 0]


def test_index_capacity_rounds_up_to_a_power_of_two() -> None:
    assert NgramIndex(capacity=100).capacity == 128
    assert NgramIndex(capacity=1 << 12).capacity == 1 << 12


def test_slot_table_moves_and_compacts_contexts() -> None:
    st = SlotTable(rows=1, arena=64)  # forces row growth, segment moves and compaction
    rows = {}
    for i in range(20):
        prompt = np.arange(i * 10, i * 10 + 30, dtype=np.int32)
        rows[i] = (st.acquire(prompt), list(prompt))
    st.release([rows[i][0] for i in range(0, 20, 2)])
    live = {i: r for i, r in rows.items() if i % 2}
    for step in range(30):
        sl = np.array([r[0] for r in live.values()], dtype=np.int64)
        st.reserve(sl, np.full(len(sl), 50, dtype=np.int64))
        for i, (s, ref) in live.items():
            new = [1000 + step * 100 + i] * 50
            a, n = int(st.si[s, C_CSTART]), int(st.si[s, C_CLEN])
            st.ctx[a + n : a + n + 50] = new
            st.si[s, C_CLEN] = n + 50
            ref += new
        # the live segments never overlap and stay inside the arena
        spans = sorted((int(st.si[s, C_CSTART]), int(st.si[s, C_CCAP])) for s, _ in live.values())
        assert all(a + c <= b for (a, c), (b, _) in zip(spans, spans[1:], strict=False))
        assert spans[-1][0] + spans[-1][1] <= len(st.ctx)
    for s, ref in live.values():
        a, n = int(st.si[s, C_CSTART]), int(st.si[s, C_CLEN])
        assert st.ctx[a : a + n].tolist() == ref
    assert len(st) == 10
    st.release([r[0] for r in list(live.values())[:5]])
    st.compact()  # the live rows' segments packed at the front, in row order
    kept = sorted(list(live.values())[5:])
    ends = 0
    for s, ref in kept:
        a, n = int(st.si[s, C_CSTART]), int(st.si[s, C_CLEN])
        assert a == ends and st.ctx[a : a + n].tolist() == ref
        ends += int(st.si[s, C_CCAP])


# -- budget -------------------------------------------------------------------------
def test_budget_total_within_budget_and_prefixes() -> None:
    surv = [np.array([0.99, 0.98, 0.97, 0.5]), np.array([0.9, 0.2]), np.array([0.95])]
    flat, lens = np.concatenate(surv), np.array([4, 2, 1])
    a = allocate(flat, lens, batch_size=3, num_kv=0, cost=COST, budget=3)
    assert a.counts == [3, 0, 0]  # the three most likely positions
    b = allocate(
        np.array([0.99, 0.5, 0.9, 0.8]),
        np.array([2, 2]),
        batch_size=2,
        num_kv=0,
        cost=COST,
        budget=3,
    )
    assert b.counts == [1, 2] and b.used == 3
    free = allocate(flat, lens, batch_size=3, num_kv=0, cost=COST)
    assert all(c <= n for c, n in zip(free.counts, lens, strict=True))
    assert free.count_array.dtype == np.int64 and free.count_array.tolist() == free.counts
    # the threshold: what one more slot costs, in tokens at the admitted set's goodput
    n_now = 3 + free.used
    marginal = COST.step_time(n_now + 1, 0) - COST.step_time(n_now, 0)
    assert free.threshold == pytest.approx(marginal * free.goodput)
    assert free.goodput == pytest.approx(free.expected / COST.step_time(n_now, 0))


def _score_one(
    tok: np.ndarray,
    lens: np.ndarray,
    table: np.ndarray,
    fine: tuple,  # type: ignore[type-arg]
    floor: float,
    rec: int = 0,
) -> tuple[int, np.ndarray, int, np.ndarray]:
    """``kernels.score`` for one request (rows = sources), every c/n 1, match and support
    1 with record bucket ``rec``: returns (picked row, its cells, positions at or above the
    floor, their survivals)."""
    from agentspec_mw.agentspec import kernels as K
    from agentspec_mw.agentspec.calibration import MATCH_EDGES, N_Q, SUPPORT_EDGES

    n_src, k = tok.shape
    ones = np.ones(n_src, dtype=np.int64)
    pick, ln = np.empty(1, np.int64), np.empty(1, np.int64)
    cell = np.zeros((1, k), np.int64)
    ok, flat = np.empty(1, np.int64), np.empty(k)
    n_flat = K.score(
        tok,
        np.ones((n_src, k)),
        lens,
        ones,
        ones,
        np.full(1, rec, np.int64),
        np.zeros(1, np.int64),  # the request's scope row: row 0 of one-row tables
        np.atleast_2d(table),
        (np.atleast_2d(fine[0]), np.atleast_2d(fine[1]), *fine[2:]),
        MATCH_EDGES,
        SUPPORT_EDGES,
        N_Q,
        np.full(1, floor),
        pick,
        ln,
        cell,
        ok,
        flat,
        np.empty((n_src, k), np.int64),
        np.empty((n_src, k)),
    )
    assert n_flat == ok[0]
    return int(pick[0]), cell[0], n_flat, flat[:n_flat]


def test_score_picks_the_candidate_that_pays_above_the_floor() -> None:
    """Of two candidates, the one with more expected accepted tokens *at or above the
    floor* is picked, not the one whose long low-survival tail sums higher."""
    from agentspec_mw.agentspec import kernels as K
    from agentspec_mw.agentspec.calibration import N_ML, N_Q, N_SUP

    n_src, k = len(SOURCES), 16
    table = np.zeros((n_src, 2, N_ML, N_SUP, K.N_POS, N_Q))
    table[0], table[1] = 0.85, 0.95  # per-token acceptance: iso 0.85, agent 0.95
    table = table.reshape(-1)
    tok = np.zeros((n_src, k), dtype=np.int32)
    tok[0], tok[1] = 1, 2  # they disagree from the first token
    lens = np.array([16, 2] + [0] * (n_src - 2), dtype=np.int64)  # iso: 16, agent: 2 tokens
    zeros = np.zeros(len(table) * K.NF)
    fine = (zeros, zeros, np.zeros(8, dtype=np.int8), 0.0)  # token classes off
    for floor, want in ((1e-12, 0), (0.8, 1)):  # sums: 5.1 vs 1.85; above 0.8: 0.85 vs 1.85
        pick, _cells, n_flat, flat = _score_one(tok, lens, table, fine, floor)
        assert pick == want, (floor, pick)
        # the positions the budget may admit: the picked row's prefix at or above floor
        assert n_flat == (16 if want == 0 else 2)
        p = 0.85 if want == 0 else 0.95
        np.testing.assert_allclose(flat, p ** np.arange(1, n_flat + 1))


def test_token_classes_from_bytes() -> None:
    from agentspec_mw.agentspec.token_classes import NEWLINE, token_classes

    table = [b"", b" ", b"\n", b"  \n", b",", b"\xe4", b" the", b"ing", b"\nfoo", b"42", b"):\n"]
    want = [0, 0, NEWLINE, NEWLINE, 1, 1, 2, 3, 2 | NEWLINE, 3, 1 | NEWLINE]
    codes = token_classes(table)
    assert codes.tolist() == want
    assert token_classes(table) is codes  # built once per token table


def test_score_splits_cells_by_token_class_and_line_break() -> None:
    """A fine cell (text class x line break crossed) with a poor record lowers only the
    tokens that fall in it; with the strength at 0 (classes off) the cells alone count."""
    from agentspec_mw.agentspec import kernels as K
    from agentspec_mw.agentspec.calibration import N_ML, N_Q, N_SUP

    n_src, k = len(SOURCES), 4
    table = np.full(n_src * 2 * N_ML * N_SUP * K.N_POS * N_Q, 0.9)
    codes = np.array([3, 4], dtype=np.int8)  # token 0: a word going on; 1: a line break
    tok = np.zeros((n_src, k), dtype=np.int32)
    tok[0] = [0, 0, 1, 0]  # word, word, line break, word (after the break)
    lens = np.array([4] + [0] * (n_src - 1), dtype=np.int64)
    fsucc, ftot = np.zeros(len(table) * K.NF), np.zeros(len(table) * K.NF)
    ftot[7 :: K.NF] = 100.0  # class 3 after a line break: 0 of 100 accepted
    low = 8 * 0.9 / 108
    for strength, last in ((8.0, low), (0.0, 0.9)):
        _pick, cells, n_flat, flat = _score_one(
            tok, lens, table, (fsucc, ftot, codes, strength), 1e-12
        )
        assert n_flat == 4
        assert (cells % K.NF).tolist() == [3, 3, 0, 7]
        np.testing.assert_allclose(flat, np.cumprod([0.9, 0.9, 0.9, last]))


def test_score_splits_cells_by_the_request_record() -> None:
    """The request's record bucket (its streak of right candidate tokens) selects a
    further split of each fine cell: a poor record in one bucket lowers only requests in
    that bucket."""
    from agentspec_mw.agentspec import kernels as K
    from agentspec_mw.agentspec.calibration import N_ML, N_Q, N_SUP

    n_src, k = len(SOURCES), 2
    table = np.full(n_src * 2 * N_ML * N_SUP * K.N_POS * N_Q, 0.9)
    codes = np.zeros(1, dtype=np.int8)
    tok = np.zeros((n_src, k), dtype=np.int32)
    lens = np.array([2] + [0] * (n_src - 1), dtype=np.int64)
    fsucc, ftot = np.zeros(len(table) * K.NF), np.zeros(len(table) * K.NF)
    fresh = 2 * K.N_CLASSES  # fine-cell offset of record bucket 1 (class 0, no line break)
    ftot[fresh :: K.NF] = 100.0  # record bucket 1: 0 of 100 accepted
    low = 8 * 0.9 / 108
    for rec, p in ((0, 0.9), (1, low), (K.N_REC - 1, 0.9)):
        _pick, cells, n_flat, flat = _score_one(
            tok, lens, table, (fsucc, ftot, codes, 8.0), 1e-12, rec=rec
        )
        assert ((cells % K.NF) // (2 * K.N_CLASSES)).tolist() == [rec, rec]
        np.testing.assert_allclose(flat, np.cumprod([p, p]))


def test_request_record_counts_right_candidate_tokens_in_a_row(tb) -> None:  # type: ignore[no-untyped-def]
    """``C_STREAK`` grows by each verified candidate token that was right (the restart
    at a wrong one is the kernel's ``else`` branch; whether a candidate exists where the
    new text begins depends on the budget, so it is not asserted here)."""
    from agentspec_mw.agentspec import kernels as K

    copy = list(range(100, 140))
    out = copy + copy + list(range(200, 210))  # a copy drafted right through, then new text
    p = _prop(tb)
    p.start("r", [1, 2, 3], None)
    p.extend("r", out[:1])
    pos, seen = 1, []
    while pos < len(out):
        d = p.propose(["r"], 8, StepContext(batch_size=1, num_kv_tokens=3 + pos))[0]
        a = 0
        while a < len(d) and pos + a < len(out) and d.token_ids[a] == out[pos + a]:
            a += 1
        adv = min(a + 1, len(out) - pos)
        p.extend("r", out[pos : pos + adv])
        pos += adv
        p._flush()
        seen.append((pos, int(p._slots.si[p._reqs["r"], K.C_STREAK])))
    in_copy = [st for q, st in seen if q <= 80]
    assert max(in_copy) >= 16  # the second copy: its candidates right token after token
    assert all(st <= q for q, st in seen)  # never more than the tokens verified so far


def test_drafts_are_frozen_draft_values(tb) -> None:  # type: ignore[no-untyped-def]
    """``propose`` builds its drafts field by field (faster than ``Draft.__init__``): they
    are still ``Draft`` values, equal to and hashed as the same draft made the usual way,
    and frozen."""
    import dataclasses

    from agentspec_mw.proposer import Draft

    copy = list(range(100, 140))
    p = _prop(tb)
    p.start("r", [1, 2, 3], None)
    p.extend("r", copy + copy[:10])
    d = p.propose(["r"], 8, StepContext(batch_size=1, num_kv_tokens=53))[0]
    assert type(d) is Draft and len(d) > 0
    assert d.token_ids == tuple(copy[10 : 10 + len(d)])
    same = Draft(d.token_ids, d.probs, d.block)
    assert d == same and hash(d) == hash(same) and repr(d) == repr(same)
    assert all(isinstance(x, float) for x in d.probs) and isinstance(d.block, str)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.token_ids = ()  # type: ignore[misc]


def _step_time_reference(
    cost: StepTimeFn, b: int, kv: float, budget: int | None, waiting: int, n: int
) -> float:
    """T(n) of the budget's docstring, spelled out: the step with ``n`` drafts and the
    prefill chunks that still fit, plus the displaced chunks at a full step's marginal
    token time."""
    if budget is None:
        return cost.step_time(b + waiting + n, kv)
    p0, pn = min(waiting, budget), min(waiting, budget - n)
    c_disp = cost.step_time(b + budget + 1, kv) - cost.step_time(b + budget, kv)
    return cost.step_time(b + n + pn, kv) + c_disp * (p0 - pn)


def _allocate_reference(
    surv: np.ndarray,
    lens: np.ndarray,
    b: int,
    kv: float,
    budget: int | None,
    floor: float,
    cost: StepTimeFn,
    waiting: int = 0,
) -> tuple[list[int], int]:
    """The allocation spelled out in numpy: the n highest survivals (stable order) for
    the n that maximises E(n) / T(n), within the budget and the floor."""
    order = np.argsort(-surv, kind="stable")
    s_sorted = surv[order]
    cap = len(surv) if budget is None else min(len(surv), budget)
    cap = min(cap, int(np.sum(s_sorted >= floor)))
    exp = b + np.concatenate(([0.0], np.cumsum(s_sorted[:cap])))
    times = np.array(
        [_step_time_reference(cost, b, kv, budget, waiting, n) for n in range(cap + 1)]
    )
    if waiting and (budget is None or budget > 0):
        times -= times[0] - cost.step_time(b, kv)  # the conserved prefill is not charged
    best = int(np.argmax(exp / times))
    owner = np.repeat(np.arange(len(lens)), lens)
    return np.bincount(owner[order[:best]], minlength=len(lens)).tolist(), cap


class _ScalarCost:
    """A cost model with only ``step_time`` (the protocol's minimum): a convex curve."""

    def step_time(self, num_batched: float, num_kv: float) -> float:
        return 6e-3 + 1e-8 * num_kv + 2e-5 * num_batched + 4e-8 * num_batched**2

    def marginal_token_cost(self, num_batched: float, num_kv: float) -> float:
        return self.step_time(num_batched + 1, num_kv) - self.step_time(num_batched, num_kv)


def _measured_cost() -> MeasuredStepTime:
    """A step-time fit to a CPU-like engine (30 ms per step, 3 ms per token)."""
    fit = MeasuredStepTime()
    for i in range(64):
        fit.observe(1 + i % 24, 1000 + 50 * i, 0.030 + 0.003 * (1 + i % 24) + 1e-7 * i)
    return fit


@pytest.mark.parametrize(
    "cost",
    [
        COST,
        PRESETS["llama8b-h100-roofline"],
        PRESETS["llama8b-h200"],
        _ScalarCost(),
        _measured_cost(),
    ],
    ids=["linear", "roofline", "ridge", "step_time-only", "measured"],
)
def test_budget_matches_the_reference_on_random_steps(cost: StepTimeFn) -> None:
    # linear models (the preset, the measured fit) are evaluated inside the kernel, the
    # others from step times
    rng = np.random.default_rng(7)
    for trial in range(200):
        n_req = int(rng.integers(1, 40))
        lens = rng.integers(0, 9, size=n_req)
        # survivals non-increasing per request, with ties (coarse values) across requests
        surv = np.concatenate(
            [np.sort(rng.integers(1, 11, size=n) / 10.0)[::-1] for n in lens]
        ).astype(np.float64)
        b = int(rng.integers(1, 300))
        kv = float(rng.integers(0, 10**6))
        budget = None if trial % 3 else int(rng.integers(0, 20))
        waiting = int(rng.choice([0, 5, 5000]))
        floor = float(rng.choice([0.0, 0.3, 0.75]))
        a = allocate(
            surv,
            lens,
            batch_size=b,
            num_kv=kv,
            cost=cost,
            budget=budget,
            prefill_tokens=waiting,
            min_survival=floor,
        )
        want, cap = _allocate_reference(surv, lens, b, kv, budget, floor, cost, waiting)
        if lens.sum():
            assert a.counts == want and a.offered == cap, trial
        else:
            assert a.counts == [0] * n_req and a.used == 0
        # the admission bound skips positions but changes no allocation
        shape = StepShape(b, kv, budget, waiting)
        bound = admission_bound(cost, shape)
        kw = dict(batch_size=b, num_kv=kv, cost=cost, budget=budget, prefill_tokens=waiting)
        free = allocate(surv, lens, **kw)  # type: ignore[arg-type]
        bounded = allocate(surv, lens, min_survival=bound, **kw)  # type: ignore[arg-type]
        assert bounded.counts == free.counts, trial
    with pytest.raises(ValueError, match="sum\\(lens\\)"):
        allocate(np.ones(3), np.array([2]), batch_size=1, num_kv=0, cost=COST)


def test_budget_charges_the_prefill_drafts_displace() -> None:
    """Under the roofline a memory-bound step's drafts are free while no prompt waits;
    once waiting chunks fill the budget every draft displaces one, which a later full
    (compute-bound) step computes at c_tok. Under the linear model a draft costs c_tok
    either way: T(n) = t(b + p(0) + n)."""
    roof, lin = PRESETS["llama8b-h100-roofline"], PRESETS["llama8b-h100"]
    b, kv, budget = 64, 64 * 20_000.0, 8192 - 64
    n = np.arange(4.0)
    idle = step_times(roof, StepShape(b, kv, budget, 0), n)
    assert np.all(np.diff(idle) == 0.0)  # under the ridge: free slots
    busy = step_times(roof, StepShape(b, kv, budget, 100_000), n)
    assert np.diff(busy) == pytest.approx([roof.c_tok] * 3)
    for waiting in (0, 100, 100_000):
        t = step_times(lin, StepShape(b, kv, budget, waiting), n)
        p0 = min(waiting, budget)
        assert t == pytest.approx([lin.step_time(b + p0 + x, kv) for x in n])
    # the bound: nothing under it pays, from G(0) x the first slot's marginal time, G(0)
    # without the conserved prefill (the decodes' own step, t(b, kv))
    shape = StepShape(b, kv, budget, 100_000)
    t0, t1 = step_times(roof, shape, np.array([0.0, 1.0]))
    assert prefill_time(roof, shape) == pytest.approx(t0 - roof.step_time(b, kv))
    assert admission_bound(roof, shape) == pytest.approx(b / roof.step_time(b, kv) * (t1 - t0))
    assert admission_bound(roof, StepShape(b, kv, budget, 0)) == 0.0
    assert admission_bound(roof, StepShape(b, kv, 0, 0)) == float("inf")
    # a 5 %-likely position: drafted when its slot is free, and when it displaces a
    # prefill token too (64 long contexts: a decode step is worth ~57 ms, 21 us is cheap)
    s = np.array([0.05])
    for waiting in (0, 100_000):
        a = allocate(
            s, np.array([1]), batch_size=b, num_kv=kv, cost=roof, budget=budget,
            prefill_tokens=waiting,
        )  # fmt: skip
        assert a.used == 1, waiting
    # with a short step (64 requests over short contexts, linear) it does not pay
    assert not allocate(s, np.array([1]), batch_size=b, num_kv=b * 300, cost=lin).used


class _NoCoefficients:
    """A cost model seen without ``linear_coefficients``: the general (array) path."""

    def __init__(self, model: Any) -> None:
        self.step_time = model.step_time
        self.step_time_array = model.step_time_array
        self.c_row = model.c_row


def test_admission_bound_linear_shortcut_matches_the_general_path() -> None:
    """For a linear model the bound is computed from its coefficients, without step
    arrays; it is the same number the general path gives (rows, prefill, displacement)."""
    rng = np.random.default_rng(7)
    for name in ("llama8b-h100", "cpu-smollm2"):
        model = PRESETS[name]
        general = _NoCoefficients(model)
        for _ in range(200):
            b = int(rng.integers(1, 300))
            kv = float(rng.integers(0, 10**6))
            budget = None if rng.random() < 0.3 else int(rng.integers(0, 9000))
            waiting = int(rng.choice([0, 1, 50, 20_000]))
            shape = StepShape(b, kv, budget, waiting)
            fast = admission_bound(model, shape)
            slow = admission_bound(general, shape)  # type: ignore[arg-type]
            assert fast == pytest.approx(slow, rel=1e-9, abs=1e-15), (name, shape)


def test_budget_does_not_let_a_prefill_chunk_cheapen_the_drafts() -> None:
    """A step carrying a prompt chunk is long, but the chunk is work every schedule
    computes once: an emitted token saves a share of the decodes' own step, not of the
    chunk. So the chunk changes neither the bound nor the drafts (linear model: it
    displaces nothing while it fits)."""
    lin = PRESETS["llama8b-h100"]
    b, kv, budget = 64, 64 * 2_000.0, 8192 - 64
    s = np.array([0.9, 0.5, 0.2, 0.12, 0.05, 0.02])
    lens = np.array([6])
    bounds, used = [], []
    for waiting in (0, 4000):
        shape = StepShape(b, kv, budget, waiting)
        bounds.append(admission_bound(lin, shape))
        a = allocate(
            s, lens, batch_size=b, num_kv=kv, cost=lin, budget=budget, prefill_tokens=waiting
        )
        used.append(a.used)
    assert bounds[0] == pytest.approx(bounds[1])
    assert used[0] == used[1] == 4  # 0.12 pays for 21 us of a 13 ms step of 64; 0.05 not
    assert prefill_time(lin, StepShape(b, kv, budget, 4000)) == pytest.approx(4000 * lin.c_tok)
    assert prefill_time(lin, StepShape(b, kv, budget, 0)) == 0.0


def test_budget_drafts_nothing_when_no_slot_pays() -> None:
    surv = np.array([0.3, 0.2, 0.1])
    # batch 256 with short contexts: a 30%-likely token does not pay for its slot
    a = allocate(surv, np.array([3]), batch_size=256, num_kv=256 * 300, cost=COST)
    assert a.counts == [0] and a.used == 0
    b = allocate(surv, np.array([3]), batch_size=1, num_kv=300, cost=COST)
    assert b.counts == [3]  # at batch 1 the slot is nearly free
    floor = allocate(
        np.array([0.99, 0.6]), np.array([2]), batch_size=1, num_kv=0, cost=COST, min_survival=0.7
    )
    assert floor.counts == [1]


def test_redundancy_score() -> None:
    assert redundancy_score(1, 1, 0.5) == pytest.approx(0.5)
    assert redundancy_score(3, 4, 0.5) > redundancy_score(1, 2, 0.5)
    assert redundancy_score(0, 3, 0.5) == 0.0


# -- the proposer -------------------------------------------------------------------
def _prop(tb: list[bytes], **opts) -> AgentSpecProposer:  # type: ignore[no-untyped-def]
    opts.setdefault("index_max_tokens", 1 << 14)
    return AgentSpecProposer(ProposerEnv(token_bytes=tb, cost_model=COST, max_k=8), **opts)


def _acceptance(p: AgentSpecProposer, cells: np.ndarray, row: int) -> np.ndarray:
    """Calibrated acceptance of fine calibration cells of scope row ``row``, in numpy:
    the readable form of ``kernels._acceptance`` the drafts' probs are checked against."""
    from agentspec_mw.agentspec import kernels as K

    sc, calib = p._scopes, p._calib
    coarse: np.ndarray = sc.table[row, cells // K.NF]
    if calib.strength <= 0.0:
        return coarse
    out: np.ndarray = (sc.fsucc[row, cells] + calib.strength * coarse) / (
        sc.ftot[row, cells] + calib.strength
    )
    return out


def _run(
    p: AgentSpecProposer,
    rid: str,
    prompt: Sequence[int],
    out: Sequence[int],
    tags,
    k: int = 8,
    batch: int = 1,
) -> int:  # type: ignore[no-untyped-def]
    """Greedy-oracle one request; return accepted tokens."""
    p.start(rid, prompt, tags)
    p.extend(rid, out[:1])
    pos, acc = 1, 0
    while pos < len(out):
        d = p.propose([rid], k, StepContext(batch_size=batch, num_kv_tokens=len(prompt) + pos))[0]
        assert len(d) <= k
        # per-token probabilities (given the earlier tokens): each draft cell's calibrated
        # acceptance, not the running product (the survival) the budget ranks by
        cells = p._slots.dcell[p._reqs[rid], : len(d)]
        row = int(p._slots.si[p._reqs[rid], C_CAL])  # the request's scope row
        np.testing.assert_allclose(d.probs, _acceptance(p, cells, row), rtol=1e-9)
        a = 0
        while a < len(d) and pos + a < len(out) and d.token_ids[a] == out[pos + a]:
            a += 1
        adv = min(a + 1, len(out) - pos)
        p.extend(rid, out[pos : pos + adv])
        pos += adv
        acc += a
    p.stop(rid)
    return acc


def test_agentspec_drafts_from_same_agent_query_block(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    p = _prop(tb)
    out = _ids(
        tiny_tokenizer,
        '{"name": "search_direct_flight", "arguments": {"origin":"JFK","destination":"SEA"}}',
    )
    prompt = _ids(tiny_tokenizer, "Book a flight")
    tags = StructureTags(agent_id="travel_agent", query_id="q1")
    assert _run(p, "a", prompt, out, tags) == 0  # nothing seen yet
    assert _run(p, "b", prompt, out, tags) > len(out) // 2  # the same query repeats itself
    other_scope = StructureTags(scope="tenant-2", agent_id="travel_agent", query_id="q1")
    p2_acc = _run(p, "c", prompt[:1], out, other_scope, batch=256)
    assert p2_acc == 0  # another scope never drafts from this one's text


def test_agentspec_tag_free_path(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    p = _prop(tb)
    out = _ids(tiny_tokenizer, "Your flight HAT100 from JFK to SEA is booked. Thank you.")
    prompt = _ids(tiny_tokenizer, "You are a travel agent. Book JFK to SEA.")
    _run(p, "x", prompt, out, None)
    assert _run(p, "y", prompt, out, None) > len(out) // 2  # same prompt prefix: same agent


def test_agentspec_sources_option_limits_where_drafts_come_from(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    """A continuation that is only in the request's own prompt is found by ``local`` and
    by nothing else; one only in another query of the same agent by ``agent`` (and
    ``scope``); one only in another agent's output by ``scope``, never across scopes."""
    text = _ids(tiny_tokenizer, "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n")
    out = _ids(tiny_tokenizer, "Fixed:\n") + text
    acc = {}
    for srcs in (("iso", "agent", "local"), ("iso", "agent"), ("local",)):
        p = _prop(tb, experimental={"sources": srcs})
        acc[srcs] = _run(p, "r", text, out, StructureTags(agent_id="coder", query_id="q1"))
    assert acc[("iso", "agent", "local")] > len(text) // 2
    assert acc[("local",)] > len(text) // 2
    # only repeats inside the output itself (iso is fed as it is produced)
    assert acc[("iso", "agent")] < acc[("local",)] // 3
    tags = [StructureTags(agent_id="coder", query_id=f"q{i}") for i in range(2)]
    for srcs, want_drafts in ((("agent",), True), (("scope",), True), (("iso", "local"), False)):
        p = _prop(tb, experimental={"sources": srcs})
        _run(p, "a", [1, 2], out, tags[0])  # the agent's earlier output, another query
        got = _run(p, "b", [3, 4], out, tags[1])
        assert (got > len(text) // 2) if want_drafts else got < len(text) // 4, (srcs, got)
    # another agent's output in the same scope: only the scope source has it, and only
    # for requests of that scope
    coder = StructureTags(agent_id="coder", query_id="q1")
    for srcs, tags_b, want_drafts in (
        (("scope",), StructureTags(agent_id="reviewer", query_id="q1"), True),
        (("iso", "agent", "local"), StructureTags(agent_id="reviewer", query_id="q1"), False),
        (("scope",), StructureTags(scope="t2", agent_id="reviewer", query_id="q1"), False),
    ):
        p = _prop(tb, experimental={"sources": srcs})
        _run(p, "a", [1, 2], out, coder)
        got = _run(p, "b", [3, 4], out, tags_b)
        assert (got > len(text) // 2) if want_drafts else got < len(text) // 4, (srcs, got)
    with pytest.raises(ValueError, match="twice"):
        _prop(tb, experimental={"sources": ("iso", "iso")})
    with pytest.raises(ValueError, match="at least one"):
        _prop(tb, experimental={"sources": ()})
    with pytest.raises(ValueError):
        _prop(tb, experimental={"sources": ("global",)})


def test_agentspec_candidates_diagnostics(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    """``candidates`` (off by default) holds each source's whole candidate and the pick."""
    p = _prop(tb)
    assert p.candidates is None
    text = _ids(tiny_tokenizer, "x = compute(alpha, beta)\nprint(x)\n")
    tags = StructureTags(agent_id="a", query_id="q")
    p.candidates = {}
    p.start("r", text, tags)
    p.extend("r", text[:4])  # the start of the prompt again: local finds the rest
    drafts = p.propose(["r"], 8, StepContext(batch_size=1, num_kv_tokens=len(text) + 4))
    c = p.candidates
    # one row per source: iso, agent, scope, local
    assert set(c) == {"tok", "lens", "pick"} and c["tok"].shape[0] == len(SOURCES)
    row = int(c["pick"][0])
    assert c["lens"][row] > 0 and row == SOURCES.index("local")  # the only candidate
    assert list(c["tok"][row, : c["lens"][row]]) == text[4 : 4 + int(c["lens"][row])]
    assert tuple(drafts[0].token_ids) == tuple(c["tok"][row, : len(drafts[0].token_ids)])


def test_agentspec_walk_depth_follows_the_floor_at_large_batch(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    """From ``index_walk_batch`` requests, a request's candidates are at most
    ``max(index_walk_min, 2 × C_OK)`` tokens (``C_OK``: its last candidate's positions
    at or above the floor); smaller steps, or ``None``, walk the whole ``k``."""
    text = _ids(tiny_tokenizer, "x = compute(alpha, beta, gamma, delta)\nprint(x, alpha)\n")
    tags = StructureTags(agent_id="a", query_id="q")

    def longest(p: AgentSpecProposer, batch: int) -> int:
        p.candidates = {}
        p.propose(["r"], 8, StepContext(batch_size=batch, num_kv_tokens=len(text) + 4))
        return int(p.candidates["lens"].max())

    for walk_batch, batch, want in ((4, 4, 2), (4, 3, 8), (None, 512, 8)):
        p = _prop(tb, index_walk_batch=walk_batch, experimental={"index_walk_min": 2})
        p.start("r", text, tags)
        p.extend("r", text[:4])  # the prompt's start again: local has the whole rest
        assert longest(p, batch) == want, (walk_batch, batch)
    p = _prop(tb, index_walk_batch=4, experimental={"index_walk_min": 2})
    p.start("r", text, tags)
    p.extend("r", text[:4])
    slot = p._reqs["r"]
    for ok in (3, 0, 1):
        p._slots.si[slot, C_OK] = ok
        assert longest(p, 4) == max(2, 2 * ok)
        assert p._slots.si[slot, C_OK] <= max(2, 2 * ok)  # this step's, for the next
    p._slots.si[slot, C_OK] = 1000
    longest(p, 3)  # a step under index_walk_batch: walked k deep, and C_OK rewritten
    assert p._slots.si[slot, C_OK] <= 8
    with pytest.raises(ValueError):
        _prop(tb, index_walk_batch=0)


def test_agentspec_stop_restart_and_release(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    p = _prop(tb)
    tags = StructureTags(agent_id="a", query_id="q")
    p.start("r", [1, 2, 3], tags)
    p.start("r", [4, 5, 6], tags)  # restart replaces
    p.extend("r", [7])
    p.stop("r")
    p.stop("r")  # idempotent
    assert not p._reqs


def test_agentspec_is_deterministic(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    out = _ids(
        tiny_tokenizer, "Action 1: Search[France]\nObservation 1: France is a country.\n" * 3
    )
    tags = StructureTags(agent_id="a", query_id="q")
    runs = []
    for _ in range(2):
        p = _prop(tb)
        runs.append(
            [_run(p, f"r{i}", [1, 2], out, tags, batch=b) for i, b in enumerate((1, 8, 64))]
        )
    assert runs[0] == runs[1]


def test_agentspec_memory_caps(tb) -> None:  # type: ignore[no-untyped-def]
    p = _prop(tb, index_max_keys=3)
    for i in range(10):
        tags = StructureTags(agent_id="a", query_id=f"q{i}")
        p.start(f"r{i}", [1, 2, 3], tags)
        p.extend(f"r{i}", [4, 5, 6, 7])
        p.propose([f"r{i}"], 4, StepContext(batch_size=1))
        p.stop(f"r{i}")
    assert len(p._keys) <= 3
    with pytest.raises(ValueError, match="index_max_tokens"):
        _prop(tb, index_max_tokens=10)
    with pytest.raises(ValueError, match="token_bytes"):
        AgentSpecProposer(ProposerEnv())


def test_block_of_reports_the_current_block(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    p = _prop(tb)
    p.start("r", _ids(tiny_tokenizer, "Write code"), StructureTags(agent_id="a", query_id="q"))
    assert p.block_of("r") == "text"
    p.extend("r", _ids(tiny_tokenizer, "Here:\n```python\nx = 1"))
    assert p.block_of("r") == "code"
    p.stop("r")
    assert p.block_of("r") is None


def test_a_draft_names_the_block_block_of_reports(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    p = _prop(tb)
    code = "Here:\n```python\nx = 1\ny = 2\n```\n"
    texts = {"a": code + code + "Here:\n```python\nx = 1", "b": "Plain words. " * 6}
    for rid, text in texts.items():
        p.start(rid, _ids(tiny_tokenizer, "Write code"), StructureTags(agent_id=rid, query_id="q"))
        p.extend(rid, _ids(tiny_tokenizer, text))
    drafts = p.propose(list(texts), 4, StepContext(batch_size=2))
    assert all(len(d) for d in drafts)
    assert [d.block for d in drafts] == [p.block_of(r) for r in texts] == ["code", "text"]


def test_agentspec_drafts_do_not_depend_on_slot_or_arena_layout(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    """Many interleaved requests: a tiny slot table (moves, compactions) drafts the same."""
    from tests.conftest import _corpus

    texts = [_ids(tiny_tokenizer, t)[:120] for t in _corpus()[:30]]
    drafts = []
    for tiny in (False, True):
        p = _prop(tb)
        if tiny:
            p._slots = SlotTable(rows=1, draft_width=8, arena=64)
        live = {f"r{i}": (t, 1) for i, t in enumerate(texts) if len(t) > 20}
        for rid, (t, _) in live.items():
            tags = StructureTags(agent_id=f"a{len(t) % 3}", query_id="q")
            p.start(rid, t[:10], tags)
            p.extend(rid, t[10:11])
        seen = []
        while live:
            ids = sorted(live)
            out = p.propose(ids, 8, StepContext(batch_size=len(ids), num_kv_tokens=1000))
            seen.append([d.token_ids for d in out])
            for rid, d in zip(ids, out, strict=True):
                t, pos = live[rid]
                a = 0
                while a < len(d) and pos + 10 + a < len(t) and d.token_ids[a] == t[10 + pos + a]:
                    a += 1
                adv = min(a + 1, len(t) - 10 - pos)
                p.extend(rid, t[10 + pos : 10 + pos + adv])
                if pos + adv >= len(t) - 10:
                    p.stop(rid)
                    del live[rid]
                else:
                    live[rid] = (t, pos + adv)
        drafts.append(seen)
    assert drafts[0] == drafts[1]
    assert any(any(d) for d in drafts[0])  # it did draft


def _interleaved_drafts(tb: list[bytes], texts: list[list[int]], batched: bool) -> list[Any]:
    """Drafts of many interleaved requests verified against ``texts`` (greedy), each step's
    accepted tokens given by one ``extend_many`` (``batched``) or one ``extend`` each."""
    p = _prop(tb)
    live = {f"r{i}": (t, 0) for i, t in enumerate(texts) if len(t) > 20}
    for rid, (t, _) in live.items():
        p.start(rid, t[:10], StructureTags(agent_id=f"a{len(t) % 3}", query_id="q"))
    seen: list[Any] = []
    while live:
        ids = sorted(live)
        out = p.propose(ids, 8, StepContext(batch_size=len(ids), num_kv_tokens=1000))
        seen.append([d.token_ids for d in out])
        fed: list[tuple[str, list[int]]] = []
        for rid, d in zip(ids, out, strict=True):
            t, pos = live[rid]
            a = 0
            while a < len(d) and 10 + pos + a < len(t) and d.token_ids[a] == t[10 + pos + a]:
                a += 1
            adv = min(a + 1, len(t) - 10 - pos)
            fed.append((rid, t[10 + pos : 10 + pos + adv]))
            live[rid] = (t, pos + adv)
        if batched:
            # a single extend before the batch (call order kept), and an empty row
            p.extend(*fed[0])
            rest = [(fed[0][0], [])] + fed[1:]
            toks = [x for _, ts in rest for x in ts]
            p.extend_many([r for r, _ in rest], np.array(toks), [len(ts) for _, ts in rest])
        else:
            for rid, ts in fed:
                p.extend(rid, ts)
        for rid, (t, pos) in list(live.items()):
            if pos >= len(t) - 10:
                p.stop(rid)
                del live[rid]
    return seen


def test_extend_many_drafts_as_one_extend_per_request(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import _corpus

    texts = [_ids(tiny_tokenizer, t)[:120] for t in _corpus()[:30]]
    one = _interleaved_drafts(tb, texts, batched=False)
    many = _interleaved_drafts(tb, texts, batched=True)
    assert many == one
    assert any(any(d) for d in one)  # it did draft


def test_extend_many_is_all_or_nothing(tb) -> None:  # type: ignore[no-untyped-def]
    p = _prop(tb)
    p.start("a", [1, 2, 3])
    with pytest.raises(KeyError):
        p.extend_many(["a", "gone"], [4, 5], [1, 1])
    for lens in ([1], [2, 1], [-1, 3], [3, 0]):
        with pytest.raises(ValueError, match="lens"):
            p.extend_many(["a", "a"], [4, 5], lens)
    with pytest.raises(ValueError, match="the 4 tokens"):  # counted flat, not by rows
        p.extend_many(["a", "a"], [[4, 5], [6, 7]], [1, 1])
    assert not p._pend_batches and not p._pend_ids  # nothing was queued
    buf = np.array([4, 5], dtype=np.int32)
    p.extend_many(["a"], buf, np.array([2]))
    buf[:] = 0  # the caller's buffer is copied
    p.propose(["a"], 4, StepContext(batch_size=1))
    start = int(p._slots.si[p._reqs["a"], C_CSTART])
    assert list(p._slots.ctx[start : start + 5]) == [1, 2, 3, 4, 5]


def test_token_ids_are_checked_at_the_door(tb) -> None:  # type: ignore[no-untyped-def]
    """Ids that cannot be tokens raise ``ValueError`` in the call that gives them and
    queue nothing (a bad read-only array once made every later ``propose`` raise); ids
    past the tokenizer's table (a model's vocabulary may be larger) are drafted like any
    other (they once read past the table: a large one crashed the process)."""
    p = _prop(tb)
    big = len(tb) + 10**8
    text = [big, big + 1, big + 2, big + 3] * 20
    p.start("a", text)
    p.extend("a", [big])
    d = p.propose(["a"], 4, StepContext(batch_size=1))[0]
    assert d.token_ids and d.token_ids[0] == big + 1
    bad_float = np.array([1.5, 2.5])
    bad_float.flags.writeable = False
    for call in (
        lambda: p.start("b", [1, -5, 3]),
        lambda: p.start("b", np.array([1, 2**31], dtype=np.int64)),
        lambda: p.extend("a", bad_float),
        lambda: p.extend("a", [3, -1]),
        lambda: p.extend_many(["a"], np.array([2**40]), [1]),
        lambda: p.extend_many(["a", "a"], [4, 5, 6], [1.5, 1.5]),
        lambda: p.extend_many(["a", "a"], [4, 5, 6], np.array([1.5, 1.5])),
    ):
        with pytest.raises(ValueError):
            call()
    assert "b" not in p._reqs and not p._pend_ids and not p._pend_batches
    p.extend("a", [big + 1])
    assert p.propose(["a"], 4, StepContext(batch_size=1))[0].token_ids[:1] == (big + 2,)


def test_a_queued_stop_frees_its_grammar_row_for_the_next_start(tb) -> None:  # type: ignore[no-untyped-def]
    """A newcomer with delimiters of its own gets the grammar row a request just stopped
    left, whether or not a ``propose`` came between (it once fell back to the default
    blocks without one)."""
    prompt = list(b"Thought: hello\n")
    step = StepContext(batch_size=1, num_kv_tokens=16)
    for between in (False, True):
        p = _prop(tb, blocks_max_per_scope=1)
        p.start("a", prompt, StructureTags(scope="t", blocks=(("<a>", "</a>"),)))
        p.propose(["a"], 4, step)
        p.stop("a")
        if between:
            p.propose([], 4, step)
        p.start("b", prompt, StructureTags(scope="t", blocks=(("<b>", "</b>"),)))
        p.propose(["b"], 4, step)
        assert p.grammar_fallbacks == 0, between


def test_step_buffers_grow_with_rows_not_with_each_new_width() -> None:
    """A caller alternating ``k`` reallocates the step's buffers at the same size (they
    once doubled every step: 2.7 GiB after 16 steps), and a full cache of views keeps
    them."""
    from agentspec_mw.agentspec.workspace import _MAX_VIEWS, Workspaces

    ws = Workspaces()
    for step in range(20):
        ws.get(1, 4 + step % 2)
    assert ws._cap == 64
    ws.get(_MAX_VIEWS + 76, 8)
    cap = ws._cap
    for _ in range(2):  # more shapes than the cache holds, each within the buffers
        for n in range(1, _MAX_VIEWS + 77):
            ws.get(n, 8)
    assert ws._cap == cap
    ws.get(cap + 1, 8)
    assert ws._cap == 2 * cap


def test_queued_calls_stay_bounded_without_a_propose(tb) -> None:  # type: ignore[no-untyped-def]
    """A host whose requests never ask for a draft (each at its ``max_tokens``) still
    frees their rows: the queue is applied once it holds ``_MAX_PENDING`` stops or
    batches, so neither it nor the slot table grows with the requests served."""
    from agentspec_mw.agentspec.proposer import _MAX_PENDING

    p = _prop(tb)
    rng = np.random.default_rng(0)
    for r in range(4 * _MAX_PENDING):
        rid = f"r{r}"
        p.start(rid, rng.integers(0, len(tb), 64))
        p.extend_many([rid], [int(rng.integers(0, len(tb)))], [1])
        p.stop(rid)
        assert len(p._pend_stop) < _MAX_PENDING and len(p._pend_batches) < _MAX_PENDING
    assert p._slots.si.shape[0] <= 2 * _MAX_PENDING
    p.start("last", [1, 2, 3])  # and the proposer still works
    p.extend("last", [1, 2, 3])
    assert len(p.propose(["last"], 4, StepContext(batch_size=1))) == 1


def test_single_extends_stay_bounded_without_a_propose(tb, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Single ``extend`` calls queue too (a host that extends one request at a time and
    never proposes): sealed into a batch every ``_MAX_PENDING`` calls and applied with the
    batches, so the queue stays bounded (it grew with every call), and the drafts are
    those of the whole queue applied at the next ``propose``."""
    from agentspec_mw.agentspec import proposer as mod

    n = mod._MAX_PENDING**2 + 5
    p, q = _prop(tb), _prop(tb)
    for x in (p, q):
        x.start("a", [1, 2, 3])
    for i in range(n):
        p.extend("a", [4 + i % 7])
        assert len(p._pend_ids) < mod._MAX_PENDING and len(p._pend_batches) < mod._MAX_PENDING
    monkeypatch.setattr(mod, "_MAX_PENDING", 10 * n)  # q: one queue, applied at propose
    for i in range(n):
        q.extend("a", [4 + i % 7])
    assert len(q._pend_ids) == n
    ctx = StepContext(batch_size=1)
    (dp,), (dq,) = p.propose(["a"], 8, ctx), q.propose(["a"], 8, ctx)
    assert dp.token_ids == dq.token_ids and len(dp)


def test_agentspec_caps_distinct_block_grammars(tb, caplog) -> None:  # type: ignore[no-untyped-def]
    from agentspec_mw.agentspec import MAX_GRAMMARS

    p = _prop(tb, blocks_max_per_scope=MAX_GRAMMARS)  # one scope may fill the table
    for i in range(MAX_GRAMMARS + 5):
        tags = StructureTags(agent_id="a", query_id="q", blocks=[(f"<b{i}>", f"</b{i}>")])
        p.start(f"r{i}", [1, 2, 3], tags)
        p.extend(f"r{i}", [4, 5])
    p.propose([f"r{i}" for i in range(MAX_GRAMMARS + 5)], 4, StepContext(batch_size=8))
    assert len(p._grammars) == MAX_GRAMMARS
    assert "distinct block delimiter sets" in caplog.text


def test_agentspec_agent_history_is_live(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    """With ``index_agent_live`` a request drafts from a concurrent request of the same
    agent (another query; ``agent``) or of another agent (``scope``) while that one is
    still decoding; without it, only once the other has stopped."""
    out = _ids(tiny_tokenizer, "def area(r):\n    return 3.14159 * r * r\n\nprint(area(2))\n")
    # agent: the same agent on another query; scope: another agent
    for source, agent_b in (("agent", "coder"), ("scope", "tester")):
        for live in (True, False):
            p = _prop(tb, experimental={"sources": (source,), "index_agent_live": live})
            p.start("a", [1, 2], StructureTags(agent_id="coder", query_id="q1"))
            p.extend("a", out)  # still in flight: no stop
            p.start("b", [3, 4], StructureTags(agent_id=agent_b, query_id="q2"))
            p.extend("b", out[:6])
            step = StepContext(batch_size=1, num_kv_tokens=64)
            d = p.propose(["a", "b"], 8, step)[1]
            if live:
                assert list(d.token_ids) == out[6 : 6 + len(d)] and len(d) >= 4
            else:
                assert len(d) == 0
                p.stop("a")  # now its output joins the history
                p.extend("b", d.token_ids or out[6:7])
                d = p.propose(["b"], 8, step)[0]
                assert len(d) >= 4, (source, live)


def test_agentspec_rejection_ledger_counts_verified_drafts(tiny_tokenizer, tb) -> None:  # type: ignore[no-untyped-def]
    """The verified counts (the rejection reported) hold exactly the drafted and accepted
    tokens a verifier saw, including a draft that runs past the end of the output."""
    p = _prop(tb)
    text = _ids(tiny_tokenizer, "total = price * quantity + shipping_cost\nreturn total\n")
    out = text + _ids(tiny_tokenizer, " # done")
    tags = StructureTags(agent_id="a", query_id="q")
    drafted = accepted = 0
    for rid in ("r1", "r2", "r3"):  # later requests draft the earlier ones' text
        p.start(rid, text, tags)
        p.extend(rid, out[:1])
        pos = 1
        while pos < len(out):
            d = p.propose([rid], 8, StepContext(batch_size=1, num_kv_tokens=len(text) + pos))[0]
            a = 0
            while a < len(d) and pos + a < len(out) and d.token_ids[a] == out[pos + a]:
                a += 1
            drafted += len(d)
            accepted += a
            adv = min(a + 1, len(out) - pos)
            p.extend(rid, out[pos : pos + adv])
            pos += adv
        p.stop(rid)
    p._flush()
    assert drafted > accepted > 0  # some drafts ran past the end of the output
    assert tuple(p._scopes.ledger[p._calib.default_row]) == (accepted, drafted)
    assert p.verified == (accepted, drafted)


def _unlikely_candidate(tiny_tokenizer, tb, **opts) -> AgentSpecProposer:  # type: ignore[no-untyped-def]
    """A proposer whose request ``x`` has one unlikely candidate (survival ~0.2): two
    earlier requests of its agent disagree on how the line goes on."""
    tags = StructureTags(agent_id="a", query_id="q")
    head = _ids(tiny_tokenizer, "total = price * quantity +")
    q = _prop(tb, **opts)
    for i, tail in enumerate([" shipping_cost\n", " tax_amount\n"]):
        q.start(f"r{i}", [1, 2], tags)
        q.extend(f"r{i}", head + _ids(tiny_tokenizer, tail))
        q.stop(f"r{i}")
    q.start("x", [1, 2], tags)
    q.extend("x", head)
    return q


def test_agentspec_kernels_are_loaded_at_construction(tb) -> None:  # type: ignore[no-untyped-def]
    """Constructing a proposer loads every numba kernel a step runs (the warm-up), so the
    engine's first decoding step does not pay numba's compilation or cache load — and
    the warm-up leaves no trace in the new proposer."""
    from numba.core.registry import CPUDispatcher

    from agentspec_mw.agentspec import kernels, ngram_index
    from agentspec_mw.agentspec import proposer as P

    p = _prop(tb)
    assert P._warm
    step_kernels = [
        kernels.scan_prompts,
        kernels.apply_extends,
        kernels.release_rows,
        kernels.gather,
        kernels.local_drafts,
        kernels.keep_candidates,
        kernels.score,
        kernels.emit_drafts,
        kernels.insert_outputs,
        ngram_index._lookup_rows,
    ]
    for f in step_kernels:
        assert isinstance(f, CPUDispatcher)
        assert f.signatures, f"{f.__name__} was not loaded by the warm-up"
    assert p.stats == {"steps": 0, "offered": 0, "drafted": 0}
    assert p._index.written == 0 and not p._keys


def test_config_keeps_at_most_12_public_fields_and_routes_experimental_ones() -> None:
    """Ablation switches live in ``experimental``; their former top-level keywords still
    work with a DeprecationWarning, and ``experimental.OPTION`` keys (``--set``) too."""
    from agentspec_mw.agentspec.config import AgentSpecConfig

    assert len(AgentSpecConfig.model_fields) <= 12
    with pytest.warns(DeprecationWarning, match="experimental"):
        old = AgentSpecConfig(sources=("iso",), index_walk_min=2)  # type: ignore[call-arg]
    new = AgentSpecConfig(experimental={"sources": ("iso",), "index_walk_min": 2})  # type: ignore[arg-type]
    dotted = AgentSpecConfig(**{"experimental.sources": ["iso"], "experimental.index_walk_min": 2})
    assert old == new == dotted
    assert new.experimental.sources == ("iso",) and new.experimental.index_walk_min == 2
    with pytest.raises(ValueError, match="extra|experimental.nope"):
        AgentSpecConfig(**{"experimental.nope": 1})


def test_the_redundancy_prior_is_the_papers_score_over_the_support() -> None:
    """``prior_table`` is ``scale · (c/n) · p(n) / n`` at each support bucket's
    representative ``n`` (the paper's ``g(c, n)`` over ``n``: the paper's own ``g`` in the
    fit measured worse on held-out recordings, docs/agentspec.md)."""
    from agentspec_mw.agentspec.calibration import _SUPPORT_MID, N_Q, cell_shape, prior_table

    prior = prior_table(0.5, 0.9).reshape(cell_shape())
    for sup, n in enumerate(_SUPPORT_MID):
        for q in range(N_Q):
            mid = (q + 0.5) / N_Q
            want = 0.9 * mid * redundancy_score(n, n, 0.5) / n
            assert prior[0, 0, 0, sup, 0, q] == pytest.approx(want)
            assert prior[0, 1, 0, sup, 0, q] == pytest.approx(min(1.0, 1.1 * want))


def test_grammar_rows_forget_the_scopes_that_gave_them_up() -> None:
    """Each tenant with its own block delimiters takes a grammar row; a row handed to
    another tenant leaves no count behind (one entry per tenant ever seen, before)."""

    env = ProposerEnv(token_bytes=[bytes([i]) for i in range(256)], max_k=4)
    p = AgentSpecProposer(env, index_max_tokens=4096)
    for i in range(300):
        p.start("r", [1, 2, 3], StructureTags(scope=f"t{i}", blocks=((f"<b{i}>", f"</b{i}>"),)))
        p.stop("r")
    p.propose([], 4, StepContext(batch_size=0))
    grammars = p._grammars
    assert 0 < len(grammars._owned) <= len(grammars) < 300
    assert all(n > 0 for n in grammars._owned.values())
