"""Proposer speed: the per-step work (start/extend/propose/stop) with a full batch.

Replays real traces through each proposer at a batch size (default 256 calls in flight)
and reports the per-step proposer time over the steps where the batch was full — the
number docs/results.md holds to its bar (p50 ≤ 1.5 ms for 256 requests; the median of
several runs' p50, the hour's load moves one run's). Prints a table;
``--json`` writes it. Timings are wall-clock on this machine: run it on a quiet machine
and compare proposers within one run.

    python benchmarks/proposer_speed.py --traces ../shared/traces/react_fever_webshop.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 256 --k 16,32
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
from _replay_setup import load_workloads, replay_parser

from agentspec_mw.cli import _parse_set
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import replay_workload


def main() -> None:
    ap = replay_parser(__doc__, proposers="agentspec,suffix,ngram")
    ap.add_argument("--k", default="16,32")
    ap.add_argument("--max-calls", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PROPOSER.OPTION=VALUE",
        help="a proposer option, as in agentspec replay (e.g. agentspec.index_walk_batch=null)",
    )
    args = ap.parse_args()
    options = _parse_set(args.set)
    ks = [int(x) for x in args.k.split(",")]
    # one request per run in flight: a "256-request step" has 256 requests, also on ToT,
    # whose samples would otherwise decode ~10 at a time per run
    setup = load_workloads(
        args.traces, args.tokenizer, max_k=max(ks), max_calls=args.max_calls, serial_runs=True
    )
    env, cost = setup.env, setup.cost
    rows = []
    head = ("workload", "proposer", "k", "full steps", "p50 ms", "p90 ms", "p99 ms")
    print("".join(f"{h:>{w}}" for h, w in zip(head, (22, 11, 4, 11, 9, 9, 9), strict=True)))
    for wl, calls in setup.workloads.items():
        for name in args.proposers.split(","):
            for k in ks:
                t0 = time.perf_counter()
                proposer = make_proposer(name, env, **options.get(name, {}))
                r = replay_workload(calls, proposer, batch=args.batch, k=k, cost_model=cost)
                us = np.asarray(r.propose_us)[np.asarray(r.step_batch) >= args.batch]
                if len(us) == 0:
                    print(
                        f"{wl:>22} {name:>10} {k:>3}  never {args.batch} calls in flight: skipped"
                    )
                    continue
                p50, p90, p99 = (float(np.percentile(us, q)) / 1e3 for q in (50, 90, 99))
                rows.append(
                    {
                        "workload": wl,
                        "proposer": name,
                        "k": k,
                        "batch": args.batch,
                        "full_steps": len(us),
                        "p50_ms": p50,
                        "p90_ms": p90,
                        "p99_ms": p99,
                        "wall_s": time.perf_counter() - t0,
                    }
                )
                print(
                    f"{wl:>22} {name:>10} {k:>3} {len(us):>10} {p50:>8.3f} {p90:>8.3f} {p99:>8.3f}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"machine": platform.processor() or platform.machine(), "rows": rows}, indent=1
            )
        )


if __name__ == "__main__":
    main()
