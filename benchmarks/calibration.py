"""Reliability of AgentSpec's calibrated acceptance: predicted vs realised, per source.

Replays traces with AgentSpec (``agentspec replay``'s scheduler and defaults) and, for
every drafted token, compares the acceptance the draft carried (``Draft.probs[j]``: the
calibrated probability that token ``j`` is right given that tokens ``0..j-1`` are) with
what the recorded output did, counted only where tokens ``0..j-1`` were right (a token
past the output's end is not counted). Tokens are grouped by the source of the picked
candidate (``iso``, ``agent``, ``scope``, ``local``) and by predicted decile; the table
gives each decile's mean prediction, realised acceptance and count. The proposer learns
from every call; only the calls of *held-out* runs are scored (``--holdout``: runs whose
id hashes to bucket 0 of that many; ``0`` scores every run), so the table reads the
calibration on runs no one tuned on.

``--split-by`` splits the table by what the call was (each split's own deciles, and a
summary line per split: tokens, mean predicted, realised, and the token-weighted mean
|gap| over its deciles), to see whether a tag the proposer does not read would change the
estimate: ``segment`` (the trace's ``segment_hint``, read off the output: an upper bound
on what a predicted segment tag could tell), ``group_kind`` (``fanout``: a ``parent_group``
whose calls are all in one run — parallel samples; ``retry``: one spanning runs — trials
of one task; ``none``), ``group_order`` (``later`` once an earlier call of the group, in
file order, came from another run — for ``fanout``, any earlier call of the group —
``first`` before that, ``none`` without a group) and ``agent``.

    python benchmarks/calibration.py --traces ../shared/traces/tau_bench_airline.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 64 --k 16 --png docs/img/calibration.png
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import textwrap
from collections.abc import Sequence

import numpy as np
from _replay_setup import Observed, load_workloads

from agentspec_mw.agentspec import SOURCES, AgentSpecProposer
from agentspec_mw.agentspec import kernels as K
from agentspec_mw.agentspec.calibration import MATCH_EDGES, N_ML, N_Q, N_SUP
from agentspec_mw.agentspec.token_classes import N_CLASSES
from agentspec_mw.cli import _parse_set
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload
from agentspec_mw.traces.tokenized import CallMeta, load_tokenizer, tokenize_trace

DECILES = 10
CALL_SPLITS = ("none", "segment", "group_kind", "group_order", "agent")
TOKEN_SPLITS = (
    "match",
    "position",
    "support",
    "agree",
    "text",
    "record",
    "cell_count",
    "fine_count",
)
"""Splits by what the proposer read for the token (its calibration cell, see
:func:`token_label`), not by what the call was."""
SPLITS = CALL_SPLITS + TOKEN_SPLITS
_COUNT_EDGES = (1, 8, 64, 512)  # cell_count / fine_count buckets


def split_labels(metas: Sequence[CallMeta], by: str) -> list[str]:
    """One label per call (file order) for ``--split-by`` (see the module doc)."""
    if by == "none":
        return ["all"] * len(metas)
    if by == "segment":
        return [m.segment_hint for m in metas]
    if by == "agent":
        return [m.agent for m in metas]
    runs: dict[str, set[str]] = {}
    for m in metas:
        if m.parent_group is not None:
            runs.setdefault(m.parent_group, set()).add(m.run_id)
    kind = {g: "fanout" if len(r) == 1 else "retry" for g, r in runs.items()}
    if by == "group_kind":
        return [kind[m.parent_group] if m.parent_group else "none" for m in metas]
    if by != "group_order":
        raise ValueError(f"--split-by {by!r}: expected one of {SPLITS}")
    seen: dict[str, set[str]] = {}
    out = []
    for m in metas:
        g = m.parent_group
        if g is None:
            out.append("none")
            continue
        before = seen.setdefault(g, set())
        later = bool(before) if kind[g] == "fanout" else bool(before - {m.run_id})
        out.append("later" if later else "first")
        before.add(m.run_id)
    return out


def _bucket(x: float, edges: Sequence[int]) -> str:
    """``x``'s bucket among ``edges`` as a label (``0``, ``1-7``, ..., ``512+``)."""
    lo = 0
    for e in edges:
        if x < e:
            return f"{lo}" if e == lo + 1 else f"{lo}-{e - 1}"
        lo = e
    return f"{lo}+"


def token_label(by: str, fcell: int, cell_count: float, fine_count: float) -> str:
    """The ``--split-by`` label of a drafted token from its fine calibration cell
    ``fcell`` (``kernels._fine`` of ``kernels._cell``) and the verified tokens its cell and
    fine cell had counted in its scope row when it was scored (``cell_count``,
    ``fine_count``: how far each estimate had moved from its prior)."""
    cell, fine = divmod(fcell, K.NF)
    rest, _q = divmod(cell, N_Q)
    rest, pb = divmod(rest, K.N_POS)
    rest, sb = divmod(rest, N_SUP)
    rest, ml = divmod(rest, N_ML)
    agree = rest % 2
    rec, text = divmod(fine, 2 * N_CLASSES)
    if by == "match":
        return f"match {int(MATCH_EDGES[ml])}{'+' if ml == N_ML - 1 else ''}"
    if by == "position":
        return f"position {('0', '1', '2-3', '4-7', '8+')[pb]}"
    if by == "support":
        return f"support {('1', '2-3', '4-7', '8+')[sb]}"
    if by == "agree":
        return "agree" if agree else "alone"
    if by == "text":
        cls = ("space", "symbol", "word start", "word on")[text % N_CLASSES]
        return f"{cls}{', crossed' if text >= N_CLASSES else ''}"
    if by == "record":
        return f"record {('0', '1-3', '4-15', '16+')[rec]}"
    if by == "cell_count":
        return f"cell n {_bucket(cell_count, _COUNT_EDGES)}"
    if by == "fine_count":
        return f"fine n {_bucket(fine_count, _COUNT_EDGES)}"
    raise ValueError(f"--split-by {by!r}: expected one of {SPLITS}")


def held_out(run_id: str, buckets: int, fold: int = 0) -> bool:
    """Whether run ``run_id`` is held out: its id hashes to bucket ``fold`` of ``buckets``
    (every run when ``buckets`` is 0)."""
    if buckets <= 0:
        return True
    h = int.from_bytes(hashlib.blake2b(run_id.encode(), digest_size=8).digest(), "little")
    return h % buckets == fold % buckets


class Scored(Observed):
    """AgentSpec driving the replay; each drafted token's prediction is scored against
    the recorded output of the held-out calls."""

    def __init__(
        self,
        agentspec: AgentSpecProposer,
        outputs: dict[str, np.ndarray],
        scored: set[str],
        labels: dict[str, str] | None = None,
        token_split: str | None = None,
        runs: dict[str, str] | None = None,
    ):
        super().__init__(agentspec)
        self.token_split = token_split
        self.runs = runs or {}
        # per scored run: per source, per decile (sum of predictions, accepted, tokens)
        self.by_run: dict[str, np.ndarray] = {}
        self.outputs, self.scored = outputs, scored
        self.labels = labels or {}
        # per split label, per source, per decile: (sum of predictions, accepted, tokens)
        self.split: dict[str, np.ndarray] = {}

    @property
    def cells(self) -> np.ndarray:
        """Per source, per decile: (sum of predictions, accepted, tokens), all splits."""
        return sum(self.split.values(), np.zeros((len(SOURCES), DECILES, 3)))

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.a.propose(req_ids, k, step)
        pick = (self.a.candidates or {}).get("pick")
        n = len(req_ids)
        for i, r in enumerate(req_ids):
            d = drafts[i]
            if not len(d) or r not in self.scored or pick is None:
                continue
            src = int(pick[i]) // n
            truth = self.outputs[r][self.pos[r] :]
            label = self.labels.get(r, "all")
            slot = self.a._reqs[r]
            row = int(self.a._slots.si[slot, K.C_CAL])
            run = self.runs.get(r, r)
            if run not in self.by_run:
                self.by_run[run] = np.zeros((len(SOURCES), DECILES, 3))
            sc = self.a._scopes
            for j, (t, p) in enumerate(zip(d.token_ids, d.probs, strict=True)):
                if j >= len(truth):
                    break
                if self.token_split is not None:
                    f = int(self.a._slots.dcell[slot, j])
                    c = f // K.NF
                    label = token_label(self.token_split, f, sc.tot[row, c], sc.ftot[row, f])
                if label not in self.split:
                    self.split[label] = np.zeros((len(SOURCES), DECILES, 3))
                ok = int(truth[j]) == t
                q = min(int(p * DECILES), DECILES - 1)
                self.split[label][src, q] += (p, ok, 1)
                self.by_run[run][src, q] += (p, ok, 1)
                if not ok:
                    break
        return drafts


def table(cells: np.ndarray, interval: np.ndarray | None = None) -> list[str]:
    """Markdown rows: source, decile, mean predicted, realised, tokens, gap (points), and
    with ``interval`` (per source and decile, see :func:`run_bootstrap`) the gap's
    interval over resampled runs."""
    head = "| source | decile | predicted | realised | tokens | gap (points) |"
    if interval is not None:
        head += " gap, 90 % over runs |"
    rows = [head, "| --- " * head.count(" |") + "|"]
    return rows + _rows(cells, interval=interval)


def _rows(cells: np.ndarray, prefix: str = "", interval: np.ndarray | None = None) -> list[str]:
    rows = []
    for s, name in enumerate(SOURCES):
        for q in range(DECILES):
            pred, acc, n = cells[s, q]
            if n == 0:
                continue
            gap = 100 * (acc - pred) / n
            row = (
                f"| {prefix}{name} | {q / DECILES:.1f}–{(q + 1) / DECILES:.1f} | {pred / n:.3f} | "
                f"{acc / n:.3f} | {int(n)} | {gap:+.1f} |"
            )
            if interval is not None:
                lo, hi = interval[s, q]
                row += f" {100 * lo:+.1f} … {100 * hi:+.1f} |"
            rows.append(row)
    return rows


def run_bootstrap(
    workloads: Sequence[Sequence[np.ndarray]], reps: int, seed: int = 0
) -> np.ndarray:
    """Per source and decile, the 5th and 95th percentile of the gap (realised − predicted)
    when each workload's scored runs are drawn again with replacement (``workloads``: per
    workload, one array per run as :attr:`Scored.by_run`'s). Tokens of one run share its
    prompts and history, so the run, not the token, is the unit a held-out set samples:
    this is how far the gap of a set of that many runs moves by which runs it holds."""
    rng = np.random.default_rng(seed)
    gaps = np.full((reps, len(SOURCES), DECILES), np.nan)
    stacks = [np.stack(runs) for runs in workloads if len(runs)]
    for b in range(reps):
        tot = np.zeros((len(SOURCES), DECILES, 3))
        for st in stacks:
            tot += st[rng.integers(0, len(st), len(st))].sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            gaps[b] = (tot[..., 1] - tot[..., 0]) / tot[..., 2]
    out = np.full((len(SOURCES), DECILES, 2), np.nan)
    for s in range(len(SOURCES)):
        for q in range(DECILES):
            g = gaps[:, s, q]
            g = g[~np.isnan(g)]
            if len(g):
                out[s, q] = np.percentile(g, [5, 95])
    return out


def brier(cells: np.ndarray) -> list[str]:
    """Plain lines: per source, the Brier score of its per-token predictions split by
    decile (Murphy's decomposition over the decile bins): ``reliability`` (how far each
    decile's mean prediction is from its realised rate: 0 is calibrated) and
    ``resolution`` (how far the deciles' realised rates spread around the source's mean:
    the share of the ``uncertainty`` ō(1 − ō) the estimate tells apart). A budget can cut
    rejected tokens from its drafts only as far as the estimate resolves them."""
    out = []
    for s, name in enumerate(SOURCES):
        pred, acc, n = cells[s, :, 0], cells[s, :, 1], cells[s, :, 2]
        total = n.sum()
        if total == 0:
            continue
        has = n > 0
        rate = acc.sum() / total
        p_d, o_d, n_d = pred[has] / n[has], acc[has] / n[has], n[has]
        rel = float((n_d * (p_d - o_d) ** 2).sum() / total)
        res = float((n_d * (o_d - rate) ** 2).sum() / total)
        unc = rate * (1 - rate)
        out.append(
            f"Brier {name}: reliability {rel:.4f}, resolution {res:.4f} of uncertainty "
            f"{unc:.4f} ({res / unc if unc else 0:.0%}), {int(total)} tokens"
        )
    return out


def split_table(split: dict[str, np.ndarray]) -> list[str]:
    """Markdown: per split label and source, deciles as :func:`table`, then a summary per
    label and source: tokens, mean predicted, realised, gap, token-weighted mean |gap|, and
    the gap minus the source's gap over every split (what the split adds to the estimate);
    last, the expected accepted tokens those split-specific gaps amount to."""
    rows = ["| split | source | decile | predicted | realised | tokens | gap (points) |"]
    rows.append("| --- " * 7 + "|")
    for label in sorted(split):
        rows += _rows(split[label], prefix=f"{label} | ")
    rows += [
        "",
        "| split | source | tokens | predicted | realised | gap | mean abs gap | gap vs pooled |",
    ]
    rows.append("| --- " * 8 + "|")
    pooled = sum(split.values(), np.zeros((len(SOURCES), DECILES, 3))).sum(axis=1)
    moved = scored = 0.0
    for label in sorted(split):
        for s, name in enumerate(SOURCES):
            c = split[label][s]
            n = c[:, 2].sum()
            if n == 0:
                continue
            has = c[:, 2] > 0
            abs_gap = np.abs(c[has, 1] - c[has, 0]).sum() / n  # sum_d n_d |gap_d| / n
            gap = (c[:, 1].sum() - c[:, 0].sum()) / n
            vs = gap - (pooled[s, 1] - pooled[s, 0]) / pooled[s, 2]
            moved += abs(vs) * n
            scored += n
            rows.append(
                f"| {label} | {name} | {int(n)} | {c[:, 0].sum() / n:.3f} | "
                f"{c[:, 1].sum() / n:.3f} | {100 * gap:+.1f} | {100 * abs_gap:.1f} | "
                f"{100 * vs:+.1f} |"
            )
    rows += [
        "",
        f"Split-specific error: Σ tokens × |gap vs pooled| = {moved:.0f} expected accepted "
        f"tokens over {scored:.0f} scored ({100 * moved / max(scored, 1):.2f} %): the most a "
        "per-split correction of the estimate could move.",
    ]
    return rows


def plot(cells: np.ndarray, path: str, title: str) -> None:
    """The reliability diagram: realised against predicted per source, one point per
    decile with tokens, the diagonal for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5.4))
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--")
    for s, name in enumerate(SOURCES):
        c = cells[s]
        has = c[:, 2] > 0
        if has.any():
            ax.plot(c[has, 0] / c[has, 2], c[has, 1] / c[has, 2], marker="o", label=name)
    ax.set_xlabel("predicted acceptance (decile mean)")
    ax.set_ylabel("realised acceptance")
    ax.set_title("\n".join(textwrap.wrap(title, 60)), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--cost-model", default="llama8b-h100")
    ap.add_argument("--max-calls-per-run", type=int, default=None)
    ap.add_argument("--holdout", type=int, default=4, help="score runs in bucket FOLD of N")
    ap.add_argument("--fold", type=int, default=0, help="the bucket scored (default 0)")
    ap.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        help="add each decile's 90 %% gap interval over this many resamplings of scored runs",
    )
    ap.add_argument("--png", default=None, help="write the diagram here")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="agentspec.OPTION=VALUE",
        help="an AgentSpec option, as agentspec replay's --set",
    )
    ap.add_argument("--split-by", default="none", choices=SPLITS, help="see the module doc")
    args = ap.parse_args(argv)
    options = _parse_set(args.set).get("agentspec", {})
    setup = load_workloads(
        args.traces,
        args.tokenizer,
        max_k=args.k,
        cost_model=args.cost_model,
        max_calls_per_run=args.max_calls_per_run,
    )
    labels: dict[str, str] = {}
    token_split = args.split_by if args.split_by in TOKEN_SPLITS else None
    if args.split_by in CALL_SPLITS[1:]:
        tok = load_tokenizer(args.tokenizer)
        for t_idx, path in enumerate(args.traces):
            metas = tokenize_trace(path, tok).calls
            for i, label in enumerate(split_labels(metas, args.split_by)):
                m = metas[i]
                labels[f"{t_idx}:{m.run_id}#{m.call_index}#{i}"] = label  # build_calls' ids
    total = np.zeros((len(SOURCES), DECILES, 3))
    total_split: dict[str, np.ndarray] = {}
    per_run: list[list[np.ndarray]] = []
    for workload, calls in setup.workloads.items():
        agentspec = make_proposer("agentspec", setup.env, **options)
        assert isinstance(agentspec, AgentSpecProposer)
        outputs = {c.req_id: c.output for c in calls}
        scored = {c.req_id for c in calls if held_out(c.run_id, args.holdout, args.fold)}
        if labels and not all(c.req_id in labels for c in calls):
            raise SystemExit("calibration: the replay's request ids no longer match the trace")
        runs = {c.req_id: c.run_id for c in calls}
        prop = Scored(agentspec, outputs, scored, labels, token_split, runs)
        replay_workload(calls, prop, batch=args.batch, k=args.k, cost_model=setup.cost)
        total += prop.cells
        for label, cells in prop.split.items():
            total_split[label] = total_split.get(label, 0) + cells
        per_run.append(list(prop.by_run.values()))
        ci = run_bootstrap(per_run[-1:], args.bootstrap) if args.bootstrap else None
        print(
            f"\n{workload}: batch {args.batch}, k = {args.k}, {len(scored)} scored calls "
            f"of {len(prop.by_run)} runs\n"
        )
        split = labels or token_split
        print("\n".join(split_table(prop.split) if split else table(prop.cells, ci)))
        print("\n" + "\n".join(brier(prop.cells)))
    if len(setup.workloads) > 1:
        print("\nall workloads\n")
        ci = run_bootstrap(per_run, args.bootstrap) if args.bootstrap else None
        print("\n".join(split_table(total_split) if split else table(total, ci)))
        print("\n" + "\n".join(brier(total)))
    if args.png:
        names = ", ".join(setup.workloads)
        plot(total, args.png, f"{names}: batch {args.batch}, k = {args.k}")
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
