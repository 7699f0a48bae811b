"""The AgentSpec proposer: structure-isolated drafting with a cost-model budget.

Sources a request may draft from, in decreasing isolation (:data:`.calibration.SOURCES`):

``iso``
    the history of the same scope, agent and *query group* in the same block kind: the
    text this agent produced earlier in this kind of block for this query (its repeats
    and retries included: they share the agent and query) — or, when the request is a
    fan-out sibling (the tags' ``group_id``), for any member of the group. Updated every
    step, so parallel siblings draft from each other.
    This is the paper's structure-isolated cache.
``agent``
    everything this agent produced in this scope, across queries (added token by token
    as its requests decode). Looked up in the same batched index call as ``iso``; what it
    adds is decided by calibration (cross-query text is trusted only where it has proven
    accepted).
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
request whose scan finds nothing skips the next 1, 2, 4 … 16 steps.

``iso``, ``agent`` and ``scope`` live in one :class:`~agentspec_mw.agentspec.ngram_index.NgramIndex`
(keys embed the isolation scope and the identity, :mod:`.identity`). Each draft token's
acceptance is calibrated online per isolation scope (:mod:`.calibration`); a position's
survival probability is the product of the calibrated acceptances of the tokens up to
it; :mod:`.budget` turns survivals into the step's drafts: the positions that maximise
the step's expected tokens per second under the engine's step-time model, the prefill
chunks the drafts displace included. Rejection is counted (:attr:`AgentSpecProposer.verified`),
never targeted.

Speed: ``start``/``extend``/``stop`` only queue their arguments; the next ``propose``
applies them for the whole batch in a few numba kernels (:mod:`.kernels`) over per-request
rows of arrays (:mod:`.slots`) and named per-step arrays (:mod:`.workspace`), so the
per-step Python work is a handful of array operations, not a loop over tokens.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np

from agentspec_mw.agentspec import kernels as K
from agentspec_mw.agentspec.blocks import BlockGrammar, BlockSpec, current
from agentspec_mw.agentspec.budget import (
    admission_bound,
    admission_bounds,
    allocate,
    prices_drafts,
    step_shape,
)
from agentspec_mw.agentspec.calibration import MATCH_EDGES, N_Q, SOURCES, SUPPORT_EDGES, Calibration
from agentspec_mw.agentspec.config import AgentSpecConfig
from agentspec_mw.agentspec.grammars import GrammarRegistry
from agentspec_mw.agentspec.identity import KeyBases, identity
from agentspec_mw.agentspec.ngram_index import NgramIndex
from agentspec_mw.agentspec.slots import SlotTable
from agentspec_mw.agentspec.workspace import Workspaces
from agentspec_mw.costmodel import StepTimeFn, get_cost_model
from agentspec_mw.proposer import (
    DECODINGS,
    EMPTY_DRAFT,
    Decoding,
    Draft,
    ProposerEnv,
    StepContext,
    TokenIds,
)
from agentspec_mw.tags import StructureTags

__all__ = ["AgentSpecProposer", "warm_kernels"]

logger = logging.getLogger(__name__)

_MIN_BOUND = 1e-12  # a position of survival 0 is never worth scoring
# Queued calls applied without waiting for a ``propose`` once this many stops or
# ``extend_many`` batches are pending (single ``extend`` calls are sealed into a batch every
# this many): a host whose requests never ask for a draft (every
# one at its ``max_tokens``, say) still frees their rows, and memory stays bounded. About
# one busy step's worth, so a host that proposes every step never reaches it.
_MAX_PENDING = 256

_warm = False
_ID_LIMIT = 2**31  # token ids are kept as int32


def _token_ids(
    ids: TokenIds, verb: str, req_id: str | None = None, copy: bool = True
) -> np.ndarray:
    """``ids`` as a flat int32 array (a copy unless ``copy`` is false and ``ids`` already
    is one), checked: integers in ``[0, 2**31)`` (an id past the tokenizer's table is
    fine: a model's vocabulary may be larger; it has no bytes). An int32 array, what the
    hosts pass every step, costs one pass (no id of it can be 2**31 or more).

    Raises:
        ValueError: not integers, or an id out of that range (nothing is queued).
    """
    if isinstance(ids, np.ndarray) and ids.dtype == np.int32:
        arr = ids.reshape(-1)
        if arr.size and arr.min() < 0:
            _bad_ids(verb, req_id, f"got {int(arr.min())}")
        return arr.copy() if copy else arr
    arr = np.asarray(ids)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":
        _bad_ids(verb, req_id, f"integers, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= _ID_LIMIT:
        _bad_ids(verb, req_id, f"got {lo if lo < 0 else hi}")
    return arr.astype(np.int32).reshape(-1)


# A Draft made field by field: the frozen dataclass's own __init__ sets each field through
# object.__setattr__, ~0.75 us a draft (~0.1 ms of a 256-request step); its slots set
# directly give the same object (equal, hashable, frozen) in ~0.5 us.
_new_draft = object.__new__
_set_tokens, _set_probs, _set_block = (
    Draft.__dict__[f].__set__ for f in ("token_ids", "probs", "block")
)


def _bad_ids(verb: str, req_id: str | None, what: str) -> NoReturn:
    where = verb if req_id is None else f"{verb}({req_id!r})"
    raise ValueError(f"{where}: token ids must be integers in [0, 2**31): {what}")


def warm_kernels() -> None:
    """Load (or compile) the numba kernels once per process (``scripts/bootstrap.sh`` calls
    it once so that numba's cache is filled at set-up; each proposer calls it when built): tiny
    private proposers draft for and verify a batch of requests (48: enough index rows for
    the threaded lookup) and stop them, live and not (``experimental.index_agent_live``). Otherwise
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
        p = AgentSpecProposer(
            env,
            index_max_tokens=1024,
            experimental={"index_agent_live": live, "calib_prior": "redundancy"},
        )
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


class AgentSpecProposer:
    """Structure-isolated, budget-aware proposer (see the module docstring)."""

    name = "agentspec"

    def __init__(self, env: ProposerEnv | None = None, **options: Any) -> None:
        self.config = cfg = AgentSpecConfig(**options)
        exp = cfg.experimental
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
        self._keys = KeyBases(cfg.index_max_keys)
        self._slots = SlotTable(draft_width=max(env.max_k, 1))
        self._reqs: dict[str, int] = {}  # live request -> slot
        # queued calls, applied at the next propose (_flush)
        self._pend_start: list[int] = []
        self._pend_slot: list[int] = []
        self._pend_ids: list[Any] = []
        # batches of extend_many (and the single extends before each, sealed in order):
        # (slots, token counts, tokens)
        self._pend_batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pend_stop: list[int] = []
        self._calib = Calibration(
            self.token_bytes,
            g_min=exp.redundancy_g_min,
            prior_scale=exp.calib_prior_scale,
            prior_strength=exp.calib_prior_strength,
            max_scopes=cfg.calib_max_scopes,
            token_classes_on=exp.calib_token_classes,
            stored=exp.calib_prior == "stored",
        )
        self._scopes = self._calib.scopes
        self.stats: dict[str, int] = {"steps": 0, "offered": 0, "drafted": 0}
        self._ws = Workspaces()
        self._off_sources = [
            h for h, name in enumerate(SOURCES[: K.N_HIST]) if name not in exp.sources
        ]
        self.candidates: dict[str, np.ndarray] | None = None
        """Set to ``{}`` to have each ``propose`` leave its candidates here (diagnostics,
        ``benchmarks/candidate_gap.py``): ``tok``/``lens`` per source row
        (``source * n_req + i``, sources in :data:`SOURCES` order) and ``pick`` (the row
        chosen for each request), before the budget cuts them."""
        warm_kernels()

    @property
    def grammar_fallbacks(self) -> int:
        """Requests whose tags named block delimiters they did not get (the delimiters
        failed to build, or no grammar row was free): they used the default blocks
        (:mod:`.grammars`)."""
        return self._grammars.fallbacks

    @property
    def verified(self) -> tuple[float, float]:
        """Accepted and drafted tokens of the verified drafts, every scope kept together
        (their rejection is reported, never targeted; a forgotten scope's counts go)."""
        return self._calib.verified

    # -- lifecycle -----------------------------------------------------------------------
    def start(
        self,
        req_id: str,
        prompt_ids: TokenIds,
        tags: StructureTags | None = None,
        *,
        decoding: Decoding = "greedy",
    ) -> None:
        """Register a request: its identity (tags, or derived from the prompt,
        :func:`.identity.identity`) and block.

        ``decoding`` picks the request's calibration row within its scope: a draft token
        of a sampled request is accepted with the model's probability of it, of a greedy
        one when it is the argmax, so each regime learns its own acceptance (from the same
        prior); the history the drafts come from is the scope's, whatever the regime.

        Nothing in ``tags`` makes this raise: unusable block delimiters fall back to the
        default grammar (:mod:`.grammars`). Prompt ids that are not integers in
        ``[0, 2**31)`` raise ``ValueError`` (before anything changes).
        """
        if decoding not in DECODINGS:
            raise ValueError(f"decoding={decoding!r} must be one of {', '.join(DECODINGS)}")
        prompt = _token_ids(prompt_ids, "start", req_id, copy=False)
        if req_id in self._reqs:
            self.stop(req_id)
        cfg = self.config
        exp = cfg.experimental
        scope, agent, group = identity(
            prompt, tags, cfg.tagfree_agent_tokens, cfg.tagfree_query_tokens
        )
        cal_key = scope if decoding == "greedy" else (scope, decoding)
        if self._pend_stop and (cal_key not in self._scopes or (tags is not None and tags.blocks)):
            # a new scope (or a grammar) may take the row of one whose last request just
            # stopped: apply the queued calls first (in order, so that request's last
            # counts go to its own scope), else the row looks live and the newcomer gets
            # the frozen prior (or the default blocks)
            self._flush()
        gid, glabel = self._grammars.acquire(None if tags is None else tags.blocks, scope)
        # a regime without a row of its own learns in the scope's greedy row, if any
        cal = self._scopes.acquire(cal_key, None if cal_key == scope else scope)
        if scope == "default" and cal_key != scope:  # (its greedy row is held from the start)
            self._scopes.keep(cal_key)  # tag-free traffic keeps a row per regime for good
        slots = self._slots
        s = slots.acquire(prompt)
        row = slots.si[s]
        row[K.C_CAL] = cal
        row[K.C_PLEN] = len(prompt)
        row[K.C_SEQ] = self._index.new_seq()
        row[K.C_KBASE] = self._keys.base((scope, agent, group, glabel))
        row[K.C_ABASE] = self._keys.base(("agent", scope, agent))
        row[K.C_GID] = gid
        row[K.C_SEQBLK] = -1
        row[K.C_LPTR] = -1
        row[K.C_ASEQ] = self._index.new_seq() if exp.index_agent_live else -1
        if "scope" in exp.sources:
            row[K.C_GBASE] = self._keys.base(("scope", scope))
            row[K.C_GSEQ] = self._index.new_seq() if exp.index_agent_live else -1
        else:
            row[K.C_GBASE] = row[K.C_GSEQ] = -1
        self._reqs[req_id] = s
        self._pend_start.append(s)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        """Accepted tokens: queued, applied for the whole batch at the next ``propose``.

        A writable array or a list is copied (the caller may reuse its buffer); a
        read-only flat int32 array (e.g. a slice of a memory-mapped trace) is kept as is.
        Ids that are not integers in ``[0, 2**31)`` raise ``ValueError`` (nothing queued).
        """
        s = self._reqs[req_id]
        if len(token_ids):
            keep = isinstance(token_ids, np.ndarray) and not token_ids.flags.writeable
            token_ids = _token_ids(token_ids, "extend", req_id, copy=not keep)
            self._pend_slot.append(s)
            self._pend_ids.append(token_ids)
            if len(self._pend_ids) >= _MAX_PENDING:  # one batch of single extends
                self._seal_pending()
                if len(self._pend_batches) >= _MAX_PENDING:
                    self._flush()

    def extend_many(
        self, req_ids: Sequence[str], token_ids: TokenIds, lens: Sequence[int] | np.ndarray
    ) -> None:
        """``extend`` of many requests in one call: request ``req_ids[i]`` gets the next
        ``lens[i]`` tokens of ``token_ids`` (their concatenation), in order — the same as
        one ``extend`` per request, without a Python call per request.

        All or nothing: an unknown request id raises ``KeyError``, and ``lens`` that are
        not one non-negative integer count per request summing to ``len(token_ids)``, or
        ids as ``extend`` refuses them, raise ``ValueError``, before anything is queued.
        ``token_ids`` and ``lens`` are copied.
        """
        n = len(req_ids)
        sl = np.fromiter(map(self._reqs.__getitem__, req_ids), np.int64, n)
        # checked on a list: a few requests cost less so than in numpy
        if isinstance(lens, np.ndarray) and lens.dtype.kind in "iu":
            counts = lens.tolist()
        else:
            try:  # an integer each (a float count would lose or invent tokens)
                counts = list(map(operator.index, lens))
            except TypeError:
                raise ValueError(f"extend_many: lens must be integers, got {lens!r}") from None
        # a copy the kernels may keep (and, writable, read without a new compilation)
        toks = _token_ids(token_ids, "extend_many")
        n_tok = len(toks)
        if len(counts) != n or (n and min(counts) < 0) or sum(counts) != n_tok:
            raise ValueError(
                f"extend_many: lens must be {n} non-negative counts summing to the "
                f"{n_tok} tokens given"
            )
        if not n_tok:
            return
        if 0 in counts:  # an empty extend is no call
            keep = [i for i, c in enumerate(counts) if c]
            sl = sl[keep]
            counts = [counts[i] for i in keep]
        self._seal_pending()
        self._pend_batches.append((sl, np.array(counts, dtype=np.int64), toks))
        if len(self._pend_batches) >= _MAX_PENDING:
            self._flush()

    def _seal_pending(self) -> None:
        """Turn the queued single ``extend`` calls into one batch (keeping call order)."""
        if self._pend_ids:
            sl = np.array(self._pend_slot, dtype=np.int64)
            lens = np.fromiter(map(len, self._pend_ids), np.int64, len(self._pend_ids))
            toks = np.concatenate(self._pend_ids, dtype=np.int32)
            self._pend_slot = []
            self._pend_ids = []
            self._pend_batches.append((sl, lens, toks))

    def stop(self, req_id: str) -> None:
        """Release the request (with ``experimental.index_agent_live=False`` its output
        joins the agent-wide history now). Queued like ``start`` and ``extend``; the queue
        is applied at the next ``propose``, or here once it holds ``_MAX_PENDING`` stops."""
        s = self._reqs.pop(req_id, None)
        if s is not None:
            self._pend_stop.append(s)
            if len(self._pend_stop) >= _MAX_PENDING:
                self._flush()

    def _flush(self) -> None:
        """Apply the queued calls (see :mod:`.kernels`), in the order they were made."""
        slots = self._slots
        ix = self._index.arrays
        cfg = self.config
        exp = cfg.experimental
        if self._pend_start:
            st = np.array(self._pend_start, dtype=np.int64)
            self._pend_start.clear()
            K.scan_prompts(
                st,
                exp.tagfree_scan_tokens,
                slots.si,
                slots.stack,
                slots.tail,
                slots.bst,
                slots.ctx,
                self._grammars.table.arrays,
            )
        self._seal_pending()
        if self._pend_batches:
            batches = self._pend_batches
            self._pend_batches = []
            if len(batches) == 1:
                sl, lens, toks = batches[0]
            else:
                sl = np.concatenate([b[0] for b in batches])
                lens = np.concatenate([b[1] for b in batches])
                toks = np.concatenate([b[2] for b in batches])
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
                self._calib.prior_strength,
                exp.index_agent_live,
                self._scopes.ledger,
            )
        if self._pend_stop:
            done = self._pend_stop
            self._pend_stop = []
            if not exp.index_agent_live:
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
        """Draft for the whole batch, then split the step's budget (see module doc).

        1. ``gather``: each request's context tail and index keys; 2. the index lookup
        (``iso``, ``agent``, ``scope`` rows) and ``local_drafts``; 3. ``score``: calibrated
        survivals and each request's best candidate; 4. ``allocate``: the positions that
        pay under the step-time model; 5. ``keep_candidates`` (for calibration, drafted or
        not) and ``emit_drafts``.
        """
        self._flush()
        if self.candidates is not None:
            self.candidates.clear()
        n_req = len(req_ids)
        if n_req == 0 or k <= 0:
            return [EMPTY_DRAFT] * n_req
        cfg = self.config
        exp = cfg.experimental
        sl = np.fromiter(map(self._reqs.__getitem__, req_ids), np.int64, n_req)
        slots = self._slots
        cal = slots.si[sl, K.C_CAL]  # each request's scope row
        # positions under the admission bound can never pay for their slot: the scoring
        # skips them
        # (per request where the model prices drafts by their request's context)
        shape = step_shape(step)
        ctx_lens = None
        if prices_drafts(self.cost):
            ctx_lens = slots.si[sl, K.C_CLEN]
            raw = admission_bounds(self.cost, shape, ctx_lens)
            bound = float(raw.min())
            bounds = np.maximum(raw, _MIN_BOUND)
        else:
            bound = admission_bound(self.cost, shape)
            bounds = np.full(n_req, max(bound, _MIN_BOUND))
        kk = max(k, 1)
        ws = self._ws.get(n_req, kk)
        cand = ws.cand
        walk = cfg.index_walk_batch is not None and step.batch_size >= cfg.index_walk_batch
        walk_min = exp.index_walk_min if walk else 0
        K.gather(
            sl,
            slots.si,
            slots.stack,
            slots.bst,
            slots.ctx,
            ws.ctx,
            ws.ctx_len,
            ws.keys,
            ws.rec,
            ws.blk,
            k,
            walk_min,
            ws.ks,
        )
        if not exp.calib_request_record:
            ws.rec[:] = 0
        for h in self._off_sources:
            ws.keys[h * n_req : (h + 1) * n_req] = -1  # a negative key skips the row
        self._index.lookup(ws.keys, ws.ctx, ws.ctx_len, k, ws.hist, ws.ks)
        if "local" in exp.sources:
            loc = ws.loc
            K.local_drafts(
                sl, ws.ks, slots.si, slots.ctx, loc.tok, loc.prob, loc.lens, loc.match, loc.support
            )
        else:
            ws.loc.lens[:] = 0
        if not np.count_nonzero(cand.lens):
            self._finish_step(0, 0)
            return [EMPTY_DRAFT] * n_req
        calib = self._calib
        fine = calib.fine
        n_flat = K.score(
            cand.tok,
            cand.prob,
            cand.lens,
            cand.match,
            cand.support,
            ws.rec,
            cal,
            self._scopes.table,
            fine,
            MATCH_EDGES,
            SUPPORT_EDGES,
            N_Q,
            bounds,
            ws.pick,
            ws.sel_len,
            ws.sel_cell,
            ws.n_ok,
            ws.flat,
            ws.score_cells,
            ws.score_surv,
        )
        if self.candidates is not None:
            self.candidates.update(tok=cand.tok.copy(), lens=cand.lens.copy(), pick=ws.pick.copy())
        alloc = allocate(
            ws.flat[:n_flat],
            ws.n_ok,
            batch_size=step.batch_size,
            num_kv=step.num_kv_tokens,
            cost=self.cost,
            budget=shape.budget,
            prefill_tokens=shape.prefill_tokens,
            min_survival=bound,
            context_lens=ctx_lens,
        )
        # every request with a candidate keeps it for calibration, drafted or not
        slots.widen_drafts(kk)
        K.keep_candidates(
            sl,
            ws.pick,
            ws.sel_len,
            ws.sel_cell,
            ws.n_ok,
            cand.tok,
            slots.si,
            slots.dtok,
            slots.dcell,
        )
        drafts: list[Draft] = [EMPTY_DRAFT] * n_req
        used = alloc.used
        if used:
            d_rows, ends, flat_tok, flat_p = K.emit_drafts(
                sl,
                alloc.count_array,
                ws.pick,
                ws.sel_cell,
                cand.tok,
                slots.si,
                cal,
                self._scopes.table,
                fine,
            )
            # Draft.probs are per-token (given the earlier tokens): each cell's acceptance;
            # slices of one tuple are tuples (no per-draft conversion)
            all_tok = tuple(flat_tok.tolist())
            all_p = tuple(flat_p.tolist())
            table = self._grammars.table
            gids = slots.si[sl[d_rows], K.C_GID].tolist()
            blks = ws.blk[d_rows].tolist()
            a = 0
            for i, b, g, blk in zip(d_rows.tolist(), ends.tolist(), gids, blks, strict=True):
                d = _new_draft(Draft)  # Draft(tokens, probs, block), made faster
                _set_tokens(d, all_tok[a:b])
                _set_probs(d, all_p[a:b])
                _set_block(d, table[g].names[blk])
                drafts[i] = d
                a = b
        self._finish_step(alloc.offered, used)
        return drafts

    def _finish_step(self, offered: int, used: int) -> None:
        self.stats["steps"] += 1
        self.stats["offered"] += offered
        self.stats["drafted"] += used
