"""Which match and which calibration to draft from: oracles and offline emulations of the pick.

Replays one trace with AgentSpec (its own schedule) and, at every request-step:

1. **The match level** (issue 28, round 3, lead a). Each index source (``iso``, ``agent``,
   ``scope``) drafts from the longest level of ``ngram_index.LEVELS`` whose last ``n``
   context tokens occurred under its key. The step's rows are looked up again with the
   levels capped at each shorter one (a lookup over ``LEVELS[:m]`` takes the longest of
   those that occurred, falling to a shorter one as the full lookup does), so a source has
   up to four candidates per request-step, one per level cap. Against the recorded output
   it counts the tokens each whole candidate would be accepted for (as
   ``pick_contest.py``: before the budget cuts it): per source ``longest`` (what the lookup
   drafts), ``best level`` (the best cap per request-step: an oracle), how often a shorter
   level is better / worse; for the pick: the picked candidate, the picked source's best
   level, the best source (``gap_decompose.py``'s choice oracle), the best source and level.

2. **Emulated picks** (``| choice | ...`` table). ``kernels.score``'s pick is recomputed
   offline (:func:`_values`: the same cells, agreement, survival and tie rules) over the
   candidate groups (every source's level caps and ``local``), under a calibration:

   * ``proposer`` — the proposer's own table (it reproduces the proposer's pick exactly:
     ``emulated default = pick``); ``proposer, levels`` — the same table, the pick among
     every level cap too (lead a, calibrated); ``proposer, rival`` — each candidate's
     ``c / n`` at its first contest with another source pooled with the rival's count,
     ``c / (n + c')`` (lead b; counts per position approximated, :func:`_counts`);
   * ``fitted, …`` — a table fitted prequentially as the proposer fits its own (same
     prior and shrinkage, counted after each step), from: every source's candidate or only
     the variant's pick (``picked only``); to the first miss, or only the positions the
     step's emitted tokens verify (``emitted``: what the proposer does, so ``fitted, picked
     only, emitted`` = ``proposer``), or to the first miss but only once the output has
     reached it (``resolved``: no look-ahead); ``one open per source``: a source's next
     candidate is counted only once its open one is resolved; ``coarse``: cells only, no
     fine split; ``levels`` / ``rival``: as above, learned;
   * ``hybrid`` — the ``fitted, resolved`` pick with the proposer table's survival.

   Columns: the picked candidate's whole-candidate tokens; ``admissible``: those among its
   leading positions at or above the step's admission bound under the variant's own table
   (what the budget could draft, not what it drafts); both over the last quarter of the
   output tokens; and the table's predicted admissible tokens (its calibration: predicted
   vs realised ``admissible``). Deterministic.

    python benchmarks/level_oracle.py --trace ../shared/traces/tau_bench_airline.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 64 --k 16
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from _replay_setup import Observed, load_trace, trace_parser
from numba import njit

from agentspec_mw.agentspec import SOURCES, AgentSpecProposer
from agentspec_mw.agentspec.budget import admission_bound, step_shape
from agentspec_mw.agentspec.calibration import MATCH_EDGES, N_Q, SUPPORT_EDGES
from agentspec_mw.agentspec.kernels import N_HIST, N_POS, NF, _acceptance, _cell, _fine
from agentspec_mw.agentspec.ngram_index import LEVELS, _lookup_rows
from agentspec_mw.agentspec.token_classes import NEWLINE
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import accepted_length, replay_workload


@njit(cache=False)
def _common_prefix(tok: np.ndarray, lens: np.ndarray, a: int, b: int) -> int:  # pragma: no cover
    """How many leading tokens candidate rows ``a`` and ``b`` share."""
    m = min(lens[a], lens[b])
    j = 0
    while j < m and tok[a, j] == tok[b, j]:
        j += 1
    return j


@njit(cache=False)
def _values(
    tok: np.ndarray,
    prob: np.ndarray,
    lens: np.ndarray,
    match: np.ndarray,
    support: np.ndarray,
    grp_src: np.ndarray,
    grp_default: np.ndarray,
    n_req: int,
    rec: np.ndarray,
    cal: np.ndarray,
    table: np.ndarray,
    fine: Any,
    levels: np.ndarray,
    sup_edges: np.ndarray,
    n_q: int,
    bound: float,
    out_w: np.ndarray,
    out_v: np.ndarray,
    out_ok: np.ndarray,
    out_cells: np.ndarray,
) -> None:  # pragma: no cover
    """``kernels.score``'s values of every candidate row (``group * n_req + r``; group
    ``g`` is of source ``grp_src[g]``): the expected accepted tokens among its positions at
    or above ``bound`` (``out_w``), of all (``out_v``), and its leading positions at or
    above ``bound`` (``out_ok``), and its positions' fine cells (``out_cells``); agreement
    is against the other sources' default groups (``grp_default``)."""
    fsucc2, ftot2, codes, strength = fine
    n_grp = tok.shape[0] // n_req
    agree = levels.shape[0] * (sup_edges.shape[0] + 1) * N_POS
    for r in range(n_req):
        cs = cal[r]
        tab, fsucc, ftot = table[cs], fsucc2[cs], ftot2[cs]
        for g in range(n_grp):
            row = g * n_req + r
            a = grp_src[g]
            w = 0.0
            v = 0.0
            ok = 0
            if lens[row] > 0:
                ml = 0
                while ml + 1 < levels.shape[0] and levels[ml + 1] <= match[row]:
                    ml += 1
                sb = 0
                while sb < sup_edges.shape[0] and sup_edges[sb] <= support[row]:
                    sb += 1
                head = (((a * 2) * levels.shape[0] + ml) * (sup_edges.shape[0] + 1) + sb) * N_POS
                ag = 0
                for g2 in range(n_grp):
                    if grp_src[g2] == a or not grp_default[g2]:
                        continue
                    ag = max(ag, _common_prefix(tok, lens, g2 * n_req + r, row))
                sv = 1.0
                crossed = 0
                lead = True
                for j in range(lens[row]):
                    c = _cell(head, agree if j < ag else 0, j, prob[row, j], n_q)
                    code = codes[tok[row, j]]
                    f = _fine(c, code, crossed, rec[r])
                    out_cells[row, j] = f
                    sv *= _acceptance(f, tab, fsucc, ftot, strength)
                    crossed |= code & NEWLINE
                    v += sv
                    if sv >= bound:
                        w += sv
                        if lead:
                            ok += 1
                    else:
                        lead = False
            out_w[row] = w
            out_v[row] = v
            out_ok[row] = ok


@njit(cache=False)
def _counts(prob: np.ndarray, ln: int, support: int, out: np.ndarray) -> None:  # pragma: no cover
    """Each position's vote count ``c`` (``out``), from its ``c / n`` and ``n`` = the
    previous position's ``c`` (``support`` at position 0; continuations that end early
    are not seen, so ``n`` may be overstated)."""
    na = support
    for j in range(ln):
        c = max(1, int(round(prob[j] * na)))
        out[j] = c
        na = c


@njit(cache=False)
def _rival_probs(
    tok: np.ndarray,
    prob: np.ndarray,
    lens: np.ndarray,
    support: np.ndarray,
    grp_src: np.ndarray,
    grp_default: np.ndarray,
    n_req: int,
    out: np.ndarray,
) -> None:  # pragma: no cover
    """Lead (b): at the first position where a default candidate and another source's
    default candidate both draft and differ, its ``c / n`` becomes ``c / (n + c')``
    (``c'``: the largest such rival's count there)."""
    n_grp = tok.shape[0] // n_req
    k = tok.shape[1]
    cnt = np.zeros(k, np.int64)
    cnt2 = np.zeros(k, np.int64)
    rival = np.zeros(k, np.int64)
    for r in range(n_req):
        for g in range(n_grp):
            if not grp_default[g]:
                continue
            row = g * n_req + r
            if lens[row] == 0:
                continue
            rival[:] = 0
            for g2 in range(n_grp):
                if not grp_default[g2] or grp_src[g2] == grp_src[g]:
                    continue
                rb = g2 * n_req + r
                j = _common_prefix(tok, lens, rb, row)
                if j < min(lens[rb], lens[row]):
                    _counts(prob[rb], lens[rb], support[rb], cnt2)
                    rival[j] = max(rival[j], cnt2[j])
            _counts(prob[row], lens[row], support[row], cnt)
            na = support[row]
            for j in range(lens[row]):
                if rival[j] > 0:
                    out[row, j] = cnt[j] / (na + rival[j])
                na = cnt[j]


@njit(cache=False)
def _count(
    cells: np.ndarray,
    lens: np.ndarray,
    acc: np.ndarray,
    use: np.ndarray,
    succ: np.ndarray,
    tot: np.ndarray,
    fsucc: np.ndarray,
    ftot: np.ndarray,
) -> None:  # pragma: no cover
    """Count the verified positions of rows ``use`` (position ``j`` counts if ``0..j-1``
    were accepted) into the fitted cells (coarse cell = fine cell // NF)."""
    for row in use:
        for j in range(min(acc[row] + 1, lens[row])):
            f = cells[row, j]
            c = f // NF
            tot[c] += 1.0
            ftot[f] += 1.0
            if j < acc[row]:
                succ[c] += 1.0
                fsucc[f] += 1.0


class Fitted:
    """A calibration fitted prequentially from every candidate of the given groups (not
    only the picked one), counted after each step, read as the proposer reads its own."""

    def __init__(
        self,
        a: AgentSpecProposer,
        groups: list[int],
        picked_only: bool = False,
        emitted: bool = False,
    ) -> None:
        sc = a._scopes
        self.prior = sc.calib.prior
        self.succ = np.zeros((1, sc.table.shape[1]))
        self.tot = np.zeros((1, sc.table.shape[1]))
        self.fsucc = np.zeros((1, sc.fsucc.shape[1]))
        self.ftot = np.zeros((1, sc.ftot.shape[1]))
        self.codes = a._calib.fine.codes
        self.strength = a._calib.fine.strength
        self.strength_fine = self.strength  # 0: read the coarse cells only
        self.groups = groups
        self.picked_only = picked_only  # count only the candidate this variant picked
        self.emitted = emitted  # count only the positions the step's emitted tokens verify
        self.resolved = False  # count a candidate only once the output has reached its miss
        self.one_open = False  # with resolved: a source's new candidate waits for its open one
        self.pending: dict[str, list[tuple[int, np.ndarray, np.ndarray, np.ndarray, int]]] = {}
        self._where: list[tuple[str, int]] = []  # this step's requests and their positions

    def table(self) -> np.ndarray:
        s = self.strength
        return (self.succ + s * self.prior) / (self.tot + s)

    def fine(self) -> Any:
        return (self.fsucc, self.ftot, self.codes, self.strength_fine)

    def count(
        self,
        cells: np.ndarray,
        lens: np.ndarray,
        acc: np.ndarray,
        n: int,
        picks: list[int],
        emitted: np.ndarray,
    ) -> None:
        """Count rows: every group's, or each request's pick (``picks``, -1: none);
        positions up to the first miss, or only those the ``emitted[r]`` tokens verify."""
        if self.picked_only:
            use = np.array([g * n + i for i, g in enumerate(picks) if g >= 0], np.int64)
        else:
            use = np.array([g * n + i for g in self.groups for i in range(n)], np.int64)
        if self.emitted:
            lens = np.minimum(lens, np.tile(emitted, len(lens) // n))
        if not self.resolved:
            _count(cells, lens, acc, use, self.succ[0], self.tot[0], self.fsucc[0], self.ftot[0])
            return
        for i, (r, pos) in enumerate(self._where):
            rows = use[use % n == i]
            if self.one_open:
                busy = {g for need, _c, _l, _a, g in self.pending.get(r, [])}
                rows = np.array([x for x in rows if x // n not in busy], np.int64)
            if len(rows):
                need = pos + int(np.minimum(acc[rows] + 1, lens[rows]).max())
                if self.one_open:
                    for x in rows:
                        ne = pos + int(min(acc[x] + 1, lens[x]))
                        q1 = (
                            ne,
                            cells[x : x + 1].copy(),
                            lens[x : x + 1].copy(),
                            acc[x : x + 1].copy(),
                            int(x // n),
                        )
                        self.pending.setdefault(r, []).append(q1)
                    continue
                q = (need, cells[rows].copy(), lens[rows].copy(), acc[rows].copy(), -1)
                self.pending.setdefault(r, []).append(q)

    def resolve(self, r: str, pos: int | None) -> None:
        """Count request ``r``'s queued candidates the output has verified (``pos``: its
        tokens so far; ``None``: it stopped, every queued one is verified)."""
        q = self.pending.get(r)
        if not q:
            return
        keep = []
        for item in q:
            need, cells, lens, acc, _g = item
            if pos is None or need <= pos:
                use = np.arange(len(lens), dtype=np.int64)
                _count(
                    cells, lens, acc, use, self.succ[0], self.tot[0], self.fsucc[0], self.ftot[0]
                )
            else:
                keep.append(item)
        self.pending[r] = keep


# candidate groups: per index source its level caps, longest first, then local
_GRP_SRC = [h for h in range(N_HIST) for _ in LEVELS] + [N_HIST]
_GRP_CAP = [m for _ in range(N_HIST) for m in range(len(LEVELS) - 1, -1, -1)] + [0]
_GRP_DEFAULT = [int(m == len(LEVELS) - 1) for m in _GRP_CAP[:-1]] + [1]
_DEFAULT_GROUPS = [g for g, d in enumerate(_GRP_DEFAULT) if d]
_GRP_SRC_A = np.array(_GRP_SRC, np.int64)
_GRP_DEFAULT_A = np.array(_GRP_DEFAULT, np.int64)


def _argmax(w: np.ndarray, v: np.ndarray, groups: Any) -> int:
    """The group with the largest ``w``, then ``v`` (the first wins ties, as
    ``kernels.score``)."""
    best = -1
    for g in groups:
        if best < 0 or w[g] > w[best] or (w[g] == w[best] and v[g] > v[best]):
            best = g
    return best


class LevelOracle(Observed):
    """AgentSpec with each index source's candidates re-looked-up per level cap."""

    def __init__(self, a: AgentSpecProposer, outputs: dict[str, np.ndarray]) -> None:
        super().__init__(a)
        self.outputs = outputs
        self.tok: Counter[str] = Counter()  # (what) -> whole-candidate accepted tokens
        self.cnt: Counter[str] = Counter()  # (what) -> request-steps
        self.gain_by: Counter[tuple[str, int, int]] = Counter()  # (src, longest, best) -> tokens
        self.fitted = {
            "fitted": Fitted(a, _DEFAULT_GROUPS),
            "fitted, levels": Fitted(a, list(range(len(_GRP_SRC)))),
            "fitted, rival": Fitted(a, _DEFAULT_GROUPS),
            "fitted, picked only": Fitted(a, _DEFAULT_GROUPS, picked_only=True),
            "fitted, emitted": Fitted(a, _DEFAULT_GROUPS, emitted=True),
            "fitted, picked only, emitted": Fitted(a, _DEFAULT_GROUPS, True, True),
            "fitted, resolved": Fitted(a, _DEFAULT_GROUPS),
            "fitted, picked only, resolved": Fitted(a, _DEFAULT_GROUPS, picked_only=True),
            "fitted, one open per source": Fitted(a, _DEFAULT_GROUPS),
            "fitted, resolved, coarse": Fitted(a, _DEFAULT_GROUPS),
            "fitted, rival, picked only, emitted": Fitted(a, _DEFAULT_GROUPS, True, True),
        }
        self.fitted["fitted, resolved, coarse"].strength_fine = 0.0
        for name in (
            "fitted, resolved",
            "fitted, picked only, resolved",
            "fitted, one open per source",
        ):
            self.fitted[name].resolved = True
        self.fitted["fitted, one open per source"].one_open = True
        self.total = sum(len(x) for x in outputs.values())
        self.pred: defaultdict[str, float] = defaultdict(float)  # variant -> predicted tokens
        self.emitted = 0

    def extend(self, req_id: str, ids: Any) -> None:
        super().extend(req_id, ids)
        self.emitted += len(ids)

    def stop(self, req_id: str) -> None:
        super().stop(req_id)
        for f in self.fitted.values():
            f.resolve(req_id, None)

    def _capped(self, n: int, k: int) -> list[tuple[np.ndarray, ...]]:
        """The index rows of this step looked up with levels ``LEVELS[:m]``, m = 1..4:
        ``(tokens, lens, match, probs, support)`` per cap (the step's keys, tails and walk
        depths)."""
        ws = self.a._ws.get(n, max(k, 1))
        ix = list(self.a._index.arrays)
        rows = N_HIST * n
        out: list[tuple[np.ndarray, ...]] = []
        for m in range(1, len(LEVELS) + 1):
            ix[6] = np.ascontiguousarray(LEVELS[:m])
            tok = np.zeros((rows, max(k, 1)), np.int32)
            prob = np.zeros((rows, max(k, 1)), np.float64)
            lens = np.zeros(rows, np.int64)
            match = np.zeros(rows, np.int64)
            sup = np.zeros(rows, np.int64)
            _lookup_rows(
                0, rows, ws.keys, ws.ctx, ws.ctx_len, ws.ks, tuple(ix), tok, prob, lens, match, sup
            )
            out.append((tok, lens, match, prob, sup))
        return out

    def _groups(
        self, n: int, k: int, capped: list[tuple[np.ndarray, ...]]
    ) -> tuple[np.ndarray, ...]:
        """Every group's candidate rows (``group * n + r``): tokens, probs, lens, match,
        support."""
        loc = self.a._ws.get(n, max(k, 1)).loc
        parts: list[list[np.ndarray]] = [[], [], [], [], []]
        for g in range(len(_GRP_SRC)):
            h, m = _GRP_SRC[g], _GRP_CAP[g]
            if h < N_HIST:
                tok, lens, match, prob, sup = capped[m]
                sl = slice(h * n, (h + 1) * n)
                src = (tok[sl], prob[sl], lens[sl], match[sl], sup[sl])
            else:
                src = (loc.tok, loc.prob, loc.lens, loc.match, loc.support)
            for p, x in zip(parts, src, strict=True):
                p.append(x)
        return tuple(np.concatenate(p) for p in parts)

    def _eval(
        self, c: tuple[np.ndarray, ...], n: int, table: np.ndarray, fine: Any, cal: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """``(w, v, ok, cells)`` of every row under a calibration (see :func:`_values`)."""
        tok, prob, lens, match, sup = c
        rows = len(lens)
        w, v = np.zeros(rows), np.zeros(rows)
        ok = np.zeros(rows, np.int64)
        cells = np.zeros(tok.shape, np.int64)
        _values(
            tok, prob, lens, match, sup, _GRP_SRC_A, _GRP_DEFAULT_A, n, self._rec, cal,
            table, fine, MATCH_EDGES, SUPPORT_EDGES, N_Q, self._bound, w, v, ok, cells,
        )  # fmt: skip
        return w.reshape(-1, n), v.reshape(-1, n), ok.reshape(-1, n), cells

    def _variants(
        self,
        req_ids: Sequence[str],
        k: int,
        step: StepContext,
        capped: list[tuple[np.ndarray, ...]],
    ) -> dict[str, tuple[tuple[np.ndarray, ...], Any]]:
        """Per variant: its ``(w, v, ok, cells)`` and what to count after the step."""
        a = self.a
        n = len(req_ids)
        ws = a._ws.get(n, max(k, 1))
        self._rec = ws.rec
        self._bound = max(admission_bound(a.cost, step_shape(step)), 1e-12)
        c = self._groups(n, k, capped)
        tok, prob, lens, match, sup = c
        # lead (b): each default candidate's c/n at a contest pooled with its rival's count
        prob2 = prob.copy()
        _rival_probs(tok, prob, lens, sup, _GRP_SRC_A, _GRP_DEFAULT_A, n, prob2)
        c2 = (tok, prob2, lens, match, sup)
        sl_ = np.fromiter(map(a._reqs.__getitem__, req_ids), np.int64, n)
        cal = a._slots.si[sl_, 22]
        zero = np.zeros(n, np.int64)
        out: dict[str, tuple[tuple[np.ndarray, ...], Any]] = {}
        out["proposer"] = (self._eval(c, n, a._scopes.table, a._calib.fine, cal), None)
        out["proposer, rival"] = (self._eval(c2, n, a._scopes.table, a._calib.fine, cal), None)
        for name, f in self.fitted.items():
            cc = c2 if "rival" in name else c
            out[name] = (self._eval(cc, n, f.table(), f.fine(), zero), f)
        self._lens = lens
        return out

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.a.propose(req_ids, k, step)
        cands = self.a.candidates or {}
        if not cands:
            return drafts
        tok, lens, pick = cands["tok"], cands["lens"], cands["pick"]
        n = len(req_ids)
        capped = self._capped(n, k)
        full_lens = capped[-1][1]
        # the uncapped re-lookup is the step's own (same index, same rows)
        assert np.array_equal(full_lens, lens[: N_HIST * n])
        for f in self.fitted.values():
            f._where = [(r, self.pos[r]) for r in req_ids]
            for r in req_ids:
                f.resolve(r, self.pos[r])
        var = self._variants(req_ids, k, step, capped)
        n_grp = len(_GRP_SRC)
        acc_rows = np.zeros(n_grp * n, np.int64)
        late = self.emitted >= 0.75 * self.total
        picks = {name: [-1] * n for name in var}
        emitted = np.zeros(n, np.int64)
        for i, r in enumerate(req_ids):
            truth = self.outputs[r][self.pos[r] :]
            accs: list[list[int]] = []  # per source: per cap (local: one)
            lvls: list[list[int]] = []
            for h in range(N_HIST):
                row = h * n + i
                accs.append([accepted_length(c[0][row, : c[1][row]], truth) for c in capped])
                lvls.append([int(c[2][row]) if c[1][row] else 0 for c in capped])
            lr = N_HIST * n + i
            accs.append([accepted_length(tok[lr, : lens[lr]], truth)])
            lvls.append([0])
            gacc = [accs[_GRP_SRC[g]][_GRP_CAP[g]] for g in range(n_grp)]
            for g in range(n_grp):
                acc_rows[g * n + i] = gacc[g]
            dr = np.asarray(drafts[i].token_ids, np.int64)
            emitted[i] = min(accepted_length(dr, truth) + 1, len(truth))
            if not any(lens[s * n + i] for s in range(len(SOURCES))):
                continue
            self.cnt["steps"] += 1
            p = int(pick[i]) // n
            for name, ((w, v, ok, _), _f) in var.items():
                groups = range(n_grp) if name == "fitted, levels" else _DEFAULT_GROUPS
                if name == "proposer":  # both the default and the level choice
                    dg = _argmax(w[:, i], v[:, i], _DEFAULT_GROUPS)
                    self.cnt["default = pick"] += int(_GRP_SRC[dg] == p)
                    ch = _argmax(w[:, i], v[:, i], range(n_grp))
                    self._add("proposer, levels", gacc[ch], int(ok[ch, i]), late)
                    self.cnt["level choice differs"] += int(ch != dg)
                ch = _argmax(w[:, i], v[:, i], groups)
                picks[name][i] = ch
                if name == "fitted, resolved":  # the hybrid: this choice, the proposer's survival
                    pw, _pv, pok, _pc = var["proposer"][0]
                    self._add("hybrid", gacc[ch], int(pok[ch, i]), late)
                    self.pred["hybrid"] += float(pw[ch, i])
                self._add(name, gacc[ch], int(ok[ch, i]), late)
                self.pred[name] += float(w[ch, i])
            self.tok["picked"] += accs[p][-1]
            self.tok["picked, its best level"] += max(accs[p])
            self.tok["best source"] += max(a[-1] for a in accs)
            self.tok["best source and level"] += max(max(a) for a in accs)
            for h in range(N_HIST):
                src = SOURCES[h]
                if full_lens[h * n + i] == 0:
                    continue
                a = accs[h]
                self.cnt[f"{src} steps"] += 1
                self.tok[f"{src} longest"] += a[-1]
                self.tok[f"{src} best level"] += max(a)
                if max(a) > a[-1]:
                    self.cnt[f"{src} shorter better"] += 1
                    best = int(np.argmax(a))
                    self.gain_by[(src, lvls[h][-1], lvls[h][best])] += max(a) - a[-1]
                if min(a) < a[-1]:
                    self.cnt[f"{src} shorter worse"] += 1
        for name, ((_, _, _, cells), f) in var.items():
            if f is not None:
                f.count(cells, self._lens, acc_rows, n, picks[name], emitted)
        return drafts

    def _add(self, name: str, acc: int, ok: int, late: bool) -> None:
        for key, x in ((name, acc), (f"{name}, admissible", min(acc, ok))):
            self.tok[key] += x
            if late:
                self.tok[f"{key}, last quarter"] += x


def main(argv: list[str] | None = None) -> int:
    args = trace_parser(__doc__, batch="64").parse_args(argv)
    t = load_trace(args)
    workload, calls, outputs, setup = t.workload, t.calls, t.outputs, t.setup
    for b in t.batches:
        a = make_proposer("agentspec", setup.env)
        assert isinstance(a, AgentSpecProposer)
        o = LevelOracle(a, outputs)
        res = replay_workload(calls, o, batch=b, k=args.k, cost_model=setup.cost)
        print(f"## {workload}, batch {b}: {o.cnt['steps']} request-steps with a candidate")
        print(f"the run: drafted {res.drafted}, accepted {res.accepted} tokens")
        base = o.tok["picked"]
        print(
            f"emulated default = pick: {o.cnt['default = pick']} of {o.cnt['steps']}; "
            f"level choice differs (proposer's table): {o.cnt['level choice differs']}"
        )
        base = o.tok["picked"]
        for key in ("picked", "picked, its best level", "best source", "best source and level"):
            v = o.tok[key]
            print(f"{key}: {v} tokens ({100 * (v - base) / max(base, 1):+.1f} % of picked)")
        print("| choice | whole | admissible | last quarter: whole | admissible |")
        print("| --- | --- | --- | --- | --- |")
        names = ("proposer", "proposer, levels", "proposer, rival", *o.fitted, "hybrid")
        for name in names:
            vals = [
                o.tok[name + x]
                for x in ("", ", admissible", ", last quarter", ", admissible, last quarter")
            ]
            print(
                f"| {name} | "
                + " | ".join(str(x) for x in vals)
                + f" | predicted admissible {o.pred[name]:.0f} |"
            )
        print(
            "| source | request-steps | longest | best level | gain | shorter better "
            "| shorter worse |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for src in SOURCES[:N_HIST]:
            st = o.cnt[f"{src} steps"]
            lo, be = o.tok[f"{src} longest"], o.tok[f"{src} best level"]
            print(
                f"| {src} | {st} | {lo} | {be} | {100 * (be - lo) / max(lo, 1):+.1f} % "
                f"| {o.cnt[f'{src} shorter better']} | {o.cnt[f'{src} shorter worse']} |"
            )
        print("gain by (source, longest level → best level), tokens:")
        for (s, x, y), v in o.gain_by.most_common(10):
            print(f"  {s} {x} → {y}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
