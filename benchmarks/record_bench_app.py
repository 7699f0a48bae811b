"""Record one of ``agentspec bench``'s workflow shapes from the real engine, for the replay.

Runs ``--queries`` workflows of ``--app`` (a name ``agentspec bench --apps`` takes: a built-in
shape of :data:`agentspec_mw_langgraph.bench_apps.APPS` or ``module:attr`` /
``file.py:attr``, resolved by :func:`~agentspec_mw_langgraph.bench_apps.resolve_app`; the
bench's topics from the start of its sequence), ``--concurrency`` at a time, on the
embedded engine without speculation (the bench's engine settings: default model,
float32, eager, 1 GiB of KV cache), the graph wrapped with ``with_agentspec`` and the
LangGraph adapter's ``TraceRecorder`` (``TaggingConfig(trace_path=...)``): every call's
prompt, the model's own output and its structure (agent, query, redundancy group). One
warm-up query runs first, unrecorded. Replay the file with

    agentspec replay --traces OUT --tokenizer MODEL_DIR --cost-model cpu-smollm2 --k 8 \\
        --proposers none,ngram,suffix,agentspec --batch 1,16,32 --tags trace

(``MODEL_DIR``: ``python -c "from agentspec_mw.default_model import resolve_model;
print(resolve_model(None))"``). Run it under the engine lock when others share the host.
A bad ``--app`` fails before the engine starts (exit code 2). The trace's workload is
``bench_`` and the name with each run of other characters than letters, digits and ``_``
made one ``_`` (``map_reduce:build`` -> ``bench_map_reduce_build``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def workload_name(app: str) -> str:
    """The trace's workload for ``--app`` ``app``: ``bench_`` + ``app`` made an identifier."""
    return "bench_" + re.sub(r"\W+", "_", app).strip("_")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="trace file to write (replaced)")
    ap.add_argument(
        "--app",
        default="demo",
        help="demo, tool_loop, reflect, or an import path module:attr / file.py:attr "
        "(as agentspec bench --apps)",
    )
    ap.add_argument("--queries", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args(argv)

    from agentspec_mw_vllm.engine import apply_env_defaults

    apply_env_defaults(in_process=True)  # before vLLM is imported
    from agentspec_mw_langgraph.backend import VLLMBackend
    from agentspec_mw_langgraph.bench_apps import BenchAppError, bench_topics, resolve_app
    from agentspec_mw_langgraph.config import TaggingConfig
    from agentspec_mw_langgraph.engine_chat import ChatAgentSpecVLLM
    from agentspec_mw_langgraph.wrap import with_agentspec
    from agentspec_mw_vllm.engine import build_llm, shutdown

    try:
        app = resolve_app(args.app)
    except BenchAppError as e:
        print(f"record_bench_app: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    llm = build_llm(
        None,
        speculative=None,
        max_model_len=2048,
        max_num_seqs=64,
        kv_cache_memory_bytes=1024 << 20,
        enforce_eager=True,
    )
    try:
        chat = ChatAgentSpecVLLM(engine=VLLMBackend(llm), max_tokens=args.max_tokens)
        app.run(with_agentspec(app.build(chat)), "warm-up: the weather")
        out.unlink(missing_ok=True)
        config = TaggingConfig(trace_path=out, trace_workload=workload_name(args.app))
        graph = with_agentspec(app.build(chat), config=config)
        topics = bench_topics(0, args.queries)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            list(pool.map(lambda t: app.run(graph, t), topics))
        wall = time.perf_counter() - t0
    finally:
        shutdown(llm)
    print(json.dumps({"app": args.app, "queries": len(topics), "wall_s": round(wall, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
