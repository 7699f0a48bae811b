"""Affinity vs round robin on a real cluster: ``agentspec cluster`` (two replicas behind
vllm-router ``consistent_hash``) plus a second vllm-router (``round_robin``) in front of the
same replicas.

Each policy runs the same concurrent multi-agent queries (plan -> ``--width`` ``Send``
workers that restate the plan -> a writer that combines the notes) through
``with_agentspec(graph, engine=router)``; every query has its own isolation scope, so the
two runs share no drafting history and each replica's per-scope counters show how many
replicas a query reached. Printed per policy: requests per replica, queries that reached
more than one replica, draft acceptance (vLLM's ``spec_decode`` counters), generated
tokens per second over the run's wall time. Prefix caching is off so the second run does
not reuse the first one's KV blocks.

    python benchmarks/cluster_affinity.py --queries 6 --width 3 --max-tokens 48

Run it alone (under ``flock /tmp/agentspec-engine.lock`` on a shared machine): the
throughput column is wall-clock time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send  # module level: LangGraph reads dispatch's type hints

MODEL = "SmolLM2-135M-Instruct"


class QState(TypedDict, total=False):
    question: str
    plan: str
    part: int
    notes: Annotated[list[str], operator.add]


def query_graph(llm: Any, width: int) -> Any:
    async def plan(state: QState) -> dict[str, Any]:
        out = await llm.ainvoke(
            [HumanMessage(f"Write a short plan to explain {state['question']}.")]
        )
        return {"plan": str(out.content)}

    def dispatch(state: QState) -> list[Send]:
        return [Send("work", {**state, "part": i}) for i in range(1, width + 1)]

    async def work(state: QState) -> dict[str, Any]:
        ask = f"Here is a plan:\n{state['plan']}\nRestate step {state['part']} of the plan."
        out = await llm.ainvoke([HumanMessage(ask)])
        return {"notes": [str(out.content)]}

    async def write(state: QState) -> dict[str, Any]:
        notes = "\n".join(state.get("notes", []))
        ask = f"Combine these notes into one answer about {state['question']}:\n{notes}"
        await llm.ainvoke([HumanMessage(ask)])
        return {}

    g = StateGraph(QState)
    g.add_node("plan", plan)
    g.add_node("work", work)
    g.add_node("write", write)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", dispatch, ["work"])
    g.add_edge("work", "write")
    g.add_edge("write", END)
    return g.compile()


def metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        return str(resp.read().decode())


def metric_sum(text: str, name: str, label: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"agentspec cluster exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    sys.exit(f"{url} not healthy in {timeout:.0f} s")


def run_policy(router: str, replicas: list[str], prefix: str, args: argparse.Namespace) -> dict:
    import httpx
    from langchain_openai import ChatOpenAI

    from agentspec_mw_langgraph import TaggingConfig, with_agentspec

    llm = ChatOpenAI(
        model=MODEL,
        base_url=router + "/v1",
        api_key="unused",
        max_tokens=args.max_tokens,
        temperature=0.0,
        max_retries=0,
        timeout=900,
        http_async_client=httpx.AsyncClient(timeout=900),
    )
    apps = [
        with_agentspec(
            query_graph(llm, args.width),
            engine=router + "/v1",
            config=TaggingConfig(tags_scope=f"{prefix}{i}"),
        )
        for i in range(args.queries)
    ]
    topics = ["photosynthesis", "tides", "volcanoes", "rainbows", "magnets", "seasons", "sound"]
    before = [metrics(u) for u in replicas]
    t0 = time.monotonic()

    async def main() -> None:
        runs = (app.ainvoke({"question": topics[i % len(topics)]}) for i, app in enumerate(apps))
        await asyncio.gather(*runs)

    asyncio.run(main())
    wall = time.monotonic() - t0
    after = [metrics(u) for u in replicas]

    def delta(name: str, label: str = "") -> list[float]:
        return [
            metric_sum(a, name, label) - metric_sum(b, name, label)
            for a, b in zip(after, before, strict=True)
        ]

    drafted = sum(delta("vllm:spec_decode_num_draft_tokens_total"))
    accepted = sum(delta("vllm:spec_decode_num_accepted_tokens_total"))
    generated = sum(delta("vllm:generation_tokens_total"))
    spread = [
        sum(
            metric_sum(a, "agentspec_scope_drafted_tokens_total", f'scope="{prefix}{i}"') > 0
            for a in after
        )
        for i in range(args.queries)
    ]
    return {
        "requests_per_replica": [int(x) for x in delta("vllm:request_success_total")],
        "queries_on_2+_replicas": sum(s > 1 for s in spread),
        "drafted": int(drafted),
        "accepted": int(accepted),
        "acceptance": round(accepted / drafted, 3) if drafted else None,
        "generated_tokens": int(generated),
        "wall_s": round(wall, 1),
        "tokens_per_s": round(generated / wall, 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=6)
    p.add_argument("--width", type=int, default=3, help="fan-out workers per query")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--port", type=int, default=8100, help="router port (replicas: +1, +2)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()

    from agentspec_mw_vllm.cluster import running_router

    log_dir = Path(tempfile.mkdtemp(prefix="agentspec-cluster-bench-"))
    serve = ["--served-model-name", MODEL, "--k", str(args.k), "--max-model-len", "1024"]
    serve += ["--metrics-labels", "scope", "--", "--enforce-eager", "--max-num-seqs", "16"]
    serve += ["--no-enable-prefix-caching"]
    argv = [sys.executable, "-m", "agentspec_mw.cli", "cluster", "--replicas", "2"]
    argv += ["--port", str(args.port), "--log-dir", str(log_dir), "--", *serve]
    print("$ " + " ".join(argv), flush=True)
    cluster = subprocess.Popen(argv, start_new_session=True)
    rows: dict[str, dict] = {}
    try:
        affinity = f"http://127.0.0.1:{args.port}"
        wait_healthy(affinity, cluster, 900)
        replicas = [f"http://127.0.0.1:{args.port + i}" for i in (1, 2)]
        for url in replicas:  # warm-up: the first request of a replica is slow
            body = {"model": MODEL, "prompt": "Hello", "max_tokens": 8}
            req = urllib.request.Request(
                url + "/v1/completions",
                json.dumps(body).encode(),
                {"content-type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=300).read()
        with running_router(
            replicas, log_dir / "rr.log", port=args.port + 10, policy="round_robin"
        ) as rr:
            for policy, router, prefix in (
                ("round_robin", rr, "rr"),
                ("consistent_hash", affinity, "aff"),
            ):
                rows[policy] = run_policy(router, replicas, prefix, args)
                print(policy, json.dumps(rows[policy]), flush=True)
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            code = cluster.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            code = cluster.wait()
        print(f"agentspec cluster stopped ({code}); logs in {log_dir}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
