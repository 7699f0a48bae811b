"""Paired proposer timing: two option sets of one proposer, step by step, in one process.

``proposer_speed.py`` times one proposer per replay, and on a shared VM the time per
step drifts by tens of percent between replays minutes apart — more than most changes
it should resolve. Here proposer A (options ``--set-a``) drives the replay, and B
(options ``--set-b``) shadows it: every ``start``/``extend``/``stop`` goes to both, and
every step both draft for the same requests (B's drafts are discarded), the one timed
first alternating between steps. Both therefore see the same steps at the same moment
of the machine's drift; the per-step ratio B / A cancels most of it.

B follows A's trajectory: the requests in flight and their accepted tokens are A's, so
B's own calibration learns from A's steps. That is what an A/B of *time* needs; B's
drafting is measured with ``agentspec replay --set``.

    python benchmarks/proposer_ab.py --traces ../shared/traces/tot_parallel_sampling.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --k 16,32 \\
        --set-a index_walk_batch=null --set-b index_walk_batch=128
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _replay_setup import load_workloads, replay_parser

from agentspec_mw.cli import _parse_set
from agentspec_mw.proposer import Draft, Proposer, StepContext, TokenIds
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload
from agentspec_mw.tags import StructureTags


class Paired:
    """A proposer that drives ``a`` and shadows every call on ``b``, timing both."""

    name = "paired"

    def __init__(self, a: Proposer, b: Proposer) -> None:
        self.a, self.b = a, b
        self.time_a: list[float] = []
        self.time_b: list[float] = []
        self.batch: list[int] = []

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        self.a.start(req_id, prompt_ids, tags)
        self.b.start(req_id, prompt_ids, tags)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        self.a.extend(req_id, token_ids)
        self.b.extend(req_id, token_ids)

    def stop(self, req_id: str) -> None:
        self.a.stop(req_id)
        self.b.stop(req_id)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        b_first = len(self.batch) % 2 == 1
        t0 = time.perf_counter()
        if b_first:
            self.b.propose(req_ids, k, step)
        t1 = time.perf_counter()
        drafts = self.a.propose(req_ids, k, step)
        t2 = time.perf_counter()
        if not b_first:
            self.b.propose(req_ids, k, step)
        t3 = time.perf_counter()
        self.time_a.append(t2 - t1)
        self.time_b.append((t1 - t0) + (t3 - t2))
        self.batch.append(step.batch_size)
        return drafts


def _options(items: Sequence[str], proposer: str) -> dict[str, Any]:
    return _parse_set([f"{proposer}.{item}" for item in items]).get(proposer, {})


def main(argv: Sequence[str] | None = None) -> int:
    ap = replay_parser(__doc__, proposers="agentspec")
    ap.add_argument("--k", default="16,32")
    ap.add_argument("--set-a", action="append", default=[], metavar="OPTION=VALUE")
    ap.add_argument("--set-b", action="append", default=[], metavar="OPTION=VALUE")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    name = args.proposers
    if "," in name:
        ap.error("--proposers: one proposer (A and B are two option sets of it)")
    opt_a, opt_b = _options(args.set_a, name), _options(args.set_b, name)
    ks = [int(x) for x in args.k.split(",")]
    setup = load_workloads(args.traces, args.tokenizer, max_k=max(ks))
    print(f"A: {name} {opt_a or '(defaults)'}\nB: {name} {opt_b or '(defaults)'}")
    head = ("workload", "k", "full steps", "A p50 ms", "B p50 ms", "B/A p50", "B/A IQR")
    widths = (22, 4, 11, 10, 10, 9, 15)
    print("".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    rows = []
    for wl, calls in setup.workloads.items():
        for k in ks:
            pair = Paired(
                make_proposer(name, setup.env, **opt_a), make_proposer(name, setup.env, **opt_b)
            )
            replay_workload(calls, pair, batch=args.batch, k=k, cost_model=setup.cost)
            full = np.asarray(pair.batch) >= args.batch
            if not full.any():
                print(f"{wl:>22} {k:>3}  never {args.batch} calls in flight: skipped")
                continue
            ta = np.asarray(pair.time_a)[full] * 1e3
            tb = np.asarray(pair.time_b)[full] * 1e3
            ratio = tb / ta
            q25, q50, q75 = (float(np.percentile(ratio, q)) for q in (25, 50, 75))
            row = {
                "workload": wl,
                "k": k,
                "batch": args.batch,
                "full_steps": int(full.sum()),
                "a_p50_ms": float(np.median(ta)),
                "b_p50_ms": float(np.median(tb)),
                "ratio_p25": q25,
                "ratio_p50": q50,
                "ratio_p75": q75,
            }
            rows.append(row)
            print(
                f"{wl:>22} {k:>3} {row['full_steps']:>10} {row['a_p50_ms']:>9.3f} "
                f"{row['b_p50_ms']:>9.3f} {q50:>8.3f}   {q25:.3f}-{q75:.3f}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": platform.processor() or platform.machine(),
                    "proposer": name,
                    "a": opt_a,
                    "b": opt_b,
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
