"""The AgentSpec proposer: structure-isolated drafting with a cost-model budget.

Sources a request may draft from, in decreasing isolation:

``iso``
    the history of the same scope, agent and *query group* in the same block kind: the
    text this agent produced earlier in this kind of block for this query — or, when the
    request belongs to a redundancy group (fan-out siblings, repeats, retries), for any
    member of the group. Updated every step, so parallel siblings draft from each other.
    This is the paper's structure-isolated cache.
``agent``
    everything this agent produced in this scope, across queries (added token by token
    as its requests decode, or when a request stops with ``index_agent_live=False``).
    Looked up in the same batched index call as ``iso``; what it adds is decided
    by calibration (cross-query text is trusted only where it has proven accepted).
``scope``
    everything any agent produced in this isolation scope (kept like ``agent``): one
    agent quoting or rewriting another's text, boilerplate shared by the agents of an
    app. The widest index source — SuffixDecoding's global tree, but never crossing a
    scope, and calibrated like the others.
``local``
    the request's own prompt and output, searched directly for the most recent longest
    match of its suffix (:mod:`~agentspec_mw.agentspec.lookup`).

The ``local`` scan is O(context) per request, so its cost is bounded: while a found match
keeps being confirmed by the accepted tokens it is followed without rescanning, and a
request whose scan finds nothing skips the next 1, 2, 4 … 16 steps. What each source
contributes at each batch size is decided by calibration and the budget, not by rules.

``iso``, ``agent`` and ``scope`` live in one :class:`~agentspec_mw.agentspec.ngram_index.NgramIndex`
(keys embed the isolation scope). Each draft token carries ``c / n`` — of the ``n``
continuations found, ``c`` agree — which is *calibrated* online: every verified draft
updates its isolation scope's acceptance table (:mod:`.scopes`: each scope learns only
from its own drafts, from a fixed prior) bucketed by (source, agreement between sources, match
length, support ``n``, draft position, ``c / n``). Each bucket's prior is the paper's
redundancy score ``g(c, n) = (c/n)·p(n)``; each bucket is split further by the drafted
token's text class and whether the draft crossed a line break (``calib_token_classes``,
:mod:`.token_classes`), a split bucket's acceptance shrunk toward its bucket's. A
position's survival probability is the product of the calibrated acceptances of the
tokens up to it; :func:`~agentspec_mw.agentspec.budget.allocate` turns survivals into the
step's drafts: the positions that maximise the step's expected tokens per second under
the engine's step-time model, the prefill chunks the drafts displace included. Rejection
is counted (:attr:`AgentSpecProposer.verified`), never targeted.

Speed: ``start``/``extend``/``stop`` only queue their arguments; the next ``propose``
applies them for the whole batch in a few numba kernels (:mod:`.kernels`) over per-request
rows of arrays (:mod:`.slots`), so the per-step Python work is a handful of array
operations, not a loop over tokens.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentspec_mw.agentspec import kernels as K
from agentspec_mw.agentspec.blocks import BlockGrammar, BlockSpec, current
from agentspec_mw.agentspec.budget import StepShape, admission_bound, allocate
from agentspec_mw.agentspec.config import AgentSpecConfig
from agentspec_mw.agentspec.grammars import MAX_GRAMMARS, GrammarRegistry
from agentspec_mw.agentspec.ngram_index import LEVELS, MAX_N, NgramIndex
from agentspec_mw.agentspec.scopes import ScopeStates
from agentspec_mw.agentspec.slots import SlotTable
from agentspec_mw.agentspec.token_classes import token_classes
from agentspec_mw.costmodel import StepTimeFn, get_cost_model
from agentspec_mw.proposer import EMPTY_DRAFT, Draft, ProposerEnv, StepContext, TokenIds
from agentspec_mw.tags import StructureTags

__all__ = ["MAX_GRAMMARS", "SOURCES", "AgentSpecProposer", "redundancy_score"]

logger = logging.getLogger(__name__)

SOURCES = ("iso", "agent", "scope", "local")
_Q = 10  # buckets of c/n
_N_ML = len(LEVELS)  # match-length buckets (index levels; local uses the same edges)
_SUPPORT_EDGES = np.array([2, 4, 8], dtype=np.int64)  # support buckets: 1, 2-3, 4-7, 8+
_N_SUP = len(_SUPPORT_EDGES) + 1
_MIN_PROB = 0.05  # the index stops a draft at a token fewer than 5% of candidates agree on


_warm = False


def _warm_kernels() -> None:
    """Load (or compile) the numba kernels once per process, at construction: tiny
    private proposers draft for and verify a batch of requests (48: enough index rows for
    the threaded lookup) and stop them, live and not (``index_agent_live``). Otherwise
    the engine's first decoding steps pay it (~0.3 s with a warm numba cache here, and
    the compilation itself on a cold one) — a hitch on the first requests, and in the
    replay a cost charged to the first workload's step times."""
    global _warm
    if _warm:
        return
    _warm = True
    env = ProposerEnv(token_bytes=[bytes([i]) for i in range(256)], max_k=4)
    text = b"Thought: look up the flight.\nAction: search[flight 42]\n" * 4
    prompt = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    for live, n in ((True, 48), (False, 1)):
        p = AgentSpecProposer(env, index_max_tokens=1024, index_agent_live=live)
        rids = [f"warm{i}" for i in range(n)]
        for rid in rids:
            p.start(rid, prompt[:-20])
            p.extend(rid, prompt[-20:-19])
        step = StepContext(batch_size=n, num_kv_tokens=n * len(prompt))
        for _ in range(3):
            for rid, d in zip(rids, p.propose(rids, 4, step), strict=True):
                p.extend(rid, list(d.token_ids[:1]) or [int(prompt[-1])])
        for rid in rids:
            p.stop(rid)
        p.propose([], 4, step)  # applies the stops
        p._slots.compact()


def redundancy_score(c: int, n: int, g_min: float) -> float:
    """The paper's ``g(c, n) = (c/n)·p(n)`` with ``p(n) = g_min + (1-g_min)(1-e^(1-n))``.

    The paper's two formulas for ``p`` disagree (``e^(-n)`` vs ``e^(1-n)``); ``e^(1-n)`` is
    used so that a single candidate gets exactly ``g_min``.
    """
    if n <= 0 or c <= 0:
        return 0.0
    return (c / n) * (g_min + (1.0 - g_min) * (1.0 - math.exp(1 - n)))


def _hash_ids(ids: np.ndarray) -> str:
    data = np.ascontiguousarray(ids, dtype=np.int32).tobytes()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class AgentSpecProposer:
    """Structure-isolated, budget-aware proposer (see the module docstring)."""

    name = "agentspec"

    def __init__(self, env: ProposerEnv | None = None, **options: Any) -> None:
        self.config = cfg = AgentSpecConfig(**options)
        env = env or ProposerEnv()
        if env.token_bytes is None:
            raise ValueError(
                "agentspec needs ProposerEnv.token_bytes (agentspec_mw.tokens.token_bytes_table)"
            )
        self.token_bytes = env.token_bytes
        self.cost: StepTimeFn = (
            env.cost_model  # type: ignore[assignment]
            if env.cost_model is not None
            else get_cost_model(cfg.budget_cost_model)
        )
        default = BlockGrammar([BlockSpec(*b) for b in cfg.blocks], self.token_bytes)
        self._grammars = GrammarRegistry(default, self.token_bytes, cfg.blocks_max_per_scope)
        self._index = NgramIndex(capacity=cfg.index_max_tokens)
        self._out_seq = self._index.new_seq()  # sequences used to insert finished outputs
        self._out_gseq = self._index.new_seq()
        self._keys: OrderedDict[tuple[str, ...], int] = OrderedDict()  # key bases, LRU
        self._next_key = 0
        self._slots = SlotTable(draft_width=max(env.max_k, 1))
        self._reqs: dict[str, int] = {}  # live request -> slot
        self._pend_start: list[int] = []
        self._pend_slot: list[int] = []
        self._pend_ids: list[Any] = []
        self._pend_stop: list[int] = []
        # calibration table over (source, agree, match, support, position, c/n) buckets
        shape = (len(SOURCES), 2, _N_ML, _N_SUP, K.N_POS, _Q)
        q_mid = (np.arange(_Q) + 0.5) / _Q
        sup_mid = np.array([1, 2, 5, 10])
        p_n = np.array([redundancy_score(1, int(n), cfg.redundancy_g_min) for n in sup_mid])
        base = cfg.calib_prior_scale * q_mid[None, None, :] * p_n[:, None, None]
        prior = np.broadcast_to(base, shape).copy()
        prior[:, 1] = np.minimum(1.0, prior[:, 1] * 1.1)  # sources agree: more trust
        self._prior = prior.reshape(-1)
        # what verified drafts teach, per isolation scope (each cell split by token text
        # class x line break crossed x record, kernels.score): calibration, and the
        # verified drafts' counts (reported)
        self._scopes = ScopeStates(self._prior, len(self._prior) * K.NF, cfg.calib_max_scopes)
        self._default_row = self._scopes.acquire("default")  # tag-free traffic: kept for good
        codes = token_classes(self.token_bytes)
        if not cfg.calib_token_classes:
            codes = np.zeros_like(codes)
        self._codes = codes
        self._strength = cfg.calib_prior_strength if cfg.calib_token_classes else 0.0
        self._overhead_s = 0.0
        self.stats: dict[str, int] = {"steps": 0, "offered": 0, "drafted": 0}
        self._ws: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}  # see _workspace
        self._ws_cap = 0
        self._off_sources = [
            h for h, name in enumerate(SOURCES[: K.N_HIST]) if name not in cfg.sources
        ]
        self.candidates: dict[str, np.ndarray] | None = None
        """Set to ``{}`` to have each ``propose`` leave its candidates here (diagnostics,
        ``benchmarks/candidate_gap.py``): ``tok``/``lens`` per source row
        (``source * n_req + i``, sources in :data:`SOURCES` order) and ``pick`` (the row
        chosen for each request), before the budget cuts them."""
        _warm_kernels()

    def _workspace(self, n_req: int, kk: int) -> tuple[np.ndarray, ...]:
        """The per-step arrays of a ``propose`` for ``n_req`` requests and candidates of
        ``kk`` tokens: leading rows of buffers reused across steps (contents left over),
        the views kept per ``(n_req, kk)`` so a step builds none."""
        ws = self._ws.get((n_req, kk))
        if ws is not None:
            return ws
        base = self._ws.get((-1, kk))
        if base is None or n_req > self._ws_cap or len(self._ws) > 1024:
            cap = max(n_req, 2 * self._ws_cap, 64)
            nh, nr = K.N_HIST * cap, (K.N_HIST + 1) * cap
            base = (
                np.zeros((nh, MAX_N), np.int32),  # ctx
                np.zeros(nh, np.int64),  # ctx_len
                np.zeros(nh, np.int64),  # keys
                np.zeros((nr, kk), np.int32),  # tok
                np.zeros((nr, kk), np.float64),  # prob
                np.zeros(nr, np.int64),  # lens
                np.zeros(nr, np.int64),  # match
                np.zeros(nr, np.int64),  # support
                np.zeros(cap, np.int64),  # pick
                np.zeros(cap, np.int64),  # sel_len
                np.zeros((cap, kk), np.int64),  # sel_cell
                np.zeros(cap, np.int64),  # n_ok
                np.zeros(cap * kk, np.float64),  # flat
                np.zeros(cap, np.int64),  # rec
                np.zeros(nh, np.int64),  # ks: walk depth per index row
            )
            self._ws = {(-1, kk): base}
            self._ws_cap = cap
        nh = K.N_HIST * n_req
        nr = nh + n_req
        ctx, ctx_len, keys, tok, prob, lens, match, support = (
            base[0][:nh],
            base[1][:nh],
            base[2][:nh],
            base[3][:nr],
            base[4][:nr],
            base[5][:nr],
            base[6][:nr],
            base[7][:nr],
        )
        ws = (
            ctx,
            ctx_len,
            keys,
            tok,
            prob,
            lens,
            match,
            support,
            *(a[:n_req] for a in base[8:12]),  # pick, sel_len, sel_cell, n_ok
            base[12][: n_req * kk],  # flat
            base[13][:n_req],  # rec
            base[14][:nh],  # ks
            *(a[:nh] for a in (tok, prob, lens, match, support)),  # index rows
            *(a[nh:] for a in (tok, prob, lens, match, support)),  # local rows
        )
        self._ws[(n_req, kk)] = ws
        return ws

    @property
    def grammar_fallbacks(self) -> int:
        """Requests whose tags named block delimiters they did not get (the delimiters
        failed to build, or no grammar row was free): they used the default blocks
        (:mod:`.grammars`)."""
        return self._grammars.fallbacks

    @property
    def _fine(self) -> tuple[Any, ...]:
        """The fine cells' counts (every scope row), token codes and shrinkage weight."""
        sc = self._scopes
        return (sc.fsucc, sc.ftot, self._codes, self._strength)

    # the default scope's row (tag-free traffic and tags without a scope)
    @property
    def _ledger(self) -> np.ndarray:
        return self._scopes.ledger[self._default_row]

    @property
    def verified(self) -> tuple[float, float]:
        """Accepted and drafted tokens of the verified drafts, every scope kept together
        (their rejection is reported, never targeted; a forgotten scope's counts go)."""
        acc, dr = self._scopes.ledger.sum(axis=0).tolist()
        return acc, dr

    # -- identity and keys ---------------------------------------------------------------
    def _key_base(self, key: tuple[str, ...]) -> int:
        """Id of a key base (index key = base * NB + block id); least recently used go."""
        kid = self._keys.get(key)
        if kid is not None:
            self._keys.move_to_end(key)
            return kid
        kid = self._keys[key] = self._next_key
        self._next_key += 1
        while len(self._keys) > self.config.index_max_keys:
            self._keys.popitem(last=False)  # its tokens become unreachable, then evicted
        return kid

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        """Register a request: its identity (tags, or derived from the prompt) and block.

        Scope-only tags (no ``agent_id``/``query_id``) get the tag-free identity inside
        their scope. Nothing in ``tags`` makes this raise: unusable block delimiters fall
        back to the default grammar (:mod:`.grammars`).
        """
        if req_id in self._reqs:
            self.stop(req_id)
        prompt = np.asarray(prompt_ids, dtype=np.int32).reshape(-1)
        cfg = self.config
        scope, agent, group = self._identity(prompt, tags)
        gid, glabel = self._grammars.acquire(None if tags is None else tags.blocks, scope)
        cal = self._scopes.acquire(scope)
        slots = self._slots
        s = slots.acquire(prompt)
        row = slots.si[s]
        row[K.C_CAL] = cal
        row[K.C_PLEN] = len(prompt)
        row[K.C_SEQ] = self._index.new_seq()
        row[K.C_KBASE] = self._key_base((scope, agent, group, glabel))
        row[K.C_ABASE] = self._key_base(("agent", scope, agent))
        row[K.C_GID] = gid
        row[K.C_SEQBLK] = -1
        row[K.C_LPTR] = -1
        row[K.C_ASEQ] = self._index.new_seq() if cfg.index_agent_live else -1
        if "scope" in cfg.sources:
            row[K.C_GBASE] = self._key_base(("scope", scope))
            row[K.C_GSEQ] = self._index.new_seq() if cfg.index_agent_live else -1
        else:
            row[K.C_GBASE] = row[K.C_GSEQ] = -1
        self._reqs[req_id] = s
        self._pend_start.append(s)

    def _identity(self, prompt: np.ndarray, tags: StructureTags | None) -> tuple[str, str, str]:
        """``(scope, agent, group)`` of a request: from its tags; what they leave out
        (all of it without tags) derived from the prompt — the agent from its first
        ``tagfree_agent_tokens`` tokens, the query group from its first
        ``tagfree_query_tokens`` — in scope ``default`` without tags."""
        cfg = self.config
        if tags is None:
            scope = "default"
            agent_id = query_id = group_id = None
        else:
            scope = str(tags.scope)
            agent_id, query_id, group_id = tags.agent_id, tags.query_id, tags.group_id
        if agent_id:
            agent = str(agent_id)
        else:
            agent = "anon:" + _hash_ids(prompt[: cfg.tagfree_agent_tokens])
        if group_id:
            group = f"g:{group_id}"
        elif query_id:
            group = f"q:{query_id}"
        else:
            group = "anon:" + _hash_ids(prompt[: cfg.tagfree_query_tokens])
        return scope, agent, group

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        """Accepted tokens: queued, applied for the whole batch at the next ``propose``.

        A writable array or a list is copied (the caller may reuse its buffer); a
        read-only array (e.g. a slice of a memory-mapped trace) is kept as is.
        """
        s = self._reqs[req_id]
        if len(token_ids):
            if not isinstance(token_ids, np.ndarray) or token_ids.flags.writeable:
                token_ids = np.array(token_ids, dtype=np.int32)
            self._pend_slot.append(s)
            self._pend_ids.append(token_ids)

    def stop(self, req_id: str) -> None:
        """Release the request (with ``index_agent_live=False`` its output joins the
        agent-wide history now)."""
        s = self._reqs.pop(req_id, None)
        if s is not None:
            self._pend_stop.append(s)

    def _flush(self) -> None:
        """Apply the queued calls (see :mod:`.kernels`), in the order they were made."""
        slots = self._slots
        ix = self._index.arrays
        if self._pend_start:
            st = np.array(self._pend_start, dtype=np.int64)
            self._pend_start.clear()
            K.scan_prompts(
                st,
                self.config.tagfree_scan_tokens,
                slots.si,
                slots.stack,
                slots.tail,
                slots.bst,
                slots.ctx,
                self._grammars.table.arrays,
            )
        if self._pend_ids:
            sl = np.array(self._pend_slot, dtype=np.int64)
            lens = np.fromiter(map(len, self._pend_ids), np.int64, len(self._pend_ids))
            toks = np.concatenate(self._pend_ids, dtype=np.int32)
            self._pend_slot = []
            self._pend_ids = []
            short, extra, off = K.room_needed(sl, lens, slots.si)
            if len(short):
                slots.reserve(short, extra)
            K.apply_extends(
                sl,
                off,
                toks,
                slots.si,
                slots.stack,
                slots.tail,
                slots.bst,
                slots.dtok,
                slots.dcell,
                slots.ctx,
                self._grammars.table.arrays,
                ix,
                self._scopes.calib,
                float(self.config.calib_prior_strength),
                self.config.index_agent_live,
                self._scopes.ledger,
            )
        if self._pend_stop:
            done = self._pend_stop
            self._pend_stop = []
            if not self.config.index_agent_live:
                dn = np.array(done, dtype=np.int64)
                K.insert_outputs(dn, self._out_seq, slots.si, slots.ctx, ix, K.C_ABASE)
                K.insert_outputs(dn, self._out_gseq, slots.si, slots.ctx, ix, K.C_GBASE)
            dn = np.array(done, dtype=np.int64)
            seqs = K.release_rows(dn, slots.si, self._scopes.ledger)
            self._index.end_seqs(seqs)
            self._scopes.release(slots.si[dn, K.C_CAL])
            self._grammars.release(slots.si[dn, K.C_GID])
            slots.release(done)

    def block_of(self, req_id: str) -> str | None:
        """The block kind request ``req_id`` is in (for per-block metrics), if it is live."""
        s = self._reqs.get(req_id)
        if s is None:
            return None
        self._flush()
        slots = self._slots
        blk = current(slots.stack[s], slots.bst[s])
        return self._grammars.table[int(slots.si[s, K.C_GID])].names[blk]

    # -- drafting ------------------------------------------------------------------------
    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        """Draft for the whole batch, then split the step's budget (see module doc)."""
        self._flush()
        if self.candidates is not None:
            self.candidates.clear()
        n_req = len(req_ids)
        if n_req == 0 or k <= 0:
            return [EMPTY_DRAFT] * n_req
        cfg = self.config
        sl = np.fromiter(map(self._reqs.__getitem__, req_ids), np.int64, n_req)
        slots = self._slots
        cal = slots.si[sl, K.C_CAL]  # each request's scope row
        # the step as the cost model sees it; positions under the admission bound can
        # never pay for their slot, so the scoring skips them
        budget = None
        if step.max_num_batched_tokens is not None:
            decode = step.num_decode_tokens or step.batch_size
            budget = max(0, step.max_num_batched_tokens - decode)
        shape = StepShape(step.batch_size, step.num_kv_tokens, budget, step.num_prefill_tokens or 0)
        bound = admission_bound(self.cost, shape, self._overhead_s)
        floors = np.full(n_req, max(bound, 1e-12))
        kk = max(k, 1)
        # index rows: iso, agent, scope (n_req each); then local. Rows are written by the
        # lookup (index rows) and local_drafts (local rows).
        (ctx, ctx_len, keys, tok, prob, lens, match, support, pick, sel_len, sel_cell, n_ok,
         flat, rec, ks, *hist_loc) = self._workspace(n_req, kk)  # fmt: skip
        hist, loc = tuple(hist_loc[:5]), hist_loc[5:]
        walk = cfg.index_walk_batch is not None and step.batch_size >= cfg.index_walk_batch
        K.gather(
            sl, slots.si, slots.stack, slots.bst, slots.ctx, ctx, ctx_len, keys, rec,
            k, cfg.index_walk_min if walk else 0, ks,
        )  # fmt: skip
        if not cfg.calib_request_record:
            rec[:] = 0
        for h in self._off_sources:
            keys[h * n_req : (h + 1) * n_req] = -1  # a negative key skips the row
        self._index.lookup(keys, ctx, ctx_len, k, _MIN_PROB, hist, ks)  # type: ignore[arg-type]
        if "local" in cfg.sources:
            K.local_drafts(sl, ks, slots.si, slots.ctx, *loc)
        else:
            loc[2][:] = 0
        if not np.count_nonzero(lens):
            self._finish_step(0, 0)
            return [EMPTY_DRAFT] * n_req
        # positions under the bound can never be admitted: the sort sees only the others
        n_flat = K.score(
            tok,
            prob,
            lens,
            match,
            support,
            rec,
            cal,
            self._scopes.table,
            self._fine,
            LEVELS,
            _SUPPORT_EDGES,
            _Q,
            floors,
            pick,
            sel_len,
            sel_cell,
            n_ok,
            flat,
        )
        if self.candidates is not None:
            self.candidates.update(tok=tok.copy(), lens=lens.copy(), pick=pick.copy())
        alloc = allocate(
            flat[:n_flat],
            n_ok,
            batch_size=step.batch_size,
            num_kv=step.num_kv_tokens,
            cost=self.cost,
            budget=budget,
            prefill_tokens=shape.prefill_tokens,
            overhead_s=self._overhead_s,
            min_survival=bound,
        )
        # every request with a candidate keeps it for calibration, drafted or not
        slots.widen_drafts(kk)
        K.keep_candidates(sl, pick, sel_len, sel_cell, n_ok, tok, slots.si, slots.dtok, slots.dcell)
        drafts: list[Draft] = [EMPTY_DRAFT] * n_req
        used = alloc.used
        if used:
            d_rows, ends, flat_tok, flat_p = K.emit_drafts(
                sl,
                alloc.count_array,
                pick,
                sel_cell,
                tok,
                slots.si,
                cal,
                self._scopes.table,
                self._fine,
            )
            # Draft.probs are per-token (given the earlier tokens): each cell's acceptance;
            # slices of one tuple are tuples (no per-draft conversion)
            all_tok = tuple(flat_tok.tolist())
            all_p = tuple(flat_p.tolist())
            a = 0
            for i, b in zip(d_rows.tolist(), ends.tolist(), strict=True):
                drafts[i] = Draft(all_tok[a:b], all_p[a:b])
                a = b
        self._finish_step(alloc.offered, used)
        return drafts

    def acceptance(self, cells: np.ndarray, row: int | None = None) -> np.ndarray:
        """Calibrated acceptance of fine calibration cells of scope row ``row`` (default:
        the ``default`` scope's), in numpy (the drafts' probs come from
        ``kernels._acceptance``, the same formula; this is the readable form the tests
        check them against)."""
        row = self._default_row if row is None else row
        sc = self._scopes
        coarse: np.ndarray = sc.table[row, cells // K.NF]
        strength = self._strength
        if strength <= 0.0:
            return coarse
        out: np.ndarray = (sc.fsucc[row, cells] + strength * coarse) / (
            sc.ftot[row, cells] + strength
        )
        return out

    def _finish_step(self, offered: int, used: int) -> None:
        self.stats["steps"] += 1
        self.stats["offered"] += offered
        self.stats["drafted"] += used
