"""The AgentSpec proposer's per-step numba kernels, one call each for the whole batch.

Per-request state lives in the rows of a few arrays (see :mod:`.slots`); the proposer
queues ``start``/``extend``/``stop`` calls and applies them here at the next ``propose``:

* :func:`scan_prompts` — at ``start``, the block automaton run over the prompt's last
  tokens (a prompt may end inside a block);
* :func:`apply_extends` — per accepted token: score the last candidate (calibration: its
  fine cells and their cells, see :func:`score`) and
  count a resolved draft in the rejection ledger, attribute the token to its block,
  append it to the block occurrence's sequence in the index (and to the agent's history
  when live), follow the ``local`` match, append it to the request's context;
* :func:`insert_outputs` — at ``stop``, a request's whole output joins its agent's history
  (only with ``experimental.index_agent_live=False``; otherwise ``apply_extends`` adds
  each token);
* :func:`gather` — each request's last :data:`MAX_N` tokens and its index keys;
* :func:`local_drafts` — the ``local`` source (own-context match, followed or scanned);
* :func:`score` — calibrated survivals, and each request's best source;
* :func:`keep_candidates` — each request's picked candidate, kept for calibration;
* :func:`emit_drafts` — the drafted tokens of the step and their acceptances;
* :func:`room_needed` — the requests whose context segments must grow for the queued
  tokens;
* :func:`release_rows` — stopped requests: their open drafts into the rejection ledger,
  their index sequences to release.

Columns of the int64 slot table are the ``C_*`` constants. Arrays that travel together
are named tuples: ``calib`` (:class:`~agentspec_mw.agentspec.scopes.CalibArrays`), ``fine``
(:class:`~agentspec_mw.agentspec.calibration.FineCells`); the per-step arrays are
:class:`~agentspec_mw.agentspec.workspace.StepWorkspace` fields.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentspec_mw.agentspec.blocks import current, feed
from agentspec_mw.agentspec.jit import kernel
from agentspec_mw.agentspec.lookup import match_tail
from agentspec_mw.agentspec.ngram_index import (
    MAX_N,
    flush_stage,
    new_stage,
    reset_seq,
    stage_run,
)
from agentspec_mw.agentspec.token_classes import N_CLASSES, NEWLINE

__all__ = [
    "NB",
    "apply_extends",
    "emit_drafts",
    "gather",
    "insert_outputs",
    "keep_candidates",
    "local_drafts",
    "release_rows",
    "room_needed",
    "scan_prompts",
    "score",
]

NB = 64  # index key = key base * NB + block id (block ids < 64)
# int64 slot table columns
C_CSTART, C_CLEN, C_CCAP, C_PLEN, C_SEQ, C_KBASE, C_ABASE, C_GID = 0, 1, 2, 3, 4, 5, 6, 7
C_SEQBLK, C_DLEN, C_DDONE, C_LPTR, C_LML, C_LSKIP, C_LBACK, C_ASEQ = 8, 9, 10, 11, 12, 13, 14, 15
C_DSENT = 16  # tokens drafted at the last step (counted in the rejection ledger)
C_GBASE, C_GSEQ = 17, 18  # scope-wide key base (-1: source off) and its live sequence
C_QUEUED = 19  # scratch: tokens queued for the slot (room_needed)
C_STREAK = 20  # verified candidate tokens in a row that were right (the request's record)
C_OK = 21  # leading positions of the request's last candidate at or above the admission bound
C_CAL = 22  # the request's row of per-scope learned state (:mod:`.scopes`; 0: frozen prior)
N_POS = 5  # draft-position buckets of the calibration table: 0, 1, 2-3, 4-7, 8+
N_COLS = 23
REC_EDGES = (1, 4, 16)  # record buckets by streak: 0, 1-3, 4-15, 16+
N_REC = len(REC_EDGES) + 1
NF = 2 * N_CLASSES * N_REC  # fine cells per cell: token class x line break x record
N_HIST = 3  # index-backed sources, in lookup-row order: iso, agent, scope
# the local source drafts after a 1-token match too (SuffixDecoding's prompt tree does): an
# answer that names what its prompt named ("The history of" -> "ink") continues from one
# token; calibration keeps 1-token matches in their own bucket (calibration.MATCH_EDGES)
_LOCAL_MIN_MATCH = 1
_LOCAL_MAX_BACKOFF = 16  # steps a request skips the local scan after failing, at most


@kernel(nogil=True)
def scan_prompts(
    slots: np.ndarray,
    n_scan: int,
    si: np.ndarray,
    stack: np.ndarray,
    tail: np.ndarray,
    bst: np.ndarray,
    ctx: np.ndarray,
    g: Any,
) -> None:  # pragma: no cover
    """Run fresh automata over the last ``n_scan`` prompt tokens (e.g. an open ReAct line),
    each slot with its grammar (column ``C_GID``, a row of the grammar table ``g``)."""
    no_out = np.empty(0, dtype=np.int64)
    for i in range(slots.shape[0]):
        s = slots[i]
        stack_s, tail_s, bst_s = stack[s], tail[s], bst[s]  # views made once per request
        bst_s[0] = 0
        bst_s[1] = 0
        tail_s[0] = 0  # the hash of no bytes
        a = si[s, C_CSTART]
        n = si[s, C_CLEN]
        feed(ctx, a + max(0, n - n_scan), a + n, stack_s, tail_s, bst_s, g, si[s, C_GID], no_out)


@kernel(nogil=True)
def apply_extends(
    slots: np.ndarray,
    off: np.ndarray,
    toks: np.ndarray,
    si: np.ndarray,
    stack: np.ndarray,
    tail: np.ndarray,
    bst: np.ndarray,
    dtok: np.ndarray,
    dcell: np.ndarray,
    ctx: np.ndarray,
    g: Any,
    ix: Any,
    calib: Any,
    strength: float,
    live: bool,
    ledger: np.ndarray,
) -> None:  # pragma: no cover
    """Apply queued ``extend`` calls in order (``toks[off[i]:off[i+1]]`` to ``slots[i]``).

    Calibration counts and the rejection ledger are the slot's scope row (``C_CAL``) of
    ``calib``/``ledger``; the frozen row 0 is never updated."""
    succ, tot, table, prior, fsucc, ftot = calib
    stage = new_stage()  # the index inserts' table probes, run in batches (stage_insert)
    blks = np.empty(64, dtype=np.int64)  # a request's tokens' blocks
    for i in range(slots.shape[0]):
        s = slots[i]
        a = off[i]
        b = off[i + 1]
        # 1. calibration: position j counts only if positions 0..j-1 matched
        m = si[s, C_DLEN]
        if m > 0:
            cs = si[s, C_CAL]
            learn = cs != 0
            done = si[s, C_DDONE]
            sent = si[s, C_DSENT]
            miss = False
            for j in range(a, b):
                fcell = dcell[s, done]
                cell = fcell // NF
                hit = dtok[s, done] == toks[j]
                if learn:
                    tot[cs, cell] += 1.0
                    ftot[cs, fcell] += 1.0
                    if hit:
                        succ[cs, cell] += 1.0
                        fsucc[cs, fcell] += 1.0
                    table[cs, cell] = (succ[cs, cell] + strength * prior[cell]) / (
                        tot[cs, cell] + strength
                    )
                if hit:
                    si[s, C_STREAK] += 1
                else:
                    si[s, C_STREAK] = 0
                if not hit:
                    m = 0
                    miss = True
                    break
                done += 1
                if done >= m:
                    m = 0
                    break
            # the rejection ledger: drafted tokens once their verification is known
            if sent > 0 and (miss or done >= sent):
                if learn:
                    ledger[cs, 0] += min(done, sent)
                    ledger[cs, 1] += sent
                sent = 0
            si[s, C_DLEN] = m
            si[s, C_DDONE] = done
            si[s, C_DSENT] = sent
        # 2. blocks and the index: one sequence per block occurrence
        seq = si[s, C_SEQ]
        base = si[s, C_KBASE] * NB
        if blks.shape[0] < b - a:
            blks = np.empty(2 * (b - a), dtype=np.int64)
        # each token's block (the one open before it), then its inserts a run of one
        # block at a time
        feed(toks, a, b, stack[s], tail[s], bst[s], g, si[s, C_GID], blks)
        j = a
        while j < b:
            blk = blks[j - a]
            e = j + 1
            while e < b and blks[e - a] == blk:
                e += 1
            if blk != si[s, C_SEQBLK]:
                reset_seq(seq, ix)
                si[s, C_SEQBLK] = blk
            stage_run(base + blk, seq, toks, j, e, ix, stage)
            j = e
        if live:
            stage_run(si[s, C_ABASE] * NB, si[s, C_ASEQ], toks, a, b, ix, stage)
            if si[s, C_GBASE] >= 0:
                stage_run(si[s, C_GBASE] * NB, si[s, C_GSEQ], toks, a, b, ix, stage)
        # 3. the local source follows its match while the accepted tokens confirm it
        c0 = si[s, C_CSTART]
        n = si[s, C_CLEN]
        lp = si[s, C_LPTR]
        if lp >= 0:
            if lp + (b - a) <= n:
                for j in range(a, b):
                    if ctx[c0 + lp + j - a] != toks[j]:
                        lp = -1
                        break
            else:
                lp = -1
            if lp >= 0:
                si[s, C_LPTR] = lp + (b - a)
                si[s, C_LML] = min(si[s, C_LML] + (b - a), MAX_N)
            else:
                si[s, C_LPTR] = -1
        # 4. the context (capacity ensured by the caller)
        for j in range(a, b):
            ctx[c0 + n + j - a] = toks[j]
        si[s, C_CLEN] = n + (b - a)
    flush_stage(ix, stage)


@kernel(nogil=True)
def room_needed(
    slots: np.ndarray, lens: np.ndarray, si: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """The slots whose context segments cannot take their queued tokens (``lens[i]`` for
    ``slots[i]``; a slot may appear more than once), with the tokens each must add; and
    the offsets of the queued calls' tokens (``off[i]:off[i+1]``, for
    :func:`apply_extends`)."""
    off = np.empty(slots.shape[0] + 1, dtype=np.int64)
    off[0] = 0
    for i in range(slots.shape[0]):
        si[slots[i], C_QUEUED] += lens[i]
        off[i + 1] = off[i] + lens[i]
    short = np.empty(slots.shape[0], dtype=np.int64)
    extra = np.empty(slots.shape[0], dtype=np.int64)
    n = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        q = si[s, C_QUEUED]
        if q == 0:
            continue  # counted at its first occurrence
        si[s, C_QUEUED] = 0
        if si[s, C_CLEN] + q > si[s, C_CCAP]:
            short[n] = s
            extra[n] = q
            n += 1
    return short[:n], extra[:n], off


@kernel(nogil=True)
def release_rows(
    done: np.ndarray, si: np.ndarray, ledger: np.ndarray
) -> np.ndarray:  # pragma: no cover
    """Stopped requests: a draft still open ran past the output's end (the rejection
    ledger of the request's scope row counts it); returns their index sequences to
    release, in slot order."""
    seqs = np.empty(3 * done.shape[0], dtype=np.int64)
    n = 0
    for i in range(done.shape[0]):
        s = done[i]
        sent = si[s, C_DSENT]
        cs = si[s, C_CAL]
        if cs != 0:
            ledger[cs, 0] += min(si[s, C_DDONE], sent)
            ledger[cs, 1] += sent
        seqs[n] = si[s, C_SEQ]
        n += 1
        for col in (C_ASEQ, C_GSEQ):
            if si[s, col] >= 0:
                seqs[n] = si[s, col]
                n += 1
    return seqs[:n]


@kernel(nogil=True)
def insert_outputs(
    slots: np.ndarray, seq: int, si: np.ndarray, ctx: np.ndarray, ix: Any, col: int
) -> None:  # pragma: no cover
    """Each stopped request's output, as one sequence under the key base in column
    ``col`` (``C_ABASE``: agent, ``C_GBASE``: scope; a negative base is skipped)."""
    stage = new_stage()
    for i in range(slots.shape[0]):
        s = slots[i]
        if si[s, col] < 0:
            continue
        reset_seq(seq, ix)
        c0 = si[s, C_CSTART]
        stage_run(si[s, col] * NB, seq, ctx, c0 + si[s, C_PLEN], c0 + si[s, C_CLEN], ix, stage)
    flush_stage(ix, stage)


@kernel(nogil=True)
def gather(
    slots: np.ndarray,
    si: np.ndarray,
    stack: np.ndarray,
    bst: np.ndarray,
    ctx: np.ndarray,
    out_ctx: np.ndarray,
    out_len: np.ndarray,
    out_keys: np.ndarray,
    out_rec: np.ndarray,
    out_blk: np.ndarray,
    k: int,
    walk_min: int,
    out_ks: np.ndarray,
) -> None:  # pragma: no cover
    """Tails of the context (``out_ctx[r, :out_len[r]]``) and keys, for the ``3n`` lookup
    rows: iso (``r``), then agent (``n + r``) and scope (``2n + r``), the same tail; each
    request's record bucket (``out_rec[r]``, its streak by :data:`REC_EDGES`) and block
    kind (``out_blk[r]``, the iso key's); and how
    deep its candidates are walked (``out_ks``, every row of the request):
    ``min(k, max(walk_min, 2 × C_OK))``, or ``k`` with ``walk_min <= 0``."""
    n = slots.shape[0]
    for r in range(n):
        s = slots[r]
        kr = k if walk_min <= 0 else min(k, max(walk_min, 2 * si[s, C_OK]))
        out_ks[r] = out_ks[n + r] = out_ks[2 * n + r] = kr
        st = si[s, C_STREAK]
        b = 0
        while b < len(REC_EDGES) and st >= REC_EDGES[b]:
            b += 1
        out_rec[r] = b
        c0 = si[s, C_CSTART]
        ln = si[s, C_CLEN]
        t = min(ln, MAX_N)
        for j in range(t):
            out_ctx[r, j] = out_ctx[n + r, j] = out_ctx[2 * n + r, j] = ctx[c0 + ln - t + j]
        out_len[r] = out_len[n + r] = out_len[2 * n + r] = t
        blk = current(stack[s], bst[s])
        out_blk[r] = blk
        out_keys[r] = si[s, C_KBASE] * NB + blk
        out_keys[n + r] = si[s, C_ABASE] * NB
        g = si[s, C_GBASE]
        out_keys[2 * n + r] = g * NB if g >= 0 else -1


@kernel(nogil=True)
def local_drafts(
    slots: np.ndarray,
    ks: np.ndarray,
    si: np.ndarray,
    ctx: np.ndarray,
    out_tok: np.ndarray,
    out_prob: np.ndarray,
    out_len: np.ndarray,
    out_ml: np.ndarray,
    out_support: np.ndarray,
) -> None:  # pragma: no cover
    """The ``local`` candidate per request (at most ``ks[r]`` tokens): follow the last
    match, or scan (with back-off).

    A local token's count ratio is 1 (``out_prob``) and its support 1: one occurrence.
    """
    for r in range(slots.shape[0]):
        s = slots[r]
        c0 = si[s, C_CSTART]
        n = si[s, C_CLEN]
        lp = si[s, C_LPTR]
        out_len[r] = 0
        out_ml[r] = 0
        out_support[r] = 1
        if 0 <= lp < n:
            pos = lp
        elif si[s, C_LSKIP] > 0:
            si[s, C_LSKIP] -= 1
            continue
        else:
            pos, ml = match_tail(ctx[c0 : c0 + n], _LOCAL_MIN_MATCH, MAX_N)
            if pos < 0:
                si[s, C_LBACK] = min(max(1, 2 * si[s, C_LBACK]), _LOCAL_MAX_BACKOFF)
                si[s, C_LSKIP] = si[s, C_LBACK]
                continue
            si[s, C_LPTR] = pos
            si[s, C_LML] = ml
            si[s, C_LBACK] = 0
        m = min(ks[r], n - pos)
        for j in range(m):
            out_tok[r, j] = ctx[c0 + pos + j]
            out_prob[r, j] = 1.0
        out_len[r] = m
        out_ml[r] = si[s, C_LML]


@kernel(nogil=True)
def keep_candidates(
    slots: np.ndarray,
    pick: np.ndarray,
    sel_len: np.ndarray,
    sel_cell: np.ndarray,
    n_ok: np.ndarray,
    tok: np.ndarray,
    si: np.ndarray,
    dtok: np.ndarray,
    dcell: np.ndarray,
) -> None:  # pragma: no cover
    """Each request with a candidate keeps it (tokens and calibration cells of its
    ``sel_len`` positions), drafted or not, for the calibration of the next extend; every
    request keeps how many of its leading positions reached the admission bound
    (``C_OK``)."""
    for r in range(slots.shape[0]):
        m = sel_len[r]
        s = slots[r]
        si[s, C_OK] = n_ok[r]
        if m <= 0:
            continue
        row = pick[r]
        for j in range(m):
            dtok[s, j] = tok[row, j]
            dcell[s, j] = sel_cell[r, j]
        si[s, C_DLEN] = m
        si[s, C_DDONE] = 0
        si[s, C_DSENT] = 0


@kernel(nogil=True, inline="always")
def _head(
    a: int,
    r: int,
    n_req: int,
    match: np.ndarray,
    support: np.ndarray,
    levels: np.ndarray,
    sup_edges: np.ndarray,
) -> int:  # pragma: no cover
    """Calibration row of candidate ``a * n_req + r`` with ``agree = 0``
    (:func:`_cell` adds agreement, position and c/n)."""
    row = a * n_req + r
    ml = 0
    while ml + 1 < levels.shape[0] and levels[ml + 1] <= match[row]:
        ml += 1
    sb = 0
    while sb < sup_edges.shape[0] and sup_edges[sb] <= support[row]:
        sb += 1
    return (((a * 2) * levels.shape[0] + ml) * (sup_edges.shape[0] + 1) + sb) * N_POS


@kernel(nogil=True, inline="always")
def _agreed(a: int, r: int, n_req: int, tok: np.ndarray, lens: np.ndarray) -> int:
    """Leading positions of candidate ``a`` that another source drafts identically."""
    n_src = tok.shape[0] // n_req
    row = a * n_req + r
    best = 0
    for b in range(n_src):
        if b == a:
            continue
        rb = b * n_req + r
        m = min(lens[rb], lens[row])
        j = 0
        while j < m and tok[rb, j] == tok[row, j]:
            j += 1
        best = max(best, j)
    return best


@kernel(nogil=True, inline="always")
def _cell(head: int, agree: int, j: int, p: float, n_q: int) -> int:  # pragma: no cover
    """Calibration cell of draft position ``j`` with count ratio ``p`` in row ``head``;
    ``agree`` is the row offset when another source drafts the same tokens up to ``j``."""
    pb = j if j < 2 else 2 if j < 4 else 3 if j < 8 else 4
    return (head + agree + pb) * n_q + min(int(p * n_q), n_q - 1)


@kernel(nogil=True, inline="always")
def _fine(cell: int, code: int, crossed: int, rec: int) -> int:  # pragma: no cover
    """Fine cell of a token in calibration ``cell``: its text class (``code``'s low
    bits, :mod:`.token_classes`), whether the draft crossed a line break before it, and
    the request's record bucket ``rec``."""
    base = cell * NF + 2 * N_CLASSES * rec
    return base + (code & (N_CLASSES - 1)) + (N_CLASSES if crossed else 0)


@kernel(nogil=True, inline="always")
def _acceptance(
    f: int, table: np.ndarray, fsucc: np.ndarray, ftot: np.ndarray, strength: float
) -> float:  # pragma: no cover
    """Calibrated acceptance of fine cell ``f`` (``table``, ``fsucc``, ``ftot``: one scope
    row): its own counts shrunk toward its cell's acceptance with weight ``strength``
    (``strength <= 0``: the cell's acceptance)."""
    c = f // NF
    if strength <= 0.0:
        return table[c]
    return (fsucc[f] + strength * table[c]) / (ftot[f] + strength)


# compiled without numba's reference counting (it allocates nothing; the caller passes the
# scratch rows): counting the arrays of the helpers inlined into its loop, per draft position,
# took ~1/6 of a 256-request step's scoring (2026-12-04, docs/experiments/proposer_speed.md)
@kernel(nogil=True, _nrt=False)
def score(
    tok: np.ndarray,
    prob: np.ndarray,
    lens: np.ndarray,
    match: np.ndarray,
    support: np.ndarray,
    rec: np.ndarray,
    cal: np.ndarray,
    table: np.ndarray,
    fine: Any,
    levels: np.ndarray,
    sup_edges: np.ndarray,
    n_q: int,
    bounds: np.ndarray,
    out_pick: np.ndarray,
    out_len: np.ndarray,
    out_cell: np.ndarray,
    out_ok: np.ndarray,
    out_flat: np.ndarray,
    cells: np.ndarray,
    surv: np.ndarray,
) -> int:  # pragma: no cover
    """Calibrated survival of every candidate row; pick each request's best source.

    Rows are ``source * n_req + r``. A token's calibration cell is, flattened,
    ``(source, agree, match bucket, support bucket, position bucket, c/n bucket)``, where
    ``agree`` = another source drafts the same tokens up to and including this position
    (:func:`_agreed`) and the position buckets are
    0, 1, 2-3, 4-7, 8+ (acceptance given the earlier positions were accepted). Each
    cell is split into :data:`NF` fine cells by the token's text class, whether the
    draft crossed a line break before it and the request's record bucket ``rec[r]``;
    ``fine`` (``FineCells``: ``fsucc, ftot, codes, strength``) holds their counts, the
    token codes (:func:`~agentspec_mw.agentspec.token_classes.token_classes`) and the
    shrinkage weight (:func:`_acceptance`); request ``r`` reads its scope's row ``cal[r]``
    of them and of ``table``. Written cells are fine cells.
    The picked row maximises the expected accepted tokens among its positions whose
    survival is at least ``bounds[r]`` (the budget's admission bound for the request this
    step: positions under it can never pay for their slot,
    :func:`~agentspec_mw.agentspec.budget.admission_bound`), then the sum of all its
    survivals; the first source wins ties. Its cells are written out; ``out_ok[r]`` is
    how many of its leading positions reach ``bounds[r]``, and those
    positions' survivals, request after request, fill ``out_flat`` (their count is
    returned). ``cells`` and ``surv`` (at least sources × candidate width) are scratch: each
    source's fine cells and survivals, kept for the one picked (no second pass).
    """
    fsucc2, ftot2, codes, strength = fine
    n_req = out_pick.shape[0]
    n_src = tok.shape[0] // n_req
    agree = levels.shape[0] * (sup_edges.shape[0] + 1) * N_POS  # row offset of agree = 1
    n_flat = 0
    for r in range(n_req):
        best_v = -1.0
        best_w = -1.0
        best_a = 0
        cs = cal[r]
        tab, fsucc, ftot = table[cs], fsucc2[cs], ftot2[cs]  # the request's scope row
        bound = bounds[r]
        for a in range(n_src):
            row = a * n_req + r
            v = 0.0
            w = 0.0  # expected accepted tokens among the positions at or above the bound
            if lens[row] > 0:
                head = _head(a, r, n_req, match, support, levels, sup_edges)
                ag = _agreed(a, r, n_req, tok, lens)
                s = 1.0
                crossed = 0
                for j in range(lens[row]):
                    c = _cell(head, agree if j < ag else 0, j, prob[row, j], n_q)
                    t = tok[row, j]  # an id past the tokenizer's table has no class
                    code = codes[t] if t < codes.shape[0] else 0
                    f = _fine(c, code, crossed, rec[r])
                    s *= _acceptance(f, tab, fsucc, ftot, strength)
                    cells[a, j] = f
                    surv[a, j] = s
                    crossed |= code & NEWLINE
                    v += s
                    if s >= bound:
                        w += s
            if w > best_w or (w == best_w and v > best_v):
                best_w = w
                best_v = v
                best_a = a
        row = best_a * n_req + r
        m = lens[row]
        out_pick[r] = row
        out_len[r] = m
        out_ok[r] = 0
        for j in range(m):
            out_cell[r, j] = cells[best_a, j]
        for j in range(m):  # the leading positions at or above the bound
            if surv[best_a, j] < bound:
                break
            out_ok[r] = j + 1
            out_flat[n_flat] = surv[best_a, j]
            n_flat += 1
    return n_flat


@kernel(nogil=True)
def emit_drafts(
    slots: np.ndarray,
    counts: np.ndarray,
    pick: np.ndarray,
    cells: np.ndarray,
    tok: np.ndarray,
    si: np.ndarray,
    cal: np.ndarray,
    table: np.ndarray,
    fine: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """The step's drafts: request ``r`` drafts the first ``counts[r]`` tokens of its
    picked row (``C_DSENT`` records the count for the rejection ledger). Returns the
    drafting requests, where each one's tokens end in the flat arrays, and the flat
    tokens and their calibrated acceptances (:func:`_acceptance` of their cells in
    their scope rows ``cal``)."""
    n_rows = 0
    total = 0
    for r in range(counts.shape[0]):
        if counts[r] > 0:
            n_rows += 1
            total += counts[r]
    rows = np.empty(n_rows, dtype=np.int64)
    ends = np.empty(n_rows, dtype=np.int64)
    flat_tok = np.empty(total, dtype=np.int64)
    flat_p = np.empty(total, dtype=np.float64)
    fsucc, ftot, _codes, strength = fine
    q = 0
    t = 0
    for r in range(counts.shape[0]):
        c = counts[r]
        if c <= 0:
            continue
        si[slots[r], C_DSENT] = c
        row = pick[r]
        cs = cal[r]
        tab, fs, ft = table[cs], fsucc[cs], ftot[cs]  # the request's scope row
        for j in range(c):
            flat_tok[t] = tok[row, j]
            flat_p[t] = _acceptance(cells[r, j], tab, fs, ft, strength)
            t += 1
        rows[q] = r
        ends[q] = t
        q += 1
    return rows, ends, flat_tok, flat_p
