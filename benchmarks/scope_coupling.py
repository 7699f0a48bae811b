"""How much another tenant's traffic moves a tenant's drafting, across steps and within one.

Tenant V replays the first ``--v-runs`` agent runs of a trace one call at a time
(greedy oracle: the recorded output is what the model emits). Tenant N sends badly
rejected traffic: real prompts of other runs whose recorded outputs are shuffled, so
the drafts N's history suggests keep failing. Four cases, with the proposer's clock
fixed (its own step time feeds the budget; fixing it makes drafts a function of the
traffic alone):

* ``alone`` — V only;
* ``between`` — a batch of ``--n-batch`` of N's calls runs in steps of its own after
  each of V's calls, in scope N:
  per-scope calibration makes V's drafts identical to ``alone``;
* ``between, same scope`` — the same, but N in V's scope (what every tenant shared
  before per-scope state): V's drafting moves;
* ``within`` — ``--n-batch`` of N's calls share every one of V's steps (scope N): the
  batch is bigger, so the step's cost-model budget (one goodput for the whole step) and
  its admission bound apply to everyone — the coupling that is inherent to batching.

Prints V's drafted and accepted tokens, its steps, how many of its drafts differ from
``alone``, and how full the index got (over 1: it evicted its oldest tokens — any
tenant's; that capacity is shared, so compare ``between`` with ``alone`` under 1).

    python benchmarks/scope_coupling.py --traces ../shared/traces/react_fever_webshop.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5
"""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass, field, replace

import numpy as np
from _replay_setup import load_workloads, replay_parser

from agentspec_mw.agentspec import proposer as P
from agentspec_mw.proposer import Proposer, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import ReplayCall
from agentspec_mw.tags import StructureTags


@dataclass
class Live:
    call: ReplayCall
    pos: int = 1
    drafts: list[tuple[int, ...]] = field(default_factory=list)


def _start(p: Proposer, rid: str, call: ReplayCall) -> Live:
    p.start(rid, call.prompt, call.tags)
    p.extend(rid, call.output[:1])
    return Live(call)


def _advance(p: Proposer, rid: str, live: Live, draft: tuple[int, ...]) -> int:
    """Verify ``draft`` against the recorded output; return the accepted count."""
    out = live.call.output
    a = 0
    while a < len(draft) and live.pos + a < len(out) and draft[a] == out[live.pos + a]:
        a += 1
    n = min(a + 1, len(out) - live.pos)
    p.extend(rid, out[live.pos : live.pos + n])
    live.pos += n
    live.drafts.append(draft)
    return a


def run(v_calls, n_calls, k: int, mode: str, n_batch: int, options) -> dict[str, object]:  # type: ignore[no-untyped-def]
    p = make_proposer("agentspec", ENV, **options)
    n_iter = itertools.cycle(n_calls or [None])
    n_live: dict[str, Live] = {}
    seq = 0
    drafted = accepted = steps = 0
    v_drafts = []
    for i, call in enumerate(v_calls):
        rid = f"v{i}"
        v = _start(p, rid, call)
        while v.pos < len(call.output):
            if mode == "within":
                while len(n_live) < n_batch:
                    seq += 1
                    n_live[f"n{seq}"] = _start(p, f"n{seq}", next(n_iter))
            ids = [rid, *n_live] if mode == "within" else [rid]
            ctx = StepContext(batch_size=len(ids), num_kv_tokens=2048 * len(ids))
            ds = p.propose(ids, k, ctx)
            drafted += len(ds[0])
            accepted += _advance(p, rid, v, ds[0].token_ids)
            steps += 1
            for nid, d in zip(ids[1:], ds[1:], strict=True):
                _advance(p, nid, n_live[nid], d.token_ids)
                if n_live[nid].pos >= len(n_live[nid].call.output):
                    p.stop(nid)
                    del n_live[nid]
        p.stop(rid)
        v_drafts.append(v.drafts)
        if mode.startswith("between"):  # a batch of N's calls, in steps without V
            for _ in range(n_batch):
                seq += 1
                n_live[f"n{seq}"] = _start(p, f"n{seq}", next(n_iter))
            while n_live:
                ids = list(n_live)
                ctx = StepContext(batch_size=len(ids), num_kv_tokens=2048 * len(ids))
                for nid, d in zip(ids, p.propose(ids, k, ctx), strict=True):
                    _advance(p, nid, n_live[nid], d.token_ids)
                    if n_live[nid].pos >= len(n_live[nid].call.output):
                        p.stop(nid)
                        del n_live[nid]
    fill = p._index.written / p._index.capacity  # type: ignore[attr-defined]
    return {
        "drafted": drafted,
        "accepted": accepted,
        "steps": steps,
        "drafts": v_drafts,
        "fill": fill,
    }


def main() -> None:
    global ENV
    ap = replay_parser(__doc__, proposers="agentspec")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--v-runs", type=int, default=3)
    ap.add_argument("--n-batch", type=int, default=16)
    ap.add_argument(
        "--index-max-tokens",
        type=int,
        default=None,
        help="the proposer's index_max_tokens (default: its own); a full index evicts "
        "the oldest tokens, any tenant's",
    )
    args = ap.parse_args()
    P.time = types.SimpleNamespace(perf_counter=lambda: 0.0)  # type: ignore[assignment]
    setup = load_workloads(args.traces, args.tokenizer, max_k=args.k, max_calls=2000)
    ENV = setup.env
    rng = np.random.default_rng(0)
    for wl, calls in setup.workloads.items():
        runs = list(dict.fromkeys(c.run_id for c in calls))
        v_runs = set(runs[: args.v_runs])

        def tagged(c: ReplayCall, scope: str) -> ReplayCall:
            tags = c.tags or StructureTags(agent_id="agent", query_id=c.run_id)
            return replace(c, tags=tags.model_copy(update={"scope": scope}))

        v_calls = [tagged(c, "V") for c in calls if c.run_id in v_runs]
        n_src = [c for c in calls if c.run_id not in v_runs][:200]
        noisy = [replace(c, output=rng.permutation(c.output)) for c in n_src]
        cases = {
            "alone": ([], "alone"),
            "between": ([tagged(c, "N") for c in noisy], "between"),
            "between, same scope": ([tagged(c, "V") for c in noisy], "between"),
            "within": ([tagged(c, "N") for c in noisy], "within"),
        }
        print(f"{wl}: V = {len(v_calls)} calls of {args.v_runs} runs, k = {args.k}")
        print(
            f"{'case':>22} {'drafted':>8} {'accepted':>9} {'steps':>6} {'drafts != alone':>16}"
            f" {'index written/capacity':>23}"
        )
        base = None
        for name, (n_calls, mode) in cases.items():
            opts = {}
            if args.index_max_tokens:
                opts["index_max_tokens"] = args.index_max_tokens
            r = run(v_calls, n_calls, args.k, mode, args.n_batch, opts)
            flat = [d for req in r["drafts"] for d in req]  # type: ignore[attr-defined]
            if base is None:
                base = flat
            diff = sum(a != b for a, b in zip(flat, base, strict=False)) + abs(
                len(flat) - len(base)
            )
            print(
                f"{name:>22} {r['drafted']:>8} {r['accepted']:>9} {r['steps']:>6} "
                f"{diff:>7} of {len(flat):>6} {r['fill']:>23.2f}",
                flush=True,
            )


ENV = None

if __name__ == "__main__":
    main()
