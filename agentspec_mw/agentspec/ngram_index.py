"""A keyed continuation index in flat arrays, with batched numba kernels.

Why not one suffix tree per key (arctic-inference's ``SuffixTree``, measured first): its
per-call cost (~5 µs per insert and 7–13 µs per lookup from Python on this machine) times
256 requests is several milliseconds per step — more than the proposer's 2 ms budget. This
index does the same job — the most frequent continuation of the longest suffix match,
with count-based per-token probabilities — for a whole batch in one compiled call.

Layout. Tokens live in a ring *arena* of ``capacity`` slots (rounded up to a power of
two) addressed by absolute positions (``abs % capacity``; a position older than
``written - capacity`` is gone — that is the token cap and its eviction, oldest first).
Each token's record (one 64-byte cache line) holds its key, for every match length ``n``
in :data:`LEVELS` the previous occurrence of the same ``n`` tokens under the same key
(``occ``), and its sequence's next :data:`AHEAD` tokens: the token itself and the three
after it as int32s, and the position of the fourth after it (``jump``). A continuation
is thus read one cache line per four tokens, not one per token (the records written
before a token are filled in as it is inserted: they are recent, so still cached). A
hash table maps ``(key, n, last n tokens)`` to the newest occurrence.

Lookup. For the longest level whose last ``n`` context tokens occurred before under the
request's key, up to :data:`MAX_CANDIDATES` occurrences are followed; the draft is built
token by token by majority vote among the continuations that still agree — the paper's
``n`` candidates of which ``c`` agree — and each token's probability is ``c / n``.
The rows of a batch walk their chains in lockstep with prefetches, so their cache misses
overlap (:func:`_lookup_rows`).
A key never sees another key's tokens: every occurrence is checked against its key.

Inserts. A batch of inserts writes its records first and runs its hash-table probes
afterwards, in order, prefetching ahead (:func:`stage_insert`, :func:`flush_stage`), with
the same result as inserting one token at a time.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import get_num_threads, njit, prange

from agentspec_mw.agentspec.jit import kernel
from agentspec_mw.agentspec.parallel import THREADED, ModeChooser
from agentspec_mw.agentspec.prefetch import prefetch2

__all__ = [
    "AHEAD",
    "LEVELS",
    "MAX_CANDIDATES",
    "MAX_N",
    "STAGE_TOKENS",
    "NgramIndex",
    "flush_stage",
    "new_stage",
    "reset_seq",
    "stage_insert",
    "stage_run",
]

LEVELS = np.array([1, 2, 4, 8], dtype=np.int64)
"""Match lengths hashed (doubling, one pass): from a single token, as SuffixDecoding's tree
matches; four fit a record's cache line. A lookup uses the longest level that occurred, so a
1-token match drafts only where no longer context did; calibration buckets its tokens apart
(``calibration.MATCH_EDGES``) and the budget drafts them only where they pay."""
MAX_N = 16  # a power of two: a sequence's ring holds its token i at i & (MAX_N - 1)
MAX_CANDIDATES = 16
_ROWS_PER_THREAD = 64  # a lookup splits its rows over threads from 2 x this many rows
STAGE_TOKENS = 256
"""Inserts whose hash-table probes wait in a stage (:func:`stage_insert`) before they run."""
_PROBE_AHEAD = 16  # staged probes whose buckets are prefetched ahead of the one running
_EMPTY = np.int64(-1)
# a token's record, one 64-byte cache line of int64s: its token and the next one (two
# int32s), key, position of the token AHEAD after it, previous occurrences per level,
# the tokens two and three after it (two int32s)
R_TOK, R_KEY, R_JMP, R_OCC, R_AH2 = 0, 1, 2, 3, 7
_R_WIDTH = 8
AHEAD = 4
"""Tokens one record holds (itself and the next three); a candidate is ``pos * 4 + phase``."""
# int32 columns (of the record's int32 view) of the token itself and the next one; the
# two after those are at 2 * R_AH2 and 2 * R_AH2 + 1 (:func:`_col`)
_T0, _T1 = 2 * R_TOK, 2 * R_TOK + 1


def _aligned(shape: tuple[int, int]) -> np.ndarray:
    """A zeroed int64 array whose rows start on 64-byte boundaries.

    Zeroed lazily: a large one is mapped pages the kernel zeroes at their first touch, so
    an index costs nothing until it is written (filling its two 64 MiB arrays took
    0.2-0.4 s per proposer; a record is fully written when its token is inserted and
    never read before, and 0 marks an empty hash-table bucket)."""
    n = shape[0] * shape[1]
    raw = np.zeros(n + 8, dtype=np.int64)
    skip = (-raw.ctypes.data % 64) // 8
    return raw[skip : skip + n].reshape(shape)


_MULT = np.uint64(0x9E3779B97F4A7C15)


@kernel(nogil=True, inline="always")
def _seed(key: np.int64) -> np.uint64:  # pragma: no cover
    """Start of the hashes of ``key``'s n-grams (:func:`_hash`)."""
    return np.uint64(key) * np.uint64(0x100000001B3)


@kernel(nogil=True, inline="always")
def _mix(h: np.uint64, t: np.int64) -> np.uint64:  # pragma: no cover
    """Fold one more (earlier) token into a running n-gram hash."""
    h = (h ^ np.uint64(t & 0xFFFFFFFF)) * _MULT
    return h ^ (h >> np.uint64(29))


@kernel(nogil=True, inline="always")
def _final(h: np.uint64, n: np.int64) -> np.int64:  # pragma: no cover
    """The table hash of a running hash over ``n`` tokens (never 0: 0 marks empty)."""
    h = (h ^ (np.uint64(n) * np.uint64(0x9E3779B1))) * _MULT
    return np.int64((h ^ (h >> np.uint64(29))) | np.uint64(1))


@kernel(nogil=True)
def _hash(key: np.int64, n: np.int64, toks: np.ndarray, end: int) -> np.int64:  # pragma: no cover
    """Hash of ``(key, n, toks[end-n:end])``, folding the tokens newest first — so the
    hashes of every level are one pass over the last :data:`MAX_N` tokens, each level's
    taken on the way (:func:`stage_insert`, :func:`_lookup_rows`)."""
    h = _seed(key)
    for c in range(1, n + 1):
        h = _mix(h, toks[end - c])
    return _final(h, n)


@kernel(nogil=True)
def new_stage() -> np.ndarray:  # pragma: no cover
    """An empty staging buffer for :func:`stage_insert` (row 0: pending probes and
    tokens; then one row per pending probe: hash, position, level)."""
    stage = np.empty((STAGE_TOKENS * LEVELS.shape[0] + 1, 3), dtype=np.int64)
    stage[0, 0] = 0
    stage[0, 1] = 0
    return stage


def _stage_insert(key: int, s: int, t: int, ix: Any, stage: np.ndarray) -> None:  # pragma: no cover
    """Append token ``t`` to sequence ``s`` under ``key`` (``ix`` = :attr:`NgramIndex.arrays`),
    leaving its hash-table probes in ``stage`` for :func:`flush_stage`.

    An insert is two halves. The first, here, writes the token's record, links it from
    its sequence's previous token, updates the sequence's ring of last tokens and hashes
    the n-gram of every level; none of it reads the hash table. The second probes the
    table for each level's n-gram and links the record to the n-gram's previous
    occurrence. Staged probes run in the order they were staged, so the index ends up as
    if each insert had been done whole; run together they prefetch ahead, so the table's
    cache misses overlap instead of stalling one insert at a time (on the development VM
    an insert took ~250 ns whole, ~100 ns staged). The stage is flushed when full: at
    most :data:`STAGE_TOKENS` tokens (and never more than the arena holds) wait, so no
    waiting record is overwritten. Callers flush before anything reads the table.
    """
    rec, ht, seq_pos, seq_ring, seq_len, state, levels, rec32 = ix
    cap = rec.shape[0]
    if stage[0, 1] >= min(STAGE_TOKENS, cap):
        flush_stage(ix, stage)
    cmask = cap - 1  # capacity is a power of two
    pos = state[0]
    state[0] += 1
    slot = pos & cmask
    rec32[slot, _T0] = t
    rec32[slot, _T1] = -1
    rec[slot, R_AH2] = _EMPTY  # tokens two and three ahead: none yet
    rec[slot, R_KEY] = key
    rec[slot, R_JMP] = _EMPTY
    ln = seq_len[s]  # tokens in the sequence so far
    # the sequence's previous AHEAD tokens hold this one at offsets 1..AHEAD-1, and the
    # AHEAD-th before it jumps here (each still in the arena: newer than pos - cap)
    for d in range(1, min(ln, AHEAD) + 1):
        prev = seq_pos[s, (ln - d) & (AHEAD - 1)]
        if prev > pos - cap:
            if d == AHEAD:
                rec[prev & cmask, R_JMP] = pos
            else:
                rec32[prev & cmask, _col(d)] = t
    seq_pos[s, ln & (AHEAD - 1)] = pos
    # circular ring of the sequence's last MAX_N tokens: token i at i % MAX_N
    seq_ring[s, ln & (MAX_N - 1)] = t
    ln += 1
    seq_len[s] = ln
    hr = _seed(key)  # running hash of the last c tokens, newest first (see _hash)
    c = 0
    ring = seq_ring[s]
    m = stage[0, 0]
    for lv in range(levels.shape[0]):
        n = levels[lv]
        rec[slot, R_OCC + lv] = _EMPTY
        if ln < n:
            continue
        while c < n:
            c += 1
            hr = _mix(hr, ring[(ln - c) & (MAX_N - 1)])
        m += 1
        stage[m, 0] = _final(hr, n)
        stage[m, 1] = pos
        stage[m, 2] = lv
    stage[0, 0] = m
    stage[0, 1] += 1


# The insert helpers are compiled without numba's reference counting (they allocate
# nothing): counting their array arguments at every call cost more than their work (~0.2 us
# per insert, docs/experiments/proposer_speed.md). A kernel appends a run of tokens under one
# key with one call of `stage_run`, into which `_stage_insert` is inlined (with `blocks.feed`:
# `apply_extends` 0.37 -> 0.21 ms a 256-request step, docs/experiments/proposer_speed.md).
stage_insert = kernel(nogil=True, _nrt=False)(_stage_insert)
_stage_insert_inline = njit(nogil=True, _nrt=False, inline="always")(_stage_insert)


@kernel(nogil=True, _nrt=False)
def stage_run(
    key: int, s: int, toks: np.ndarray, lo: int, hi: int, ix: Any, stage: np.ndarray
) -> None:  # pragma: no cover
    """:func:`stage_insert` of ``toks[lo:hi]``, in order, to sequence ``s`` under ``key``."""
    for p in range(lo, hi):
        _stage_insert_inline(key, s, toks[p], ix, stage)


@kernel(nogil=True)
def flush_stage(ix: Any, stage: np.ndarray) -> None:  # pragma: no cover
    """Run the staged probes of :func:`stage_insert`, in order, and empty the stage."""
    rec, ht, _sp, _sr, _sn, _st, _lv, _r32 = ix
    cap = rec.shape[0]
    cmask = cap - 1
    mask = np.uint64(ht.shape[0] - 1)
    m = stage[0, 0]
    for q in range(1, min(m, _PROBE_AHEAD) + 1):
        prefetch2(ht, np.uint64(stage[q, 0]) & mask, 0)
    for q in range(1, m + 1):
        if q + _PROBE_AHEAD <= m:
            prefetch2(ht, np.uint64(stage[q + _PROBE_AHEAD, 0]) & mask, 0)
        h = stage[q, 0]
        pos = stage[q, 1]
        oldest = pos - cap
        b = np.uint64(h) & mask
        for _probe in range(32):
            hk = ht[b, 0]
            if hk == h:
                rec[pos & cmask, R_OCC + stage[q, 2]] = ht[b, 1]
                ht[b, 1] = pos
                break
            if hk == 0 or ht[b, 1] < oldest:
                ht[b, 0] = h
                ht[b, 1] = pos
                break
            b = (b + np.uint64(1)) & mask
    stage[0, 0] = 0
    stage[0, 1] = 0


@kernel(nogil=True, _nrt=False)
def reset_seq(s: int, ix: Any) -> None:  # pragma: no cover
    """Start sequence ``s`` afresh (its earlier tokens stay in the index)."""
    ix[4][s] = 0


@kernel(nogil=True)
def _insert(
    keys: np.ndarray, seqs: np.ndarray, toks: np.ndarray, ix: Any, stage: np.ndarray
) -> None:  # pragma: no cover
    for i in range(toks.shape[0]):
        stage_insert(keys[i], seqs[i], toks[i], ix, stage)
    flush_stage(ix, stage)


@kernel(nogil=True, inline="always")
def _col(ph: int) -> int:  # pragma: no cover
    """The int32 column of a record holding the token ``ph`` (0..3) after it."""
    return ph + (2 * R_AH2 - 2) * (ph >> 1)


@kernel(nogil=True, inline="always")
def _vote(ctok: np.ndarray, na: int) -> tuple[int, int]:  # pragma: no cover
    """The token most of the continuations hold (``ctok[:na]``: each one's next token),
    and how many hold it (the first seen wins ties)."""
    best_t = ctok[0]
    best_c = 1
    for c in range(1, na):
        if ctok[c] == best_t:
            best_c += 1
    if best_c == na:  # all agree: the common case
        return best_t, best_c
    best_c = 0
    for c in range(na):
        tk = ctok[c]
        seen = False
        for d in range(c):
            if ctok[d] == tk:
                seen = True
                break
        if seen:
            continue
        cnt = 1
        for d in range(c + 1, na):
            if ctok[d] == tk:
                cnt += 1
        if cnt > best_c:
            best_c = cnt
            best_t = tk
        if 2 * best_c > na:
            break
    return best_t, best_c


@kernel(nogil=True)
def _lookup_rows(
    lo: int,
    hi: int,
    keys: np.ndarray,
    ctx: np.ndarray,
    ctx_len: np.ndarray,
    ks: np.ndarray,
    ix: Any,
    out_tok: np.ndarray,
    out_prob: np.ndarray,
    out_len: np.ndarray,
    out_match: np.ndarray,
    out_support: np.ndarray,
) -> None:  # pragma: no cover
    """Rows ``lo:hi`` of a batched lookup (see :meth:`NgramIndex.lookup`).

    Each row's work is a chain of dependent reads of records scattered over an arena far
    larger than the caches (the occurrences of its suffix, then their continuations), so
    the rows advance in lockstep — one hop of every row per round, the next hop's record
    prefetched — and the rows' cache misses overlap instead of queuing one by one. The
    result equals a row-by-row walk:

    1. hash the last ``n`` context tokens for every level ``n`` and probe the table
       (all rows' buckets prefetched first);
    2. from the longest level with an entry, follow its occurrences (newest first, at
       most :data:`MAX_CANDIDATES` with a continuation, stopping at another key's or an
       evicted record); a level without a continuation falls to the next shorter one;
    3. draft by majority vote among the continuations that still agree, one position
       per round, until ``ks[r]`` tokens or no candidate left (a drafted token's
       ``c / n`` is at least ``1 / MAX_CANDIDATES``).
       Each candidate's next token is kept beside it (``ctok``), read once when the
       candidate advances: the vote and the survivors' filter read that small array,
       not the records.
    """
    n_lv = ix[6].shape[0]
    nr = hi - lo
    _walk_rows(
        lo,
        hi,
        keys,
        ctx,
        ctx_len,
        ks,
        ix,
        out_tok,
        out_prob,
        out_len,
        out_match,
        out_support,
        np.zeros((nr, n_lv), dtype=np.int64),  # hashes (0: level longer than the context)
        np.full((nr, n_lv), _EMPTY, dtype=np.int64),  # heads
        np.full(nr, -1, dtype=np.int64),  # level
        np.full(nr, _EMPTY, dtype=np.int64),  # pointer
        np.zeros(nr, dtype=np.int64),  # candidates
        np.empty((nr, MAX_CANDIDATES), dtype=np.int64),
        np.empty((nr, MAX_CANDIDATES), dtype=np.int32),  # each candidate's token
        np.empty(nr, dtype=np.int64),  # the active rows
    )


# the body of `_lookup_rows`, compiled without numba's reference counting (it allocates
# nothing): counting the arrays passed to its inlined helpers per drafted token cost ~1/10
# of a 256-request step's lookup (2026-12-04, docs/experiments/proposer_speed.md)
@kernel(nogil=True, _nrt=False)
def _walk_rows(
    lo: int,
    hi: int,
    keys: np.ndarray,
    ctx: np.ndarray,
    ctx_len: np.ndarray,
    ks: np.ndarray,
    ix: Any,
    out_tok: np.ndarray,
    out_prob: np.ndarray,
    out_len: np.ndarray,
    out_match: np.ndarray,
    out_support: np.ndarray,
    hs: np.ndarray,
    heads: np.ndarray,
    lvl: np.ndarray,
    ptr: np.ndarray,
    nc: np.ndarray,
    cand: np.ndarray,
    ctok: np.ndarray,
    act: np.ndarray,
) -> None:  # pragma: no cover
    rec, ht, _sp, _sr, _sn, state, levels, rec32 = ix
    cap = rec.shape[0]
    mask = np.uint64(ht.shape[0] - 1)
    oldest = state[0] - cap
    cmask = cap - 1  # capacity is a power of two
    n_lv = levels.shape[0]
    nr = hi - lo
    # 1. every row's bucket per level, prefetched, then probed
    for i in range(nr):
        r = lo + i
        out_len[r] = 0
        out_match[r] = 0
        out_support[r] = 0
        key = keys[r]
        if key < 0:
            continue
        hr = _seed(key)  # see _hash: one pass, newest token first
        c = 0
        end = ctx_len[r]
        for lv in range(n_lv):
            n = levels[lv]
            if end < n:
                break
            while c < n:
                c += 1
                hr = _mix(hr, ctx[r, end - c])
            h = _final(hr, n)
            hs[i, lv] = h
            prefetch2(ht, np.uint64(h) & mask, 0)
    n_act = 0
    for i in range(nr):
        top = -1
        for lv in range(n_lv):
            h = hs[i, lv]
            if h == 0:
                continue
            top = lv
            b = np.uint64(h) & mask
            for _probe in range(32):
                hk = ht[b, 0]
                if hk == 0:
                    break
                if hk == h:
                    heads[i, lv] = ht[b, 1]
                    break
                b = (b + np.uint64(1)) & mask
        if top >= 0:
            lvl[i] = top
            ptr[i] = heads[i, top]
            if ptr[i] >= 0:
                prefetch2(rec, ptr[i] & cmask, 0)
            act[n_act] = i
            n_act += 1
    # 2. the occurrence chains, one hop per row per round
    while n_act > 0:
        w = 0
        for t in range(n_act):
            i = act[t]
            p = ptr[i]
            if p >= 0 and p >= oldest and nc[i] < MAX_CANDIDATES:
                sl = p & cmask
                if rec[sl, R_KEY] == keys[lo + i]:
                    nt = rec32[sl, _T1]
                    if nt >= 0:  # a continuation: the token after p
                        cand[i, nc[i]] = p * AHEAD + 1
                        ctok[i, nc[i]] = nt
                        nc[i] += 1
                    p = rec[sl, R_OCC + lvl[i]]
                    ptr[i] = p
                    if p >= 0:
                        prefetch2(rec, p & cmask, 0)
                    act[w] = i
                    w += 1
                    continue
            if nc[i] == 0:  # no continuation at this level: the next shorter one
                lvl[i] -= 1
                if lvl[i] >= 0:
                    ptr[i] = heads[i, lvl[i]]
                    if ptr[i] >= 0:
                        prefetch2(rec, ptr[i] & cmask, 0)
                    act[w] = i
                    w += 1
        n_act = w
    # 3. the drafts, one position per row per round
    for i in range(nr):
        if nc[i] > 0:
            out_match[lo + i] = levels[lvl[i]]
            out_support[lo + i] = nc[i]
            for c in range(nc[i]):
                prefetch2(rec, (cand[i, c] >> 2) & cmask, 0)
            act[n_act] = i
            n_act += 1
    while n_act > 0:
        w = 0
        for t in range(n_act):
            i = act[t]
            r = lo + i
            m = out_len[r]
            na = nc[i]  # cand[i, :na] = the candidates that agreed so far (in order)
            if m >= ks[r] or na == 0:
                continue
            best_t, best_c = _vote(ctok[i], na)
            pr = best_c / na
            out_tok[r, m] = best_t
            out_prob[r, m] = pr
            out_len[r] = m + 1
            keep = 0
            for c in range(na):
                if ctok[i, c] != best_t:
                    continue
                # the candidate's next token: in the same record, or the first of the
                # record it jumps to (prefetched a round earlier, when it reached the
                # record's last token)
                cc = cand[i, c]
                ph = cc & 3
                sl = (cc >> 2) & cmask
                if ph < AHEAD - 1:
                    nt = rec32[sl, _col(ph + 1)]
                    if nt >= 0:
                        cand[i, keep] = cc + 1
                        ctok[i, keep] = nt
                        keep += 1
                        if ph == AHEAD - 2:
                            nx = rec[sl, R_JMP]
                            if nx >= 0:
                                prefetch2(rec, nx & cmask, 0)
                else:
                    nx = rec[sl, R_JMP]
                    if nx >= 0:
                        cand[i, keep] = nx * AHEAD
                        ctok[i, keep] = rec32[nx & cmask, _T0]
                        keep += 1
            nc[i] = keep
            act[w] = i
            w += 1
        n_act = w


@kernel(nogil=True, parallel=True)
def _lookup_par(
    n_chunks: int,
    keys: np.ndarray,
    ctx: np.ndarray,
    ctx_len: np.ndarray,
    ks: np.ndarray,
    ix: Any,
    out_tok: np.ndarray,
    out_prob: np.ndarray,
    out_len: np.ndarray,
    out_match: np.ndarray,
    out_support: np.ndarray,
) -> None:  # pragma: no cover
    """:func:`_lookup_rows` over ``n_chunks`` contiguous row ranges, one per thread
    (lookups only read the index)."""
    n = keys.shape[0]
    step = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        _lookup_rows(
            c * step,
            min(n, (c + 1) * step),
            keys,
            ctx,
            ctx_len,
            ks,
            ix,
            out_tok,
            out_prob,
            out_len,
            out_match,
            out_support,
        )


class NgramIndex:
    """Continuation index over many keys and sequences (see the module docstring)."""

    def __init__(self, capacity: int = 1 << 21, table_bits: int | None = None) -> None:
        if capacity < 64:
            raise ValueError(f"index capacity={capacity} must be >= 64 tokens")
        self.capacity = 1 << (int(capacity) - 1).bit_length()  # a power of two
        bits = table_bits or max(10, int(np.ceil(np.log2(self.capacity * len(LEVELS)))))
        self.rec = _aligned((self.capacity, _R_WIDTH))
        self.ht = _aligned((1 << bits, 2))
        self.rec32 = self.rec.view(np.int32)  # the records' int32 halves (tokens)
        self.state = np.zeros(1, dtype=np.int64)  # [tokens written]
        self._seq_pos = np.zeros((64, AHEAD), dtype=np.int64)  # ring of last positions
        self._seq_ring = np.zeros((64, MAX_N), dtype=np.int32)
        self._seq_len = np.zeros(64, dtype=np.int64)
        self._free_seqs: list[int] = list(range(63, -1, -1))
        self.lookup_modes = ModeChooser()  # serial or threaded lookups, by measured speed
        self._ks = np.zeros(0, dtype=np.int64)  # per-row k of lookups (all equal), reused

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays :func:`stage_insert` takes (rebuilt: sequence arrays grow)."""
        return (
            self.rec,
            self.ht,
            self._seq_pos,
            self._seq_ring,
            self._seq_len,
            self.state,
            LEVELS,
            self.rec32,
        )

    @property
    def written(self) -> int:
        """Tokens ever inserted (those older than ``written - capacity`` are evicted)."""
        return int(self.state[0])

    def new_seq(self) -> int:
        """A sequence id (one per block occurrence); release it with :meth:`end_seqs`."""
        if not self._free_seqs:
            n = len(self._seq_len)
            self._seq_pos = np.concatenate([self._seq_pos, np.zeros((n, AHEAD), np.int64)])
            self._seq_ring = np.concatenate([self._seq_ring, np.zeros((n, MAX_N), np.int32)])
            self._seq_len = np.concatenate([self._seq_len, np.zeros(n, dtype=np.int64)])
            self._free_seqs = list(range(2 * n - 1, n - 1, -1))
        return self._free_seqs.pop()  # free ids are clean: new, or reset by end_seqs

    def end_seqs(self, seqs: np.ndarray) -> None:
        """Release sequence ids, in order (their tokens stay in the index until evicted)."""
        self._seq_len[seqs] = 0
        self._free_seqs.extend(seqs.tolist())

    def insert(self, keys: np.ndarray, seqs: np.ndarray, toks: np.ndarray) -> None:
        """Append ``toks[i]`` to sequence ``seqs[i]`` under key ``keys[i]``, in order."""
        if len(toks):
            _insert(keys, seqs, toks, self.arrays, new_stage())

    def lookup(
        self,
        keys: np.ndarray,
        ctx: np.ndarray,
        ctx_len: np.ndarray,
        k: int,
        out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
        ks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Drafts for a batch: ``(tokens[r, :len], probs[r, :len], len, match_n, support)``.

        ``ctx[r, :ctx_len[r]]`` holds the last (at most :data:`MAX_N`) context tokens of
        request ``r``; ``keys[r] < 0`` skips the row. ``out`` (optional) are arrays of
        those shapes to fill instead of new ones (tokens/probs beyond ``len`` untouched).
        ``ks`` (optional, each in ``0..k``, else ``ValueError``): row ``r`` drafts at most
        ``ks[r]`` tokens.

        From ``2 × 64`` rows the rows may be split over numba's threads; whether a call
        runs threaded or serial is chosen by measured speed
        (:class:`~agentspec_mw.agentspec.parallel.ModeChooser`, :attr:`lookup_modes`):
        on a host whose other cores are busy the serial kernel is the faster one.
        Both give identical results.
        """
        n = len(keys)
        if out is None:
            out = (
                np.zeros((n, max(k, 1)), dtype=np.int32),
                np.zeros((n, max(k, 1)), dtype=np.float64),
                np.zeros(n, dtype=np.int64),
                np.zeros(n, dtype=np.int64),
                np.zeros(n, dtype=np.int64),
            )
        if ks is None:
            ks = self._ks
            if len(ks) < n or (n and ks[0] != k):
                ks = self._ks = np.full(max(n, 2 * len(ks)), k, dtype=np.int64)
        elif len(ks) < n or (n and not 0 <= ks[:n].min() <= ks[:n].max() <= k):
            # the kernels write ks[r] tokens into rows k wide, unchecked
            raise ValueError(f"ks must hold {n} depths in 0..k={k}")
        args = (keys, ctx, ctx_len, ks[:n], self.arrays)
        rows_per = n // _ROWS_PER_THREAD
        threads = min(get_num_threads(), rows_per) if rows_per >= 2 else 1
        if threads < 2:
            _lookup_rows(0, n, *args, *out)
            return out
        modes = self.lookup_modes
        mode = modes.pick()
        t0 = time.perf_counter()
        if mode == THREADED:
            _lookup_par(threads, *args, *out)
        else:
            _lookup_rows(0, n, *args, *out)
        modes.observe(mode, time.perf_counter() - t0, n)
        return out
