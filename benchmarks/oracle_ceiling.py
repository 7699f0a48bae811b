"""What speculation can buy on the real engine: perfect drafts against none, and AgentSpec's share.

On one embedded engine with ``agentspec bench``'s settings (default model, eager, 1 GiB of
KV cache, ``--k`` draft tokens, ``--max-tokens`` per call), ``--n`` concurrent workflows of
``--app`` (a name ``agentspec bench --apps`` takes), each repeat runs seven passes over two
sets of fresh topics with the proposer of ``_oracle_proposer.py`` in one of its modes, vLLM's
prefix cache reset before each pass:

* topics T: ``off`` (no drafts; records every request's output), ``trim`` (AgentSpec's
  drafts cut to their accepted prefix: the same accepted tokens, no rejected ones),
  ``oracle`` (each request drafts its own output: every draft token is accepted), ``off``;
* topics U: ``off``, ``agentspec`` (AgentSpec's drafts as they are), ``off``.

AgentSpec sees only its own passes (``trim``, ``agentspec``), as its engine in ``agentspec
bench`` sees its own runs: it meets T and U first in its pass. It prints each pass's output
tokens per second, drafted and accepted tokens, and per repeat ``oracle``, ``trim`` (over
the mean of T's ``off`` passes) and ``agentspec`` (over U's), then their medians and
AgentSpec's share of the ceiling, ``(x − 1) / (oracle − 1)`` of the medians. ``trim`` against
``agentspec`` is what the rejected draft tokens cost; ``oracle`` against ``trim``, the
tokens AgentSpec did not draft. The baseline is the speculative engine with every draft
empty, not an engine without speculation (``agentspec bench`` measures that one). Outputs
of every pass over a topic set must be the same token for token (exit code 1 otherwise).
The process re-executes itself with the environment ``agentspec bench`` gives its engines
(vLLM's CPU preload, thread defaults).

    python benchmarks/oracle_ceiling.py --app demo --n 32 --repeats 3 --max-tokens 32

Run it under the engine lock when others share the host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

PASSES = (
    ("off", 0),
    ("trim", 0),
    ("oracle", 0),
    ("off", 0),
    ("off", 1),
    ("agentspec", 1),
    ("off", 1),
)
"""(mode, topic set) of each pass of a repeat."""
_CHILD = "AGENTSPEC_ORACLE_CEILING_CHILD"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="demo", help="as agentspec bench --apps (one)")
    ap.add_argument("--n", type=int, default=32, help="concurrent workflows")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", help="write every pass and the ratios here")
    args = ap.parse_args(argv)
    from agentspec_mw_langgraph.bench_apps import bench_topics, topic_count

    if 2 * args.repeats * args.n > topic_count():
        ap.error(f"2 x --repeats x --n over {topic_count()} topics: AgentSpec would see one twice")
    if os.environ.get(_CHILD) != "1":
        script = str(Path(__file__).resolve())
        argv = sys.argv[1:] if argv is None else argv
        from agentspec_mw_langgraph.bench import engine_env

        env = {**engine_env("agentspec"), _CHILD: "1"}  # the bench's engines' environment
        os.execve(sys.executable, [sys.executable, script, *argv], env)

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the engine imports the proposer
    import _oracle_proposer as oracle
    from tqdm import tqdm

    from agentspec_mw_langgraph.bench_worker import Worker, WorkerSpec

    spec = WorkerSpec(
        label="oracle",
        speculative="_oracle_proposer:OracleProposer",
        k=args.k,
        max_tokens=args.max_tokens,
        apps=(args.app,),
    )
    worker = Worker(spec)
    passes: list[dict[str, object]] = []
    ratios: dict[str, list[float]] = {"oracle": [], "trim": [], "agentspec": []}
    mismatches = 0
    bar = tqdm(total=args.repeats * len(PASSES), desc="passes", unit="pass", file=sys.stderr)
    try:
        for r in range(args.repeats):
            sets = [bench_topics((2 * r + j) * args.n, args.n) for j in (0, 1)]
            tps: dict[tuple[str, int], list[float]] = {}
            hashes: dict[int, list[list[str]]] = {0: [], 1: []}
            for i, (mode, t) in enumerate(PASSES):
                oracle.OracleProposer.mode = mode
                worker.llm.reset_prefix_cache()
                res = worker.run(args.app, sets[t])
                tps.setdefault((mode, t), []).append(res.output_tokens / res.wall_s)
                hashes[t].append(res.token_hashes)
                row = {
                    "repeat": r,
                    "pass": i + 1,
                    "mode": mode,
                    "topics": "TU"[t],
                    "tokens_per_s": round(res.output_tokens / res.wall_s, 2),
                    "wall_s": round(res.wall_s, 2),
                    "output_tokens": res.output_tokens,
                    "drafted": res.drafted,
                    "accepted": res.accepted,
                }
                passes.append(row)
                bar.update(1)
                tqdm.write(json.dumps(row), file=sys.stderr)
            same = all(h == hs[0] for hs in hashes.values() for h in hs)
            mismatches += not same
            off = [statistics.fmean(tps[("off", t)]) for t in (0, 1)]
            ratios["oracle"].append(tps[("oracle", 0)][0] / off[0])
            ratios["trim"].append(tps[("trim", 0)][0] / off[0])
            ratios["agentspec"].append(tps[("agentspec", 1)][0] / off[1])
            print(
                f"repeat {r}: "
                + ", ".join(f"{m} / off {v[-1]:.3f}" for m, v in ratios.items())
                + f", outputs identical: {same}",
                flush=True,
            )
    finally:
        bar.close()
        worker.close()
    med = {m: statistics.median(v) for m, v in ratios.items()}
    ceiling = med["oracle"] - 1

    def share(m: str) -> str:
        return f" ({(med[m] - 1) / ceiling:.0%} of the ceiling)" if ceiling > 0 else ""

    print(
        f"{args.app}, N = {args.n}, k = {args.k}, max tokens {args.max_tokens}, "
        f"{args.repeats} repeat(s), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"median oracle / off {med['oracle']:.3f}, trim / off {med['trim']:.3f}{share('trim')}, "
        f"agentspec / off {med['agentspec']:.3f}{share('agentspec')}"
        + (f"; {mismatches} repeat(s) with differing outputs" if mismatches else "")
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(args).items() if k != "json"},
                    "passes": passes,
                    "ratios": ratios,
                    "median": med,
                },
                indent=1,
            )
        )
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
