"""The AgentSpec proposer: structure-isolated drafting with a cost-model budget.

Sources a request may draft from, in decreasing isolation:

``iso``
    the history of the same scope, agent and *query group* in the same block kind: the
    text this agent produced earlier in this kind of block for this query — or, when the
    request belongs to a redundancy group (fan-out siblings, repeats, retries), for any
    member of the group. Updated every step, so parallel siblings draft from each other.
    This is the paper's structure-isolated cache.
``agent``
    everything this agent produced in this scope, across queries (added when a request
    stops). Looked up in the same batched index call as ``iso``; what it adds is decided
    by calibration (cross-query text is trusted only where it has proven accepted).
``local``
    the request's own prompt and output, searched directly for the most recent longest
    match of its suffix (:mod:`~agentspec_mw.agentspec.lookup`).

The ``local`` scan is O(context) per request, so its cost is bounded: while a found match
keeps being confirmed by the accepted tokens it is followed without rescanning, and a
request whose scan finds nothing skips the next 1, 2, 4 … 16 steps. What each source
contributes at each batch size is decided by calibration and the budget, not by rules.

``iso`` and ``agent`` live in one :class:`~agentspec_mw.agentspec.ngram_index.NgramIndex`
(keys embed the isolation scope). Each draft token carries ``c / n`` — of the ``n``
continuations found, ``c`` agree — which is *calibrated* online: every verified draft
updates an acceptance table bucketed by (source, agreement between sources, match
length, support ``n``, ``c / n``). Each bucket's prior is the paper's redundancy score
``g(c, n) = (c/n)·p(n)``. A position's survival probability is the product of the
calibrated acceptances of the tokens up to it; :func:`~agentspec_mw.agentspec.budget.allocate`
turns survivals into the step's drafts.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentspec_mw.agentspec.blocks import BlockGrammar, BlockSpec, BlockState
from agentspec_mw.agentspec.budget import allocate
from agentspec_mw.agentspec.config import AgentSpecConfig
from agentspec_mw.agentspec.lookup import match_own_context
from agentspec_mw.agentspec.ngram_index import LEVELS, MAX_N, NgramIndex
from agentspec_mw.costmodel import StepTimeFn, get_cost_model
from agentspec_mw.peers._buffer import TokenBuffer
from agentspec_mw.proposer import EMPTY_DRAFT, Draft, ProposerEnv, StepContext, TokenIds
from agentspec_mw.tags import StructureTags

__all__ = ["SOURCES", "AgentSpecProposer", "redundancy_score"]

SOURCES = ("iso", "agent", "local")
_ISO, _AGENT, _LOCAL = 0, 1, 2
_Q = 10  # buckets of c/n
_N_ML = len(LEVELS)  # match-length buckets (index levels; local uses the same edges)
_SUPPORT_EDGES = np.array([2, 4, 8])  # support buckets: 1, 2-3, 4-7, 8+
_N_SUP = len(_SUPPORT_EDGES) + 1
_LOCAL_MIN_MATCH = 3
_LOCAL_MAX_BACKOFF = 16  # steps a request skips the local scan after failing, at most
_MIN_PROB = 0.05  # the index stops a draft at a token fewer than 5% of candidates agree on


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


class _Req:
    __slots__ = (
        "iso_base",
        "agent_key",
        "ctx",
        "prompt_len",
        "state",
        "seq",
        "seq_key",
        "draft",
        "block",
        "lptr",
        "lml",
        "lskip",
        "lback",
    )

    def __init__(
        self,
        iso_base: tuple[str, str, str],
        agent_key: tuple[str, str, str, str],
        prompt: np.ndarray,
        state: BlockState,
    ) -> None:
        self.iso_base = iso_base
        self.agent_key = agent_key
        self.ctx = TokenBuffer(prompt)
        self.prompt_len = len(prompt)
        self.state = state
        self.seq = -1  # index sequence of the current block occurrence
        self.seq_key = -1  # its key id
        # the chosen candidate, drafted or not, checked against the tokens that follow:
        # (candidate ids, calibration cells, positions already checked)
        self.draft: tuple[list[int], list[int], int] | None = None
        self.block = ""  # block of the current sequence
        # the local source follows a match through the own context while it holds:
        # lptr = context position the followed continuation resumes at (-1: none),
        # lml = its match length; a failed scan backs off (lskip steps, doubling lback)
        self.lptr = -1
        self.lml = 0
        self.lskip = 0
        self.lback = 0


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
        self._default_grammar = BlockGrammar([BlockSpec(*b) for b in cfg.blocks], self.token_bytes)
        self._grammars: dict[tuple[tuple[str, str], ...], BlockGrammar] = {}
        self._index = NgramIndex(capacity=cfg.index_max_tokens)
        self._keys: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self._next_key = 0
        self._reqs: dict[str, _Req] = {}
        self._pend_key: list[int] = []
        self._pend_seq: list[int] = []
        self._pend_tok: list[int] = []
        self._pend_end: list[int] = []  # sequences to release after the next flush
        # calibration table, flat cell = (((src*2 + agree)*N_ML + ml)*N_SUP + sup)*Q + q
        shape = (len(SOURCES), 2, _N_ML, _N_SUP, _Q)
        q_mid = (np.arange(_Q) + 0.5) / _Q
        sup_mid = np.array([1, 2, 5, 10])
        p_n = np.array([redundancy_score(1, int(n), cfg.redundancy_g_min) for n in sup_mid])
        prior = np.broadcast_to(cfg.calib_prior_scale * q_mid[None, :] * p_n[:, None], shape).copy()
        prior[:, 1] = np.minimum(1.0, prior[:, 1] * 1.1)  # sources agree: more trust
        self._prior = prior.reshape(-1)
        self._succ = np.zeros_like(self._prior)
        self._tot = np.zeros_like(self._prior)
        self._table = self._prior.copy()
        self._threshold = 0.0
        self._overhead_s = 0.0
        self.stats: dict[str, int] = {"steps": 0, "offered": 0, "drafted": 0}

    # -- identity and keys ---------------------------------------------------------------
    def _grammar(self, tags: StructureTags | None) -> BlockGrammar:
        if tags is None or tags.blocks is None:
            return self._default_grammar
        g = self._grammars.get(tags.blocks)
        if g is None:
            specs = [BlockSpec(f"b{i}:{s}", s, e) for i, (s, e) in enumerate(tags.blocks)]
            g = self._grammars[tags.blocks] = BlockGrammar(specs, self.token_bytes)
        return g

    def _key_id(self, key: tuple[str, ...], create: bool = True) -> int:
        kid = self._keys.get(key)
        if kid is not None:
            self._keys.move_to_end(key)
            return kid
        if not create:
            return -1
        kid = self._keys[key] = self._next_key
        self._next_key += 1
        while len(self._keys) > self.config.index_max_keys:
            self._keys.popitem(last=False)  # its tokens become unreachable, then evicted
        return kid

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        """Register a request: its identity (tags, or derived from the prompt) and block."""
        if req_id in self._reqs:
            self.stop(req_id)
        cfg = self.config
        prompt = np.array(prompt_ids, dtype=np.int32)
        if tags is not None:
            scope, agent = tags.scope, tags.agent_id
            group = f"g:{tags.group_id}" if tags.group_id else f"q:{tags.query_id}"
        else:
            scope = "default"
            agent = "anon:" + _hash_ids(prompt[: cfg.tagfree_agent_tokens])
            group = "anon:" + _hash_ids(prompt[: cfg.tagfree_query_tokens])
        state = BlockState(self._grammar(tags))
        state.feed(prompt[-cfg.tagfree_scan_tokens :])
        self._reqs[req_id] = _Req(
            (scope, agent, group), ("agent", scope, agent, "*"), prompt, state
        )

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        """Accepted tokens: calibrate the last draft, route tokens into block histories."""
        req = self._reqs[req_id]
        ids = token_ids.tolist() if isinstance(token_ids, np.ndarray) else list(token_ids)
        if not ids:
            return
        if req.draft is not None:
            req.draft = self._calibrate(req.draft, ids)
        runs = req.state.feed(ids)
        off = 0
        for block, n in runs:
            if block != req.block or req.seq < 0:
                if req.seq >= 0:
                    self._pend_end.append(req.seq)
                req.seq = self._index.new_seq()
                req.seq_key = self._key_id((*req.iso_base, block))
                req.block = block
            self._pend_key.extend([req.seq_key] * n)
            self._pend_seq.extend([req.seq] * n)
            self._pend_tok.extend(ids if len(runs) == 1 else ids[off : off + n])
            off += n
        if req.lptr >= 0:
            view = req.ctx.view()
            end = req.lptr + len(ids)
            if end <= len(view) and view[req.lptr : end].tolist() == ids:
                req.lptr = end
                req.lml = min(req.lml + len(ids), MAX_N)
            else:
                req.lptr = -1
        req.ctx.extend(ids)

    def stop(self, req_id: str) -> None:
        """Release the request; its output joins the agent-wide history."""
        req = self._reqs.pop(req_id, None)
        if req is None:
            return
        if req.seq >= 0:
            self._pend_end.append(req.seq)
        out = req.ctx.view()[req.prompt_len :].tolist()
        if out:
            seq = self._index.new_seq()
            self._pend_key.extend([self._key_id(req.agent_key)] * len(out))
            self._pend_seq.extend([seq] * len(out))
            self._pend_tok.extend(out)
            self._pend_end.append(seq)

    def _flush(self) -> None:
        if self._pend_tok:
            self._index.insert(
                np.array(self._pend_key, dtype=np.int64),
                np.array(self._pend_seq, dtype=np.int64),
                np.array(self._pend_tok, dtype=np.int32),
            )
            self._pend_key.clear()
            self._pend_seq.clear()
            self._pend_tok.clear()
        for seq in self._pend_end:
            self._index.end_seq(seq)
        self._pend_end.clear()

    def block_of(self, req_id: str) -> str | None:
        """The block kind request ``req_id`` is in (for per-block metrics), if it is live."""
        req = self._reqs.get(req_id)
        return req.state.current if req is not None else None

    # -- calibration ---------------------------------------------------------------------
    def _calibrate(
        self, draft: tuple[list[int], list[int], int], ids: list[int]
    ) -> tuple[list[int], list[int], int] | None:
        """Score the candidate against the tokens that followed; keep it while unresolved.

        Position ``j`` counts only if positions ``0..j-1`` matched, so each cell estimates
        a conditional acceptance — whether or not the position was actually drafted.
        """
        tokens, cells, done = draft
        s = self.config.calib_prior_strength
        succ, tot, table, prior = self._succ, self._tot, self._table, self._prior
        for t in ids:
            cell = cells[done]
            tot[cell] += 1.0
            hit = tokens[done] == t
            if hit:
                succ[cell] += 1.0
            table[cell] = (succ[cell] + s * prior[cell]) / (tot[cell] + s)
            if not hit:
                return None
            done += 1
            if done >= len(tokens):
                return None
        return tokens, cells, done

    # -- drafting ------------------------------------------------------------------------
    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        """Draft for the whole batch, then split the step's budget (see module doc)."""
        t0 = time.perf_counter()
        self._flush()
        cfg = self.config
        n_req = len(req_ids)
        drafts: list[Draft] = [EMPTY_DRAFT] * n_req
        if n_req == 0 or k <= 0:
            return drafts
        floor = cfg.budget_floor * min(
            1.0, math.log2(max(step.batch_size, 1)) / math.log2(cfg.budget_floor_batch)
        )
        reqs = [self._reqs[r] for r in req_ids]
        ctx = np.zeros((n_req, MAX_N), dtype=np.int32)
        ctx_len = np.empty(n_req, dtype=np.int64)
        iso_keys = np.empty(n_req, dtype=np.int64)
        keys = self._keys
        for i, req in enumerate(reqs):
            tail = req.ctx.tail(MAX_N)
            ctx[i, : len(tail)] = tail
            ctx_len[i] = len(tail)
            block = req.state.current
            iso_keys[i] = (
                req.seq_key if block == req.block else keys.get((*req.iso_base, block), -1)
            )
        # candidate matrices: one row per (request, source)
        rows = [self._index.lookup(iso_keys, ctx, ctx_len, k, _MIN_PROB)]
        srcs = [np.full(n_req, _ISO)]
        agent_keys = np.fromiter((keys.get(r.agent_key, -1) for r in reqs), np.int64, n_req)
        rows.append(self._index.lookup(agent_keys, ctx, ctx_len, k, _MIN_PROB))
        srcs.append(np.full(n_req, _AGENT))
        l_tok = np.zeros((n_req, max(k, 1)), dtype=np.int32)
        l_len = np.zeros(n_req, dtype=np.int64)
        l_ml = np.zeros(n_req, dtype=np.int64)
        for i, req in enumerate(reqs):
            own = self._local(req, k)
            if own is not None:
                l_tok[i, : len(own)] = own
                l_len[i] = len(own)
                l_ml[i] = req.lml
        l_prob = np.ones(l_tok.shape, dtype=np.float64)
        rows.append((l_tok, l_prob, l_len, l_ml, np.ones(n_req, np.int64)))
        srcs.append(np.full(n_req, _LOCAL))
        tok = np.concatenate([r[0] for r in rows])
        prob = np.concatenate([r[1] for r in rows])
        lens = np.concatenate([r[2] for r in rows])
        match = np.concatenate([r[3] for r in rows])
        support = np.concatenate([r[4] for r in rows])
        src = np.concatenate(srcs)
        has = lens > 0
        if not has.any():
            self._finish_step(t0, 0, 0, step)
            return drafts
        # agreement: another source of the same request drafts the same first token
        first = np.where(has, tok[:, 0], -1).reshape(len(rows), n_req)
        agree2 = np.zeros(first.shape, dtype=np.int64)
        for a in range(len(rows)):
            for b in range(len(rows)):
                if a != b:
                    agree2[a] |= (first[a] >= 0) & (first[a] == first[b])
        agree = agree2.reshape(-1)
        # calibrated per-token acceptance and survival
        kk = tok.shape[1]
        mlb = np.clip(np.searchsorted(LEVELS, match, side="right") - 1, 0, _N_ML - 1)
        supb = np.searchsorted(_SUPPORT_EDGES, support, side="right")
        head = ((((src * 2 + agree) * _N_ML + mlb) * _N_SUP + supb) * _Q)[:, None]
        qb = np.minimum((prob * _Q).astype(np.int64), _Q - 1)
        cell = head + qb
        valid = np.arange(kk)[None, :] < lens[:, None]
        acc = np.where(valid, self._table[cell], 0.0)
        surv = np.cumprod(acc, axis=1)
        value = surv.sum(axis=1)
        best = value.reshape(len(rows), n_req).argmax(axis=0)
        pick = best * n_req + np.arange(n_req)
        sel_len = lens[pick]
        sel_surv = surv[pick]
        flat = sel_surv[np.arange(kk)[None, :] < sel_len[:, None]]
        budget = None
        if step.max_num_batched_tokens is not None:
            budget = max(0, step.max_num_batched_tokens - step.batch_size)
        alloc = allocate(
            flat,
            sel_len,
            batch_size=step.batch_size,
            num_kv=step.num_kv_tokens,
            cost=self.cost,
            budget=budget,
            overhead_s=self._overhead_s,
            min_survival=floor,
        )
        self._threshold = alloc.threshold
        used = 0
        for i, n in enumerate(alloc.counts):
            row = int(pick[i])
            m = int(lens[row])
            if m:
                reqs[i].draft = (tok[row, :m].tolist(), cell[row, :m].tolist(), 0)
            if n > 0:
                drafts[i] = Draft(tuple(tok[row, :n].tolist()), tuple(sel_surv[i, :n].tolist()))
                used += n
        self._finish_step(t0, alloc.offered, used, step)
        return drafts

    def _local(self, req: _Req, k: int) -> np.ndarray | None:
        """The ``local`` candidate: follow the last match, or scan (with back-off)."""
        view = req.ctx.view()
        if 0 <= req.lptr < len(view):
            return view[req.lptr : req.lptr + k]
        if req.lskip > 0:
            req.lskip -= 1
            return None
        own, ml, pos = match_own_context(view, _LOCAL_MIN_MATCH, MAX_N, k)
        if len(own):
            req.lptr = pos
            req.lml = ml
            req.lback = 0
            return own
        req.lback = min(max(1, 2 * req.lback), _LOCAL_MAX_BACKOFF)
        req.lskip = req.lback
        return None

    def _finish_step(self, t0: float, offered: int, used: int, step: StepContext) -> None:
        if not offered:
            t = self.cost.step_time(step.batch_size, step.num_kv_tokens)
            marginal = self.cost.step_time(step.batch_size + 1, step.num_kv_tokens) - t
            self._threshold = marginal * step.batch_size / t if t > 0 else 0.0
        dt = time.perf_counter() - t0
        self._overhead_s = 0.9 * self._overhead_s + 0.1 * dt
        self.stats["steps"] += 1
        self.stats["offered"] += offered
        self.stats["drafted"] += used
