"""What speculation can buy on the real engine: perfect drafts against none, and AgentSpec's share.

On one embedded engine with ``agentspec bench``'s settings (default model, eager, 1 GiB of
KV cache, ``--k`` draft tokens, ``--max-tokens`` per call), ``--n`` concurrent workflows of
``--app`` (a name ``agentspec bench --apps`` takes), each repeat runs four passes over the
same fresh topics with the proposer of ``_oracle_proposer.py`` in one of its modes, vLLM's
prefix cache reset before each pass:

1. ``agentspec`` (AgentSpec has not seen these topics),
2. ``off`` (no drafts; records every request's output),
3. ``oracle`` (each request drafts its own output: every draft token is accepted),
4. ``off`` again.

It prints each pass's output tokens per second, drafted and accepted tokens, and per repeat
``oracle / off`` and ``agentspec / off`` (``off``: the mean of passes 2 and 4), then their
medians and AgentSpec's share of the ceiling, ``(agentspec − 1) / (oracle − 1)`` of the
medians. The baseline is the speculative engine with every draft empty, not an engine
without speculation (``agentspec bench`` measures that one). Outputs of every pass must be
the same token for token (exit code 1 otherwise). The process re-executes itself with the
environment ``agentspec bench`` gives its engines (vLLM's CPU preload, thread defaults).

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

PASSES = ("agentspec", "off", "oracle", "off")
_CHILD = "AGENTSPEC_ORACLE_CEILING_CHILD"


def _engine_env() -> dict[str, str]:
    """``agentspec bench``'s engine environment (its ``_engine_env``, from public parts)."""
    from agentspec_mw_vllm.engine import env_defaults
    from agentspec_mw_vllm.preload import with_preload

    env = dict(os.environ)
    for key, value in env_defaults(env).items():
        env.setdefault(key, value)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env[_CHILD] = "1"
    return with_preload(env)


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

    if args.repeats * args.n > topic_count():
        ap.error(f"--repeats x --n over {topic_count()} topics: AgentSpec would see one twice")
    if os.environ.get(_CHILD) != "1":
        script = str(Path(__file__).resolve())
        argv = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, script, *argv], _engine_env())

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
    ratios: dict[str, list[float]] = {"oracle": [], "agentspec": []}
    mismatches = 0
    bar = tqdm(total=args.repeats * len(PASSES), desc="passes", unit="pass", file=sys.stderr)
    try:
        for r in range(args.repeats):
            topics = bench_topics(r * args.n, args.n)
            tps: list[float] = []
            hashes: list[list[str]] = []
            for i, mode in enumerate(PASSES):
                oracle.OracleProposer.mode = mode
                worker.llm.reset_prefix_cache()
                res = worker.run(args.app, topics)
                tps.append(res.output_tokens / res.wall_s)
                hashes.append(res.token_hashes)
                row = {
                    "repeat": r,
                    "pass": i + 1,
                    "mode": mode,
                    "tokens_per_s": round(tps[-1], 2),
                    "wall_s": round(res.wall_s, 2),
                    "output_tokens": res.output_tokens,
                    "drafted": res.drafted,
                    "accepted": res.accepted,
                }
                passes.append(row)
                bar.update(1)
                tqdm.write(json.dumps(row), file=sys.stderr)
            same = all(h == hashes[0] for h in hashes)
            mismatches += not same
            off = (tps[1] + tps[3]) / 2
            ratios["oracle"].append(tps[2] / off)
            ratios["agentspec"].append(tps[0] / off)
            print(
                f"repeat {r}: oracle / off {ratios['oracle'][-1]:.3f}, agentspec / off "
                f"{ratios['agentspec'][-1]:.3f}, outputs identical: {same}",
                flush=True,
            )
    finally:
        bar.close()
        worker.close()
    med = {m: statistics.median(v) for m, v in ratios.items()}
    share = (med["agentspec"] - 1) / (med["oracle"] - 1) if med["oracle"] > 1 else float("nan")
    print(
        f"{args.app}, N = {args.n}, k = {args.k}, max tokens {args.max_tokens}, "
        f"{args.repeats} repeat(s), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"median oracle / off {med['oracle']:.3f}, agentspec / off {med['agentspec']:.3f} "
        f"({share:.0%} of the ceiling)"
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
